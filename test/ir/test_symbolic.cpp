// ir::SymExpr: canonical form, printing as Python does, parsing back, evaluation. The randomized
// test builds expressions from random operations and compares each with the same operations on
// integers, at random symbol values. Then graphs with size symbols: declared as graph inputs,
// printed as seed 003 prints `placeholder s0`, symbolic metadata (`f32[s0, 784]`), the text
// format's round trip, lint's checks, and the interpreter running a parsed graph at any size.
#include <torchcompile/ir/symbolic.h>

#include <torchcompile/ir/graph_module.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/parser.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>

using torchcompile::ir::SymExpr;

namespace {

const SymExpr s0 = SymExpr::symbol("s0"), s1 = SymExpr::symbol("s1"), s2 = SymExpr::symbol("s2");

int64_t py_floordiv(int64_t n, int64_t d) {
  int64_t q = n / d;
  if (n % d != 0 && ((n < 0) != (d < 0))) --q;
  return q;
}

TEST(SymExpr, PrintsAsPythonDoes) {
  EXPECT_EQ(SymExpr().str(), "0");
  EXPECT_EQ(SymExpr(784).str(), "784");
  EXPECT_EQ(SymExpr(-3).str(), "-3");
  EXPECT_EQ(s0.str(), "s0");
  EXPECT_EQ((s0 * 64).str(), "64*s0");
  EXPECT_EQ((s0 + 1).str(), "s0 + 1");
  EXPECT_EQ((SymExpr(3) - s0).str(), "-s0 + 3");
  EXPECT_EQ((s1 * s0).str(), "s0*s1");
  EXPECT_EQ(((s0 + 1) * (s0 + 1)).str(), "s0*s0 + 2*s0 + 1");
  EXPECT_EQ(floordiv(s0, 2).str(), "s0//2");
  EXPECT_EQ(floordiv(s0 + 1, 2).str(), "(s0 + 1)//2");
  EXPECT_EQ((s1 * floordiv(s0, 2)).str(), "s1*(s0//2)");
  EXPECT_EQ((floordiv(s0, 2) * 2).str(), "2*(s0//2)");
}

TEST(SymExpr, CanonicalFormMakesEqualExpressionsEqual) {
  EXPECT_EQ(s0 + s1, s1 + s0);
  EXPECT_EQ(s0 * s1 * 2, (s1 + s1) * s0);
  EXPECT_EQ(s0 - s0, SymExpr(0));
  EXPECT_TRUE((s0 - s0).is_constant());
  EXPECT_EQ(floordiv(s0 * 4, 2), s0 * 2);                // exact
  EXPECT_EQ(floordiv(s0 * 4 + 3, 2), s0 * 2 + 1);        // (4 s0 + 3) // 2 = 2 s0 + 3 // 2
  EXPECT_EQ(floordiv(SymExpr(-7), 2), SymExpr(-4));      // Python's floor
  EXPECT_EQ(floordiv(s0, 1), s0);
  EXPECT_NE(floordiv(s0, 2) * 2, s0);
  EXPECT_EQ(s0.as_symbol(), "s0");
  EXPECT_FALSE((s0 * 2).as_symbol().has_value());
  EXPECT_EQ((s1 * floordiv(s2 + s0, 3)).symbols(), (std::vector<std::string>{"s0", "s1", "s2"}));
}

TEST(SymExpr, ParseErrorsSayWhere) {
  EXPECT_THROW(SymExpr::parse("s0 +"), c10::Error);
  EXPECT_THROW(SymExpr::parse("s0 // s1"), c10::Error);  // divisors are constants
  EXPECT_THROW(SymExpr::parse("s0 // 0"), c10::Error);
  EXPECT_THROW(SymExpr::parse("(s0 + 1"), c10::Error);
  EXPECT_THROW(SymExpr::parse("s0 / 2"), c10::Error);
  try {
    SymExpr::parse("s0 + $");
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(SymExpr::parse(" ( s0*2 ) // 4 "), floordiv(s0 * 2, 4));
}

// A random expression and, beside it, a function computing the same on integers.
struct Built {
  SymExpr e;
  std::function<int64_t(const std::map<std::string, int64_t>&)> f;
};

Built random_expr(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  if (depth == 0 || pick(4) == 0) {
    if (pick(2) == 0) {
      const int64_t c = pick(19) - 6;
      return {SymExpr(c), [c](const auto&) { return c; }};
    }
    const std::string name = "s" + std::to_string(pick(3));
    return {SymExpr::symbol(name), [name](const auto& v) { return v.at(name); }};
  }
  Built a = random_expr(rng, depth - 1);
  switch (pick(4)) {
    case 0: {
      Built b = random_expr(rng, depth - 1);
      return {a.e + b.e, [a, b](const auto& v) { return a.f(v) + b.f(v); }};
    }
    case 1: {
      Built b = random_expr(rng, depth - 1);
      return {a.e - b.e, [a, b](const auto& v) { return a.f(v) - b.f(v); }};
    }
    case 2: {
      Built b = random_expr(rng, depth - 1);
      return {a.e * b.e, [a, b](const auto& v) { return a.f(v) * b.f(v); }};
    }
    default: {
      const int64_t d = 1 + pick(5);
      return {floordiv(a.e, d), [a, d](const auto& v) { return py_floordiv(a.f(v), d); }};
    }
  }
}

TEST(SymExpr, RandomExpressionsEvaluateAndRoundTrip) {
  std::mt19937 rng(38);
  for (int k = 0; k < 3000; ++k) {
    const Built b = random_expr(rng, 4);
    const std::string text = b.e.str();
    SCOPED_TRACE(text);
    const SymExpr back = SymExpr::parse(text);
    EXPECT_EQ(back.str(), text);
    EXPECT_EQ(back, b.e);
    for (int t = 0; t < 4; ++t) {
      std::map<std::string, int64_t> v;
      for (const char* name : {"s0", "s1", "s2"}) v[name] = std::uniform_int_distribution<int64_t>(-9, 40)(rng);
      EXPECT_EQ(b.e.evaluate(v), b.f(v));
      EXPECT_EQ(back.evaluate(v), b.f(v));
    }
  }
}

// The graph of seed 003's SimpleNN's first layer at a symbolic batch size: x [s0, 4] -> linear
// -> relu -> view as [s0 * 8] -> chunk-like narrow of the first s0//2*8 values.
std::unique_ptr<torchcompile::ir::Graph> symbolic_graph() {
  using namespace torchcompile::ir;
  auto g = std::make_unique<Graph>();
  g->add_symbol(SizeSymbolDecl{"s0", 6, 2, std::numeric_limits<int64_t>::max()});
  auto meta = [](std::vector<SymExpr> sizes, std::vector<SymExpr> strides) {
    TensorMeta m;
    m.sym_sizes = std::move(sizes);
    m.sym_strides = std::move(strides);
    const auto examples = std::map<std::string, int64_t>{{"s0", 6}};
    for (const SymExpr& e : m.sym_sizes) m.sizes.push_back(e.evaluate(examples));
    for (const SymExpr& e : m.sym_strides) m.strides.push_back(e.evaluate(examples));
    return m;
  };
  Value x = g->placeholder("x", meta({s0, 4}, {4, 1}));
  TensorMeta w;
  w.sizes = {8, 4};
  w.strides = {4, 1};
  Value weight = g->get_attr("fc1.weight", w);
  Node* lin = g->call_function(find_op("aten::linear"), {x, weight, c10::IValue()}, {meta({s0, 8}, {8, 1})});
  Node* relu = g->call_function(find_op("aten::relu"), {lin->output()}, {meta({s0, 8}, {8, 1})});
  Node* flat = g->call_function(find_op("aten::view"), {relu->output(), c10::IValue(std::vector<int64_t>{-1})},
                                {meta({s0 * 8}, {1})});
  g->output({flat->output()});
  return g;
}

TEST(SymbolicGraph, PrintsSymbolsAsPlaceholdersAndSymbolicMetadata) {
  auto g = symbolic_graph();
  torchcompile::ir::lint(*g);
  const std::string tab = torchcompile::ir::tabular_string(*g);
  // The first row after the header and the rule is the symbol, as seed 003 prints it:
  // `placeholder    s0    s0    ()    {}`.
  std::istringstream rows(tab);
  std::string line;
  for (int i = 0; i < 3; ++i) std::getline(rows, line);
  std::istringstream cells(line);
  std::vector<std::string> fields{std::istream_iterator<std::string>(cells), std::istream_iterator<std::string>()};
  EXPECT_EQ(fields, (std::vector<std::string>{"placeholder", "s0", "s0", "()", "{}"})) << tab;
  const std::string text = torchcompile::ir::to_text(*g);
  EXPECT_NE(text.find("%s0 : Sym(6, [2, inf]) = placeholder[target=s0]"), std::string::npos) << text;
  EXPECT_NE(text.find("%x : f32[s0, 4]{4, 1} = placeholder[target=x]"), std::string::npos) << text;
  EXPECT_NE(text.find("f32[8*s0]{1}"), std::string::npos) << text;
  std::ostringstream readable;
  torchcompile::ir::print_readable(*g, readable);
  EXPECT_NE(readable.str().find("def forward(self, s0: Sym, x: f32[s0, 4]{4, 1})"), std::string::npos)
      << readable.str();
}

TEST(SymbolicGraph, TextFormatRoundTripsAndTheParsedGraphRunsAtAnySize) {
  const std::string text = torchcompile::ir::to_text(*symbolic_graph());
  std::shared_ptr<torchcompile::ir::Graph> parsed = torchcompile::ir::parse_graph(text);
  torchcompile::ir::lint(*parsed);
  EXPECT_EQ(torchcompile::ir::to_text(*parsed), text);
  ASSERT_EQ(parsed->symbols().size(), 1u);
  EXPECT_EQ(parsed->placeholders().at(0)->output_meta().at(0).sizes, (std::vector<int64_t>{6, 4}));
  torchcompile::ir::GraphModule gm(parsed);
  const at::Tensor weight = at::randn({8, 4});
  gm.set_attribute("fc1.weight", weight, torchcompile::ir::AttributeKind::Parameter);
  torchcompile::ir::Interpreter interp(gm);
  for (int64_t batch : {2, 6, 11}) {
    const at::Tensor x = at::randn({batch, 4});
    const std::vector<at::Tensor> out = interp.run({x});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(at::equal(out[0], at::relu(at::linear(x, weight)).view({-1}))) << "batch " << batch;
  }
}

TEST(SymbolicGraph, LintFindsUndeclaredUnboundAndInconsistentSymbols) {
  using namespace torchcompile::ir;
  auto expect_lint_error = [](const Graph& g, const std::string& what) {
    try {
      lint(g);
      ADD_FAILURE() << "expected a lint error mentioning '" << what << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  {
    Graph g;  // s1 is used but not declared
    TensorMeta m;
    m.sizes = {3};
    m.strides = {1};
    m.sym_sizes = {s1};
    m.sym_strides = {SymExpr(1)};
    g.output({g.placeholder("x", m)});
    expect_lint_error(g, "s1, which is not declared");
  }
  {
    Graph g;  // s0 is declared but no placeholder dimension is s0
    g.add_symbol(SizeSymbolDecl{"s0", 3, 2, 10});
    TensorMeta m;
    m.sizes = {6};
    m.strides = {1};
    m.sym_sizes = {s0 * 2};
    m.sym_strides = {SymExpr(1)};
    g.output({g.placeholder("x", m)});
    expect_lint_error(g, "s0 is not bound");
  }
  {
    Graph g;  // the example size disagrees with the expression
    g.add_symbol(SizeSymbolDecl{"s0", 3, 2, 10});
    TensorMeta m;
    m.sizes = {4};
    m.strides = {1};
    m.sym_sizes = {s0};
    m.sym_strides = {SymExpr(1)};
    g.output({g.placeholder("x", m)});
    expect_lint_error(g, "example run had 4");
  }
  EXPECT_THROW(parse_graph("graph():\n  %x : f32[s0]{1} = placeholder[target=x]\n  return (%x,)\n"), c10::Error);
}

}  // namespace

namespace {

// x: f32[s0, s1, 6] -> view(x, [s0*s1, -1]) + arange(s1) broadcast: integers that are size
// expressions (`[%(s0*s1), -1]`, `%s1`).
std::unique_ptr<torchcompile::ir::Graph> graph_with_size_expressions() {
  using namespace torchcompile::ir;
  const std::string text = R"(graph():
  %s0 : Sym(2, [2, inf]) = placeholder[target=s0]
  %s1 : Sym(3, [2, inf]) = placeholder[target=s1]
  %x : f32[s0, s1, 6]{6*s1, 6, 1} = placeholder[target=x]
  %view : f32[s0*s1, 6]{6, 1} = call_function[target=aten::view](args = (%x, [%(s0*s1), -1]), kwargs = {})
  %arange : f32[s1]{1} = call_function[target=aten::arange](args = (%s1,), kwargs = {dtype: torch.float32})
  %repeat : f32[s0*s1]{1} = call_function[target=aten::repeat](args = (%arange, [%s0]), kwargs = {})
  %unsqueeze : f32[s0*s1, 1]{1, 1} = call_function[target=aten::unsqueeze](args = (%repeat, 1), kwargs = {})
  %add : f32[s0*s1, 6]{6, 1} = call_function[target=aten::add.Tensor](args = (%view, %unsqueeze), kwargs = {})
  return (%add,)
)";
  return parse_graph(text);
}

}  // namespace

// Size expressions as arguments: parsed from `%s1` / `%(s0*s1)`, printed back the same, with the
// example values as constants; the interpreter evaluates them at each call's sizes; a static copy
// at other values (clear_symbols) has them as constants; lint checks their symbols.
TEST(SymbolicGraph, SizeExpressionArgumentsRoundTripAndRunAtAnySize) {
  using namespace torchcompile::ir;
  std::shared_ptr<Graph> g = graph_with_size_expressions();
  lint(*g);
  const std::string text = to_text(*g);
  EXPECT_EQ(to_text(*parse_graph(text)), text);
  EXPECT_NE(text.find("[%(s0*s1), -1]"), std::string::npos) << text;
  const Node* view = g->find_node("view");
  ASSERT_TRUE(view->args()[1].is_size_expression());
  EXPECT_EQ(view->args()[1].constant().toIntVector(), (std::vector<int64_t>{6, -1}));  // at s0=2, s1=3
  EXPECT_NE(tabular_string(*g).find("[s0*s1, -1]"), std::string::npos) << tabular_string(*g);
  EXPECT_TRUE(g->has_size_expressions());
  GraphModule gm(g);
  Interpreter interp(gm);
  auto expected = [](const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1);
    return x.view({b * t, -1}) + at::arange(t, at::kFloat).repeat({b}).unsqueeze(1);
  };
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {5, 4}, {3, 9}}) {
    const at::Tensor x = at::randn({b, t, 6});
    EXPECT_TRUE(at::equal(interp.run({x}).at(0), expected(x))) << b << "x" << t;
  }
  // A static copy at s0=5, s1=4: constants, no symbols; it runs at those sizes only.
  auto copy = parse_graph(text);
  copy->clear_symbols({{"s0", 5}, {"s1", 4}});
  EXPECT_FALSE(copy->has_size_expressions());
  EXPECT_EQ(copy->find_node("view")->args()[1].constant().toIntVector(), (std::vector<int64_t>{20, -1}));
  // Lint: an expression's example value must be the argument's.
  Node* v = g->find_node("view");
  v->set_arg(1, Argument::size_expression({SymExpr::symbol("s0") * SymExpr::symbol("s1"), SymExpr(-1)},
                                          c10::IValue(std::vector<int64_t>{7, -1})));
  try {
    lint(*g);
    ADD_FAILURE() << "expected a lint error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the argument's example value is 7"), std::string::npos) << e.what();
  }
}
