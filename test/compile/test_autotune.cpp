// CompileOptions::mode "max-autotune" (src/compile/autotune.cpp): every candidate compiled and
// timed on the real inputs, the fastest kept, the choice cached in memory and on disk; graphs
// that must not run twice (training, state changes) compiled as in "default".
#include "support/test_util.h"

#include "compile/autotune.h"

#include <torchcompile/support/logging.h>
#include <torchcompile/torchcompile.h>

#include <gmock/gmock.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "examples/models.h"

namespace {

// A backend slower than any built-in: the interpreter plus 3 ms per call; counts its compiles.
std::atomic<int> slow_compiles{0};
void register_slow() {
  static bool done = [] {
    torchcompile::register_backend("autotune_test_slow", [](torchcompile::GraphModule& gm,
                                                            const std::vector<at::Tensor>&) -> torchcompile::CompiledFn {
      ++slow_compiles;
      auto fn = torchcompile::ir::interpreter_fn(gm);
      return [fn](std::vector<at::Tensor> in) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        return fn(std::move(in));
      };
    });
    return true;
  }();
  (void)done;
}

std::string compile_log(const std::function<void()>& f) {
  torchcompile::logging::set_logs("passes");
  ::testing::internal::CaptureStderr();
  f();
  std::string out = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::reset_logs();
  return out;
}

}  // namespace

TEST(Autotune, PicksAFasterBackendThanTheOneGivenAndKeepsEagersResult) {
  register_slow();
  torchcompile::compile_stage::detail::forget_autotune_choices();
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torchcompile_examples::Mlp net;
  auto x = torch::randn({64, 784});
  auto compiled = torch::compile(net, torchcompile::CompileOptions("autotune_test_slow").with_mode("max-autotune"));
  torch::Tensor y;
  const std::string log = compile_log([&] { y = tc_test::second_call(compiled, x); });
  EXPECT_TRUE(torch::allclose(y, net->forward(x), 1e-4, 1e-5));
  EXPECT_THAT(log, ::testing::HasSubstr("max-autotune: "));
  EXPECT_THAT(log, ::testing::HasSubstr("autotune_test_slow "));  // its time is listed
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("max-autotune: autotune_test_slow")));
  // The call after compiling does not sleep: the slow backend is not what runs.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) compiled(x);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(15));

  // Another compile of the same graph at the same shapes: the cached choice, the slow backend
  // is not even compiled.
  const int before = slow_compiles.load();
  auto again = torch::compile(net, torchcompile::CompileOptions("autotune_test_slow").with_mode("max-autotune"));
  const std::string log2 = compile_log([&] { again(x); });
  EXPECT_EQ(slow_compiles.load(), before);
  EXPECT_THAT(log2, ::testing::HasSubstr("chosen earlier, cached"));
  // explain() shows the choice.
  auto e = torchcompile::explain(torchcompile::CompileOptions("autotune_test_slow").with_mode("max-autotune"), net, x);
  EXPECT_THAT(tc_test::partition_of(e), ::testing::HasSubstr("max-autotune: "));
}

TEST(Autotune, ChoicesPersistInTheCacheDirectory) {
  register_slow();
  const auto dir = std::filesystem::temp_directory_path() / ("tc_autotune_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  setenv("TORCHCOMPILE_CACHE_DIR", dir.c_str(), 1);
  torchcompile::compile_stage::detail::forget_autotune_choices();
  torch::NoGradGuard no_grad;
  torchcompile_examples::Mlp net;
  auto x = torch::randn({32, 784});
  auto first = torch::compile(net, torchcompile::CompileOptions("autotune_test_slow").with_mode("max-autotune"));
  first(x);
  std::ifstream in(dir / "autotune-v1.txt");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_THAT(line, ::testing::HasSubstr("threads="));
  // As a new process would: nothing in memory, the file read, the slow backend not compiled.
  torchcompile::compile_stage::detail::forget_autotune_choices();
  const int before = slow_compiles.load();
  auto second = torch::compile(net, torchcompile::CompileOptions("autotune_test_slow").with_mode("max-autotune"));
  const std::string log = compile_log([&] { second(x); });
  EXPECT_EQ(slow_compiles.load(), before);
  EXPECT_THAT(log, ::testing::HasSubstr("chosen earlier, cached"));
  unsetenv("TORCHCOMPILE_CACHE_DIR");
  torchcompile::compile_stage::detail::forget_autotune_choices();
  std::filesystem::remove_all(dir);
}

TEST(Autotune, TrainingAndStatefulGraphsAreNotRunTwice) {
  register_slow();
  torchcompile::compile_stage::detail::forget_autotune_choices();
  torch::manual_seed(0);
  torchcompile_examples::Mlp net;
  auto x = torch::randn({16, 784});
  auto compiled = torch::compile(net, torchcompile::CompileOptions("autotune_test_slow").with_mode("max-autotune"));
  const std::string log = compile_log([&] { compiled(x).sum().backward(); });
  EXPECT_THAT(log, ::testing::HasSubstr("not tuned, it records autograd"));

  // BatchNorm in training mode updates its running statistics: running the graph to time it would
  // update them again.
  torch::NoGradGuard no_grad;
  torchcompile_examples::ConvNet conv(4, 8);
  conv->train();
  auto img = torch::randn({2, 3, 8, 8});
  auto conv_ref = torchcompile_examples::ConvNet(4, 8);
  torch::NoGradGuard g;
  for (size_t i = 0; i < conv->parameters().size(); ++i) conv_ref->parameters()[i].copy_(conv->parameters()[i]);
  auto c2 = torch::compile(conv, torchcompile::CompileOptions("default").with_mode("max-autotune"));
  const std::string log2 = compile_log([&] { c2(img); });
  conv_ref->train();
  conv_ref->forward(img);
  EXPECT_THAT(log2, ::testing::HasSubstr("not tuned, running it changes state"));
  EXPECT_TRUE(torch::allclose(conv->bn1->running_mean, conv_ref->bn1->running_mean, 1e-5, 1e-6))
      << "the running statistics were updated once, as by one eager call";
}

TEST(Autotune, ModesAreCheckedWhenCompiling) {
  torchcompile_examples::Mlp net;
  auto message = [&](const std::string& mode) {
    try {
      torch::compile(net, torchcompile::CompileOptions("default").with_mode(mode));
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("max-autotune"), "no error");
  EXPECT_EQ(message("max-autotune-no-cudagraphs"), "no error");
  EXPECT_THAT(message("reduce-overhead"), ::testing::HasSubstr("captures CUDA graphs in PyTorch"));
  EXPECT_THAT(message("fastest"), ::testing::HasSubstr("unknown mode \"fastest\"; expected \"default\""));
}
