// partitioned_backend (compile/partitioner.h): registered backends composed by their claims.
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

using tc_test::tensors_close;

constexpr double kRtol = 1e-4, kAtol = 1e-5;

using tc_test::partition_of;
using tc_test::second_call;

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
