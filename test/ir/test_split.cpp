// split_module and group_by_support: a split graph computes what the original computes
// (random graphs with mutations and random ops, bitwise), and groups that cannot be ordered are
// refused.
#include "support/test_util.h"
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>

#include "ir/ir_test_graphs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <set>

namespace {

using namespace torchcompile::ir;
using tc_test::error_of;
using tc_test::meta;
using tc_test::same_bits;
using ::testing::HasSubstr;

// A random graph over two (3, 4) inputs and a parameter: pointwise ops, in-place updates of
// inputs and intermediates, random ops, several outputs.
std::shared_ptr<GraphModule> random_graph(std::mt19937& rng) {
  auto gm = std::make_shared<GraphModule>();
  Graph& g = gm->graph();
  std::vector<Value> pool{g.placeholder("x", meta({3, 4})), g.placeholder("y", meta({3, 4}))};
  gm->set_attribute("w", torch::randn({3, 4}), AttributeKind::Parameter);
  pool.push_back(g.get_attr("w", meta({3, 4})));
  auto pick = [&] { return pool[rng() % pool.size()]; };
  const int length = 4 + static_cast<int>(rng() % 14);
  for (int i = 0; i < length; ++i) {
    Node* n = nullptr;
    switch (rng() % 9) {
      case 0: n = g.call_function(find_op("aten::relu"), {pick()}, {meta({3, 4})}); break;
      case 1: n = g.call_function(find_op("aten::sigmoid"), {pick()}, {meta({3, 4})}); break;
      case 2: n = g.call_function(find_op("aten::neg"), {pick()}, {meta({3, 4})}); break;
      case 3: n = g.call_function(find_op("aten::add.Tensor"), {pick(), pick(), c10::IValue(1)}, {meta({3, 4})}); break;
      case 4: n = g.call_function(find_op("aten::mul.Tensor"), {pick(), pick()}, {meta({3, 4})}); break;
      case 5: n = g.call_function(find_op("aten::mul.Scalar"), {pick(), c10::IValue(0.5)}, {meta({3, 4})}); break;
      case 6: {  // an in-place update of an input or an intermediate (not of the parameter)
        Value target = pick();
        if (target.node->kind() == NodeKind::GetAttr) target = pool[0];
        n = g.call_function(find_op("aten::add_.Tensor"), {target, pick(), c10::IValue(2)}, {meta({3, 4})});
        break;
      }
      case 7: n = g.call_function(find_op("aten::rand_like"), {pick()}, {meta({3, 4})}); break;
      default: n = g.call_function(find_op("aten::tanh"), {pick()}, {meta({3, 4})}); break;
    }
    pool.push_back(n->output());
  }
  std::vector<Value> outs{pool.back()};
  for (int k = static_cast<int>(rng() % 3); k > 0; --k) outs.push_back(pick());
  g.output(outs);
  lint(g);
  return gm;
}

// Runs `gm` on fresh copies of the same inputs with the same random seed: its outputs, then the
// inputs as the run left them (in-place updates).
std::vector<at::Tensor> run(GraphModule& gm, const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> in;
  for (const auto& t : inputs) in.push_back(t.clone());
  torch::manual_seed(7);
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> out = gm.forward(in);
  out.insert(out.end(), in.begin(), in.end());
  return out;
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << what << ": result " << i;
}

size_t count_kind(const Graph& g, NodeKind k) {
  size_t n = 0;
  for (const auto& node : g.nodes()) n += node->kind() == k;
  return n;
}

std::string qualified(const Node& n) {
  const auto& name = n.schema().operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

const char* const kOps[] = {"aten::relu", "aten::sigmoid", "aten::neg", "aten::add.Tensor", "aten::mul.Tensor",
                            "aten::mul.Scalar", "aten::add_.Tensor", "aten::rand_like", "aten::tanh"};

TEST(SplitModule, RandomGraphsSplitBySupportComputeTheSameBits) {
  std::mt19937 rng(3);
  size_t parts = 0;
  for (int trial = 0; trial < 300; ++trial) {
    auto gm = random_graph(rng);
    std::set<std::string> supported;
    for (const char* op : kOps)
      if (rng() % 2) supported.insert(op);
    auto groups = group_by_support(gm->graph(), [&](const Node& n) { return supported.count(qualified(n)) != 0; });
    SplitGraph split = split_module(*gm, groups);
    parts += split.parts.size();
    EXPECT_EQ(count_kind(split.parent->graph(), NodeKind::CallModule), groups.size());
    const std::vector<at::Tensor> inputs{torch::randn({3, 4}), torch::randn({3, 4})};
    expect_same(run(*gm, inputs), run(*split.parent, inputs), "trial " + std::to_string(trial) + "\n" +
                                                                  to_text(gm->graph()) + "\nparent:\n" +
                                                                  to_text(split.parent->graph()));
  }
  EXPECT_GT(parts, 150u);
}

// Arbitrary groups (not runs): split_module either refuses them or orders the graph so that it
// computes the same bits, side effects included.
TEST(SplitModule, RandomGroupsAreRefusedOrComputeTheSameBits) {
  std::mt19937 rng(5);
  size_t accepted = 0, refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    auto gm = random_graph(rng);
    std::vector<std::vector<const Node*>> groups(1 + rng() % 3);
    for (const auto& n : gm->graph().nodes())
      if (n->kind() == NodeKind::CallFunction && rng() % 3) groups[rng() % groups.size()].push_back(n.get());
    groups.erase(std::remove_if(groups.begin(), groups.end(), [](const auto& gr) { return gr.empty(); }), groups.end());
    std::optional<SplitGraph> split;
    try {
      split = split_module(*gm, groups);
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what_without_backtrace(), HasSubstr("cannot be ordered"));
      ++refused;
      continue;
    }
    ++accepted;
    const std::vector<at::Tensor> inputs{torch::randn({3, 4}), torch::randn({3, 4})};
    expect_same(run(*gm, inputs), run(*split->parent, inputs), "trial " + std::to_string(trial) + "\n" +
                                                                   to_text(gm->graph()) + "\nparent:\n" +
                                                                   to_text(split->parent->graph()));
  }
  EXPECT_GT(accepted, 50u);
  EXPECT_GT(refused, 20u);
}

TEST(SplitModule, PartsReadTheirInputsAndAttributesAndGiveBackWhatOthersRead) {
  GraphModule gm;
  Graph& g = gm.graph();
  Value x = g.placeholder("x", meta({4}));
  gm.set_attribute("w", torch::randn({4}), AttributeKind::Parameter);
  Value w = g.get_attr("w", meta({4}));
  Node* mul = g.call_function(find_op("aten::mul.Tensor"), {x, w}, {meta({4})});
  Node* relu = g.call_function(find_op("aten::relu"), {mul->output()}, {meta({4})});
  Node* cos = g.call_function(find_op("aten::cos"), {relu->output()}, {meta({4})});
  Node* add = g.call_function(find_op("aten::add.Tensor"), {cos->output(), mul->output(), c10::IValue(1)}, {meta({4})});
  g.output({add->output()});
  auto groups = group_by_support(g, [](const Node& n) { return n.schema().name() != "aten::cos"; });
  ASSERT_EQ(groups.size(), 2u);  // {mul, relu} and {add}
  SplitGraph split = split_module(gm, groups);
  ASSERT_EQ(split.parts.size(), 2u);
  const Graph& p0 = split.parts[0].module->graph();
  EXPECT_EQ(count_kind(p0, NodeKind::Placeholder), 1u);  // x
  EXPECT_EQ(count_kind(p0, NodeKind::GetAttr), 1u);      // its own read of w
  EXPECT_TRUE(split.parts[0].module->has_attribute("w"));
  EXPECT_EQ(p0.output_node()->args()[0].list().size(), 2u);  // mul (read by add) and relu (read by cos)
  EXPECT_EQ(count_kind(split.parent->graph(), NodeKind::GetAttr), 0u);  // only the part reads w
  EXPECT_FALSE(split.parent->has_attribute("w"));
  EXPECT_EQ(split.parts[0].path, "submod_0");
  std::ostringstream table;
  split.parent->print_tabular(table);
  EXPECT_THAT(table.str(), HasSubstr("call_module    submod_0"));
  const at::Tensor in = torch::randn({4});
  EXPECT_TRUE(same_bits(gm.forward({in})[0], split.parent->forward({in})[0]));

  // The caller replaces a part's implementation (as a backend's compiled function would).
  int calls = 0;
  auto part = split.parts[1].module;
  split.parent->set_submodule(split.parts[1].path, [&calls, part](const std::vector<at::Tensor>& args) {
    ++calls;
    return part->forward(args);
  });
  split.parent->recompile();
  EXPECT_TRUE(same_bits(gm.forward({in})[0], split.parent->forward({in})[0]));
  EXPECT_EQ(calls, 1);
}

TEST(SplitModule, RefusesGroupsThatCannotBeOrdered) {
  {
    // a and c in one group, b outside between them: c needs b, which needs a.
    GraphModule gm;
    Graph& g = gm.graph();
    Value x = g.placeholder("x", meta({4}));
    Node* a = g.call_function(find_op("aten::relu"), {x}, {meta({4})});
    Node* b = g.call_function(find_op("aten::neg"), {a->output()}, {meta({4})});
    Node* c = g.call_function(find_op("aten::mul.Tensor"), {a->output(), b->output()}, {meta({4})});
    g.output({c->output()});
    EXPECT_THAT(error_of([&] { split_module(gm, {{a, c}}); }),
                HasSubstr("split_module: group 0 (relu, mul) cannot be ordered"));
    EXPECT_NO_THROW(split_module(gm, {{a}, {c}}));
  }
  {
    // The group would move x's read across the in-place update of x between its nodes.
    GraphModule gm;
    Graph& g = gm.graph();
    Value x = g.placeholder("x", meta({4}));
    Node* a = g.call_function(find_op("aten::mul.Scalar"), {x, c10::IValue(2.0)}, {meta({4})});
    g.call_function(find_op("aten::add_.Scalar"), {x, c10::IValue(1.0), c10::IValue(1)}, {meta({4})});
    Node* c = g.call_function(find_op("aten::relu"), {x}, {meta({4})});
    Node* d = g.call_function(find_op("aten::add.Tensor"), {a->output(), c->output(), c10::IValue(1)}, {meta({4})});
    g.output({d->output()});
    EXPECT_THAT(error_of([&] { split_module(gm, {{a, c}}); }), HasSubstr("cannot be ordered"));
    SplitGraph split = split_module(gm, {{c, d}});
    const at::Tensor in = torch::randn({4});
    EXPECT_TRUE(same_bits(gm.forward({in.clone()})[0], split.parent->forward({in.clone()})[0]));
  }
}

TEST(SplitModule, ChecksItsGroups) {
  GraphModule gm;
  Graph& g = gm.graph();
  Value x = g.placeholder("x", meta({4}));
  Node* a = g.call_function(find_op("aten::relu"), {x}, {meta({4})});
  g.output({a->output()});
  EXPECT_THAT(error_of([&] { split_module(gm, {{a}, {a}}); }), HasSubstr("relu is in two groups"));
  EXPECT_THAT(error_of([&] { split_module(gm, {{x.node}}); }), HasSubstr("not a call_function node"));
  EXPECT_THAT(error_of([&] { split_module(gm, {{}}); }), HasSubstr("group 0 is empty"));
  EXPECT_EQ(group_by_support(g, [](const Node&) { return true; }, /*min_size=*/2).size(), 0u);
}

}  // namespace
