// The `default` backend (src/compile/default_backend.cpp): oneDNN for GEMMs and convolutions with
// their post-ops, fused for pointwise runs, the interpreter for the rest, AOT autograd for graphs
// that record autograd; and the pipeline's log of its steps.
#include "support/test_util.h"

#include <torchcompile/torchcompile.h>

#include <gmock/gmock.h>

#include <atomic>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "examples/models.h"

namespace {

using tc_test::tensors_close;

constexpr double kRtol = 1e-4, kAtol = 1e-5;

using tc_test::partition_of;
using tc_test::second_call;

}  // namespace

// ---- `default`: onednn for GEMMs with their post-ops, fused for pointwise runs --------------------

TEST(DefaultBackend, ComposesOnednnAndFused) {
  if (!torchcompile::has_backend("onednn")) GTEST_SKIP() << "onednn is not in this build";
  torch::NoGradGuard no_grad;
  auto lin = torch::nn::Linear(64, 32).ptr();
  auto fn = [lin](torch::Tensor x) {
    auto h = torch::relu(lin->forward(x));                 // onednn: linear+bias+relu
    return torch::sigmoid(h * 2 - 1) * torch::tanh(h);  // fused
  };
  auto x = torch::randn({16, 64});
  auto e = torchcompile::explain("default", fn, x);
  const std::string part = partition_of(e);
  EXPECT_NE(part.find("onednn: linear+bias+relu"), std::string::npos) << e;
  EXPECT_NE(part.find("fused: "), std::string::npos) << e;
  auto compiled = torch::compile(fn, "default");
  EXPECT_TRUE(tensors_close(fn(x), second_call(compiled, x), kRtol, kAtol));
}

TEST(DefaultBackend, ExplainListsThePartitionOfEachGraph) {
  if (!torchcompile::has_backend("onednn")) GTEST_SKIP() << "onednn is not in this build";
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torchcompile_examples::ConvNet m3(8, 16);
  m3->eval();
  auto e = torchcompile::explain("default", m3, torch::randn({2, 3, 16, 16}));
  ASSERT_EQ(e.compiled.size(), 1u);
  // Split: the convolutions with their BatchNorms and ReLUs and the pooling (one oneDNN part, the
  // values between the convolutions kept blocked), flatten (the interpreter), the linear layer.
  EXPECT_EQ(e.compiled[0].backend, "default");
  EXPECT_EQ(e.compiled[0].partition,
            (std::vector<std::string>{"onednn: conv+bias+bn+relu", "onednn: conv+bias+bn+relu", "onednn: avgpool",
                                      "onednn: 2 value(s) kept in blocked layout", "onednn: linear+bias",
                                      "interpreter: 1 operator(s) in all"}));
  std::ostringstream printed;
  printed << e;
  EXPECT_THAT(printed.str(), ::testing::HasSubstr("Graph 1: compiled by default"));
  EXPECT_THAT(printed.str(), ::testing::HasSubstr("part: onednn: conv+bias+bn+relu"));

  // A mixed graph: a GEMM with its post-op (oneDNN), then pointwise work (fused).
  torch::nn::Linear lin(8, 8);
  auto mixed = [l = lin.ptr()](torch::Tensor x) { return torch::sin(torch::relu(l->forward(x))) * 3; };
  auto e2 = torchcompile::explain("default", mixed, torch::randn({4, 8}));
  ASSERT_EQ(e2.compiled.size(), 1u);
  EXPECT_EQ(e2.compiled[0].backend, "default");
  EXPECT_THAT(e2.compiled[0].partition, ::testing::Contains("onednn: linear+bias+relu"));
  EXPECT_THAT(e2.compiled[0].partition, ::testing::Contains(::testing::HasSubstr("fused: sin+mul")));

  // A graph oneDNN takes whole: named as the backend that compiled it.
  torch::nn::Sequential seq(torch::nn::Linear(8, 16), torch::nn::ReLU());
  auto e4 = torchcompile::explain("default", seq, torch::randn({4, 8}));
  EXPECT_EQ(e4.compiled[0].backend, "onednn");

  // Training: the graph must record autograd, so `default` lifts it with AOT autograd and its
  // composition compiles the forward and the backward graph (neither oneDNN nor fused would
  // take the captured graph itself, which records autograd: each declines saying so).
  torch::AutoGradMode grad(true);
  m3->train();
  tc_test::ScopedEnv dynamic_gemms("TORCHCOMPILE_ONEDNN_DYNAMIC_GEMM", "1");  // the linear's weight is an input
  auto e3 = torchcompile::explain("default", m3, torch::randn({2, 3, 16, 16}));
  ASSERT_EQ(e3.compiled.size(), 1u);
  EXPECT_EQ(e3.compiled[0].backend, "default");
  std::vector<std::string> steps;
  for (const auto& s : e3.compiled[0].steps) steps.push_back(s.name);
  EXPECT_THAT(steps, ::testing::IsSupersetOf({"aot: forward compiler", "aot: backward compiler"}));
  EXPECT_THAT(e3.compiled[0].partition, ::testing::Contains(::testing::HasSubstr("onednn: linear")));
  EXPECT_THAT(e3.compiled[0].partition, ::testing::Contains(::testing::HasSubstr("fused: ")));
  auto e5 = torchcompile::explain("onednn", m3, torch::randn({2, 3, 16, 16}));
  ASSERT_EQ(e5.compiled.size(), 1u);
  EXPECT_EQ(e5.compiled[0].backend, "interpreter");
  ASSERT_FALSE(e5.compiled[0].attempts.empty());
  EXPECT_THAT(e5.compiled[0].attempts[0].reason, ::testing::HasSubstr("grad mode is enabled"));
}

TEST(Pipeline, PassesLogShowsEachStepWithItsTime) {
  if (!torchcompile::has_backend("onednn")) GTEST_SKIP() << "onednn is not in this build";
  torch::NoGradGuard no_grad;
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU());
  torchcompile::logging::set_logs("passes");
  ::testing::internal::CaptureStderr();
  auto fast = torch::compile(net, "default");
  fast(torch::randn({4, 8}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::reset_logs();
  EXPECT_THAT(err, ::testing::ContainsRegex("step lint \\(the captured graph\\) \\([0-9.]+ ms\\)"));
  EXPECT_THAT(err, ::testing::ContainsRegex("step dead-code elimination \\([0-9.]+ ms\\)"));
  EXPECT_THAT(err, ::testing::ContainsRegex("step backend default \\([0-9.]+ ms\\)"));
  EXPECT_THAT(err, ::testing::HasSubstr("compiled by onednn"));
}

// ---- products with a broadcast operand (compile/broadcast_products.h) ----------------------------

// Randomized: `mm` with one operand a single value broadcast (a 0-d or one-element tensor
// expanded, possibly transposed or reshaped on the way) equals eager's under `default`, and the
// report names the rewrite; an operand broadcast along one dimension only (a row repeated) is a
// real product and stays one.
TEST(DefaultBackend, ProductWithABroadcastOperandIsASum) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 24; ++trial) {
    const int form = trial % 4;            // how the broadcast operand is made
    const bool first = trial % 8 < 4;      // which operand it is
    const bool row_only = trial % 6 == 5;  // a row (of at least 2 values) repeated: not one value
    const int64_t M = pick(1, 40), K = pick(row_only && first ? 2 : 1, 70), N = pick(row_only && !first ? 2 : 1, 50);
    auto broadcast = [=](const torch::Tensor& s, int64_t rows, int64_t cols) {
      if (row_only) return s.expand({rows, cols});
      switch (form) {
        case 0: return s.reshape({}).expand({rows, cols});
        case 1: return s.reshape({1, 1}).expand({rows, cols});
        case 2: return s.reshape({}).expand({cols, rows}).t();
        default:
          return s.reshape({1, 1, 1}).expand({2, rows, cols + 1}).reshape({2 * rows, cols + 1}).narrow(0, 1, rows)
              .narrow(1, 1, cols);
      }
    };
    auto fn = [=](torch::Tensor s, torch::Tensor other) {
      torch::Tensor product = first ? torch::mm(broadcast(s, M, K), other) : torch::mm(other, broadcast(s, K, N));
      return torch::relu(product) + 1;
    };
    torch::Tensor s = row_only ? torch::randn({1, first ? K : N}) : torch::randn({1});
    torch::Tensor other = first ? torch::randn({K, N}) : torch::randn({M, K});
    SCOPED_TRACE("trial " + std::to_string(trial) + ": M " + std::to_string(M) + " K " + std::to_string(K) + " N " +
                 std::to_string(N) + ", form " + std::to_string(form) + (first ? ", first" : ", second") +
                 (row_only ? ", a row repeated" : ""));
    auto compiled = torch::compile(fn, "default");
    EXPECT_TRUE(tensors_close(fn(s, other), second_call(compiled, s, other), kRtol, kAtol));
    s.normal_();  // the value is read at each call, not kept from the traced one
    other.normal_();
    EXPECT_TRUE(tensors_close(fn(s, other), compiled(s, other), kRtol, kAtol));
    auto e = torchcompile::explain("default", fn, s, other);
    ASSERT_EQ(e.compiled.size(), 1u);
    EXPECT_EQ(e.compiled[0].rewrites.size(), row_only ? 0u : 1u) << e;
  }
}

// The same with size symbols (`dynamic = true`): the product's sizes are symbols of the input's
// sizes, and the rewritten graph serves every size.
TEST(DefaultBackend, ProductWithABroadcastOperandIsASumAtEverySize) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(11);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const auto options = torchcompile::CompileOptions("default").with_dynamic(true);
  for (int trial = 0; trial < 8; ++trial) {
    // first: [N, M] (one value broadcast) @ other [M, K]: host code reads M (which then stays a
    // size of the trace), K is a symbol (at least 2: a dimension of size 1 stays static);
    // else: other [M, K] @ [K, N] (one value broadcast; host code reads K): M is a symbol.
    const bool first = trial % 2 == 0;
    const int64_t K0 = pick(2, 40), N = pick(1, 30);
    auto fn = [=](torch::Tensor s, torch::Tensor other) {
      torch::Tensor product = first ? torch::mm(s.reshape({}).expand({N, other.size(0)}), other)
                                    : torch::mm(other, s.reshape({1, 1}).expand({other.size(1), N}));
      return torch::relu(product) + 1;
    };
    SCOPED_TRACE("trial " + std::to_string(trial) + ": K " + std::to_string(K0) + " N " + std::to_string(N) +
                 (first ? ", first" : ", second"));
    auto compiled = torch::compile(fn, options);
    const int64_t M0 = pick(2, 30);
    for (auto [M, K] : std::vector<std::pair<int64_t, int64_t>>{{M0, K0}, {M0, K0 + 5}, {M0 + 3, K0}, {M0 - 1, K0 + 1}}) {
      torch::Tensor s = torch::randn({1}), other = torch::randn({M, K});
      EXPECT_TRUE(tensors_close(fn(s, other), compiled(s, other), kRtol, kAtol)) << "M " << M << ", K " << K;
    }
    auto e = torchcompile::explain(options, fn, torch::randn({1}), torch::randn({M0, K0}));
    ASSERT_EQ(e.compiled.size(), 1u);
    ASSERT_EQ(e.compiled[0].rewrites.size(), 1u) << e;
    EXPECT_THAT(e.compiled[0].rewrites[0], ::testing::HasSubstr("s0")) << e;
  }
}

namespace {

// A training step with a sum() loss compiled with `options` and called at `batches`: the gradients
// are eager's at every call, and `explain` lists two rewrites matching `rewrite` (the backward of
// the last Linear multiplies by the loss's gradient broadcast, twice).
void expect_sum_loss_products_are_sums(const torchcompile::CompileOptions& options, const std::vector<int64_t>& batches,
                                       const ::testing::Matcher<const std::string&>& rewrite) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(24, 48), torch::nn::GELU(), torch::nn::Linear(48, 16));
  torch::nn::Sequential ref(torch::nn::Linear(24, 48), torch::nn::GELU(), torch::nn::Linear(48, 16));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < net->parameters().size(); ++i) ref->parameters()[i].copy_(net->parameters()[i]);
  }
  auto step = [](torch::nn::Sequential& m, const torch::Tensor& x) { return m->forward(x).sum(); };
  auto compiled = torch::compile([&](torch::Tensor x) { return step(net, x); }, options);
  for (int64_t batch : batches) {
    auto x = torch::randn({batch, 24});
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    for (auto& p : ref->parameters()) p.mutable_grad() = torch::Tensor();
    auto got = compiled(x);
    got.backward();
    auto want = step(ref, x);
    want.backward();
    EXPECT_TRUE(tensors_close(want, got, kRtol, kAtol)) << "batch " << batch;
    for (size_t i = 0; i < net->parameters().size(); ++i)
      EXPECT_TRUE(tensors_close(ref->parameters()[i].grad(), net->parameters()[i].grad(), kRtol, kAtol))
          << "batch " << batch << ", gradient " << i;
  }
  auto e = torchcompile::explain(options, [&](torch::Tensor x) { return step(net, x); }, torch::randn({batches[0], 24}));
  ASSERT_EQ(e.compiled.size(), 1u);
  EXPECT_THAT(e.compiled[0].rewrites, ::testing::ElementsAre(rewrite, rewrite)) << e;
}

}  // namespace

// Training with a sum() loss: both products become sums, and the gradients are eager's.
TEST(DefaultBackend, SumLossBackwardProductsAreSums) {
  expect_sum_loss_products_are_sums(torchcompile::CompileOptions("default"), {32, 32, 32},
                                    ::testing::HasSubstr("column sums of its second operand"));
}

// The same with `dynamic = true` over batch sizes: the products are sums in the graph with the
// batch symbol, and the gradients are eager's at every size.
TEST(DefaultBackend, SumLossBackwardProductsAreSumsAtEveryBatchSize) {
  expect_sum_loss_products_are_sums(
      torchcompile::CompileOptions("default").with_dynamic(true), {32, 40, 17, 32, 5},
      ::testing::AllOf(::testing::HasSubstr("column sums of its second operand"), ::testing::HasSubstr("s0")));
}
