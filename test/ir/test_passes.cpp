// lint() and eliminate_dead_code().
#include "support/test_util.h"
#include <torchcompile/ir/parser.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>

#include "ir/ir_test_graphs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace {

using tc_test::error_of;

using namespace torchcompile::ir;
using tc_test::meta;
using ::testing::HasSubstr;

std::vector<std::string> names(const Graph& g) {
  std::vector<std::string> out;
  for (const auto& n : g.nodes()) out.push_back(n->name());
  return out;
}

TEST(IrLint, AcceptsWellFormedGraphs) {
  auto g = tc_test::seed_graph();
  EXPECT_NO_THROW(lint(*g));
  // Insertion before existing nodes keeps the graph well formed.
  g->set_insert_point(g->find_node("add"));
  Node* neg = g->call_function(find_op("aten::neg"), {g->find_node("cos")->output()}, {meta({10})});
  g->find_node("add")->set_arg(1, neg->output());
  EXPECT_NO_THROW(lint(*g));
}

TEST(IrLint, CatchesAMissingOutputNode) {
  Graph g;
  Value x = g.placeholder("x", meta({4}));
  g.call_function(find_op("aten::cos"), {x}, {meta({4})});
  EXPECT_THAT(error_of([&] { lint(g); }), HasSubstr("lint: expected an output node"));
  g.output({x});
  EXPECT_NO_THROW(lint(g));
}

TEST(IrLint, UseListsStayConsistentThroughEdits) {
  // lint rebuilds the use lists from the arguments and compares; run it after each edit.
  auto g = tc_test::seed_graph();
  Node* cos = g->find_node("cos");
  Node* sin = g->find_node("sin");
  Node* add = g->find_node("add");
  add->set_arg(0, sin->output());
  lint(*g);
  EXPECT_FALSE(cos->has_uses());
  ASSERT_EQ(sin->uses().size(), 2u);
  g->replace_all_uses(sin->output(), g->find_node("x")->output());
  lint(*g);
  g->erase(sin);
  g->erase(cos);
  lint(*g);
  EXPECT_EQ(to_text(*g),
            "graph():\n"
            "  %x : f32[10]{1} = placeholder[target=x]\n"
            "  %y : f32[10]{1} = placeholder[target=y]\n"
            "  %add : f32[10]{1} = call_function[target=aten::add.Tensor](args = (%x, %x), kwargs = {})\n"
            "  return (%add,)\n");
}

TEST(IrLint, BrokenTextIsRejected) {
  // The factories and the parser refuse what lint would flag: a use before its definition and
  // a second output node.
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %a : f32[4]{1} = call_function[target=aten::neg](args = (%b,), kwargs = {})\n"
                    "  %b : f32[4]{1} = call_function[target=aten::neg](args = (%x,), kwargs = {})\n"
                    "  return (%a,)\n");
              }),
              HasSubstr("'%b' is not defined before its use"));
  Graph g;
  Value x = g.placeholder("x", meta({4}));
  g.output({x});
  EXPECT_THAT(error_of([&] { g.output({x}); }), HasSubstr("already has an output node"));
  EXPECT_THAT(error_of([&] { g.erase(x.node); }), HasSubstr("still has users"));
  lint(g);
}

TEST(IrDce, RemovesDeadPureNodesAndKeepsSideEffects) {
  Graph g;
  Value x = g.placeholder("x", meta({4}));
  Value unused_input = g.placeholder("unused", meta({4}));
  Value w = g.get_attr("w", meta({4}));  // unused attribute read: dead
  Node* cos = g.call_function(find_op("aten::cos"), {x}, {meta({4})});  // dead
  Node* exp = g.call_function(find_op("aten::exp"), {x}, {meta({4})});  // dead chain exp -> neg
  g.call_function(find_op("aten::neg"), {exp->output()}, {meta({4})});
  Node* clone = g.call_function(find_op("aten::clone"), {x}, {meta({4})});
  g.call_function(find_op("aten::relu_"), {clone->output()}, {meta({4})});  // mutates clone: kept
  g.call_function(find_op("aten::dropout"), {x, c10::IValue(0.5), c10::IValue(true)}, {meta({4})});  // random
  g.call_function(find_op("aten::bernoulli"), {x}, {meta({4})});  // random
  Node* max = g.call_function(find_op("aten::max.dim"), {x, c10::IValue(int64_t{0})},
                              {meta({}), meta({}, c10::ScalarType::Long)});  // only output 1 used
  Node* add = g.call_function(find_op("aten::add.Tensor"), {clone->output(), x}, {meta({4})});
  g.output({add->output(), max->output(1)});
  (void)unused_input, (void)w, (void)cos;
  lint(g);

  EXPECT_TRUE(eliminate_dead_code(g));
  lint(g);
  EXPECT_EQ(names(g), (std::vector<std::string>{"x", "unused", "clone", "relu_", "dropout", "bernoulli", "max", "add",
                                                "output"}));
  // Nothing left to remove.
  EXPECT_FALSE(eliminate_dead_code(g));
  // The result still round-trips.
  EXPECT_EQ(to_text(*parse_graph(to_text(g))), to_text(g));
}

TEST(IrDce, GoldenTextInAndOut) {
  auto g = parse_graph(
      "graph():\n"
      "  %x : f32[4]{1} = placeholder[target=x]\n"
      "  %sin : f32[4]{1} = call_function[target=aten::sin](args = (%x,), kwargs = {})\n"
      "  %cos : f32[4]{1} = call_function[target=aten::cos](args = (%sin,), kwargs = {})\n"
      "  %add_ : f32[4]{1} = call_function[target=aten::add_.Tensor](args = (%x, %x), kwargs = {})\n"
      "  %mul : f32[4]{1} = call_function[target=aten::mul.Tensor](args = (%x, %x), kwargs = {})\n"
      "  return (%mul,)\n");
  EXPECT_TRUE(eliminate_dead_code(*g));
  lint(*g);
  EXPECT_EQ(to_text(*g),
            "graph():\n"
            "  %x : f32[4]{1} = placeholder[target=x]\n"
            "  %add_ : f32[4]{1} = call_function[target=aten::add_.Tensor](args = (%x, %x), kwargs = {})\n"
            "  %mul : f32[4]{1} = call_function[target=aten::mul.Tensor](args = (%x, %x), kwargs = {})\n"
            "  return (%mul,)\n");
}

}  // namespace
