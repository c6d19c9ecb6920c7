// torch::compile's API: what can be compiled, how it is called, what it returns, and what
// happens when tracing or the backend cannot produce a graph.
#include "support/test_util.h"

#include <torchcompile/ir/graph.h>

using tc_test::CompileCounter;
using tc_test::tensors_close;

namespace {

struct TwoLayerNetImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  TwoLayerNetImpl() {
    a = register_module("a", torch::nn::Linear(6, 6));
    b = register_module("b", torch::nn::Linear(6, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return b->forward(torch::relu(a->forward(x))); }
};
TORCH_MODULE(TwoLayerNet);

torch::Tensor free_function(torch::Tensor a, torch::Tensor b) { return torch::cos(a) + torch::sin(b); }

TEST(Compile, SharedPtrModuleHolderLambdaAndFunctionPointer) {
  auto net = std::make_shared<TwoLayerNetImpl>();
  auto x = torch::randn({3, 6});
  auto fast = torch::compile(net, "eager");
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_TRUE(tensors_close(net->forward(x), fast->forward(x)));

  TwoLayerNet holder;
  auto fast_holder = torch::compile(holder, "eager");
  EXPECT_TRUE(tensors_close(holder->forward(x), fast_holder(x)));

  auto y = torch::randn({3, 6});
  auto fast_lambda = torch::compile([](torch::Tensor a, torch::Tensor b) { return torch::cos(a) + torch::sin(b); }, "eager");
  EXPECT_TRUE(tensors_close(free_function(x, y), fast_lambda(x, y)));
  auto fast_fp = torch::compile(&free_function);
  EXPECT_TRUE(tensors_close(free_function(x, y), fast_fp(x, y)));
  auto fast_fp_opts = torch::compile(free_function, torchcompile::CompileOptions().with_fullgraph());
  EXPECT_TRUE(tensors_close(free_function(x, y), fast_fp_opts(x, y)));
}

TEST(Compile, CompiledCallsDoNotRunTheForward) {
  int forward_calls = 0;
  auto fast = torch::compile([&forward_calls](torch::Tensor a) {
    ++forward_calls;  // a host side effect: happens on tracing calls only (documented)
    return a * 3;
  });
  auto x = torch::randn({4});
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(tensors_close(x * 3, fast(x)));
  EXPECT_EQ(forward_calls, 1);
}

TEST(Compile, ParametersAreReadLiveAtEveryCall) {
  CompileCounter cc;
  auto net = std::make_shared<TwoLayerNetImpl>();
  auto fast = torch::compile(net, cc.backend());
  auto x = torch::randn({2, 6});
  fast(x);
  {
    torch::NoGradGuard no_grad;
    net->a->weight.mul_(-2);  // an optimizer-like in-place update
    net->b->bias.fill_(3);
  }
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_EQ(cc.frames(), 1);
  // Parameters are get_attr nodes by qualified name, not constants.
  EXPECT_THAT(cc.graphs()[0], ::testing::HasSubstr("a.weight"));
  EXPECT_THAT(cc.graphs()[0], ::testing::Not(::testing::HasSubstr("_tensor_constant")));
}

TEST(Compile, ArgumentAndReturnKinds) {
  CompileCounter cc;
  auto fn = [](std::vector<torch::Tensor> xs, c10::optional<torch::Tensor> bias, double scale) {
    auto s = torch::stack(xs) * scale;
    if (bias) s = s + *bias;
    return std::vector<torch::Tensor>{s.sum(0), s.amax(0)};
  };
  auto fast = torch::compile(fn, cc.backend());
  std::vector<torch::Tensor> xs{torch::randn({3}), torch::randn({3})};
  auto b = torch::randn({3});
  for (int i = 0; i < 2; ++i) {
    auto e = fn(xs, b, 2.0);
    auto c = fast(xs, b, 2.0);
    ASSERT_EQ(c.size(), 2u);
    EXPECT_TRUE(tensors_close(e[0], c[0]));
    EXPECT_TRUE(tensors_close(e[1], c[1]));
  }
  EXPECT_EQ(cc.frames(), 1);
  auto c = fast(xs, c10::nullopt, 2.0);
  EXPECT_TRUE(tensors_close(fn(xs, c10::nullopt, 2.0)[0], c[0]));
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_THAT(fast.state().last_recompile_reason(), ::testing::HasSubstr("argument 1 presence mismatch"));
  xs.push_back(torch::randn({3}));
  EXPECT_TRUE(tensors_close(fn(xs, b, 2.0)[1], fast(xs, b, 2.0)[1]));
  EXPECT_EQ(cc.frames(), 3);
  EXPECT_THAT(fast.state().last_recompile_reason(), ::testing::HasSubstr("argument 0 length mismatch"));
}

TEST(Compile, PlaceholdersAreNamed) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a, std::vector<torch::Tensor> bs) { return a + bs[1]; },
                             torchcompile::CompileOptions(cc.backend()).with_input_names({"x", "ys"}));
  fast(torch::randn({2}), std::vector<torch::Tensor>{torch::randn({2}), torch::randn({2})});
  ASSERT_EQ(cc.frames(), 1);
  EXPECT_THAT(cc.graphs()[0], ::testing::HasSubstr("%x "));
  EXPECT_THAT(cc.graphs()[0], ::testing::HasSubstr("%ys_1 "));
}

TEST(Compile, FullgraphTurnsAHostReadIntoAnError) {
  auto fast = torch::compile([](torch::Tensor a) { return a.sum().item<double>() > 0 ? a : -a; },
                             torchcompile::CompileOptions("eager").with_fullgraph());
  try {
    fast(torch::randn({3}));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("fullgraph"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("aten::item"));
  }
}

TEST(Compile, ThrowingBackendWarnsAndRunsEagerly) {
  int compiles = 0;
  auto bad = [&compiles](torchcompile::GraphModule&, const std::vector<at::Tensor>&) -> torchcompile::CompiledFn {
    ++compiles;
    throw std::runtime_error("boom");
  };
  auto fast = torch::compile([](torch::Tensor a) { return a.exp(); }, bad);
  auto x = torch::randn({3});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(tensors_close(x.exp(), fast(x)));
  EXPECT_EQ(compiles, 1) << "a failed compile is not retried for the same signature";
  auto entry = fast.state().entries().front();
  EXPECT_TRUE(entry->runs_eagerly());
  EXPECT_THAT(entry->eager_reason(), ::testing::HasSubstr("boom"));
}

TEST(Compile, UnknownBackendNameFailsAtCompile) {
  try {
    torch::compile([](torch::Tensor a) { return a; }, "no_such_backend");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("no_such_backend"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("eager"));
  }
}

TEST(Compile, ReturningAnInputOrParameterDirectly) {
  struct Id : torch::nn::Module {
    torch::Tensor w;
    Id() { w = register_parameter("w", torch::ones({2})); }
    std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) { return {x, w}; }
  };
  auto m = std::make_shared<Id>();
  auto fast = torch::compile(m, "eager");
  auto x = torch::randn({2});
  fast(x);
  auto [a, w] = fast(x);
  EXPECT_TRUE(a.is_same(x));
  EXPECT_TRUE(w.is_same(m->w));
}

}  // namespace

namespace {

TEST(Verify, CatchesHostStateTheTraceCannotSee) {
  int mode = 0;
  auto fast = torch::compile([&mode](torch::Tensor a) { return mode == 0 ? a + 1 : a * 2; },
                             torchcompile::CompileOptions("eager").with_verify());
  auto x = torch::randn({5});
  fast(x);
  EXPECT_EQ(fast.state().verify_failure(), "");
  mode = 1;  // the compiled graph still computes a + 1
  fast(x);
  EXPECT_THAT(fast.state().verify_failure(), ::testing::HasSubstr("output 0 differs from eager"));
}

TEST(Verify, StatefulForwardPassesAndIsNotAppliedTwice) {
  auto seq = torch::nn::Sequential(torch::nn::Linear(6, 6), torch::nn::BatchNorm1d(6), torch::nn::Dropout(0.5));
  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone());
  auto fast = torch::compile(seq, torchcompile::CompileOptions("eager").with_verify());
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({8, 6});
    torch::manual_seed(i);
    auto expected = reference->forward(x);
    torch::manual_seed(i);
    auto actual = fast(x);
    EXPECT_TRUE(tc_test::tensors_equal(expected, actual));
  }
  EXPECT_EQ(fast.state().verify_failure(), "");
  auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(seq[1]);
  auto bn_ref = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>((*reference)[1]);
  EXPECT_TRUE(tc_test::tensors_equal(bn_ref->running_mean, bn->running_mean));
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 4);
}

TEST(Verify, EnvironmentSwitch) {
  tc_test::ScopedEnv env("TORCHCOMPILE_VERIFY", "1");
  int mode = 0;
  auto fast = torch::compile([&mode](torch::Tensor a) { return mode == 0 ? a.sin() : a.cos(); }, "eager");
  fast(torch::ones({2}));
  mode = 1;
  fast(torch::ones({2}));
  EXPECT_THAT(fast.state().verify_failure(), ::testing::HasSubstr("differs"));
}

}  // namespace
