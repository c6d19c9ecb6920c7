// parse_graph(): round trips text -> graph -> text, typed constants, and error messages.
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

// Parses `text`, lints the result, and checks that it prints back as `text`.
std::unique_ptr<Graph> round_trip(const std::string& text) {
  auto g = parse_graph(text);
  lint(*g);
  EXPECT_EQ(to_text(*g), text);
  return g;
}

// Prints `g`, parses it back and checks the copy prints the same (and the same table).
std::unique_ptr<Graph> round_trip(const Graph& g) {
  lint(g);
  auto copy = round_trip(to_text(g));
  EXPECT_EQ(tabular_string(*copy), tabular_string(g));
  return copy;
}

TEST(IrParser, SeedGraphRoundTrips) {
  auto g = tc_test::seed_graph();
  auto copy = round_trip(*g);
  ASSERT_EQ(copy->size(), 6u);
  Node* add = copy->find_node("add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->target(), "aten::add.Tensor");
  EXPECT_EQ(add->args()[0].value().node, copy->find_node("cos"));
  EXPECT_EQ(add->args()[2].constant().toInt(), 1);  // alpha's default
  EXPECT_EQ(add->output_meta()[0], meta({10}));
}

TEST(IrParser, MultiOutputOpsRoundTrip) {
  Graph g;
  Value x = g.placeholder("x", meta({6, 4}));
  Node* max = g.call_function(find_op("aten::max.dim"), {x, c10::IValue(int64_t{1})},
                              {meta({6}), meta({6}, c10::ScalarType::Long)});
  Node* split = g.call_function(find_op("aten::split.Tensor"), {x, c10::IValue(int64_t{2})},
                                {meta({2, 4}), meta({2, 4}), meta({2, 4})}, {3});
  Node* drop = g.call_function(find_op("aten::native_dropout"), {x, c10::IValue(0.25), c10::IValue(true)},
                               {meta({6, 4}), meta({6, 4}, c10::ScalarType::Bool)});
  g.output({max->output(1), split->output(2), split->output(0), drop->output(1)});
  auto copy = round_trip(g);

  Node* split2 = copy->find_node("split");
  ASSERT_NE(split2, nullptr);
  EXPECT_EQ(split2->return_counts(), std::vector<uint32_t>{3});
  EXPECT_EQ(split2->num_outputs(), 3u);
  Node* max2 = copy->find_node("max");
  EXPECT_EQ(max2->return_counts(), (std::vector<uint32_t>{1, 1}));
  EXPECT_EQ(max2->output_meta()[1].dtype, c10::ScalarType::Long);
  const auto& outs = copy->output_node()->args()[0].list();
  ASSERT_EQ(outs.size(), 4u);
  EXPECT_EQ(*outs[0], (Value{max2, 1}));
  EXPECT_EQ(*outs[1], (Value{split2, 2}));
  EXPECT_EQ(split2->uses(1).size(), 0u);
  // native_dropout's `bool? train` came back as a bool, p as a double.
  Node* drop2 = copy->find_node("native_dropout");
  EXPECT_TRUE(drop2->args()[1].constant().isDouble());
  EXPECT_TRUE(drop2->args()[2].constant().toBool());
}

TEST(IrParser, ListsOptionalsKwargsAndInPlaceOpsRoundTrip) {
  Graph g;
  Value x = g.placeholder("x", meta({2, 4, 3}));
  Value y = g.placeholder("y", meta({2, 4, 3}));
  Value w = g.get_attr("bn.weight", meta({4}));
  Value rm = g.get_attr("bn.running_mean", meta({4}));
  Value rv = g.get_attr("bn.running_var", meta({4}));
  Node* cat = g.call_function(find_op("aten::cat"), {std::vector<std::optional<Value>>{x, y, x}, c10::IValue(int64_t{1})},
                              {meta({2, 12, 3})});
  // batch_norm with a weight but no bias, momentum 0.1, eps 1e-5.
  Node* bn = g.call_function(find_op("aten::batch_norm"),
                             {x, w, c10::IValue(), rm, rv, c10::IValue(false), c10::IValue(0.1), c10::IValue(1e-5),
                              c10::IValue(true)},
                             {meta({2, 4, 3})});
  bn->set_module_path("features.bn");
  Node* ln = g.call_function(find_op("aten::layer_norm"),
                             {bn->output(), c10::IValue(std::vector<int64_t>{3}), c10::IValue(), c10::IValue(),
                              c10::IValue(1e-6)},
                             {meta({2, 4, 3})});
  Node* add = g.call_function(find_op("aten::add.Tensor"), {ln->output(), y, c10::IValue(at::Scalar(0.5))},
                              {meta({2, 4, 3})});
  Node* relu = g.call_function(find_op("aten::relu_"), {add->output()}, {meta({2, 4, 3})});
  Node* zeros = g.call_function(
      find_op("aten::zeros"),
      {c10::IValue(std::vector<int64_t>{2, 3}), c10::IValue(c10::ScalarType::Double), c10::IValue(c10::kStrided),
       c10::IValue(c10::Device(c10::kCPU)), c10::IValue(false)},
      {meta({2, 3}, c10::ScalarType::Double)});
  Node* to = g.call_function(find_op("aten::to.dtype"),
                             {relu->output(), c10::IValue(c10::ScalarType::Half), c10::IValue(false),
                              c10::IValue(false), c10::IValue(c10::MemoryFormat::ChannelsLast)},
                             {meta({2, 4, 3}, c10::ScalarType::Half)});
  Node* sum = g.call_function(find_op("aten::sum.dim_IntList"),
                              {cat->output(), c10::IValue(std::vector<int64_t>{0, 2}), c10::IValue(true)},
                              {meta({1, 12, 1})});
  g.output({relu->output(), zeros->output(), to->output(), sum->output()});

  auto copy = round_trip(g);
  const std::string text = to_text(*copy);
  EXPECT_THAT(text, HasSubstr("(args = ([%x, %y, %x], 1), kwargs = {})"));
  EXPECT_THAT(text, HasSubstr("(args = (%x, %bn_weight, None, %bn_running_mean, %bn_running_var, False, 0.1, 1e-05, "
                              "True), kwargs = {})  # module: features.bn"));
  EXPECT_THAT(text, HasSubstr("(args = (%batch_norm, [3], None, None, 1e-06), kwargs = {})"));
  EXPECT_THAT(text, HasSubstr("kwargs = {alpha: 0.5}"));
  EXPECT_THAT(text, HasSubstr("%relu_ : f32[2, 4, 3]{12, 3, 1} = call_function[target=aten::relu_](args = (%add,)"));
  EXPECT_THAT(text, HasSubstr("kwargs = {dtype: torch.float64, layout: torch.strided, device: device(type='cpu'), "
                              "pin_memory: False}"));
  EXPECT_THAT(text, HasSubstr("(args = (%relu_, torch.float16, False, False, torch.channels_last), kwargs = {})"));

  // Constants came back with the schema's types.
  Node* bn2 = copy->find_node("batch_norm");
  EXPECT_EQ(bn2->module_path(), "features.bn");
  EXPECT_TRUE(bn2->args()[2].is_constant() && bn2->args()[2].constant().isNone());
  EXPECT_DOUBLE_EQ(bn2->args()[7].constant().toDouble(), 1e-5);
  EXPECT_EQ(bn2->args()[6].constant().toDouble(), 0.1);
  Node* cat2 = copy->find_node("cat");
  ASSERT_TRUE(cat2->args()[0].is_list());
  EXPECT_EQ(cat2->args()[0].list().size(), 3u);
  EXPECT_EQ(copy->find_node("x")->uses().size(), 3u);  // cat twice, batch_norm once
  Node* add2 = copy->find_node("add");
  EXPECT_TRUE(add2->args()[2].constant().isDouble());
  Node* zeros2 = copy->find_node("zeros");
  EXPECT_EQ(zeros2->args()[1].constant().toInt(), static_cast<int64_t>(c10::ScalarType::Double));
  EXPECT_TRUE(zeros2->args()[3].constant().isDevice());
  EXPECT_TRUE(copy->find_node("sum")->args()[1].constant().isIntList());
}

TEST(IrParser, OptionalTensorListsRoundTrip) {
  Graph g;
  Value x = g.placeholder("x", meta({4, 5}));
  Value i = g.placeholder("i", meta({2}, c10::ScalarType::Long));
  // x[:, i]: aten::index.Tensor takes a Tensor?[] with None for the untouched dimension.
  Node* index = g.call_function(find_op("aten::index.Tensor"),
                                {x, std::vector<std::optional<Value>>{std::nullopt, i}}, {meta({4, 2})});
  g.output({index->output()});
  auto copy = round_trip(g);
  EXPECT_THAT(to_text(*copy), HasSubstr("(args = (%x, [None, %i]), kwargs = {})"));
  EXPECT_THAT(tabular_string(*copy), HasSubstr("(x, [None, i])"));
  const auto& list = copy->find_node("index")->args()[1].list();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_FALSE(list[0].has_value());
  EXPECT_EQ(list[1]->node, copy->find_node("i"));
  // A plain Tensor[] refuses None.
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %cat : f32[4]{1} = call_function[target=aten::cat](args = ([%x, None],), kwargs = {})\n");
              }),
              HasSubstr("line 3: argument 'tensors' of aten::cat expects tensors like %x in its list, got 'None'"));
}

TEST(IrParser, FloatArgumentsGivenAsIntsBecomeDoubles) {
  auto g = parse_graph(
      "graph():\n"
      "  %x : f32[4]{1} = placeholder[target=x]\n"
      "  %dropout : f32[4]{1} = call_function[target=aten::dropout](args = (%x, 1, False), kwargs = {})\n"
      "  %add : f32[4]{1} = call_function[target=aten::add.Tensor](args = (%x, %dropout), kwargs = {'alpha': 3})\n"
      "  return (%add,)\n");
  EXPECT_TRUE(g->find_node("dropout")->args()[1].constant().isDouble());
  EXPECT_EQ(to_text(*g).find("(%x, 1.0, False)") != std::string::npos, true);
  EXPECT_EQ(g->find_node("add")->args()[2].constant().toInt(), 3);
  lint(*g);
}

TEST(IrParser, MetadataNamesAndModulePathsRoundTrip) {
  Graph g;
  TensorMeta rg = meta({3});
  rg.requires_grad = true;
  TensorMeta cuda = meta({3});
  cuda.device = c10::Device("cuda:0");
  TensorMeta undef;
  undef.defined = false;
  Value x = g.placeholder("x", rg);
  Value x1 = g.placeholder("x", cuda);  // becomes x_1, target x
  Node* a = g.call_function(find_op("aten::add.Tensor"), {x, x1}, {meta({3})});
  Node* b = g.call_function(find_op("aten::add.Tensor"), {a->output(), x}, {meta({3})});
  Node* c = g.call_function(find_op("aten::neg"), {x}, {undef});
  Node* m = g.call_module("encoder.layer", {b->output(), c10::IValue(int64_t{2}), c10::IValue(std::string("a#b"))},
                          {meta({3}), meta({3})});
  m->set_module_path("encoder");
  Node* scalar = g.call_function(find_op("aten::sum"), {m->output(1)}, {meta({})});
  g.output({m->output(0), scalar->output()});
  // Remove `add` (the first) from the name series: the copy must keep `add_1` as it is.
  g.replace_all_uses(a->output(), x);
  g.erase(a);
  g.erase(c);

  auto copy = round_trip(g);
  const std::string text = to_text(*copy);
  EXPECT_THAT(text, HasSubstr("  %x : f32[3]{1} rg = placeholder[target=x]\n"));
  EXPECT_THAT(text, HasSubstr("  %x_1 : f32[3]{1} cuda:0 = placeholder[target=x]\n"));
  EXPECT_THAT(text, HasSubstr("  %add_1 : f32[3]{1} = call_function"));
  EXPECT_THAT(text, HasSubstr("  %encoder_layer : (f32[3]{1}, f32[3]{1}) = call_module[target=encoder.layer]"
                              "(args = (%add_1, 2, 'a#b'), kwargs = {})  # module: encoder\n"));
  EXPECT_THAT(text, HasSubstr("  %sum : f32[]{} = call_function"));
  EXPECT_EQ(copy->find_node("x_1")->target(), "x");
  EXPECT_EQ(copy->find_node("encoder_layer")->module_path(), "encoder");
}

TEST(IrParser, UndefinedMetaRoundTrips) {
  round_trip(
      "graph():\n"
      "  %x : f32[3]{1} = placeholder[target=x]\n"
      "  %native_dropout : (f32[3]{1}, undef) = call_function[target=aten::native_dropout]"
      "(args = (%x, 0.5, False), kwargs = {})\n"
      "  return (%native_dropout.0,)\n");
}

TEST(IrParser, ErrorsNameTheLineAndWhatWasExpected) {
  // A use before its definition.
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %cos : f32[4]{1} = call_function[target=aten::cos](args = (%sin,), kwargs = {})\n"
                    "  %sin : f32[4]{1} = call_function[target=aten::sin](args = (%x,), kwargs = {})\n"
                    "  return (%cos,)\n");
              }),
              HasSubstr("line 3: '%sin' is not defined before its use"));
  // An unknown operator.
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %f : f32[4]{1} = call_function[target=aten::frobnicate](args = (%x,), kwargs = {})\n");
              }),
              ::testing::AllOf(HasSubstr("line 3"), HasSubstr("aten::frobnicate")));
  // A second output node.
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  return (%x,)\n"
                    "  return (%x,)\n");
              }),
              HasSubstr("line 4: expected nothing after the return line"));
  // A constant of the wrong type.
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %max : (f32[]{}, i64[]{}) = call_function[target=aten::max.dim](args = (%x, 0.5), kwargs = {})\n");
              }),
              HasSubstr("line 3: argument 'dim' of aten::max.dim expects int, got '0.5'"));
  // Unknown keyword, missing argument, wrong metadata shape, duplicate names.
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %add : f32[4]{1} = call_function[target=aten::add.Tensor](args = (%x, %x), kwargs = {beta: 2})\n");
              }),
              HasSubstr("line 3: aten::add.Tensor has no argument named 'beta'"));
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %add : f32[4]{1} = call_function[target=aten::add.Tensor](args = (%x,), kwargs = {})\n");
              }),
              HasSubstr("line 3: aten::add.Tensor expects argument 'other', which has no default"));
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %max : f32[4]{1} = call_function[target=aten::max.dim](args = (%x, 0), kwargs = {})\n");
              }),
              HasSubstr("line 3: aten::max.dim has 2 returns, got 1 tensor types"));
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %x : f32[4]{1} = placeholder[target=y]\n");
              }),
              HasSubstr("line 3: node '%x' is defined twice"));
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4{1} = placeholder[target=x]\n");
              }),
              HasSubstr("line 2: expected ']'"));
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %max : (f32[]{}, i64[]{}) = call_function[target=aten::max.dim](args = (%x, 0), kwargs = {})\n"
                    "  return (%max,)\n");
              }),
              HasSubstr("line 4: expected '%max.<i>'"));
  EXPECT_THAT(error_of([] { parse_graph("grap():\n"); }), HasSubstr("line 1: expected 'graph'"));
}

}  // namespace
