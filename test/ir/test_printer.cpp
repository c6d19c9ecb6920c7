// The printers: FX's tabular view (golden text), the code-like listing, the round-trip text
// format, and Python-like constants.
#include <torchcompile/ir/printer.h>

#include "ir/ir_test_graphs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <sstream>

namespace {

using namespace torchcompile::ir;
using tc_test::meta;
using ::testing::HasSubstr;

// Seed 000's table for fn(x, y) = cos(x) + sin(y), with ATen targets as AOT graphs print them.
TEST(IrPrinter, TabularMatchesFxLayoutForSeedGraph) {
  auto g = tc_test::seed_graph();
  const std::string expected = tc_test::kSeedTable;
  EXPECT_EQ(tabular_string(*g), expected);
  std::ostringstream os;
  print_tabular(*g, os);
  EXPECT_EQ(os.str(), expected);
}

// A graph with constants, keyword arguments, a multi-output node, a TensorList and get_attr.
std::unique_ptr<Graph> rich_graph() {
  auto g = std::make_unique<Graph>();
  Value x = g->placeholder("x", meta({6, 4}));
  Value w = g->get_attr("layer1.weight", meta({6, 1}));
  Node* max = g->call_function(find_op("aten::max.dim"), {x, c10::IValue(int64_t{1}), c10::IValue(true)},
                               {meta({6, 1}), meta({6, 1}, c10::ScalarType::Long)});
  Node* add = g->call_function(find_op("aten::add.Tensor"), {max->output(0), w, c10::IValue(2)}, {meta({6, 1})});
  Node* zeros = g->call_function(
      find_op("aten::zeros"),
      {c10::IValue(std::vector<int64_t>{2, 3}), c10::IValue(c10::ScalarType::Double), c10::IValue(),
       c10::IValue(c10::Device(c10::kCPU))},
      {meta({2, 3}, c10::ScalarType::Double)});
  Node* cat = g->call_function(find_op("aten::cat"), {std::vector<std::optional<Value>>{x, x}}, {meta({12, 4})});
  Node* ln = g->call_function(find_op("aten::layer_norm"),
                              {x, c10::IValue(std::vector<int64_t>{4}), c10::IValue(), c10::IValue(), c10::IValue(0.1)},
                              {meta({6, 4})});
  ln->set_module_path("encoder.norm");
  g->output({add->output(), max->output(1), zeros->output(), cat->output(), ln->output()});
  return g;
}

TEST(IrPrinter, TabularShowsConstantsKwargsAndMultiOutputs) {
  auto g = rich_graph();
  // Positional arguments up to the last non-default one, keyword-only ones that differ from
  // their defaults, `.i` for outputs of multi-output nodes, `[...]` for TensorList arguments.
  const std::string expected =
      "opcode         name           target                   args                                     kwargs\n"
      "-------------  -------------  -----------------------  ---------------------------------------  "
      "------------------------------------------------------\n"
      "placeholder    x              x                        ()                                       {}\n"
      "get_attr       layer1_weight  layer1.weight            ()                                       {}\n"
      "call_function  max            aten.max.dim             (x, 1, True)                             {}\n"
      "call_function  add            aten.add.Tensor          (max.0, layer1_weight)                   {'alpha': 2}\n"
      "call_function  zeros          aten.zeros.default       ([2, 3],)                                "
      "{'dtype': torch.float64, 'device': device(type='cpu')}\n"
      "call_function  cat            aten.cat.default         ([x, x],)                                {}\n"
      "call_function  layer_norm     aten.layer_norm.default  (x, [4], None, None, 0.1)                {}\n"
      "output         output         output                   ((add, max.1, zeros, cat, layer_norm),)  {}\n";
  EXPECT_EQ(tabular_string(*g), expected);
}

TEST(IrPrinter, ConstantRepr) {
  EXPECT_EQ(constant_repr(c10::IValue()), "None");
  EXPECT_EQ(constant_repr(true), "True");
  EXPECT_EQ(constant_repr(false), "False");
  EXPECT_EQ(constant_repr(int64_t{-3}), "-3");
  EXPECT_EQ(constant_repr(2.0), "2.0");
  EXPECT_EQ(constant_repr(0.1), "0.1");
  EXPECT_EQ(constant_repr(1e-5), "1e-05");
  EXPECT_EQ(constant_repr(1.0000000000000002), "1.0000000000000002");
  EXPECT_EQ(constant_repr(-0.0), "-0.0");
  EXPECT_EQ(constant_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(constant_repr(1e300), "1e+300");
  EXPECT_EQ(constant_repr(c10::IValue(at::Scalar(2.5))), "2.5");
  EXPECT_EQ(constant_repr(c10::IValue(at::Scalar(int64_t{7}))), "7");
  EXPECT_EQ(constant_repr(std::string("it's")), "'it\\'s'");
  EXPECT_EQ(constant_repr(std::vector<int64_t>{2, 3}), "[2, 3]");
  EXPECT_EQ(constant_repr(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(constant_repr(c10::List<double>({0.5, 1.0})), "[0.5, 1.0]");
  EXPECT_EQ(constant_repr(c10::List<bool>({true, false})), "[True, False]");
  EXPECT_EQ(constant_repr(c10::Device("cpu")), "device(type='cpu')");
  EXPECT_EQ(constant_repr(c10::Device("cuda:1")), "device(type='cuda', index=1)");
  EXPECT_EQ(constant_repr(c10::ivalue::Tuple::create({c10::IValue(int64_t{1})})), "(1,)");
  EXPECT_EQ(constant_repr(c10::ivalue::Tuple::create({c10::IValue(int64_t{1}), c10::IValue(2.0)})), "(1, 2.0)");
  EXPECT_EQ(constant_repr(c10::complex<double>(1, -2)), "complex(1.0, -2.0)");
}

TEST(IrPrinter, TextFormatGolden) {
  auto g = tc_test::seed_graph();
  g->find_node("add")->set_module_path("encoder.layers.0");
  const std::string expected =
      "graph():\n"
      "  %x : f32[10]{1} = placeholder[target=x]\n"
      "  %y : f32[10]{1} = placeholder[target=y]\n"
      "  %cos : f32[10]{1} = call_function[target=aten::cos](args = (%x,), kwargs = {})\n"
      "  %sin : f32[10]{1} = call_function[target=aten::sin](args = (%y,), kwargs = {})\n"
      "  %add : f32[10]{1} = call_function[target=aten::add.Tensor](args = (%cos, %sin), kwargs = {})"
      "  # module: encoder.layers.0\n"
      "  return (%add,)\n";
  EXPECT_EQ(to_text(*g), expected);
  std::ostringstream os;
  os << *g;
  EXPECT_EQ(os.str(), expected);
}

TEST(IrPrinter, TextFormatShowsMultiOutputsListsAndKwargs) {
  auto g = rich_graph();
  const std::string expected =
      "graph():\n"
      "  %x : f32[6, 4]{4, 1} = placeholder[target=x]\n"
      "  %layer1_weight : f32[6, 1]{1, 1} = get_attr[target=layer1.weight]\n"
      "  %max : (f32[6, 1]{1, 1}, i64[6, 1]{1, 1}) = call_function[target=aten::max.dim]"
      "(args = (%x, 1, True), kwargs = {})\n"
      "  %add : f32[6, 1]{1, 1} = call_function[target=aten::add.Tensor]"
      "(args = (%max.0, %layer1_weight), kwargs = {alpha: 2})\n"
      "  %zeros : f64[2, 3]{3, 1} = call_function[target=aten::zeros]"
      "(args = ([2, 3],), kwargs = {dtype: torch.float64, device: device(type='cpu')})\n"
      "  %cat : f32[12, 4]{4, 1} = call_function[target=aten::cat](args = ([%x, %x],), kwargs = {})\n"
      "  %layer_norm : f32[6, 4]{4, 1} = call_function[target=aten::layer_norm]"
      "(args = (%x, [4], None, None, 0.1), kwargs = {})  # module: encoder.norm\n"
      "  return (%add, %max.1, %zeros, %cat, %layer_norm)\n";
  EXPECT_EQ(to_text(*g), expected);
}

TEST(IrPrinter, ListReturnsPrintAsBrackets) {
  Graph g;
  Value x = g.placeholder("x", meta({6}));
  Node* split = g.call_function(find_op("aten::split.Tensor"), {x, c10::IValue(int64_t{4})}, {meta({4}), meta({2})},
                                {2});
  g.output({split->output(1)});
  EXPECT_THAT(to_text(g), HasSubstr("%split : [f32[4]{1}, f32[2]{1}] = call_function[target=aten::split.Tensor]"
                                    "(args = (%x, 4), kwargs = {})\n"));
  EXPECT_THAT(to_text(g), HasSubstr("return (%split.1,)"));
}

TEST(IrPrinter, Readable) {
  auto g = rich_graph();
  std::ostringstream os;
  print_readable(*g, os);
  const std::string text = os.str();
  EXPECT_THAT(text, HasSubstr("def forward(self, x: f32[6, 4]{4, 1}):\n"));
  EXPECT_THAT(text, HasSubstr("    layer1_weight = self.layer1.weight  # f32[6, 1]{1, 1}\n"));
  EXPECT_THAT(text, HasSubstr("    add = aten::add.Tensor(max.0, layer1_weight, alpha=2)  # f32[6, 1]{1, 1}\n"));
  EXPECT_THAT(text, HasSubstr("    layer_norm = aten::layer_norm(x, [4], None, None, 0.1)  # f32[6, 4]{4, 1}  "
                              "module: encoder.norm\n"));
  EXPECT_THAT(text, HasSubstr("    return (add, max.1, zeros, cat, layer_norm)\n"));
}

}  // namespace
