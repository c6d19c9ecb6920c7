// The debug backend prints seed 000's table for fn(x, y) and runs the graph.
#include "support/test_util.h"

namespace {

// Trailing blanks are not part of the layout.
std::string rstrip_lines(const std::string& s) {
  std::string out, line;
  std::istringstream is(s);
  while (std::getline(is, line)) {
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  return out;
}

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
  // FX layout (tabulate "simple"): column width = max(cells, header + 2), two spaces between.
  const std::string expected =
      "opcode         name    target            args        kwargs\n"
      "-------------  ------  ----------------  ----------  --------\n"
      "placeholder    x       x                 ()          {}\n"
      "placeholder    y       y                 ()          {}\n"
      "call_function  cos     aten.cos.default  (x,)        {}\n"
      "call_function  sin     aten.sin.default  (y,)        {}\n"
      "call_function  add     aten.add.Tensor   (cos, sin)  {}\n"
      "output         output  output            ((add,),)   {}\n";
  EXPECT_THAT(rstrip_lines(out), ::testing::HasSubstr(expected)) << out;
  // A second call replays without printing again.
  ::testing::internal::CaptureStdout();
  fast(x, y);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
}

}  // namespace
