// Graph, Node, Value and Argument: factories, naming, input checks and use lists.
#include "support/test_util.h"
#include <torchcompile/ir/graph.h>
#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/passes.h>

#include "ir/ir_test_graphs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace {

using tc_test::error_of;

using namespace torchcompile::ir;
using tc_test::meta;
using ::testing::HasSubstr;

TEST(IrGraph, FindOpAndTargetNames) {
  EXPECT_EQ(op_target_name(find_op("aten::add.Tensor")), "aten::add.Tensor");
  EXPECT_EQ(op_target_name(find_op("aten::cos")), "aten::cos");
  // FX's spelling works too.
  EXPECT_EQ(op_target_name(find_op("aten.cos.default")), "aten::cos");
  EXPECT_EQ(op_target_name(find_op("aten.max.dim")), "aten::max.dim");
  EXPECT_THAT(error_of([] { find_op("aten::no_such_op"); }), HasSubstr("aten::no_such_op"));
  EXPECT_THAT(error_of([] { find_op("aten::add.NoSuchOverload"); }), HasSubstr("aten::add.NoSuchOverload"));
}

TEST(IrGraph, UniqueNamesAreFxStyle) {
  Graph g;
  EXPECT_EQ(g.unique_name("add"), "add");
  EXPECT_EQ(g.unique_name("add"), "add_1");
  EXPECT_EQ(g.unique_name("add"), "add_2");
  // Asking for a taken `add_1` continues the `add` series, as FX does.
  EXPECT_EQ(g.unique_name("add_1"), "add_3");
  EXPECT_EQ(g.unique_name("layer1.weight"), "layer1_weight");
  EXPECT_EQ(g.unique_name("0"), "_0");
}

TEST(IrGraph, NodeNamesAndTargets) {
  Graph g;
  Value x = g.placeholder("x", meta({2, 3}));
  Value w = g.get_attr("layer1.weight", meta({3, 3}));
  Node* add = g.call_function(find_op("aten::add.Tensor"), {x, x}, {meta({2, 3})});
  Node* add1 = g.call_function(find_op("aten::add.Tensor"), {add->output(), x}, {meta({2, 3})});
  Node* relu = g.call_function(find_op("aten::relu_"), {add1->output()}, {meta({2, 3})});
  Node* mm = g.call_function(find_op("aten::addmm"), {x, x, w}, {meta({2, 3})});
  Node* out = g.output({relu->output(), mm->output()});

  EXPECT_EQ(x.node->name(), "x");
  EXPECT_EQ(x.node->target(), "x");
  EXPECT_EQ(w.node->name(), "layer1_weight");
  EXPECT_EQ(w.node->target(), "layer1.weight");
  EXPECT_EQ(add->name(), "add");
  EXPECT_EQ(add->target(), "aten::add.Tensor");
  EXPECT_EQ(add1->name(), "add_1");
  EXPECT_EQ(relu->name(), "relu_");
  EXPECT_EQ(relu->target(), "aten::relu_");
  EXPECT_EQ(mm->name(), "addmm");
  EXPECT_EQ(out->name(), "output");
  EXPECT_EQ(out->target(), "output");
  EXPECT_EQ(g.output_node(), out);
  EXPECT_EQ(g.find_node("add_1"), add1);
  EXPECT_EQ(g.find_node("nope"), nullptr);
  EXPECT_EQ(g.placeholders(), std::vector<Node*>{x.node});
  EXPECT_STREQ(to_string(add->kind()), "call_function");
  EXPECT_STREQ(to_string(w.node->kind()), "get_attr");
  lint(g);
}

TEST(IrGraph, PlaceholderNamesAreMadeUnique) {
  Graph g;
  Value a = g.placeholder("x", meta({1}));
  Value b = g.placeholder("x", meta({1}));
  EXPECT_EQ(a.node->name(), "x");
  EXPECT_EQ(b.node->name(), "x_1");
  EXPECT_EQ(b.node->target(), "x");
}

TEST(IrGraph, MissingTrailingArgumentsTakeDefaults) {
  Graph g;
  Value x = g.placeholder("x", meta({4}));
  Node* add = g.call_function(find_op("aten::add.Tensor"), {x, x}, {meta({4})});
  ASSERT_EQ(add->args().size(), 3u);
  ASSERT_TRUE(add->args()[2].is_constant());
  EXPECT_EQ(add->args()[2].constant().toScalar().toLong(), 1);

  Node* ln = g.call_function(find_op("aten::layer_norm"), {x, c10::IValue(std::vector<int64_t>{4})}, {meta({4})});
  ASSERT_EQ(ln->args().size(), 6u);
  EXPECT_TRUE(ln->args()[2].constant().isNone());
  EXPECT_DOUBLE_EQ(ln->args()[4].constant().toDouble(), 1e-5);
  EXPECT_TRUE(ln->args()[5].constant().toBool());
}

TEST(IrGraph, FactoriesCheckTheirInputs) {
  Graph g, other;
  Value x = g.placeholder("x", meta({4}));
  Value y = other.placeholder("y", meta({4}));
  auto add = find_op("aten::add.Tensor");

  EXPECT_THAT(error_of([&] { g.call_function(add, {x}, {meta({4})}); }), HasSubstr("'other'"));
  EXPECT_THAT(error_of([&] { g.call_function(add, {x, x, c10::IValue(1), c10::IValue(2)}, {meta({4})}); }), HasSubstr("at most 3"));
  EXPECT_THAT(error_of([&] { g.call_function(add, {x, y}, {meta({4})}); }), HasSubstr("another graph"));
  EXPECT_THAT(error_of([&] { g.call_function(add, {x, Value{x.node, 1}}, {meta({4})}); }),
              HasSubstr("refers to output 1"));
  EXPECT_THAT(error_of([&] { g.call_function(add, {x, x}, {}); }), HasSubstr("metadata"));
  EXPECT_THAT(error_of([&] { g.call_function(add, {x, c10::IValue(1.0)}, {meta({4})}); }),
              HasSubstr("expects a tensor value"));
  EXPECT_THAT(error_of([&] { g.call_function(add, {x, x, x}, {meta({4})}); }), HasSubstr("expects a constant"));
  EXPECT_THAT(error_of([&] { g.call_function(find_op("aten::cos"), {x}, {meta({4})}, {2}); }),
              HasSubstr("not a list"));
  g.output({x});
  EXPECT_THAT(error_of([&] { g.output({x}); }), HasSubstr("already has an output node"));
  // Nothing half-built was left behind.
  EXPECT_EQ(g.size(), 2u);
  EXPECT_TRUE(x.node->uses().size() == 1);
  lint(g);
}

TEST(IrGraph, MultiOutputNodesAndReturnCounts) {
  Graph g;
  Value x = g.placeholder("x", meta({6, 4}));
  Node* max = g.call_function(find_op("aten::max.dim"), {x, c10::IValue(int64_t{1})},
                              {meta({6}), meta({6}, c10::ScalarType::Long)});
  EXPECT_EQ(max->num_outputs(), 2u);
  EXPECT_EQ(max->return_counts(), (std::vector<uint32_t>{1, 1}));
  Node* split = g.call_function(find_op("aten::split.Tensor"), {x, c10::IValue(int64_t{2})},
                                {meta({2, 4}), meta({2, 4}), meta({2, 4})}, {3});
  EXPECT_EQ(split->num_outputs(), 3u);
  EXPECT_EQ(split->return_counts(), std::vector<uint32_t>{3});
  EXPECT_THAT(error_of([&] { g.call_function(find_op("aten::split.Tensor"), {x, c10::IValue(int64_t{2})}, {meta({2, 4})}, {3}); }),
              HasSubstr("produces 3 outputs"));
  Node* cat = g.call_function(find_op("aten::cat"),
                              {std::vector<std::optional<Value>>{split->output(0), split->output(2)}},
                              {meta({4, 4})});
  EXPECT_EQ(split->uses(0).size(), 1u);
  EXPECT_EQ(split->uses(1).size(), 0u);
  EXPECT_EQ(split->uses(2).size(), 1u);
  EXPECT_EQ(split->uses(2)[0], (Use{cat, 0}));
  EXPECT_THAT(error_of([&] { max->output(2); }), HasSubstr("has 2 outputs"));
  g.output({max->output(1), cat->output()});
  lint(g);
}

TEST(IrGraph, UseListsFollowArgumentChanges) {
  Graph g;
  Value x = g.placeholder("x", meta({4}));
  Value y = g.placeholder("y", meta({4}));
  Node* cos = g.call_function(find_op("aten::cos"), {x}, {meta({4})});
  Node* add = g.call_function(find_op("aten::add.Tensor"), {cos->output(), cos->output()}, {meta({4})});
  g.output({add->output()});

  ASSERT_EQ(cos->uses().size(), 2u);
  EXPECT_EQ(cos->uses()[0], (Use{add, 0}));
  EXPECT_EQ(cos->uses()[1], (Use{add, 1}));
  EXPECT_TRUE(cos->has_uses());

  add->set_arg(1, y);
  EXPECT_EQ(cos->uses().size(), 1u);
  ASSERT_EQ(y.node->uses().size(), 1u);
  EXPECT_EQ(y.node->uses()[0], (Use{add, 1}));
  lint(g);

  // set_arg refuses a value defined after the user.
  EXPECT_THAT(error_of([&] { cos->set_arg(0, add->output()); }), HasSubstr("not defined before"));

  g.replace_all_uses(cos->output(), x);
  EXPECT_FALSE(cos->has_uses());
  EXPECT_EQ(add->args()[0].value(), x);
  lint(g);

  EXPECT_THAT(error_of([&] { g.erase(x.node); }), HasSubstr("still has users"));
  g.erase(cos);
  EXPECT_EQ(g.size(), 4u);
  EXPECT_EQ(x.node->uses().size(), 1u);
  lint(g);
}

TEST(IrGraph, InsertPointPlacesNodesBeforeIt) {
  Graph g;
  Value x = g.placeholder("x", meta({4}));
  Node* cos = g.call_function(find_op("aten::cos"), {x}, {meta({4})});
  g.output({cos->output()});
  g.set_insert_point(cos);
  Node* sin = g.call_function(find_op("aten::sin"), {x}, {meta({4})});
  EXPECT_THAT(error_of([&] { g.call_function(find_op("aten::neg"), {cos->output()}, {meta({4})}); }),
              HasSubstr("not defined before"));
  g.set_insert_point(nullptr);
  Node* neg = g.call_function(find_op("aten::neg"), {cos->output()}, {meta({4})});
  // A placeholder added late still goes with the other placeholders.
  Value z = g.placeholder("z", meta({4}));

  std::vector<std::string> order;
  for (const auto& n : g.nodes()) order.push_back(n->name());
  EXPECT_EQ(order, (std::vector<std::string>{"x", "z", "sin", "cos", "neg", "output"}));
  (void)sin, (void)neg, (void)z;
  lint(g);
}

TEST(IrGraph, OperatorProperties) {
  for (const char* name : {"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::native_dropout",
                           "aten::bernoulli", "aten::bernoulli.p", "aten::bernoulli_.float", "aten::rand_like",
                           "aten::randn", "aten::randint", "aten::randperm", "aten::multinomial", "aten::normal_",
                           "aten::uniform_", "aten::rrelu", "aten::poisson", "aten::exponential_"}) {
    EXPECT_TRUE(op_is_random(find_op(name))) << name;
  }
  for (const char* name : {"aten::cos", "aten::add.Tensor", "aten::relu_", "aten::addmm", "aten::zeros"}) {
    EXPECT_FALSE(op_is_random(find_op(name))) << name;
  }
  for (const char* name : {"aten::relu_", "aten::add_.Tensor", "aten::add.out", "aten::copy_"}) {
    EXPECT_TRUE(op_is_mutating(find_op(name))) << name;
  }
  for (const char* name : {"aten::relu", "aten::add.Tensor", "aten::view", "aten::split.Tensor"}) {
    EXPECT_FALSE(op_is_mutating(find_op(name))) << name;
  }

  Graph g;
  Value x = g.placeholder("x", meta({4}));
  Value w = g.get_attr("w", meta({4}));
  Node* cos = g.call_function(find_op("aten::cos"), {x}, {meta({4})});
  Node* relu = g.call_function(find_op("aten::relu_"), {x}, {meta({4})});
  Node* drop = g.call_function(find_op("aten::dropout"), {x, c10::IValue(0.5), c10::IValue(true)}, {meta({4})});
  Node* mod = g.call_module("encoder", {x}, {meta({4})});
  Node* out = g.output({cos->output()});
  EXPECT_TRUE(x.node->has_side_effects());
  EXPECT_FALSE(w.node->has_side_effects());
  EXPECT_FALSE(cos->has_side_effects());
  EXPECT_TRUE(relu->has_side_effects());
  EXPECT_TRUE(drop->has_side_effects());
  EXPECT_TRUE(mod->has_side_effects());
  EXPECT_TRUE(out->has_side_effects());
  EXPECT_EQ(mod->name(), "encoder");
  EXPECT_FALSE(mod->has_op());
  EXPECT_THAT(error_of([&] { mod->op(); }), HasSubstr("not call_function"));
}

TEST(IrGraph, TensorMeta) {
  at::Tensor t = torch::randn({2, 3});
  TensorMeta m = TensorMeta::of(t);
  EXPECT_EQ(m.str(), "f32[2, 3]{3, 1}");
  EXPECT_EQ(m, meta({2, 3}));
  EXPECT_FALSE(m == meta({3, 2}));

  TensorMeta tr = TensorMeta::of(t.t());
  EXPECT_EQ(tr.str(), "f32[3, 2]{1, 3}");

  TensorMeta rg = TensorMeta::of(torch::zeros({4}, torch::dtype(torch::kLong)).to(torch::kDouble).requires_grad_());
  EXPECT_EQ(rg.str(), "f64[4]{1} rg");

  EXPECT_EQ(TensorMeta::of(torch::tensor(true)).str(), "b8[]{}");
  TensorMeta undef = TensorMeta::of(at::Tensor());
  EXPECT_FALSE(undef.defined);
  EXPECT_EQ(undef.str(), "undef");
  TensorMeta undef2;
  undef2.defined = false;
  undef2.dtype = c10::ScalarType::Long;
  EXPECT_EQ(undef, undef2);

  TensorMeta cuda = meta({2});
  cuda.device = c10::Device("cuda:1");
  EXPECT_EQ(cuda.str(), "f32[2]{1} cuda:1");
}

TEST(IrGraph, RenameFreesTheOldName) {
  Graph g;
  Value x = g.placeholder("x", meta({1}));
  Node* cos = g.call_function(find_op("aten::cos"), {x}, {meta({1})});
  EXPECT_EQ(g.rename(cos, "c"), "c");
  EXPECT_EQ(cos->name(), "c");
  EXPECT_EQ(g.find_node("c"), cos);
  EXPECT_EQ(g.unique_name("cos"), "cos");
  EXPECT_EQ(g.rename(cos, "x"), "x_1");
}

}  // namespace
