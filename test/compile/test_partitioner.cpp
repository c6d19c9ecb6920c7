// partitioned_backend (compile/partitioner.h): registered backends composed by their claims.
#include "support/test_util.h"

#include <torchcompile/torchcompile.h>

#include <gmock/gmock.h>

#include <atomic>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using tc_test::tensors_close;

constexpr double kRtol = 1e-4, kAtol = 1e-5;

using tc_test::partition_of;
using tc_test::second_call;

// A module applying `fn` to its input.
struct FnModule : torch::nn::Module {
  std::function<torch::Tensor(FnModule&, torch::Tensor)> fn;
  torch::Tensor forward(torch::Tensor x) { return fn(*this, x); }
};

}  // namespace

// A user's backend composed with fused by its claim (the snippet of docs/backends-and-plugins.md): it gets the mm parts,
// fused the pointwise runs; its decline reason for a part shows in the partition.
TEST(PartitionedBackend, ComposesAUsersBackendByItsClaim) {
  if (!torchcompile::has_backend("fused")) GTEST_SKIP() << "fused is not in this build";
  torch::NoGradGuard no_grad;
  auto seen = std::make_shared<std::atomic<int>>(0);
  torchcompile::register_backend("test_mm_only", [seen](torchcompile::GraphModule& gm, const std::vector<at::Tensor>&) {
    ++*seen;
    if (gm.graph().nodes().size() > 100) return torchcompile::decline("too big");
    return torchcompile::CompiledFn(torchcompile::ir::interpreter_fn(gm));
  });
  torchcompile::register_claim("test_mm_only", torchcompile::claim_if([](const torchcompile::ir::Node& n) {
    return n.target() == "aten::mm";
  }));
  torchcompile::register_backend("test_mm_fused", torchcompile::partitioned_backend(
      {torchcompile::partition_backend("test_mm_only"), torchcompile::partition_backend("fused")}));
  auto fn = [](torch::Tensor x, torch::Tensor w) { return torch::tanh(torch::mm(torch::relu(x * 2), w)) + 1; };
  auto x = torch::randn({8, 16}), w = torch::randn({16, 4});
  auto e = torchcompile::explain("test_mm_fused", fn, x, w);
  EXPECT_EQ(e.compiled[0].backend, "test_mm_fused");
  EXPECT_EQ(e.compiled[0].partition.size(), 2u) << e;  // the two fused parts; the mm part reports nothing
  EXPECT_NE(partition_of(e).find("fused: mul+relu"), std::string::npos) << e;
  EXPECT_NE(partition_of(e).find("fused: tanh+add"), std::string::npos) << e;
  EXPECT_EQ(seen->load(), 1);
  auto compiled = torch::compile(fn, "test_mm_fused");
  EXPECT_TRUE(tensors_close(fn(x, w), second_call(compiled, x, w), kRtol, kAtol));
  EXPECT_THAT(tc_test::error_of([] { torchcompile::partition_backend("eager"); }),
              ::testing::HasSubstr("backend 'eager' has no claim"));
}

// While a part compiles, graph_weight_bytes() gives the weights of the whole graph (every
// floating-point attribute it reads), not those of the part; outside a partitioned compile a
// graph module gives its own (an empty one 0).
TEST(PartitionedBackend, PartsSeeTheWholeGraphsWeightBytes) {
  if (!torchcompile::has_backend("fused")) GTEST_SKIP() << "fused is not in this build";
  torch::NoGradGuard no_grad;
  struct Seen {
    std::vector<int64_t> during, own;
    std::vector<std::shared_ptr<torchcompile::GraphModule>> parts;
  };
  auto seen = std::make_shared<Seen>();
  torchcompile::register_backend("test_linear_weights", [seen](torchcompile::GraphModule& gm,
                                                               const std::vector<at::Tensor>&) {
    seen->during.push_back(torchcompile::graph_weight_bytes(gm));
    int64_t own = 0;
    for (const auto& [name, attr] : gm.attributes()) own += static_cast<int64_t>(attr.first.nbytes());
    seen->own.push_back(own);
    return torchcompile::CompiledFn(torchcompile::ir::interpreter_fn(gm));
  });
  torchcompile::register_claim("test_linear_weights", torchcompile::claim_if([](const torchcompile::ir::Node& n) {
    return n.target() == "aten::addmm" || n.target() == "aten::t";
  }));
  torchcompile::register_backend("test_linear_fused", torchcompile::partitioned_backend(
      {torchcompile::partition_backend("test_linear_weights"), torchcompile::partition_backend("fused")}));
  torch::nn::Linear a(16, 32), b(32, 8);
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({32}));
  auto m = std::make_shared<FnModule>();
  m->register_module("a", a);
  m->register_module("b", b);
  m->register_module("norm", norm);
  m->fn = [a, b, norm](FnModule&, torch::Tensor x) mutable {
    return b->forward(torch::tanh(norm->forward(a->forward(x)) * 2));
  };
  int64_t all = 0;
  for (const auto& p : m->parameters()) all += static_cast<int64_t>(p.nbytes());
  auto compiled = torch::compile(m, torchcompile::CompileOptions("test_linear_fused"));
  torch::Tensor x = torch::randn({4, 16});
  EXPECT_TRUE(tensors_close(m->forward(x), compiled(x), kRtol, kAtol));
  ASSERT_EQ(seen->during.size(), 2u);  // the two Linear parts (t and addmm)
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(seen->during[i], all) << "part " << i;
    EXPECT_LT(seen->own[i], all) << "part " << i;
  }
  torchcompile::GraphModule alone;
  EXPECT_EQ(torchcompile::graph_weight_bytes(alone), 0);
}
