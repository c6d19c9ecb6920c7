// Guards and recompilation: a recording backend counts compiles (Dynamo's CompileCounter).
#include "support/test_util.h"

using tc_test::CompileCounter;
using tc_test::tensors_close;

namespace {

struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::Dropout drop{nullptr};
  Net() {
    fc = register_module("fc", torch::nn::Linear(8, 4));
    drop = register_module("drop", torch::nn::Dropout(0.5));
  }
  torch::Tensor forward(torch::Tensor x) { return drop->forward(fc->forward(x)).relu(); }
};

TEST(Recompile, TwoSameShapeCallsCompileOnce) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  net->eval();
  auto fast = torch::compile(net, cc.backend());
  auto x = torch::randn({3, 8});
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_TRUE(tensors_close(net->forward(x), fast(torch::randn({3, 8}) * 0 + x)));
  EXPECT_EQ(cc.frames(), 1);
  EXPECT_EQ(fast.state().num_entries(), 1u);
}

TEST(Recompile, ShapeChangeRecompilesWithReason) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  net->eval();
  auto fast = torch::compile(net, torchcompile::CompileOptions(cc.backend()).with_input_names({"x"}));
  fast(torch::randn({64, 8}));
  auto y = fast(torch::randn({32, 8}));
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().last_recompile_reason(), "tensor 'x' size mismatch at index 0: expected 64, got 32");
  EXPECT_EQ(y.size(0), 32);
  // The second size made a dynamic entry (automatic dynamic) with a graph with size symbols,
  // which serves 64 from now on without another compile (the trace is observed while autograd
  // records, and host code read no size).
  fast(torch::randn({64, 8}));
  fast(torch::randn({64, 8}));
  fast(torch::randn({32, 8}));
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().num_entries(), 2u);
}

TEST(Recompile, ShapeChangeWithDynamicFalseKeepsAnEntryPerShape) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  net->eval();
  auto fast = torch::compile(net, torchcompile::CompileOptions(cc.backend()).with_dynamic(false));
  for (int64_t n : {64, 32, 64, 32, 16}) EXPECT_EQ(fast(torch::randn({n, 8})).size(0), n);
  EXPECT_EQ(cc.frames(), 3);
  EXPECT_EQ(fast.state().num_entries(), 3u);
}

TEST(Recompile, DtypeChangeRecompiles) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a) { return a * 2 + 1; }, cc.backend());
  fast(torch::randn({4}));
  auto r = fast(torch::randn({4}, torch::kFloat64));
  EXPECT_EQ(r.scalar_type(), torch::kFloat64);
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_THAT(fast.state().last_recompile_reason(), ::testing::HasSubstr("dtype mismatch: expected Float, got Double"));
}

TEST(Recompile, TrainEvalChangeRecompiles) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  auto fast = torch::compile(net, cc.backend());
  auto x = torch::randn({3, 8});
  net->train();
  fast(x);
  net->eval();
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x))) << "eval mode must not drop out";
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_THAT(fast.state().last_recompile_reason(), ::testing::HasSubstr("training flag mismatch"));
  // Both graphs call dropout (LibTorch passes the training flag as an argument); they differ in it.
  EXPECT_THAT(cc.graphs()[0], ::testing::HasSubstr("aten::dropout"));
  EXPECT_NE(cc.graphs()[0], cc.graphs()[1]);
  net->train();
  fast(x);
  EXPECT_EQ(cc.frames(), 2) << "back to train: the first entry is reused";
}

TEST(Recompile, StridesRequiresGradAndGradModeAreGuarded) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a) { return a.sin(); }, cc.backend());
  auto x = torch::randn({4, 6});
  fast(x);
  fast(x.t().contiguous().t());  // same sizes? no: (4, 6) transposed twice keeps sizes, new strides
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_THAT(fast.state().last_recompile_reason(), ::testing::HasSubstr("stride mismatch"));
  auto g = fast(x.clone().requires_grad_());
  EXPECT_EQ(cc.frames(), 3);
  EXPECT_TRUE(g.requires_grad());
  fast(x);  // hit: the first entry becomes the most recently used again
  EXPECT_EQ(cc.frames(), 3);
  {
    torch::NoGradGuard no_grad;
    fast(x);
  }
  EXPECT_EQ(cc.frames(), 4);
  EXPECT_THAT(fast.state().last_recompile_reason(), ::testing::HasSubstr("grad mode mismatch"));
}

TEST(Recompile, ScalarArgumentsAreSpecialized) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a, int64_t k, double s, bool flip) {
    auto r = a.roll(k) * s;
    return flip ? -r : r;
  }, cc.backend());
  auto x = torch::randn({5});
  EXPECT_TRUE(tensors_close(x.roll(2) * 0.5, fast(x, 2, 0.5, false)));
  EXPECT_TRUE(tensors_close(x.roll(2) * 0.5, fast(x, 2, 0.5, false)));
  EXPECT_EQ(cc.frames(), 1);
  EXPECT_TRUE(tensors_close(x.roll(3) * 0.5, fast(x, 3, 0.5, false)));
  EXPECT_EQ(fast.state().last_recompile_reason(), "argument 1 mismatch: expected 2, got 3");
  EXPECT_TRUE(tensors_close(-(x.roll(3) * 0.5), fast(x, 3, 0.5, true)));
  EXPECT_TRUE(tensors_close(x.roll(3) * 1.5, fast(x, 3, 1.5, false)));
  EXPECT_EQ(cc.frames(), 4);
}

TEST(Recompile, AliasedInputsAreGuarded) {
  CompileCounter cc;
  auto fn = [](torch::Tensor a, torch::Tensor b) {
    a.add_(1);
    return a * b;
  };
  auto fast = torch::compile(fn, cc.backend());
  auto x = torch::ones({3});
  auto r = fast(x, x);  // traced with a and b the same tensor: (1+1)*(1+1)
  EXPECT_TRUE(tensors_close(torch::full({3}, 4.0), r));
  auto y = torch::ones({3}), z = torch::ones({3});
  auto r2 = fast(y, z);  // must not reuse the aliased graph
  EXPECT_TRUE(tensors_close(torch::full({3}, 2.0), r2));
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_THAT(fast.state().last_recompile_reason(), ::testing::HasSubstr("was the same tensor as"));
  // And the other way: traced with separate tensors, called with one tensor twice. A graph
  // break's continuation traced on such a call would read the second argument for the first.
  auto w = torch::ones({3});
  EXPECT_TRUE(tensors_close(torch::full({3}, 4.0), fast(w, w)));
  EXPECT_EQ(cc.frames(), 2);
}

// More than 16 tensor inputs take the sorted path of the identity check.
TEST(Recompile, AliasedTensorsInALongListAreGuarded) {
  CompileCounter cc;
  auto fn = [](std::vector<torch::Tensor> xs) {
    xs[0].add_(1);
    torch::Tensor sum = xs[1] * 1;
    for (size_t i = 2; i < xs.size(); ++i) sum = sum + xs[i];
    return sum;
  };
  auto fast = torch::compile(fn, cc.backend());
  auto make = [](bool alias) {
    std::vector<torch::Tensor> xs;
    for (int i = 0; i < 20; ++i) xs.push_back(torch::full({2}, static_cast<double>(i)));
    if (alias) xs[1] = xs[0];
    return xs;
  };
  for (bool alias : {false, true, false, true}) {
    auto xs = make(alias), ys = make(alias);
    EXPECT_TRUE(tensors_close(fn(xs), fast(ys))) << "alias " << alias;
  }
  EXPECT_EQ(cc.frames(), 2);
}

TEST(Recompile, InputsThatAreTheModulesOwnTensorsAreGuarded) {
  struct Scale : torch::nn::Module {
    torch::Tensor state;
    Scale() { state = register_buffer("state", torch::ones({3})); }
    torch::Tensor forward(torch::Tensor x) {
      state.mul_(2);
      return x + 1;
    }
  };
  auto m = std::make_shared<Scale>();
  CompileCounter cc;
  auto fast = torch::compile(m, cc.backend());
  auto x = torch::zeros({3});
  EXPECT_TRUE(tensors_close(torch::ones({3}), fast(x)));  // separate
  EXPECT_TRUE(tensors_close(torch::full({3}, 5.0), fast(m->state)));  // state becomes 4, then + 1
  EXPECT_THAT(fast.state().last_recompile_reason(),
              ::testing::HasSubstr("is buffer 'state', which it was not when traced"));
  EXPECT_TRUE(tensors_close(torch::ones({3}), fast(x)));
  EXPECT_TRUE(tensors_close(torch::full({3}, 17.0), fast(m->state)));
  EXPECT_TRUE(tensors_close(torch::full({3}, 16.0), m->state));
  EXPECT_EQ(cc.frames(), 2);
  auto fresh = torch::compile(m, cc.backend());
  EXPECT_TRUE(tensors_close(torch::full({3}, 33.0), fresh(m->state)));
  EXPECT_TRUE(tensors_close(torch::ones({3}), fresh(x)));
  EXPECT_THAT(fresh.state().last_recompile_reason(),
              ::testing::HasSubstr("was buffer 'state' when traced, and is not now"));
}

TEST(Recompile, CacheSizeLimitFallsBackToEager) {
  CompileCounter cc;
  // Static shapes: each size is an entry (automatic dynamic would serve sizes >= 2 with one).
  auto fast = torch::compile([](torch::Tensor a) { return a + 1; },
                             torchcompile::CompileOptions(cc.backend()).with_cache_size_limit(2).with_dynamic(false));
  for (int n = 1; n <= 5; ++n) {
    auto x = torch::randn({n});
    EXPECT_TRUE(tensors_close(x + 1, fast(x)));
  }
  EXPECT_EQ(cc.frames(), 2);
}

TEST(Recompile, CacheSizeLimitWarnsOnceNamingTheModuleAndTheLastReason) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  net->eval();
  auto fast = torch::compile(net, torchcompile::CompileOptions(cc.backend()).with_cache_size_limit(1).with_input_names({"x"}));
  fast(torch::randn({2, 8}));
  ::testing::internal::CaptureStderr();
  fast(torch::randn({3, 8}));
  fast(torch::randn({4, 8}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, ::testing::HasSubstr("cache_size_limit (1) reached"));
  EXPECT_THAT(err, ::testing::HasSubstr("torch::compile(" + net->name() + ")"));
  EXPECT_THAT(err, ::testing::HasSubstr("tensor 'x' size mismatch at index 0: expected 2, got 3"));
  const auto first = err.find("cache_size_limit");
  EXPECT_EQ(err.find("cache_size_limit", first + 1), std::string::npos) << "warned once: " << err;
  EXPECT_EQ(cc.frames(), 1);
}

}  // namespace
