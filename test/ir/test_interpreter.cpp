// The interpreter runs hand-built graphs through the dispatcher.
#include "support/test_util.h"
#include "ir/ir_test_graphs.h"

#include <torchcompile/ir/graph_module.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_step.h>

#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/forward_grad.h>

#include <cstring>
#include <random>
#include <thread>

using namespace torchcompile::ir;

namespace {

TEST(Interpreter, RunsConstantsListsAndMultiOutputOps) {
  auto gm = std::make_shared<GraphModule>();
  Graph& g = gm->graph();
  auto x = torch::randn({4, 6});
  Value in = g.placeholder("x", TensorMeta::of(x));
  gm->set_attribute("w", torch::randn({6}), AttributeKind::Parameter);
  Value w = g.get_attr("w", TensorMeta::of(gm->attribute("w")));
  Node* mul = g.call_function(find_op("aten::mul.Tensor"), {in, w}, {TensorMeta::of(x)});
  // split returns Tensor[]: two values
  Node* split = g.call_function(find_op("aten::split.Tensor"), {mul->output(), c10::IValue(int64_t{2}), c10::IValue(int64_t{0})},
                                {TensorMeta::of(x.slice(0, 0, 2)), TensorMeta::of(x.slice(0, 2, 4))}, {2});
  Node* cat = g.call_function(find_op("aten::cat"),
                              {Argument(std::vector<std::optional<Value>>{split->output(1), split->output(0)}), c10::IValue(int64_t{0})},
                              {TensorMeta::of(x)});
  Node* mx = g.call_function(find_op("aten::max.dim"), {cat->output(), c10::IValue(int64_t{1})},
                             {TensorMeta::of(x.select(1, 0)), TensorMeta::of(x.select(1, 0).to(torch::kLong))});
  g.output({mx->output(0), mx->output(1)});
  auto outs = gm->forward({x});
  auto m = x * gm->attribute("w");
  auto expected = torch::cat({m.slice(0, 2, 4), m.slice(0, 0, 2)}, 0).max(1);
  EXPECT_TRUE(tc_test::tensors_equal(std::get<0>(expected), outs[0]));
  EXPECT_TRUE(tc_test::tensors_equal(std::get<1>(expected), outs[1]));
  // attributes are read at each call
  gm->attribute("w").fill_(0);
  EXPECT_EQ(gm->forward({x})[0].abs().sum().item<float>(), 0.f);
}

TEST(Interpreter, OptionalTensorArgumentsAcceptNone) {
  auto gm = std::make_shared<GraphModule>();
  Graph& g = gm->graph();
  auto x = torch::randn({3, 4});
  Value in = g.placeholder("x", TensorMeta::of(x));
  Node* ln = g.call_function(find_op("aten::layer_norm"),
                             {in, c10::IValue(std::vector<int64_t>{4}), c10::IValue(), c10::IValue()}, {TensorMeta::of(x)});
  g.output({ln->output()});
  EXPECT_TRUE(tc_test::tensors_close(torch::layer_norm(x, {4}), gm->forward({x})[0]));
}

TEST(Interpreter, RejectsWrongInputCountAndIsThreadSafe) {
  auto gm = std::make_shared<GraphModule>();
  Graph& g = gm->graph();
  auto x = torch::randn({8});
  Value in = g.placeholder("x", TensorMeta::of(x));
  Node* s = g.call_function(find_op("aten::sin"), {in}, {TensorMeta::of(x)});
  Node* e = g.call_function(find_op("aten::exp"), {s->output()}, {TensorMeta::of(x)});
  g.output({e->output()});
  EXPECT_THROW(gm->forward({}), c10::Error);
  Interpreter interp(*gm);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto in = torch::randn({8});
        if (!torch::equal(in.sin().exp(), interp.run({in})[0])) ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace

// ---- in-place reuse of dead intermediates and dispatch below autograd ------------------------

namespace {

// x -> sin -> a; exp(a) -> b; outputs chosen by the caller.
struct SinExp {
  std::shared_ptr<GraphModule> gm = std::make_shared<GraphModule>();
  Node* sin = nullptr;
  Node* exp = nullptr;
  explicit SinExp(const torch::Tensor& x) {
    Graph& g = gm->graph();
    Value in = g.placeholder("x", TensorMeta::of(x));
    sin = g.call_function(find_op("aten::sin"), {in}, {TensorMeta::of(x)});
    exp = g.call_function(find_op("aten::exp"), {sin->output()}, {TensorMeta::of(x)});
  }
};

}  // namespace

TEST(OpStepReuse, PlanRuleNeedsAFreshSameLayoutResultReadOnce) {
  auto x = torch::randn({4, 3});
  SinExp f(x);
  auto slot = [](const Value&) { return uint32_t{0}; };
  OpStep exp_step(*f.exp, slot, {1});
  EXPECT_TRUE(exp_step.enable_self_reuse(*f.exp));  // sin's result, same dtype/sizes/strides
  OpStep sin_step(*f.sin, slot, {1});
  EXPECT_FALSE(sin_step.enable_self_reuse(*f.sin));  // reads a placeholder: maybe the caller's memory

  Graph& g = f.gm->graph();
  // A result of another dtype or shape cannot be written into self.
  Node* to_double = g.call_function(find_op("aten::_to_copy"),
                                    {f.exp->output(), c10::IValue(c10::ScalarType::Double), c10::IValue(), c10::IValue(),
                                     c10::IValue(), c10::IValue(false), c10::IValue()},
                                    {TensorMeta::of(x.to(torch::kDouble))});
  EXPECT_FALSE(OpStep(*to_double, slot, {2}).enable_self_reuse(*to_double));
  Node* sum = g.call_function(find_op("aten::sum.dim_IntList"),
                              {f.exp->output(), c10::IValue(std::vector<int64_t>{1}), c10::IValue(false), c10::IValue()},
                              {TensorMeta::of(x.sum(1))});
  EXPECT_FALSE(OpStep(*sum, slot, {2}).enable_self_reuse(*sum));
  // self read twice by the node (mul(a, a)): no.
  Node* square = g.call_function(find_op("aten::mul.Tensor"), {f.exp->output(), f.exp->output()}, {TensorMeta::of(x)});
  auto distinct = [&](const Value& v) { return v == f.exp->output() ? uint32_t{2} : uint32_t{0}; };
  EXPECT_FALSE(OpStep(*square, distinct, {3}).enable_self_reuse(*square));
  // A view's result (t) is not fresh: relu of it may not run in place.
  Node* view = g.call_function(find_op("aten::view"), {f.exp->output(), c10::IValue(std::vector<int64_t>{12})},
                               {TensorMeta::of(x.view({12}))});
  Node* relu = g.call_function(find_op("aten::relu"), {view->output()}, {TensorMeta::of(x.view({12}))});
  EXPECT_FALSE(OpStep(*relu, slot, {4}).enable_self_reuse(*relu));
  // Half and BFloat16 results are not: LibTorch 2.x rounds some in-place overloads differently.
  for (auto dt : {at::kHalf, at::kBFloat16}) {
    SinExp r(torch::randn({4, 3}).to(dt));
    EXPECT_FALSE(OpStep(*r.exp, slot, {1}).enable_self_reuse(*r.exp)) << dt;
  }
  // Random operators are never rewritten.
  Node* drop = g.call_function(find_op("aten::dropout"), {f.exp->output(), c10::IValue(0.5), c10::IValue(true)},
                               {TensorMeta::of(x)});
  EXPECT_FALSE(OpStep(*drop, slot, {5}).enable_self_reuse(*drop));
}

TEST(OpStepReuse, RunsInPlaceOnlyWhenTheSlotIsTheOnlyReference) {
  auto x = torch::randn({4, 3});
  SinExp f(x);
  OpStep exp_step(*f.exp, [](const Value&) { return uint32_t{0}; }, {1});
  ASSERT_TRUE(exp_step.enable_self_reuse(*f.exp));
  torch::jit::Stack stack;
  {
    // The slot holds the only reference: exp runs in place, in the same memory.
    std::vector<at::Tensor> slots{x.sin(), at::Tensor()};
    void* memory = slots[0].data_ptr();
    exp_step.run(slots.data(), stack, /*below_autograd=*/true);
    EXPECT_EQ(slots[1].data_ptr(), memory);
    EXPECT_TRUE(tc_test::tensors_close(x.sin().exp(), slots[1]));
  }
  {
    // Someone else holds the tensor: it keeps its value.
    std::vector<at::Tensor> slots{x.sin(), at::Tensor()};
    at::Tensor other = slots[0];
    exp_step.run(slots.data(), stack, true);
    EXPECT_NE(slots[1].data_ptr(), other.data_ptr());
    EXPECT_TRUE(tc_test::tensors_equal(x.sin(), other));
  }
  {
    // A view of it is alive: same.
    std::vector<at::Tensor> slots{x.sin(), at::Tensor()};
    at::Tensor view = slots[0].view({12});
    exp_step.run(slots.data(), stack, true);
    EXPECT_TRUE(tc_test::tensors_equal(x.sin().view({12}), view));
  }
  {
    // With the autograd keys in use (grad mode), never in place.
    std::vector<at::Tensor> slots{x.sin(), at::Tensor()};
    void* memory = slots[0].data_ptr();
    exp_step.run(slots.data(), stack, false);
    EXPECT_NE(slots[1].data_ptr(), memory);
  }
}

// Randomized: chains of pointwise ops whose intermediates are also returned (as themselves or
// through views) at random; every output equals eager, under no_grad and with grad enabled.
TEST(OpStepReuse, RandomChainsWithVisibleIntermediatesMatchEager) {
  torch::manual_seed(7);
  const char* unary[] = {"aten::sin", "aten::exp", "aten::relu", "aten::neg", "aten::tanh"};
  for (int trial = 0; trial < 60; ++trial) {
    auto x = torch::randn({5, 4});
    auto gm = std::make_shared<GraphModule>();
    Graph& g = gm->graph();
    Value v = g.placeholder("x", TensorMeta::of(x));
    std::vector<Value> outs;
    std::vector<std::function<torch::Tensor(const torch::Tensor&)>> expected;
    std::function<torch::Tensor(const torch::Tensor&)> chain = [](const torch::Tensor& t) { return t; };
    const int length = 2 + trial % 6;
    for (int i = 0; i < length; ++i) {
      const char* op = unary[(trial * 7 + i * 3) % 5];
      Node* n = g.call_function(find_op(op), {v}, {TensorMeta::of(x)});
      v = n->output();
      auto fn = find_op(op);
      chain = [chain, fn](const torch::Tensor& t) {
        torch::jit::Stack s{chain(t)};
        fn.callBoxed(&s);
        return s[0].toTensor();
      };
      const int r = (trial + i * 5) % 4;
      if (r == 0 && i + 1 < length) {  // the intermediate itself is an output
        outs.push_back(v);
        expected.push_back(chain);
      } else if (r == 1 && i + 1 < length) {  // a view of it is an output
        Node* view = g.call_function(find_op("aten::view"), {v, c10::IValue(std::vector<int64_t>{20})},
                                     {TensorMeta::of(x.view({20}))});
        outs.push_back(view->output());
        expected.push_back([chain](const torch::Tensor& t) { return chain(t).view({20}); });
      }
    }
    outs.push_back(v);
    expected.push_back(chain);
    g.output(outs);
    for (bool grad : {false, true}) {
      torch::AutoGradMode mode(grad);
      auto got = gm->forward({x});
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(tc_test::tensors_close(expected[i](x), got[i])) << "trial " << trial << " output " << i;
    }
  }
}

TEST(OpStepReuse, ForwardModeGradientsStillPropagate) {
  auto x = torch::randn({4, 3});
  auto tangent = torch::randn({4, 3});
  SinExp f(x);
  f.gm->graph().output({f.exp->output()});
  const uint64_t level = torch::autograd::ForwardADLevel::get_next_idx();
  {
    torch::NoGradGuard no_grad;  // forward-mode AD ignores grad mode, as eager does
    auto dual = at::_make_dual(x, tangent, static_cast<int64_t>(level));
    auto got = f.gm->forward({dual})[0];
    auto want = dual.sin().exp();
    auto got_tangent = std::get<1>(at::_unpack_dual(got, static_cast<int64_t>(level)));
    auto want_tangent = std::get<1>(at::_unpack_dual(want, static_cast<int64_t>(level)));
    ASSERT_TRUE(want_tangent.defined());
    ASSERT_TRUE(got_tangent.defined());
    EXPECT_TRUE(tc_test::tensors_close(want_tangent, got_tangent));
  }
  torch::autograd::ForwardADLevel::release_idx(level);
}

using tc_test::same_bits;

// add/sub/mul/div with a constant scalar run as their `.Tensor` overloads with a prepared
// operand: random chains over float and double (and Half, BFloat16 and integers, which keep
// the `.Scalar` call), int and double constants and alpha, give eager's bits, with and without grad mode,
// with and without the in-place reuse of the intermediate.
TEST(OpStepScalarOperand, RandomScalarChainsMatchEagerBitwise) {
  std::mt19937 rng(11);
  const char* ops[] = {"aten::add.Scalar", "aten::sub.Scalar", "aten::mul.Scalar", "aten::div.Scalar"};
  const c10::ScalarType dtypes[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong};
  const std::vector<c10::IValue> constants = {c10::IValue(0.1), c10::IValue(int64_t{3}), c10::IValue(-2.5),
                                              c10::IValue(1e-3), c10::IValue(int64_t{-7}), c10::IValue(1.0 / 3)};
  for (int trial = 0; trial < 80; ++trial) {
    const c10::ScalarType dtype = dtypes[trial % 5];
    at::Tensor x = dtype == at::kLong ? torch::randint(1, 9, {3, 5}, at::kLong) : torch::randn({3, 5}).to(dtype);
    auto gm = std::make_shared<GraphModule>();
    Graph& g = gm->graph();
    Value v = g.placeholder("x", TensorMeta::of(x));
    at::Tensor expected = x;
    std::vector<std::unique_ptr<OpStep>> steps;
    const int length = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < length; ++i) {
      const char* target = ops[rng() % 4];
      const c10::IValue c = constants[rng() % constants.size()];
      std::vector<Argument> args{v, c};
      const bool alpha = std::string(target).rfind("aten::add", 0) == 0 || std::string(target).rfind("aten::sub", 0) == 0;
      if (alpha) args.emplace_back(c10::IValue(int64_t{2}));
      const bool floating_self = expected.scalar_type() == at::kFloat || expected.scalar_type() == at::kDouble;
      torch::jit::Stack s{expected, c};
      if (alpha) s.emplace_back(int64_t{2});
      find_op(target).callBoxed(&s);
      expected = s[0].toTensor();
      Node* n = g.call_function(find_op(target), args, {TensorMeta::of(expected)});
      v = n->output();
      steps.push_back(std::make_unique<OpStep>(*n, [](const Value&) { return 0u; }, std::vector<uint32_t>{0}));
      EXPECT_EQ(steps.back()->scalar_operand_prepared(), floating_self) << target << " " << dtype;
    }
    g.output({v});
    for (bool grad : {false, true}) {
      torch::AutoGradMode mode(grad);
      at::Tensor got = gm->forward({x})[0];
      EXPECT_TRUE(same_bits(expected, got)) << "trial " << trial << " dtype " << dtype << " grad " << grad;
    }
    // The same steps run one by one on a slot, below autograd, in place where allowed.
    torch::NoGradGuard no_grad;
    at::Tensor slot = x.clone();
    torch::jit::Stack stack;
    for (auto& step : steps) step->run(&slot, stack, /*below_autograd=*/true);
    EXPECT_TRUE(same_bits(expected, slot)) << "trial " << trial;
  }
}

// A slot whose dtype is not the traced one (not possible under guards, but an OpStep must not
// rely on it) runs the traced `.Scalar` overload.
TEST(OpStepScalarOperand, OtherDtypeAtRunTimeUsesTheScalarOverload) {
  Graph g;
  at::Tensor x = torch::randn({4});
  Value in = g.placeholder("x", TensorMeta::of(x));
  Node* mul = g.call_function(find_op("aten::mul.Scalar"), {in, c10::IValue(0.5)}, {TensorMeta::of(x)});
  OpStep step(*mul, [](const Value&) { return 0u; }, {0});
  ASSERT_TRUE(step.scalar_operand_prepared());
  torch::NoGradGuard no_grad;
  at::Tensor slot = torch::arange(4, at::kLong);
  torch::jit::Stack stack;
  step.run(&slot, stack, true);
  EXPECT_EQ(slot.scalar_type(), torch::mul(torch::arange(4, at::kLong), 0.5).scalar_type());
  EXPECT_TRUE(tc_test::tensors_equal(torch::mul(torch::arange(4, at::kLong), 0.5), slot));
}

// The operand is prepared without the dispatcher: AOT builds interpreters while tracing the
// joint graph with functionalization on, where a dispatched op would return a functional
// wrapper (or be recorded), not a plain constant.
TEST(OpStepScalarOperand, PreparedUnderFunctionalizationIsAPlainConstant) {
  Graph g;
  at::Tensor x = torch::randn({4});
  Value in = g.placeholder("x", TensorMeta::of(x));
  Node* mul = g.call_function(find_op("aten::mul.Scalar"), {in, c10::IValue(0.3)}, {TensorMeta::of(x)});
  std::optional<OpStep> step;
  {
    c10::impl::IncludeDispatchKeyGuard functionalize(c10::DispatchKey::Functionalize);
    step.emplace(*mul, [](const Value&) { return 0u; }, std::vector<uint32_t>{0});
  }
  ASSERT_TRUE(step->scalar_operand_prepared());
  torch::NoGradGuard no_grad;
  at::Tensor slot = x.clone();
  torch::jit::Stack stack;
  step->run(&slot, stack, /*below_autograd=*/true);
  EXPECT_FALSE(at::functionalization::impl::isFunctionalTensor(slot));
  EXPECT_TRUE(same_bits(torch::mul(x, 0.3), slot));
}
