// User functions as call_function targets (printing, the text format and its registry), the
// interpreter's overrides, and seed 003's custom backend (examples/custom_ops.h).
#include "support/test_util.h"
#include "ir/ir_test_graphs.h"
#include "examples/custom_ops.h"

#include <torchcompile/compat.h>
#include <torchcompile/ir/callable.h>
#include <torchcompile/ir/graph_module.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_step.h>
#include <torchcompile/ir/parser.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>

#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace torchcompile::ir;
using tc_test::error_of;
using tc_test::meta;
using ::testing::HasSubstr;

namespace {

// Seed 003's forward as a graph: add = x + x; add_1 = add + add.
std::unique_ptr<GraphModule> double_add_module() {
  auto gm = std::make_unique<GraphModule>();
  Graph& g = gm->graph();
  Value x = g.placeholder("x", meta({10, 2}));
  Node* add = g.call_function(find_op("aten::add.Tensor"), {x, x}, {meta({10, 2})});
  Node* add_1 = g.call_function(find_op("aten::add.Tensor"), {add->output(), add->output()}, {meta({10, 2})});
  g.output({add_1->output()});
  return gm;
}

// An add that counts its calls.
CallableFn counted_add(std::shared_ptr<int> calls) {
  return typed_callable([calls](const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha) {
    ++*calls;
    return at::add(a, b, alpha);
  });
}

// Registers `fn` under `name` for the scope (replacing a registration left by an earlier run).
struct ScopedCallable {
  ScopedCallable(std::string n, CallableFn fn) : name(std::move(n)) {
    torchcompile::unregister_callable(name);
    torchcompile::register_callable(name, std::move(fn));
  }
  ~ScopedCallable() { torchcompile::unregister_callable(name); }
  std::string name;
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + what.size())) ++n;
  return n;
}

}  // namespace

TEST(UserFunctions, NodeCallsItsFunctionAndPrintsItsName) {
  auto gm = double_add_module();
  Graph& g = gm->graph();
  Node* add = g.find_node("add");
  auto calls = std::make_shared<int>(0);
  auto x = torch::ones({10, 2});
  EXPECT_TRUE(tc_test::tensors_equal(torch::full({10, 2}, 4.f), gm->forward({x})[0]));  // plan prepared

  g.set_target(add, make_callable("counted_add", counted_add(calls)));
  EXPECT_EQ(add->target(), "counted_add");
  EXPECT_EQ(op_target_name(add->op()), "aten::add.Tensor");  // the schema it takes its arguments from
  EXPECT_TRUE(add->has_side_effects());                      // user code: dead-code elimination keeps it
  lint(g);
  gm->forward({x});
  EXPECT_EQ(*calls, 0);  // the prepared plan does not see the edit...
  gm->recompile();       // ...until it is prepared again
  EXPECT_TRUE(tc_test::tensors_equal(torch::full({10, 2}, 4.f), gm->forward({x})[0]));
  EXPECT_EQ(*calls, 1);

  EXPECT_EQ(tabular_string(g),
            "opcode         name    target           args         kwargs\n"
            "-------------  ------  ---------------  -----------  --------\n"
            "placeholder    x       x                ()           {}\n"
            "call_function  add     counted_add      (x, x)       {}\n"
            "call_function  add_1   aten.add.Tensor  (add, add)   {}\n"
            "output         output  output           ((add_1,),)  {}\n");
  std::ostringstream readable;
  print_readable(g, readable);
  EXPECT_THAT(readable.str(), HasSubstr("    add = counted_add(x, x)  # f32[10, 2]{2, 1}\n"));
  EXPECT_THAT(to_text(g), HasSubstr("  %add : f32[10, 2]{2, 1} = call_function[target=counted_add, "
                                    "op=aten::add.Tensor](args = (%x, %x), kwargs = {})\n"));

  g.reset_target(add);
  EXPECT_EQ(add->target(), "aten::add.Tensor");
  EXPECT_EQ(add->callable(), nullptr);
  gm->recompile();
  gm->forward({x});
  EXPECT_EQ(*calls, 1);
}

TEST(UserFunctions, TextFormatRoundTripsThroughTheRegistry) {
  auto calls = std::make_shared<int>(0);
  ScopedCallable registered("tc_test::counted_add", counted_add(calls));
  auto gm = double_add_module();
  Graph& g = gm->graph();
  g.set_target(g.find_node("add"), "tc_test::counted_add");  // by its registered name
  g.set_target(g.find_node("add_1"), torchcompile::lookup_callable("tc_test::counted_add"));
  const std::string text = to_text(g);
  EXPECT_THAT(text, HasSubstr("call_function[target=tc_test::counted_add, op=aten::add.Tensor]"));

  std::shared_ptr<Graph> parsed = parse_graph(text);
  lint(*parsed);
  EXPECT_EQ(to_text(*parsed), text);
  EXPECT_EQ(tabular_string(*parsed), tabular_string(g));
  EXPECT_EQ(parsed->find_node("add")->callable(), torchcompile::lookup_callable("tc_test::counted_add"));
  GraphModule copy(parsed);
  EXPECT_TRUE(tc_test::tensors_equal(torch::full({10, 2}, 4.f), copy.forward({torch::ones({10, 2})})[0]));
  EXPECT_EQ(*calls, 2);

  // Not registered: a clear refusal naming the line, what was expected and what came.
  torchcompile::unregister_callable("tc_test::counted_add");
  EXPECT_THAT(error_of([&] { parse_graph(text); }),
              HasSubstr("parse_graph: line 3: expected a callable registered with torchcompile::register_callable as "
                        "the target of a call_function node with op=aten::add.Tensor, got 'tc_test::counted_add', "
                        "which is not registered (registered: "));
}

TEST(UserFunctions, ErrorsSayWhatWasExpectedAndWhatCame) {
  auto calls = std::make_shared<int>(0);
  ScopedCallable registered("tc_test::registered_add", counted_add(calls));
  // A user function's name without its operator.
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %add : f32[4]{1} = call_function[target=tc_test::registered_add](args = (%x, %x), kwargs = {})\n");
              }),
              HasSubstr("line 3: expected an operator as the target of a call_function node, got the user function "
                        "'tc_test::registered_add' without its operator (write '[target=tc_test::registered_add, "
                        "op=<operator>]')"));
  EXPECT_THAT(error_of([] { parse_graph("graph():\n  %x : f32[4]{1} = placeholder[target=x, op=aten::cos]\n"); }),
              HasSubstr("line 2: expected ']' after the target (only a call_function node may add ', op=<operator>'), "
                        "got ', op=aten::cos'"));
  EXPECT_THAT(error_of([] {
                parse_graph(
                    "graph():\n"
                    "  %x : f32[4]{1} = placeholder[target=x]\n"
                    "  %add : f32[4]{1} = call_function[target=tc_test::registered_add, op=](args = (%x, %x), kwargs = {})\n");
              }),
              HasSubstr("line 3: expected an operator after 'op=', got nothing"));

  auto gm = double_add_module();
  Graph& g = gm->graph();
  EXPECT_THAT(error_of([&] { g.set_target(g.find_node("add"), "tc_test::unknown"); }),
              HasSubstr("set_target(add): expected the name of a callable registered with "
                        "torchcompile::register_callable, got 'tc_test::unknown' (registered: "));
  EXPECT_THAT(error_of([&] { g.set_target(g.find_node("x"), "tc_test::registered_add"); }),
              HasSubstr("set_target: expected a call_function node, got placeholder node 'x'"));
  EXPECT_THAT(error_of([] { make_callable("2fast", counted_add(nullptr)); }),
              HasSubstr("make_callable: expected a name of letters, digits, '_', '.' and ':' not starting with a "
                        "digit (like 'test_add' or 'mylib::fast_add'), got '2fast'"));
  EXPECT_THAT(error_of([] { make_callable("fast add", counted_add(nullptr)); }), HasSubstr("got 'fast add'"));
  EXPECT_THAT(error_of([] { make_callable("empty", nullptr); }),
              HasSubstr("make_callable('empty'): expected a function, got an empty one"));
  EXPECT_THAT(error_of([&] { torchcompile::register_callable("tc_test::registered_add", counted_add(calls)); }),
              HasSubstr("a callable named 'tc_test::registered_add' is already registered"));

  // At run time: a typed function of the wrong arity, a function returning the wrong count.
  g.set_target(g.find_node("add"), make_callable("two_args", typed_callable([](const at::Tensor& a, const at::Tensor& b) {
                                                   return a + b;
                                                 })));
  EXPECT_THAT(error_of([&] { Interpreter(*gm).run({torch::ones({10, 2})}); }),
              HasSubstr("typed callable: takes 2 arguments, the node passes 3 (the operator's arguments in schema "
                        "order, defaults included)"));
  g.set_target(g.find_node("add"), make_callable("two_results", [](const std::vector<c10::IValue>& args) {
                 return std::vector<at::Tensor>{args[0].toTensor(), args[1].toTensor()};
               }));
  EXPECT_THAT(error_of([&] { Interpreter(*gm).run({torch::ones({10, 2})}); }),
              HasSubstr("node 'add' (two_results) returned 2 tensors; the graph expects 1 (one per output of "
                        "aten::add.Tensor)"));
  // An OpStep (what backends use for the operators they leave to ATen) would call the operator.
  EXPECT_THAT(error_of([&] { OpStep(*g.find_node("add"), [](const Value&) { return uint32_t{0}; }, {1}); }),
              HasSubstr("OpStep: node 'add' calls the user function 'two_results' in place of aten::add.Tensor; "
                        "expected a node calling its operator (user functions run with ir::Interpreter)"));
}

TEST(UserFunctions, SplitModuleKeepsThem) {
  auto calls = std::make_shared<int>(0);
  auto gm = double_add_module();
  Graph& g = gm->graph();
  g.set_target(g.find_node("add_1"), make_callable("counted_add", counted_add(calls)));
  SplitGraph split = split_module(*gm, {{g.find_node("add"), g.find_node("add_1")}});
  ASSERT_EQ(split.parts.size(), 1u);
  EXPECT_EQ(split.parts[0].module->graph().find_node("add_1")->target(), "counted_add");
  EXPECT_TRUE(tc_test::tensors_equal(torch::full({10, 2}, 4.f), split.parent->forward({torch::ones({10, 2})})[0]));
  EXPECT_EQ(*calls, 1);
}

namespace {

// x, y -> sin -> exp -> add(., y) -> relu -> neg -> mul(., 0.9)
std::unique_ptr<GraphModule> chain_module() {
  auto gm = std::make_unique<GraphModule>();
  Graph& g = gm->graph();
  Value x = g.placeholder("x", meta({4, 3}));
  Value y = g.placeholder("y", meta({4, 3}));
  Value v = g.call_function(find_op("aten::sin"), {x}, {meta({4, 3})})->output();
  v = g.call_function(find_op("aten::exp"), {v}, {meta({4, 3})})->output();
  v = g.call_function(find_op("aten::add.Tensor"), {v, y}, {meta({4, 3})})->output();
  v = g.call_function(find_op("aten::relu"), {v}, {meta({4, 3})})->output();
  v = g.call_function(find_op("aten::neg"), {v}, {meta({4, 3})})->output();
  v = g.call_function(find_op("aten::mul.Scalar"), {v, c10::IValue(0.9)}, {meta({4, 3})})->output();
  g.output({v});
  return gm;
}

at::Tensor chain_eager(const at::Tensor& x, const at::Tensor& y) { return (x.sin().exp() + y).relu().neg() * 0.9; }

// CPU tensor allocations made by `f`.
int allocations_of(const std::function<void()>& f) {
  static torchcompile::compat::CountingAllocator counting(c10::GetCPUAllocator());
  static uint8_t priority = 100;  // each SetCPUAllocator needs a priority at least the last one's
  c10::SetCPUAllocator(&counting, ++priority);
  counting.reset();
  f();
  const int n = counting.count();
  c10::SetCPUAllocator(counting.base(), ++priority);
  return n;
}

}  // namespace

// Overriding one operator makes that node's step call the function; every other node keeps its
// prepared step with the plan's shortcuts: in-place reuse of dying intermediates and the
// prepared scalar operand (one allocation for the whole plain chain), dispatch below autograd.
TEST(InterpreterOverride, OneOperatorOverriddenTheOthersKeepTheirPreparedSteps) {
  torch::NoGradGuard no_grad;
  auto gm = chain_module();
  auto x = torch::randn({4, 3}), y = torch::randn({4, 3});
  const at::Tensor expected = chain_eager(x, y);

  Interpreter plain(*gm);
  EXPECT_EQ(plain.describe(),
            "sin = aten::sin\n"
            "exp = aten::exp  (in place)\n"
            "add = aten::add.Tensor  (in place)\n"
            "relu = aten::relu  (in place)\n"
            "neg = aten::neg  (in place)\n"
            "mul = aten::mul.Scalar  (in place)  (scalar operand prepared)\n");
  plain.run({x, y});  // warm up (the scratch stack)
  at::Tensor out;
  EXPECT_EQ(allocations_of([&] { out = plain.run({x, y})[0]; }), 1);  // sin's result, reused by the rest
  EXPECT_TRUE(tc_test::tensors_equal(expected, out));

  Interpreter interp(*gm);
  int calls = 0;
  bool args_as_traced = false;
  EXPECT_EQ(interp.override("aten::add.Tensor",
                            [&](const std::vector<c10::IValue>& args) {
                              ++calls;
                              args_as_traced = args.size() == 3 && args[1].toTensor().is_same(y) &&
                                               args[2].toScalar().toLong() == 1;
                              return std::vector<at::Tensor>{at::add(args[0].toTensor(), args[1].toTensor())};
                            }),
            1u);
  EXPECT_EQ(interp.describe(),
            "sin = aten::sin\n"
            "exp = aten::exp  (in place)\n"
            "add = aten::add.Tensor  (override)\n"
            "relu = aten::relu\n"  // reads the function's result, which may be anything
            "neg = aten::neg  (in place)\n"
            "mul = aten::mul.Scalar  (in place)  (scalar operand prepared)\n");
  interp.run({x, y});
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(args_as_traced);
  // sin, the override's add, relu: exp, neg and mul still run in place, mul's scalar prepared.
  EXPECT_EQ(allocations_of([&] { out = interp.run({x, y})[0]; }), 3);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(tc_test::tensors_equal(expected, out));
  EXPECT_GE(allocations_of([&] { chain_eager(x, y); }), 6);  // eager: one per operator

  // With grad mode on (the autograd keys in use, no in-place reuse) the results are eager's too.
  torch::AutoGradMode grad(true);
  auto xg = x.clone().requires_grad_(), yg = y.clone();
  at::Tensor got = interp.run({xg, yg})[0];
  EXPECT_TRUE(tc_test::tensors_equal(chain_eager(x, y), got.detach()));
  got.sum().backward();
  auto xe = x.clone().requires_grad_();
  chain_eager(xe, y).sum().backward();
  EXPECT_TRUE(tc_test::tensors_close(xe.grad(), xg.grad()));
}

TEST(InterpreterOverride, NodeHooksSeeTheNodeAndCanRunItsTarget) {
  torch::NoGradGuard no_grad;
  auto gm = chain_module();
  auto x = torch::randn({4, 3}), y = torch::randn({4, 3});
  Interpreter interp(*gm);
  std::vector<std::string> seen;
  // FX's run_node: every call_function node, logged, then run as it would have run.
  EXPECT_EQ(interp.override_if([](const Node&) { return true; },
                               [&](const Node& n, const std::vector<c10::IValue>& args) {
                                 seen.push_back(n.name());
                                 return run_target(n, args);
                               }),
            6u);
  EXPECT_TRUE(tc_test::tensors_equal(chain_eager(x, y), interp.run({x, y})[0]));
  EXPECT_EQ(seen, (std::vector<std::string>{"sin", "exp", "add", "relu", "neg", "mul"}));

  // A later override wins; a target without nodes changes nothing.
  EXPECT_EQ(interp.override("aten::neg", [](const std::vector<c10::IValue>& args) {
              return std::vector<at::Tensor>{args[0].toTensor().clone()};  // neg left out
            }),
            1u);
  seen.clear();
  EXPECT_TRUE(tc_test::tensors_equal(-chain_eager(x, y), interp.run({x, y})[0]));
  EXPECT_EQ(seen, (std::vector<std::string>{"sin", "exp", "add", "relu", "mul"}));
  Interpreter plain(*gm);
  const std::string before = plain.describe();
  EXPECT_EQ(plain.override("aten::cos", [](const std::vector<c10::IValue>&) { return std::vector<at::Tensor>{}; }), 0u);
  EXPECT_EQ(plain.describe(), before);

  // A node's own user function is overridden by its name; run_target calls that function.
  auto calls = std::make_shared<int>(0);
  gm->graph().set_target(gm->graph().find_node("add"), make_callable("counted_add", counted_add(calls)));
  Interpreter with_function(*gm);
  EXPECT_THAT(with_function.describe(), HasSubstr("add = counted_add  (user function)\n"));
  int overridden = 0;
  EXPECT_EQ(with_function.override("counted_add",
                                   [&](const std::vector<c10::IValue>& args) {
                                     ++overridden;
                                     return run_target(*gm->graph().find_node("add"), args);
                                   }),
            1u);
  EXPECT_TRUE(tc_test::tensors_equal(chain_eager(x, y), with_function.run({x, y})[0]));
  EXPECT_EQ(overridden, 1);
  EXPECT_EQ(*calls, 1);
}

// Seed 003: aot_autograd with addmm decomposed and a forward compiler that swaps every
// aten::add.Tensor node for test_add ("call test add"), or overrides the operator in its own
// interpreter. The first call traces (eager's result, no call of test_add); each later call
// prints "call test add" exactly twice and returns eager's result.
TEST(Seed003, CustomBackendPrintsCallTestAddTwicePerCall) {
  for (bool graph_edit : {true, false}) {
    SCOPED_TRACE(graph_edit ? "set_target" : "Interpreter::override");
    custom_ops::SimpleNN model(2);
    auto model_opt = torch::compile(
        model, custom_ops::seed_backend(graph_edit ? custom_ops::compiler_demo_inner : custom_ops::override_compiler));
    auto inputs = torch::ones({10, 2});
    const at::Tensor expected = model->forward(inputs);
    EXPECT_TRUE(tc_test::tensors_equal(torch::full({10, 2}, 4.f), expected));
    for (int call = 1; call <= 4; ++call) {
      ::testing::internal::CaptureStdout();
      at::Tensor out = model_opt(inputs);
      const std::string printed = ::testing::internal::GetCapturedStdout();
      EXPECT_EQ(count_of(printed, "call test add"), call == 1 ? 0u : 2u) << "call " << call << ":\n" << printed;
      EXPECT_TRUE(tc_test::tensors_equal(expected, out)) << "call " << call;
      if (call == 1 && graph_edit) {  // the compiler printed the forward graph before and after the swap
        EXPECT_EQ(count_of(printed, "aten.add.Tensor"), 2u) << printed;
        EXPECT_EQ(count_of(printed, "call_function  add"), 4u) << printed;
        EXPECT_EQ(count_of(printed, "test_add"), 2u) << printed;
      }
    }
  }
}
