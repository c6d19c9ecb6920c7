// Backend plugins: loading by path and through TORCHCOMPILE_BACKEND_PATH, and the loader's
// error for each kind of bad plugin (each names the file and the specific reason).
#include "support/test_util.h"

#include <torchcompile/backends/registry.h>
#include <torchcompile/support/logging.h>
#include <torchcompile/torchcompile.h>
#include <torchcompile/ir/graph.h>
#include <torchcompile/ir/graph_module.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using tc_test::error_of;
using tc_test::ScopedEnv;
using tc_test::cos_graph;

using ::testing::HasSubstr;
using torchcompile::CompiledFn;
using torchcompile::GraphModule;

std::string dir_of(const std::string& path) { return std::filesystem::path(path).parent_path().string(); }

}  // namespace

#ifdef TORCHCOMPILE_EXAMPLE_PLUGIN

TEST(Plugin, LoadByPathThenLookup) {
  const std::string path = TORCHCOMPILE_EXAMPLE_PLUGIN;
  EXPECT_EQ(torchcompile::load_backend_library(path), std::vector<std::string>{"example"});
  ASSERT_TRUE(torchcompile::has_backend("example"));

  auto x = torch::randn({2, 3});
  auto gm = cos_graph(x);
  ::testing::internal::CaptureStderr();
  CompiledFn fn = torchcompile::lookup_backend("example")(*gm, {x});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("[example backend] compiling graph #"));
  EXPECT_THAT(log, HasSubstr("with 3 nodes and 1 inputs"));
  ASSERT_TRUE(fn);
  auto out = fn({x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(tc_test::tensors_close(x.cos(), out[0]));
}

TEST(Plugin, LoadingTheSameFileTwiceIsANoOp) {
  const std::string path = TORCHCOMPILE_EXAMPLE_PLUGIN;
  const auto first = torchcompile::load_backend_library(path);
  EXPECT_EQ(first, std::vector<std::string>{"example"});
  EXPECT_EQ(torchcompile::load_backend_library(path), first);
  // Another spelling of the same file.
  const std::string other = dir_of(path) + "/./" + std::filesystem::path(path).filename().string();
  EXPECT_EQ(torchcompile::load_backend_library(other), first);
}

TEST(Plugin, CompileWithPluginBackend) {
  torchcompile::load_backend_library(TORCHCOMPILE_EXAMPLE_PLUGIN);
  auto f = torch::compile([](torch::Tensor a, torch::Tensor b) { return a.cos() + b.sin(); }, "example");
  auto a = torch::randn({4}), b = torch::randn({4});
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(tc_test::tensors_close(a.cos() + b.sin(), f(a, b)));
  EXPECT_TRUE(tc_test::tensors_close(a.cos() + b.sin(), f(a, b)));  // replayed
  const std::string log = ::testing::internal::GetCapturedStderr();
  // Two calls, one compile.
  const auto first = log.find("[example backend] compiling graph");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("[example backend] compiling graph", first + 1), std::string::npos) << log;
}

// A graph without operators (a forward returning its input, a segment before a graph break that
// only reads) is not given to the backend, as torch.compile skips a graph without calls.
TEST(Plugin, AGraphWithoutOperatorsIsNotGivenToTheBackend) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  torchcompile::register_backend("count_graphs_without_ops", [calls](torchcompile::GraphModule& gm,
                                                                     const std::vector<at::Tensor>&) {
    ++*calls;
    return torchcompile::CompiledFn([&gm](std::vector<at::Tensor> in) { return gm.forward(std::move(in)); });
  });
  auto a = torch::randn({4});
  auto identity = torch::compile([](torch::Tensor x) { return x; }, "count_graphs_without_ops");
  EXPECT_TRUE(identity(a).is_same(a));
  EXPECT_EQ(calls->load(), 0);
  auto e = torchcompile::explain("count_graphs_without_ops", [](torch::Tensor x) { return x; }, a);
  ASSERT_EQ(e.compiled.size(), 1u);
  EXPECT_EQ(e.compiled[0].backend, "interpreter");
  EXPECT_TRUE(e.compiled[0].attempts.empty());
  // Reads before a graph break, then operators: the backend gets the second segment only.
  auto reads_first = [](torch::Tensor x) { return torch::equal(x, x) ? x.cos() : x.sin(); };
  auto fast = torch::compile(reads_first, "count_graphs_without_ops");
  EXPECT_TRUE(tc_test::tensors_equal(fast(a), a.cos()));
  EXPECT_EQ(calls->load(), 1);
}

TEST(Plugin, DeclineReasonReachesExplainAndTheLogs) {
  torchcompile::load_backend_library(TORCHCOMPILE_EXAMPLE_PLUGIN);
  // A graph with an integer input: the example backend declines it, with its reason.
  auto twice = [](torch::Tensor a) { return a * 2; };
  auto a = torch::randint(0, 9, {4});
  auto e = torchcompile::explain("example", twice, a);
  ASSERT_EQ(e.compiled.size(), 1u);
  EXPECT_EQ(e.compiled[0].backend, "interpreter");
  ASSERT_EQ(e.compiled[0].attempts.size(), 1u);
  EXPECT_EQ(e.compiled[0].attempts[0].backend, "example");
  EXPECT_EQ(e.compiled[0].attempts[0].outcome, torchcompile::BackendAttempt::Outcome::Declined);
  EXPECT_EQ(e.compiled[0].attempts[0].reason, "it takes float32 inputs only");
  std::ostringstream printed;
  printed << e;
  EXPECT_THAT(printed.str(), HasSubstr("Graph 1: run by the interpreter"));
  EXPECT_THAT(printed.str(), HasSubstr("declined by example: it takes float32 inputs only"));

  torchcompile::logging::set_logs("passes");
  ::testing::internal::CaptureStderr();
  auto f = torch::compile(twice, "example");
  EXPECT_TRUE(tc_test::tensors_equal(a * 2, f(a)));
  const std::string log = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::reset_logs();
  EXPECT_THAT(log, HasSubstr("declined by example: it takes float32 inputs only")) << log;

  // A graph with operators is compiled by it, and explain says so.
  auto e2 = torchcompile::explain("example", [](torch::Tensor x) { return x.cos(); }, torch::randn({4}));
  ASSERT_EQ(e2.compiled.size(), 1u);
  EXPECT_EQ(e2.compiled[0].backend, "example");
}

#endif  // TORCHCOMPILE_EXAMPLE_PLUGIN

TEST(Plugin, FoundThroughSearchPath) {
  // Only this test loads "example2", which lives alone in its directory.
  ScopedEnv env("TORCHCOMPILE_BACKEND_PATH", std::string("/nonexistent/dir::") + TORCHCOMPILE_EXAMPLE2_PLUGIN_DIR);
  auto x = torch::randn({3});
  auto gm = cos_graph(x);
  ::testing::internal::CaptureStderr();
  CompiledFn fn = torchcompile::lookup_backend("example2")(*gm, {x});
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("[example2 backend] compiling graph"));
  ASSERT_TRUE(fn);
  EXPECT_TRUE(tc_test::tensors_close(x.cos(), fn({x}).at(0)));
  EXPECT_TRUE(torchcompile::has_backend("example2"));
  const auto names = torchcompile::list_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "example2"), names.end());
}

TEST(Plugin, SearchPathNameStillUnknown) {
  ScopedEnv env("TORCHCOMPILE_BACKEND_PATH", TORCHCOMPILE_EXAMPLE2_PLUGIN_DIR);
  const std::string msg = error_of([] { torchcompile::lookup_backend("plugin_test_absent"); });
  EXPECT_THAT(msg, HasSubstr("unknown backend 'plugin_test_absent'"));
  EXPECT_THAT(msg, HasSubstr(std::string("searched TORCHCOMPILE_BACKEND_PATH: ") + TORCHCOMPILE_EXAMPLE2_PLUGIN_DIR));
}

TEST(Plugin, MissingFile) {
  const std::string path = "/nonexistent/libtorchcompile_backend_missing.so";
  const std::string msg = error_of([&] { torchcompile::load_backend_library(path); });
  EXPECT_THAT(msg, HasSubstr("cannot load backend plugin '" + path + "'"));
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));  // from dlerror()
}

TEST(Plugin, NotASharedLibrary) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tc_not_a_plugin_" + std::to_string(getpid()) + ".so")).string();
  { std::ofstream(path) << "this is not an ELF file\n"; }
  const std::string msg = error_of([&] { torchcompile::load_backend_library(path); });
  std::filesystem::remove(path);
  EXPECT_THAT(msg, HasSubstr("cannot load backend plugin '" + path + "'"));
  EXPECT_THAT(msg, HasSubstr("tc_not_a_plugin_"));
}

TEST(Plugin, MissingRegisterSymbol) {
  const std::string path = TORCHCOMPILE_BAD_PLUGIN_NO_REGISTER;
  const std::string msg = error_of([&] { torchcompile::load_backend_library(path); });
  EXPECT_THAT(msg, HasSubstr("backend plugin '" + path + "'"));
  EXPECT_THAT(msg, HasSubstr("does not export the symbol '" TORCHCOMPILE_PLUGIN_REGISTER_SYMBOL "'"));
  EXPECT_THAT(msg, HasSubstr("undefined symbol: " TORCHCOMPILE_PLUGIN_REGISTER_SYMBOL));  // from dlerror()
}

TEST(Plugin, WrongAbiVersion) {
  const std::string path = TORCHCOMPILE_BAD_PLUGIN_ABI;
  const std::string msg = error_of([&] { torchcompile::load_backend_library(path); });
  EXPECT_THAT(msg, HasSubstr("backend plugin '" + path + "'"));
  EXPECT_THAT(msg, HasSubstr("built for plugin ABI version 9999"));
  EXPECT_THAT(msg, HasSubstr("expects ABI version " + std::to_string(torchcompile::kPluginAbiVersion)));
}

TEST(Plugin, BadPluginOnSearchPathReportsItsError) {
  // lookup_backend("bad_abi") finds libtorchcompile_backend_bad_abi.so; its load error is more
  // useful than "unknown backend", so it is what the caller sees.
  const std::string path = TORCHCOMPILE_BAD_PLUGIN_ABI;
  ScopedEnv env("TORCHCOMPILE_BACKEND_PATH", dir_of(path));
  const std::string msg = error_of([] { torchcompile::lookup_backend("bad_abi"); });
  EXPECT_THAT(msg, HasSubstr("libtorchcompile_backend_bad_abi.so"));
  EXPECT_THAT(msg, HasSubstr("built for plugin ABI version 9999"));
}

TEST(Plugin, DuplicateNameRegistersNothing) {
  const std::string path = TORCHCOMPILE_BAD_PLUGIN_DUPLICATE;
  const std::string msg = error_of([&] { torchcompile::load_backend_library(path); });
  EXPECT_THAT(msg, HasSubstr("backend plugin '" + path + "'"));
  EXPECT_THAT(msg, HasSubstr("registers backend 'eager', which is already registered (built-in)"));
  // Its other backend was not half-registered, and a second attempt fails the same way.
  EXPECT_FALSE(torchcompile::has_backend("bad_dup_ok"));
  EXPECT_THAT(error_of([&] { torchcompile::load_backend_library(path); }),
              HasSubstr("registers backend 'eager', which is already registered"));
  EXPECT_FALSE(torchcompile::has_backend("bad_dup_ok"));
}
