// Fallback chains (compile/chain.h): each backend of a chain is tried in order, every answer is
// recorded, and a chain where every backend declines or fails runs the graph with the interpreter.
#include "support/test_util.h"

#include <torchcompile/torchcompile.h>

#include <gmock/gmock.h>

#include <atomic>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using tc_test::cos_graph;
using torchcompile::Backend;
using torchcompile::CompiledFn;
using torchcompile::GraphModule;

using tc_test::counting_backend;

}  // namespace

TEST(FallbackChain, SkipsThrowingAndDecliningBackends) {
  std::vector<std::string> tried;
  torchcompile::register_backend("reg_test_fc_throws", [&](GraphModule&, const std::vector<at::Tensor>&) -> CompiledFn {
    tried.push_back("throws");
    throw std::runtime_error("cannot compile this");
  });
  torchcompile::register_backend("reg_test_fc_declines", [&](GraphModule&, const std::vector<at::Tensor>&) -> CompiledFn {
    tried.push_back("declines");
    return {};
  });
  auto count = std::make_shared<std::atomic<int>>(0);
  torchcompile::register_backend("reg_test_fc_works", counting_backend(count));

  auto x = torch::randn({3, 2});
  auto gm = cos_graph(x);
  Backend chain = torchcompile::fallback_chain({"reg_test_fc_throws", "reg_test_fc_declines", "reg_test_fc_works"});
  CompiledFn fn = chain(*gm, {x});
  ASSERT_TRUE(fn);
  EXPECT_EQ(tried, (std::vector<std::string>{"throws", "declines"}));
  EXPECT_EQ(count->load(), 1);
  auto out = fn({x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(tc_test::tensors_close(x.cos(), out[0]));
}

TEST(FallbackChain, EndsInInterpreter) {
  int throws = 0, declines = 0;
  torchcompile::register_backend("reg_test_fc2_throws", [&](GraphModule&, const std::vector<at::Tensor>&) -> CompiledFn {
    ++throws;
    TORCH_CHECK(false, "this backend always fails");
  });
  torchcompile::register_backend("reg_test_fc2_declines", [&](GraphModule&, const std::vector<at::Tensor>&) -> CompiledFn {
    ++declines;
    return {};
  });

  auto x = torch::randn({5});
  auto gm = cos_graph(x);
  // An unknown name in the chain is just another failing backend.
  Backend chain = torchcompile::fallback_chain({"reg_test_fc2_throws", "reg_test_fc_no_such", "reg_test_fc2_declines"});
  CompiledFn fn = chain(*gm, {x});
  ASSERT_TRUE(fn);
  EXPECT_EQ(throws, 1);
  EXPECT_EQ(declines, 1);
  auto out = fn({x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(tc_test::tensors_close(x.cos(), out[0]));

  // An empty chain runs the graph with the interpreter too.
  CompiledFn plain = torchcompile::fallback_chain({})(*gm, {x});
  ASSERT_TRUE(plain);
  EXPECT_TRUE(tc_test::tensors_close(x.cos(), plain({x}).at(0)));
}

TEST(FallbackChain, ReachesTheNextBackendOnlyForDeclinedGraphs) {
  if (!torchcompile::has_backend("onednn")) GTEST_SKIP() << "onednn is not in this build";
  torch::NoGradGuard no_grad;
  auto reached = std::make_shared<std::atomic<int>>(0);
  torchcompile::register_backend("onednn_test_next", [reached](torchcompile::GraphModule& gm, const std::vector<at::Tensor>&) {
    ++*reached;
    return torchcompile::CompiledFn([&gm](std::vector<at::Tensor> in) { return gm.forward(std::move(in)); });
  });
  auto chain = torchcompile::fallback_chain({"onednn", "onednn_test_next"});
  // Pure pointwise: oneDNN has nothing to fuse and declines, so the next backend compiles it.
  auto pointwise = [](torch::Tensor x) { return (x * 2).sin() + 1; };
  auto x = torch::randn({8, 8});
  auto e = torchcompile::explain(chain, pointwise, x);
  EXPECT_EQ(reached->load(), 1);
  ASSERT_EQ(e.compiled.size(), 1u);
  EXPECT_EQ(e.compiled[0].backend, "onednn_test_next");
  ASSERT_EQ(e.compiled[0].attempts.size(), 2u);
  EXPECT_EQ(e.compiled[0].attempts[0].backend, "onednn");
  EXPECT_EQ(e.compiled[0].attempts[0].outcome, torchcompile::BackendAttempt::Outcome::Declined);
  EXPECT_EQ(e.compiled[0].attempts[0].reason, "nothing to fuse");
  // A GEMM: oneDNN compiles it and the next backend is never asked.
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU());
  auto e2 = torchcompile::explain(chain, net, x);
  EXPECT_EQ(reached->load(), 1);
  ASSERT_EQ(e2.compiled.size(), 1u);
  EXPECT_EQ(e2.compiled[0].backend, "onednn");
  EXPECT_THAT(e2.compiled[0].partition, ::testing::Contains("onednn: linear+bias+relu"));
}
