// Graph breaks: a data-dependent host read splits the trace; calls run segment by segment and
// take the branch keyed by the value read; a new value retraces without repeating the prefix.
#include "support/test_util.h"

#include <torchcompile/support/logging.h>

using tc_test::CompileCounter;
using tc_test::tensors_close;
using tc_test::tensors_equal;

namespace {

// Seed 000's toy_example, as the issue writes it in C++: the float is compared on the host.
torch::Tensor toy_example(torch::Tensor a, torch::Tensor b) {
  auto x = a / (torch::abs(a) + 1);
  if (b.sum().item<float>() < 0) b = b * -1;
  return x * b;
}

TEST(GraphBreaks, ToyExampleGivesThreeGraphsAndMatchesEager) {
  CompileCounter cc;
  auto fast = torch::compile(&toy_example, torchcompile::CompileOptions(cc.backend()).with_input_names({"a", "b"}));
  torch::manual_seed(3);
  bool saw_negative = false, saw_positive = false;
  for (int i = 0; i < 100; ++i) {
    auto a = torch::randn({10}), b = torch::randn({10});
    (b.sum().item<float>() < 0 ? saw_negative : saw_positive) = true;
    ASSERT_TRUE(tensors_close(toy_example(a, b), fast(a, b))) << "call " << i;
  }
  ASSERT_TRUE(saw_negative && saw_positive);
  EXPECT_EQ(cc.frames(), 3) << "one prefix graph and one graph per side of the branch";
  ASSERT_EQ(cc.state->tabulars.size(), 3u);
  // The prefix: abs, add, div, sum, returning the division and the sum that is read.
  EXPECT_THAT(cc.state->tabulars[0], ::testing::HasSubstr("aten.abs.default"));
  EXPECT_THAT(cc.state->tabulars[0], ::testing::HasSubstr("aten.div.Tensor"));
  EXPECT_THAT(cc.state->tabulars[0], ::testing::HasSubstr("aten.sum.default"));
  EXPECT_EQ(cc.state->op_counts[0], 4u);
  // The two continuations: x * (b * -1), and x * b.
  std::vector<size_t> continuation_ops{cc.state->op_counts[1], cc.state->op_counts[2]};
  std::sort(continuation_ops.begin(), continuation_ops.end());
  EXPECT_EQ(continuation_ops, (std::vector<size_t>{1, 2}));
  auto entry = fast.state().entries().front();
  EXPECT_EQ(entry->num_graphs(), 3u);
  EXPECT_EQ(entry->num_breaks(), 1u);
}

TEST(GraphBreaks, KnownBranchValuesDoNotRunTheForward) {
  int forward_runs = 0;
  auto fn = [&forward_runs](torch::Tensor a) {
    ++forward_runs;
    auto s = a.sum();
    if ((s < 0).item<bool>()) return a.neg() * 2;
    return a.exp();
  };
  CompileCounter cc;
  auto fast = torch::compile(fn, cc.backend());
  auto pos = torch::rand({5}) + 0.1, neg = -torch::rand({5}) - 0.1;
  fast(pos);  // traces the prefix and the positive branch
  fast(neg);  // replays the prefix, retraces the negative branch
  EXPECT_EQ(forward_runs, 2);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(tensors_close(neg.neg() * 2, fast(neg)));
    EXPECT_TRUE(tensors_close(pos.exp(), fast(pos)));
  }
  EXPECT_EQ(forward_runs, 2) << "both branch values are known: the forward does not run again";
  EXPECT_EQ(cc.frames(), 3);
}

TEST(GraphBreaks, FullgraphErrorNamesTheOp) {
  auto fast = torch::compile(&toy_example, torchcompile::CompileOptions("eager").with_fullgraph());
  try {
    fast(torch::randn({10}), torch::randn({10}));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("fullgraph=true"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("aten::item"));
  }
}

// The prefix mutates buffers (BatchNorm in training) and draws random numbers (dropout): a
// retrace of a new branch must not do either a second time.
struct PrefixWithState : torch::nn::Module {
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
  PrefixWithState() {
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
    drop = register_module("drop", torch::nn::Dropout(0.3));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = drop->forward(bn->forward(x));
    if (h.mean().item<double>() > 0) return h.relu() * 3;
    return h.sigmoid();
  }
};

TEST(GraphBreaks, PrefixSideEffectsHappenOncePerCall) {
  torch::manual_seed(0);
  auto compiled_model = std::make_shared<PrefixWithState>();
  auto eager_model = std::make_shared<PrefixWithState>();
  auto fast = torch::compile(compiled_model, "eager");
  torch::manual_seed(11);
  std::vector<torch::Tensor> inputs;
  for (int i = 0; i < 30; ++i) inputs.push_back(torch::randn({8, 4}) + (i % 3 == 0 ? 1.0 : -1.0) * torch::rand({1}));
  for (int i = 0; i < 30; ++i) {
    torch::manual_seed(100 + i);
    auto expected = eager_model->forward(inputs[i]);
    auto eager_next = torch::rand({2});
    torch::manual_seed(100 + i);
    auto actual = fast(inputs[i]);
    auto compiled_next = torch::rand({2});
    ASSERT_TRUE(tensors_equal(expected, actual)) << "call " << i;
    ASSERT_TRUE(tensors_equal(eager_next, compiled_next)) << "RNG state after call " << i;
  }
  EXPECT_TRUE(tensors_equal(eager_model->bn->running_mean, compiled_model->bn->running_mean));
  EXPECT_TRUE(tensors_equal(eager_model->bn->running_var, compiled_model->bn->running_var));
  EXPECT_EQ(compiled_model->bn->num_batches_tracked.item<int64_t>(), 30);
  EXPECT_EQ(fast.state().entries().front()->num_graphs(), 3u);
}

TEST(GraphBreaks, AFloatUsedAsANumberStopsAtTheBranchLimit) {
  CompileCounter cc;
  auto fn = [](torch::Tensor a) { return a * a.max().item<double>(); };
  auto fast = torch::compile(fn, torchcompile::CompileOptions(cc.backend()).with_cache_size_limit(3));
  for (int i = 0; i < 20; ++i) {
    auto a = torch::randn({6});
    ASSERT_TRUE(tensors_close(fn(a), fast(a)));
  }
  EXPECT_EQ(cc.frames(), 1 + 3) << "the prefix and at most cache_size_limit continuations";
}

TEST(GraphBreaks, SeveralBreaksInOneForward) {
  auto fn = [](torch::Tensor a) {
    auto r = a;
    for (int i = 0; i < 3; ++i) {
      if (r.sum().item<double>() > 0) {
        r = r - 1;
      } else {
        r = r * -2;
      }
    }
    return r;
  };
  CompileCounter cc;
  auto fast = torch::compile(fn, cc.backend());
  torch::manual_seed(5);
  for (int i = 0; i < 40; ++i) {
    auto a = torch::randn({4}) * 3;
    ASSERT_TRUE(tensors_close(fn(a), fast(a))) << "call " << i;
  }
  auto entry = fast.state().entries().front();
  EXPECT_GE(entry->num_breaks(), 3u);
}

}  // namespace

namespace {

TEST(GraphBreaks, LogsShowBreaksGraphsAndRecompiles) {
  torchcompile::logging::set_logs("graph_breaks,recompiles,graph,guards");
  auto fast = torch::compile(&toy_example, "eager");
  ::testing::internal::CaptureStderr();
  fast(torch::ones({10}), torch::ones({10}));
  fast(torch::ones({10}), -torch::ones({10}));
  fast(torch::ones({12}), torch::ones({12}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::reset_logs();
  EXPECT_THAT(err, ::testing::HasSubstr("[torchcompile:graph_breaks]"));
  EXPECT_THAT(err, ::testing::HasSubstr("graph break: data-dependent host read aten::item returned 10"));
  EXPECT_THAT(err, ::testing::HasSubstr("[torchcompile:graph]"));
  EXPECT_THAT(err, ::testing::HasSubstr("aten::abs"));
  EXPECT_THAT(err, ::testing::HasSubstr("[torchcompile:recompiles]"));
  EXPECT_THAT(err, ::testing::HasSubstr("tensor 'arg0' size mismatch at index 0: expected 10, got 12"));
  EXPECT_THAT(err, ::testing::HasSubstr("[torchcompile:guards]"));
}

}  // namespace

namespace {

TEST(Explain, ReportsGraphsBreaksOpsAndGuards) {
  auto e = torchcompile::explain(&toy_example, torch::ones({10}), -torch::ones({10}));
  std::ostringstream os;
  os << e;
  const std::string printed = os.str();
  EXPECT_EQ(e.graph_count, 2u);
  EXPECT_EQ(e.graph_break_count, 1u);
  ASSERT_EQ(e.break_reasons.size(), 1u);
  EXPECT_THAT(e.break_reasons[0], ::testing::HasSubstr("aten::item"));
  EXPECT_THAT(e.break_reasons[0], ::testing::HasSubstr("-10"));
  ASSERT_EQ(e.ops_per_graph.size(), 2u);
  EXPECT_THAT(e.ops_per_graph[0], ::testing::ElementsAre("aten::abs", "aten::add.Scalar", "aten::div.Tensor", "aten::sum"));
  EXPECT_THAT(e.ops_per_graph[1], ::testing::ElementsAre("aten::mul.Scalar", "aten::mul.Tensor"));
  EXPECT_EQ(e.op_count, 6u);
  EXPECT_FALSE(e.guards.empty());
  EXPECT_THAT(printed, ::testing::HasSubstr("Graph Count: 2"));
  EXPECT_THAT(printed, ::testing::HasSubstr("Graph Break Count: 1"));
  EXPECT_THAT(printed, ::testing::HasSubstr("Out Guards:"));
  // Each graph with the backend that runs it (explain's default is the eager backend).
  ASSERT_EQ(e.compiled.size(), 2u);
  EXPECT_EQ(e.compiled[0].backend, "eager");
  EXPECT_THAT(printed, ::testing::HasSubstr("Graph 2: compiled by eager"));
}

TEST(Explain, ModuleWithoutBreaks) {
  auto e = torchcompile::explain(torch::nn::Linear(3, 2), torch::randn({4, 3}));
  EXPECT_EQ(e.graph_count, 1u);
  EXPECT_EQ(e.graph_break_count, 0u);
  EXPECT_GE(e.op_count, 1u);
}

}  // namespace
