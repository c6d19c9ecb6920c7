// The `default` backend (src/compile/default_backend.cpp): oneDNN for GEMMs and convolutions with
// their post-ops, fused for pointwise runs, the interpreter for the rest, AOT autograd for graphs
// that record autograd; and the pipeline's log of its steps.
#include "support/test_util.h"

#include <torchcompile/torchcompile.h>

#include <gmock/gmock.h>

#include <atomic>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
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
