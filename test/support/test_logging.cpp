// TORCHCOMPILE_LOGS: parsing, set_logs() overriding the environment, and what log() prints.
#include "support/test_util.h"

#include <gmock/gmock.h>

#include <torchcompile/support/logging.h>

#include <thread>

namespace tcl = torchcompile::logging;
using tcl::LogKind;
using ::testing::HasSubstr;

namespace {

uint32_t bits(std::initializer_list<LogKind> kinds) {
  uint32_t m = 0;
  for (LogKind k : kinds) m |= static_cast<uint32_t>(k);
  return m;
}

// Restores the environment-driven state after each test.
struct Logging : ::testing::Test {
  void TearDown() override {
    tcl::set_logs("");
    tcl::reset_logs();
  }
};

TEST_F(Logging, ParsesCommaListsAllAndPlusNames) {
  EXPECT_EQ(tcl::parse_log_spec(""), 0u);
  EXPECT_EQ(tcl::parse_log_spec("recompiles"), bits({LogKind::Recompiles}));
  EXPECT_EQ(tcl::parse_log_spec("recompiles,guards,graph,graph_breaks"),
            bits({LogKind::Recompiles, LogKind::Guards, LogKind::Graph, LogKind::GraphBreaks}));
  EXPECT_EQ(tcl::parse_log_spec(" graph , graph_breaks ,"), bits({LogKind::Graph, LogKind::GraphBreaks}));
  EXPECT_EQ(tcl::parse_log_spec("+guards"), bits({LogKind::Guards}));
  EXPECT_EQ(tcl::parse_log_spec("all"), tcl::parse_log_spec("recompiles,guards,graph,graph_breaks,passes,dynamic"));
  EXPECT_EQ(tcl::parse_log_spec("+all"), tcl::parse_log_spec("all"));
  // "graph" is not a prefix match of "graph_breaks" and vice versa.
  EXPECT_EQ(tcl::parse_log_spec("graph"), bits({LogKind::Graph}));
}

TEST_F(Logging, UnknownNamesAreReportedAndIgnored) {
  std::vector<std::string> unknown;
  EXPECT_EQ(tcl::parse_log_spec("recompiles,dynamo,Guards", &unknown), bits({LogKind::Recompiles}));
  EXPECT_EQ(unknown, (std::vector<std::string>{"dynamo", "Guards"}));
  EXPECT_EQ(tcl::valid_log_names(), "recompiles, guards, graph, graph_breaks, passes, dynamic, all");
}

TEST_F(Logging, SetLogsOverridesAndResetRereadsTheEnvironment) {
  tc_test::ScopedEnv env("TORCHCOMPILE_LOGS", "guards");
  tcl::reset_logs();
  EXPECT_TRUE(tcl::log_enabled(LogKind::Guards));
  EXPECT_FALSE(tcl::log_enabled(LogKind::Recompiles));

  tcl::set_logs("recompiles,graph");
  EXPECT_TRUE(tcl::log_enabled(LogKind::Recompiles));
  EXPECT_TRUE(tcl::log_enabled(LogKind::Graph));
  EXPECT_FALSE(tcl::log_enabled(LogKind::Guards));
  EXPECT_FALSE(tcl::log_enabled(LogKind::GraphBreaks));

  tcl::set_logs("");
  for (LogKind k : {LogKind::Recompiles, LogKind::Guards, LogKind::Graph, LogKind::GraphBreaks})
    EXPECT_FALSE(tcl::log_enabled(k)) << tcl::log_kind_name(k);

  tcl::reset_logs();  // back to the environment
  EXPECT_TRUE(tcl::log_enabled(LogKind::Guards));
}

TEST_F(Logging, OffWithoutTheVariable) {
  tc_test::ScopedEnv env("TORCHCOMPILE_LOGS", nullptr);
  tcl::reset_logs();
  for (LogKind k : {LogKind::Recompiles, LogKind::Guards, LogKind::Graph, LogKind::GraphBreaks})
    EXPECT_FALSE(tcl::log_enabled(k)) << tcl::log_kind_name(k);
}

TEST_F(Logging, UnknownNamesInTheEnvironmentWarnOnceListingValidNames) {
  tc_test::ScopedEnv env("TORCHCOMPILE_LOGS", "recompiles,bogus");
  ::testing::internal::CaptureStderr();
  tcl::reset_logs();
  EXPECT_TRUE(tcl::log_enabled(LogKind::Recompiles));  // reads the variable
  EXPECT_TRUE(tcl::log_enabled(LogKind::Recompiles));  // does not read it again
  EXPECT_FALSE(tcl::log_enabled(LogKind::Graph));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err,
            "[torchcompile] warning: TORCHCOMPILE_LOGS: unknown log name 'bogus' ignored; valid names: recompiles, "
            "guards, graph, graph_breaks, passes, dynamic, all\n");
}

TEST_F(Logging, LogWritesPrefixedBlocksToStderr) {
  ::testing::internal::CaptureStderr();
  tcl::log(LogKind::Recompiles, "tensor 'x' size mismatch at index 0: expected 64, got 32");
  tcl::log(LogKind::Graph, "graph():\n    %x : [#users=1] = placeholder[target=x]\n");
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out,
            "[torchcompile:recompiles] tensor 'x' size mismatch at index 0: expected 64, got 32\n"
            "[torchcompile:graph] graph():\n    %x : [#users=1] = placeholder[target=x]\n");
}

TEST_F(Logging, MacroEvaluatesItsMessageOnlyWhenEnabled) {
  int evaluated = 0;
  auto message = [&] {
    ++evaluated;
    return std::string("hello");
  };
  tcl::set_logs("guards");
  ::testing::internal::CaptureStderr();
  TORCHCOMPILE_LOG(LogKind::Recompiles, message());
  TORCHCOMPILE_LOG(LogKind::Guards, message(), " ", 42);
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(out, "[torchcompile:guards] hello 42\n");
}

TEST_F(Logging, ConcurrentMessagesDoNotInterleave) {
  tcl::set_logs("all");
  ::testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 50; ++i) TORCHCOMPILE_LOG(LogKind::GraphBreaks, "thread ", t, " line ", i, "\nsecond line");
    });
  for (auto& th : threads) th.join();
  const std::string out = ::testing::internal::GetCapturedStderr();
  std::istringstream is(out);
  std::string first, second;
  int blocks = 0;
  while (std::getline(is, first)) {
    ASSERT_TRUE(std::getline(is, second));
    EXPECT_THAT(first, ::testing::StartsWith("[torchcompile:graph_breaks] thread "));
    EXPECT_EQ(second, "second line");
    ++blocks;
  }
  EXPECT_EQ(blocks, 200);
}

}  // namespace
