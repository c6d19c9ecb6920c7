// Regression tests for graph-break defects found on real client code (D1-D4): each runs the
// forward compiled and eagerly over calls with changing branch values and compares every result,
// under `eager`, `aot_eager` and `default`.
#include "support/test_util.h"

#include <torchcompile/ir/interpreter.h>

using tc_test::tensors_close;
using tc_test::tensors_equal;

namespace {

class BreakDefects : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& backend() const { return GetParam(); }
  // What `f` printed to stderr, where LibTorch's warnings go; torch::compile's warnings start
  // with "torch::compile(".
  template <typename F>
  static std::string warnings_of(F&& f) {
    ::testing::internal::CaptureStderr();
    f();
    std::string err = ::testing::internal::GetCapturedStderr();
    return err.find("torch::compile(") == std::string::npos ? "" : err;
  }
};

std::string backend_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

// D1: a tensor made by a factory op before a graph break, updated in place after it.
struct Fill : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x, torch::Tensor n) {
    torch::Tensor out = torch::zeros({3});
    int64_t k = n.item<int64_t>();
    out.add_(x * k);
    return out;
  }
};

TEST_P(BreakDefects, D1FactoryTensorUpdatedAfterABreak) {
  auto m = std::make_shared<Fill>();
  auto fast = torch::compile(m, backend());
  auto x = torch::ones({3});
  std::string warned = warnings_of([&] {
    for (int k : {2, 5, 2, 5, 5, 5, 7, 2}) {
      auto n = torch::tensor(k);
      ASSERT_TRUE(tensors_equal(m->forward(x, n), fast(x, n))) << "k = " << k;
    }
  });
  EXPECT_EQ(warned, "");
  auto entry = fast.state().entries().front();
  EXPECT_FALSE(entry->runs_eagerly());
  EXPECT_EQ(entry->num_graphs(), 4u) << "the prefix and one continuation per value";
}

// D2: ops returning their own argument (in-place ops, eval-mode dropout) in the prefix.
struct Fill2 : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x, torch::Tensor n) {
    torch::Tensor out = torch::zeros({3});
    out.add_(x);
    int64_t a = n[0].item<int64_t>();
    out.add_(x * a);
    int64_t b = n[1].item<int64_t>();
    return out * b;
  }
};

TEST_P(BreakDefects, D2InPlaceOpsInThePrefix) {
  auto m = std::make_shared<Fill2>();
  auto fast = torch::compile(m, backend());
  auto x = torch::ones({3});
  std::string warned = warnings_of([&] {
    for (auto v : {std::pair{2, 3}, {5, 1}, {2, 3}, {5, 1}, {5, 3}, {2, 1}}) {
      auto n = torch::tensor({v.first, v.second});
      ASSERT_TRUE(tensors_equal(m->forward(x, n), fast(x, n))) << v.first << ", " << v.second;
    }
  });
  EXPECT_EQ(warned, "");
}

struct DropoutLoop : torch::nn::Module {
  torch::nn::Dropout drop{nullptr};
  DropoutLoop() { drop = register_module("drop", torch::nn::Dropout(0.5)); }
  std::vector<torch::Tensor> forward(torch::Tensor h, torch::Tensor n) {
    std::vector<torch::Tensor> outs;
    for (int64_t i = 0; i < 3; ++i) {
      h = h * 0.5 + n[i].item<int64_t>();
      torch::Tensor p = drop->forward(h);  // eval mode: returns h itself
      outs.push_back(p * 2);
    }
    return outs;
  }
};

TEST_P(BreakDefects, D2EvalDropoutReturnsItsArgumentInALoop) {
  auto m = std::make_shared<DropoutLoop>();
  m->eval();
  auto fast = torch::compile(m, backend());
  auto h = torch::ones({4});
  torch::manual_seed(0);
  for (int call = 0; call < 12; ++call) {
    auto n = torch::randint(0, 3, {3}, torch::kLong);
    auto expected = m->forward(h, n);
    auto actual = fast(h, n);
    ASSERT_EQ(expected.size(), actual.size());
    for (size_t i = 0; i < expected.size(); ++i)
      ASSERT_TRUE(tensors_equal(expected[i], actual[i])) << "call " << call << " output " << i;
  }
}

TEST_P(BreakDefects, D2TrainingDropoutAndBatchNormBeforeBreaks) {
  struct Net : torch::nn::Module {
    torch::nn::BatchNorm1d bn{nullptr};
    torch::nn::Dropout drop{nullptr};
    Net() {
      bn = register_module("bn", torch::nn::BatchNorm1d(4));
      drop = register_module("drop", torch::nn::Dropout(0.3));
    }
    torch::Tensor forward(torch::Tensor x, torch::Tensor n) {
      torch::Tensor acc = torch::zeros({8, 4});
      auto h = drop->forward(bn->forward(x));
      acc.add_(h);
      int64_t a = n[0].item<int64_t>();
      acc.mul_(a);
      h = drop->forward(h.relu());
      int64_t b = n[1].item<int64_t>();
      return acc + h * b;
    }
  };
  torch::manual_seed(1);
  auto compiled_model = std::make_shared<Net>();
  auto eager_model = std::make_shared<Net>();
  eager_model->bn->weight.data().copy_(compiled_model->bn->weight.data());
  auto fast = torch::compile(compiled_model, backend());
  for (int call = 0; call < 10; ++call) {
    auto x = torch::randn({8, 4});
    auto n = torch::randint(0, 3, {2}, torch::kLong);
    torch::manual_seed(100 + call);
    auto expected = eager_model->forward(x, n);
    auto eager_next = torch::rand({2});
    torch::manual_seed(100 + call);
    auto actual = fast(x, n);
    auto compiled_next = torch::rand({2});
    ASSERT_TRUE(tensors_close(expected, actual)) << "call " << call;
    ASSERT_TRUE(tensors_equal(eager_next, compiled_next)) << "RNG state after call " << call;
    ASSERT_TRUE(tensors_close(eager_model->bn->running_mean, compiled_model->bn->running_mean)) << "call " << call;
    ASSERT_TRUE(tensors_close(eager_model->bn->running_var, compiled_model->bn->running_var)) << "call " << call;
  }
}

// D2's fallback: a branch point past its continuation limit runs the rest eagerly, and that
// must still give eager's result.
TEST_P(BreakDefects, ClosedBranchRunsEagerlyWithEagersResult) {
  auto m = std::make_shared<Fill2>();
  auto fast = torch::compile(m, torchcompile::CompileOptions(backend()).with_cache_size_limit(2));
  auto x = torch::ones({3});
  warnings_of([&] {
    for (int a = 0; a < 6; ++a)
      for (int b = 0; b < 3; ++b) {
        auto n = torch::tensor({a, b});
        ASSERT_TRUE(tensors_equal(m->forward(x, n), fast(x, n))) << a << ", " << b;
      }
  });
}

// D3: a forward returning an undefined tensor (an empty recurrent state passed through).
struct PassThrough : torch::nn::Module {
  std::vector<torch::Tensor> forward(torch::Tensor x, torch::Tensor h) { return {x * 2, h}; }
};

TEST_P(BreakDefects, D3UndefinedOutputsRoundTrip) {
  auto fast = torch::compile(std::make_shared<PassThrough>(), backend());
  for (int call = 0; call < 3; ++call) {
    auto out = fast(torch::ones({2}), torch::Tensor());
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(tensors_equal(torch::full({2}, 2.0), out[0]));
    EXPECT_FALSE(out[1].defined());
  }
  auto h = torch::randn({2});
  auto out = fast(torch::ones({2}), h);
  EXPECT_TRUE(out[1].defined());
  EXPECT_TRUE(tensors_equal(h, out[1]));
  for (const auto& e : fast.state().entries()) EXPECT_FALSE(e->runs_eagerly()) << e->eager_reason();
}

TEST_P(BreakDefects, D3UndefinedOutputsNestedInTuplesAndAfterBreaks) {
  auto fn = [](torch::Tensor x, torch::Tensor n) -> std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>> {
    if (n.item<int64_t>() > 0) return {x + 1, {torch::Tensor(), x * 3}};
    return {torch::Tensor(), {x - 1, torch::Tensor()}};
  };
  auto fast = torch::compile(fn, backend());
  auto x = torch::randn({3});
  for (int k : {1, 0, 1, 0}) {
    auto [a, bc] = fast(x, torch::tensor(k));
    auto [ea, ebc] = fn(x, torch::tensor(k));
    ASSERT_EQ(a.defined(), ea.defined());
    ASSERT_EQ(std::get<0>(bc).defined(), std::get<0>(ebc).defined());
    ASSERT_EQ(std::get<1>(bc).defined(), std::get<1>(ebc).defined());
    if (a.defined()) EXPECT_TRUE(tensors_equal(ea, a));
    if (std::get<0>(bc).defined()) EXPECT_TRUE(tensors_equal(std::get<0>(ebc), std::get<0>(bc)));
    if (std::get<1>(bc).defined()) EXPECT_TRUE(tensors_equal(std::get<1>(ebc), std::get<1>(bc)));
  }
}

// D4: an in-place update of a tensor made by a factory op (the accumulator pattern).
TEST_P(BreakDefects, D4AccumulatorIntoAFactoryTensor) {
  auto fn = [](torch::Tensor x) {
    torch::Tensor out = torch::zeros({3});
    out.add_(x);
    auto idx = torch::tensor({0, 2});
    out.index_put_({idx}, x.index({idx}) * 3, /*accumulate=*/true);
    return out * 2;
  };
  auto fast = torch::compile(fn, backend());
  for (bool grad : {false, true}) {
    for (int call = 0; call < 3; ++call) {
      auto x = torch::randn({3}).requires_grad_(grad);
      auto x_ref = x.detach().clone().requires_grad_(grad);
      auto expected = fn(x_ref);
      std::string warned = BreakDefects::warnings_of([&] {
        auto actual = fast(x);
        ASSERT_TRUE(tensors_close(expected, actual));
        if (grad) {
          actual.sum().backward();
          expected.sum().backward();
          ASSERT_TRUE(tensors_close(x_ref.grad(), x.grad()));
        }
      });
      EXPECT_EQ(warned, "") << "grad " << grad;
    }
  }
  for (const auto& e : fast.state().entries()) EXPECT_FALSE(e->runs_eagerly()) << e->eager_reason();
}

// Graph inputs that share memory, one of them updated in place: the graph must see the update
// through the other (found by the fuzzer under aot_eager, whose functionalized graph treated
// each input as a separate tensor). A view made before a break and its base both cross it.
struct AliasedAcrossABreak : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x, torch::Tensor n) {
    torch::Tensor a = x + 1;
    torch::Tensor v = a.view({2, 3});
    int64_t k = n.item<int64_t>();
    v.add_(k);
    return a * 2 + v.sum();
  }
};

TEST_P(BreakDefects, InputsSharingMemoryAcrossABreakOneUpdatedInPlace) {
  auto m = std::make_shared<AliasedAcrossABreak>();
  auto fast = torch::compile(m, backend());
  for (bool grad : {false, true}) {
    torch::AutoGradMode mode(grad);
    for (int k : {1, 2, 1, 3}) {
      auto x = torch::randn({6}).requires_grad_(grad);
      auto n = torch::tensor(k);
      auto x_ref = x.detach().clone().requires_grad_(grad);
      auto expected = m->forward(x_ref, n);
      auto actual = fast(x, n);
      ASSERT_TRUE(tensors_close(expected, actual)) << "k = " << k << ", grad " << grad;
      if (grad) {
        expected.sum().backward();
        actual.sum().backward();
        ASSERT_TRUE(tensors_close(x_ref.grad(), x.grad())) << "k = " << k;
      }
    }
  }
}

// The same, with the aliasing made by the caller: inputs distinct on the first call, then one a
// view of the other, then an input that is the module's own buffer, which the forward updates.
struct BumpsCounter : torch::nn::Module {
  torch::Tensor counter;
  BumpsCounter() { counter = register_buffer("counter", torch::zeros({4})); }
  torch::Tensor forward(torch::Tensor a, torch::Tensor b) {
    b.add_(1);
    counter.add_(a.sum());
    return a * 2 + counter;
  }
};

TEST_P(BreakDefects, CallerPassesInputsThatShareMemory) {
  torch::NoGradGuard no_grad;
  auto make = [](int how, const std::shared_ptr<BumpsCounter>& mod) -> std::pair<torch::Tensor, torch::Tensor> {
    auto base = torch::arange(4, torch::kFloat);
    if (how == 0) return {base, torch::ones({4})};
    if (how == 1) return {base, base.view({4})};
    if (how == 2) return {base, base.narrow(0, 1, 2)};
    if (how == 3) return {mod->counter, mod->counter};  // both inputs are the buffer the forward updates
    return {mod->counter, torch::ones({4})};
  };
  // Compiled first for separate inputs, then for shared ones.
  for (const auto& order : {std::vector<int>{0, 1, 0, 2, 3, 1, 3, 4}, std::vector<int>{3, 1, 0, 2, 3, 0},
                            std::vector<int>{4, 0, 4, 1, 3}}) {
    auto m = std::make_shared<BumpsCounter>();
    auto twin = std::make_shared<BumpsCounter>();
    auto fast = torch::compile(m, backend());
    for (int how : order) {
      auto [ea, eb] = make(how, twin);
      auto [a, b] = make(how, m);
      auto expected = twin->forward(ea, eb);
      auto actual = fast(a, b);
      ASSERT_TRUE(tensors_close(expected, actual)) << "case " << how << " after case " << order[0];
      ASSERT_TRUE(tensors_close(ea, a)) << "case " << how << " after case " << order[0];
      ASSERT_TRUE(tensors_close(twin->counter, m->counter)) << "case " << how << " after case " << order[0];
    }
  }
}

// One tensor passed as two arguments, one updated in place, the other read after it: compiled
// for that first, then called with separate tensors and with a view (and the reverse order).
TEST_P(BreakDefects, OneTensorPassedAsTwoArguments) {
  auto fn = [](torch::Tensor a, torch::Tensor b) {
    a.add_(1);
    return b * 2 + a;
  };
  torch::NoGradGuard no_grad;
  for (const auto& order : {std::vector<int>{1, 0, 2, 1, 0}, std::vector<int>{0, 1, 2, 0, 1}}) {
    auto fast = torch::compile(fn, backend());
    for (int how : order) {
      auto x = torch::arange(4, torch::kFloat), y = torch::ones({4});
      auto x2 = x.clone(), y2 = y.clone();
      auto pick = [how](torch::Tensor& p, torch::Tensor& q) { return how == 0 ? q : how == 1 ? p : p.view({4}); };
      auto expected = fn(x, pick(x, y));
      auto actual = fast(x2, pick(x2, y2));
      ASSERT_TRUE(tensors_equal(expected, actual)) << "case " << how << " after case " << order[0];
      ASSERT_TRUE(tensors_equal(x, x2)) << "case " << how << " after case " << order[0];
    }
  }
}

// An input updated in place from a parameter (it gets a grad_fn) before a break whose new
// value makes the call start again: the restart must see the input as the call began, its
// autograd history included, or the gradient takes the abandoned first attempt's path too
// (found by the fuzzer, with a view of the input as a second argument).
struct HistoryAcrossARestart : torch::nn::Module {
  torch::Tensor w;
  HistoryAcrossARestart() { w = register_parameter("w", torch::linspace(0.5, 1.5, 3)); }
  torch::Tensor forward(torch::Tensor x, torch::Tensor n, torch::Tensor y) {
    y.add_(n[0].item<int64_t>());
    x.copy_(x + w);
    const int64_t b = n[1].item<int64_t>();
    y.narrow(0, 0, 1).copy_(y.narrow(0, 1, 1) + w);  // a view of the input given a grad_fn
    const int64_t c = n[2].item<int64_t>();
    return x * b + y * c;
  }
};

TEST_P(BreakDefects, AutogradHistoryOfInputsIsRestoredWhenACallStartsAgain) {
  auto m = std::make_shared<HistoryAcrossARestart>();
  auto twin = std::make_shared<HistoryAcrossARestart>();
  auto fast = torch::compile(m, backend());
  for (bool view : {false, true}) {
    for (auto v : view ? std::vector<std::pair<int, int>>{{1, 1}, {1, 2}} : std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {2, 2}, {1, 3}, {2, 1}, {1, 1}}) {
      auto n = torch::tensor({v.first, v.second, v.first == v.second ? 2 : 1});
      auto x = torch::randn({2, 3});
      auto x2 = x.clone();
      auto y = view ? x.view({2, 3}) : torch::zeros({2, 3});
      auto y2 = view ? x2.view({2, 3}) : torch::zeros({2, 3});
      auto expected = twin->forward(x, n, y);
      auto actual = fast(x2, n, y2);
      ASSERT_TRUE(tensors_close(expected, actual)) << v.first << ", " << v.second << ", view " << view;
      ASSERT_TRUE(tensors_close(x, x2));
      expected.sum().backward();
      actual.sum().backward();
      ASSERT_TRUE(tensors_close(twin->w.grad(), m->w.grad())) << v.first << ", " << v.second << ", view " << view;
      twin->w.mutable_grad().reset();
      m->w.mutable_grad().reset();
    }
  }
}

// The same when only the view argument is updated: its base, the other argument, is not saved
// for its contents (the update restores them through the view) but gets a grad_fn too.
struct UpdatesOnlyTheView : torch::nn::Module {
  torch::Tensor w;
  UpdatesOnlyTheView() { w = register_parameter("w", torch::linspace(0.5, 1.5, 3)); }
  torch::Tensor forward(torch::Tensor x, torch::Tensor n, torch::Tensor y) {
    const int64_t a = n[0].item<int64_t>();
    y.add_(w * a);
    const int64_t b = n[1].item<int64_t>();
    return x * b;
  }
};

TEST_P(BreakDefects, AutogradHistoryOfTheBaseOfAnUpdatedViewArgumentIsRestored) {
  auto m = std::make_shared<UpdatesOnlyTheView>();
  auto twin = std::make_shared<UpdatesOnlyTheView>();
  auto fast = torch::compile(m, backend());
  for (auto v : {std::pair{1, 1}, {1, 2}, {2, 2}, {1, 3}, {2, 1}}) {
    auto n = torch::tensor({v.first, v.second});
    auto x = torch::randn({2, 3});
    auto x2 = x.clone();
    auto expected = twin->forward(x, n, x.view({2, 3}));
    auto actual = fast(x2, n, x2.view({2, 3}));
    ASSERT_TRUE(tensors_close(expected, actual)) << v.first << ", " << v.second;
    expected.sum().backward();
    actual.sum().backward();
    ASSERT_TRUE(tensors_close(twin->w.grad(), m->w.grad())) << v.first << ", " << v.second;
    twin->w.mutable_grad().reset();
    m->w.mutable_grad().reset();
  }
}

// A value read at one break, kept on the host and used after a later break: the segment
// between the breaks is the same graph for every value, but what follows it is not. Sharing that
// segment between values gave one value's last graph to the other (found with a view argument
// in the fuzzer's restart tests).
struct KeepsAValueAcrossBreaks : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x, torch::Tensor n) {
    const int64_t b = n[0].item<int64_t>();
    torch::Tensor y = x + 1;
    const bool positive = n[1].item<int64_t>() > 0;
    return positive ? y * b : y * -b;
  }
};

TEST_P(BreakDefects, AValueKeptOnTheHostSelectsItsOwnLaterSegments) {
  auto m = std::make_shared<KeepsAValueAcrossBreaks>();
  auto fast = torch::compile(m, backend());
  auto x = torch::randn({3});
  for (auto v : {std::pair{2, 1}, {3, 1}, {2, 1}, {3, 0}, {2, 0}, {3, 1}}) {
    auto n = torch::tensor({v.first, v.second});
    ASSERT_TRUE(tensors_equal(m->forward(x, n), fast(x, n))) << v.first << ", " << v.second;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BreakDefects, ::testing::Values("eager", "aot_eager", "default"), backend_name);

}  // namespace


namespace {

// A backend whose results differ from ATen's in the last bits (as the fused backend's reductions
// and onednn's GEMMs do): the graph, then every floating output nudged by one part in 1e7.
torchcompile::CompiledFn last_bits_backend(torchcompile::GraphModule& gm, const std::vector<at::Tensor>&) {
  auto run = torchcompile::ir::interpreter_fn(gm);
  return [run](std::vector<at::Tensor> inputs) {
    auto outs = run(std::move(inputs));
    for (auto& t : outs)
      if (t.defined() && t.is_floating_point()) t = t * (1 + 1e-7);
    return outs;
  };
}

// A float read at a graph break: the compiled value differs from the one the eager trace read.
// The continuation the eager value took is kept for the compiled value, so later calls with the
// same inputs run compiled instead of running the forward again every time.
TEST(BreakOnFloat, CompiledValueThatDiffersFromEagersInTheLastBitsIsRemembered) {
  torch::NoGradGuard no_grad;
  int forward_runs = 0;
  auto toy = [&forward_runs](torch::Tensor a, torch::Tensor b) {
    ++forward_runs;  // host code: runs only when the forward runs (trace or retrace)
    auto x = a / (torch::abs(a) + 1);
    if (b.sum().item<float>() < 0) b = b * -1;
    return x * b;
  };
  auto fast = torch::compile(toy, torchcompile::Backend(&last_bits_backend));
  torch::manual_seed(0);
  auto a = torch::randn({10}), b = torch::randn({10});
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(tensors_close(toy(a, b), fast(a, b), 1e-5, 1e-6));
  // 10 eager calls; the compiled object traced once and retraced once (its value missed).
  EXPECT_LE(forward_runs, 10 + 2);
}

}  // namespace
