// The debug backend prints seed 000's table for fn(x, y) and runs the graph.
#include "support/test_util.h"
#include "ir/ir_test_graphs.h"

namespace {

TEST(DebugBackend, PrintsTheSeedTableForFn) {
  auto fn = [](torch::Tensor x, torch::Tensor y) {
    auto a = torch::cos(x);
    auto b = torch::sin(y);
    return a + b;
  };
  auto fast = torch::compile(fn, torchcompile::CompileOptions("debug").with_input_names({"x", "y"}));
  auto x = torch::randn({10}), y = torch::randn({10});
  ::testing::internal::CaptureStdout();
  auto r = fast(x, y);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(tc_test::tensors_close(fn(x, y), r));
  EXPECT_THAT(out, ::testing::HasSubstr(tc_test::kSeedTable));
  // A second call replays without printing again.
  ::testing::internal::CaptureStdout();
  fast(x, y);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
}

}  // namespace
