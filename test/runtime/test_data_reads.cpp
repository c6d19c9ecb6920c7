// Host code that reads tensor data through a pointer (`data_ptr`, accessors, a copy into a
// std::vector) and decides with it: how many rows to take, where to split a sequence. The tracer
// cannot see such a read as an operator; the forward runs on observed tensors, whose data access
// ends the graph there, and the continuation is keyed by the contents read. Every forward runs
// compiled and eagerly on random data under every built-in backend, in inference and training,
// and every result (and gradient) must be eager's on every call, with no signature left to run
// eagerly. Also here: an operator whose schema hides that its result aliases its argument
// (`_unsafe_view`), which the tracer used to give up on.
#include "support/test_util.h"

#include <torchcompile/compat.h>

#include <cstring>
#include <random>

using tc_test::copy_parameters;
using tc_test::tensors_close;

namespace {

// The smallest case: a count read through data_ptr<int>() decides a narrow.
struct NarrowByCount : torch::nn::Module {
  torch::nn::Linear lin{nullptr};
  NarrowByCount() { lin = register_module("lin", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x, torch::Tensor n) {
    const int k = n.data_ptr<int>()[0];
    return lin->forward(x.narrow(0, 0, k)) * 2 + 1;
  }
};

// The rows to keep, read from a computed tensor with an accessor into a std::vector, then
// handed back to ATen as a host-made tensor.
struct RowsFromAccessor : torch::nn::Module {
  torch::nn::Linear lin{nullptr};
  RowsFromAccessor() { lin = register_module("lin", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = lin->forward(x);
    torch::Tensor positives = (h > 0).sum(1).to(torch::kInt);  // [B]
    auto acc = positives.accessor<int, 1>();
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < acc.size(0); ++i)
      if (acc[i] >= 2) rows.push_back(i);
    if (rows.empty()) return h.sum(0);
    return h.index_select(0, torch::tensor(rows)).relu().sum(0) + h.mean(0);
  }
};

// pytorch-cpp-rl's recurrent policy (NNBase::forward_gru): the steps where any environment's
// episode ended are found with nonzero, read on the host through data_ptr<int>() into a
// std::vector<int>, and the GRU runs over the sequence in pieces between them, its hidden
// state reset (times the mask) at each piece's start.
struct RecurrentPolicy : torch::nn::Module {
  torch::nn::GRU gru{nullptr};
  torch::nn::Linear head{nullptr};
  RecurrentPolicy() {
    gru = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(5, 6)));
    head = register_module("head", torch::nn::Linear(6, 2));
  }
  // x: [T * N, 5], hxs: [N, 6], masks: [T * N, 1] (0 where an episode ended).
  torch::Tensor forward(torch::Tensor x, torch::Tensor hxs, torch::Tensor masks) {
    const int64_t N = hxs.size(0), T = x.size(0) / N;
    torch::Tensor xs = x.view({T, N, x.size(1)});
    torch::Tensor m = masks.view({T, N});
    torch::Tensor has_zeros = (m.narrow(0, 1, T - 1) == 0).any(-1).nonzero().squeeze(-1).to(torch::kInt);
    std::vector<int> starts{0};
    const int* p = has_zeros.data_ptr<int>();
    for (int64_t i = 0; i < has_zeros.numel(); ++i) starts.push_back(p[i] + 1);  // +1: m[1:]
    starts.push_back(static_cast<int>(T));
    torch::Tensor h = hxs.unsqueeze(0);
    std::vector<torch::Tensor> outs;
    for (size_t i = 0; i + 1 < starts.size(); ++i) {
      const int s = starts[i], e = starts[i + 1];
      auto [out, h_next] = gru->forward(xs.narrow(0, s, e - s), h * m[s].view({1, -1, 1}));
      outs.push_back(out);
      h = h_next;
    }
    torch::Tensor y = torch::cat(outs, 0).view({T * N, -1});
    return head->forward(y) + h.squeeze(0).sum();
  }
};

class DataReads : public ::testing::TestWithParam<std::string> {
 protected:
  // Runs `calls` calls of `compiled(inputs)` and `eager(inputs)` side by side; in training, the
  // gradients of the two modules' parameters too. No torch::compile warning, no eager entry.
  template <class M, class Make>
  void check(const std::shared_ptr<M>& m, const std::shared_ptr<M>& reference, bool training, int calls,
             Make make_inputs) {
    copy_parameters(*m, *reference);
    auto fast = torch::compile(m, GetParam());
    std::optional<torch::NoGradGuard> no_grad;
    if (!training) no_grad.emplace();
    ::testing::internal::CaptureStderr();
    for (int call = 0; call < calls; ++call) {
      const std::vector<torch::Tensor> in = make_inputs(call);
      torch::Tensor expected = std::apply([&](auto&&... a) { return reference->forward(a...); }, as_tuple<M>(in));
      torch::Tensor actual = std::apply([&](auto&&... a) { return fast(a...); }, as_tuple<M>(in));
      EXPECT_TRUE(tensors_close(expected, actual)) << "call " << call;
      if (training) {
        m->zero_grad();
        reference->zero_grad();
        expected.sum().backward();
        actual.sum().backward();
        for (const auto& p : reference->named_parameters()) {
          const torch::Tensor& g = m->named_parameters()[p.key()].grad();
          EXPECT_TRUE(g.defined() && tensors_close(p.value().grad(), g)) << p.key() << ", call " << call;
        }
      }
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("torch::compile("), std::string::npos) << err;
    ASSERT_FALSE(fast.state().entries().empty());
    for (const auto& entry : fast.state().entries()) {
      EXPECT_FALSE(entry->runs_eagerly()) << entry->eager_reason();
      EXPECT_GE(entry->num_breaks(), 1u);
    }
  }

  template <class M>
  static auto as_tuple(const std::vector<torch::Tensor>& in) {
    if constexpr (std::is_same_v<M, RecurrentPolicy>) {
      return std::make_tuple(in.at(0), in.at(1), in.at(2));
    } else if constexpr (std::is_same_v<M, NarrowByCount>) {
      return std::make_tuple(in.at(0), in.at(1));
    } else {
      return std::make_tuple(in.at(0));
    }
  }
};

TEST_P(DataReads, CountReadThroughDataPtrDecidesANarrow) {
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    torch::manual_seed(1);
    std::mt19937 rng(17);
    check(std::make_shared<NarrowByCount>(), std::make_shared<NarrowByCount>(), training, 12, [&](int) {
      const int k = std::uniform_int_distribution<int>(1, 6)(rng);
      return std::vector<torch::Tensor>{torch::randn({6, 4}), torch::full({1}, k, torch::kInt)};
    });
  }
}

TEST_P(DataReads, RowsReadThroughAnAccessorMatchEager) {
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    torch::manual_seed(2);
    check(std::make_shared<RowsFromAccessor>(), std::make_shared<RowsFromAccessor>(), training, 12,
          [&](int) { return std::vector<torch::Tensor>{torch::randn({5, 4})}; });
  }
}

// Every reset pattern of 6 steps x 3 environments (random ones, a reset in 30% of the cells).
TEST_P(DataReads, RecurrentPolicySplitAtEpisodeResetsMatchesEager) {
  constexpr int64_t T = 6, N = 3;
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    torch::manual_seed(3);
    std::mt19937 rng(29);
    check(std::make_shared<RecurrentPolicy>(), std::make_shared<RecurrentPolicy>(), training, 14, [&](int) {
      torch::Tensor masks = torch::ones({T * N, 1});
      for (int64_t i = 0; i < T * N; ++i)
        if (std::uniform_real_distribution<double>(0, 1)(rng) < 0.3) masks[i][0] = 0.0;
      return std::vector<torch::Tensor>{torch::randn({T * N, 5}), torch::randn({N, 6}), masks};
    });
  }
}

// pytorch/examples' sentence classification CNN flattens its pooled features with
// at::_unsafe_view, whose schema does not say that the result is a view of its argument: it is
// recorded as the `view` it is (was: the trace was abandoned and the model ran eagerly).
struct TextCnn : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::Conv1d conv{nullptr};
  torch::nn::Linear fc{nullptr};
  TextCnn() {
    emb = register_module("emb", torch::nn::Embedding(50, 8));
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(8, 6, 3)));
    fc = register_module("fc", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(torch::Tensor tokens) {
    torch::Tensor c = torch::relu(conv->forward(emb->forward(tokens).transpose(1, 2)));  // [B, 6, L - 2]
    // Global max pooling (the example's max_pool1d over the whole length: LibTorch 1.13's
    // max_pool1d reads data_ptr directly, which AOT's functional tracing cannot run).
    torch::Tensor pooled = c.amax(2, /*keepdim=*/true);  // [B, 6, 1]
    torch::Tensor flat = at::_unsafe_view(pooled, {pooled.size(0), -1});
    return torch::log_softmax(fc->forward(flat), 1);
  }
};

TEST_P(DataReads, UnsafeViewIsRecordedAsTheViewItIs) {
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    torch::manual_seed(4);
    auto m = std::make_shared<TextCnn>();
    auto reference = std::make_shared<TextCnn>();
    copy_parameters(*m, *reference);
    auto fast = torch::compile(m, GetParam());
    std::optional<torch::NoGradGuard> no_grad;
    if (!training) no_grad.emplace();
    ::testing::internal::CaptureStderr();
    int nan_calls = 0;  // parameters not compared (2.x, NaNs in a gradient)
    for (int call = 0; call < 8; ++call) {
      torch::Tensor tokens = torch::randint(50, {4, 7});
      torch::Tensor expected = reference->forward(tokens), actual = fast(tokens);
      EXPECT_TRUE(tensors_close(expected, actual)) << "call " << call;
      if (!training) continue;
      m->zero_grad();
      reference->zero_grad();
      expected.sum().backward();
      actual.sum().backward();
      // LibTorch 2.6's own eager backward gives this model's embedding a gradient with NaNs on
      // some training calls (the process's first most often; docs/libtorch2.md), eager's and the
      // compiled module's alike (both run its embedding backward). With 2.x a call whose
      // gradients have NaNs on either side is not compared; most calls are.
      for (const auto& p : reference->named_parameters()) {
        const at::Tensor &want = p.value().grad(), &got = m->named_parameters()[p.key()].grad();
        if (torchcompile::compat::kTorchMajor >= 2 && (want.isnan().any().item<bool>() || got.isnan().any().item<bool>())) {
          ++nan_calls;
          continue;
        }
        EXPECT_TRUE(tensors_close(want, got)) << p.key() << ", call " << call;
      }
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_LE(nan_calls, 4) << "most calls' gradients must be compared";
    EXPECT_EQ(err.find("torch::compile("), std::string::npos) << err;
    ASSERT_EQ(fast.state().entries().size(), 1u);
    EXPECT_FALSE(fast.state().entries().front()->runs_eagerly()) << fast.state().entries().front()->eager_reason();
    const torchcompile::ExplainOutput e = torchcompile::explain(m, torch::randint(50, {4, 7}));
    ASSERT_EQ(e.graphs.size(), 1u);
    EXPECT_NE(e.graphs[0].find("aten::view"), std::string::npos) << e.graphs[0];
    EXPECT_EQ(e.graphs[0].find("_unsafe_view"), std::string::npos) << e.graphs[0];
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DataReads, ::testing::Values("eager", "aot_eager", "fused", "onednn", "default"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The break is a graph break: fullgraph refuses it and says what was read.
TEST(DataReadsFullgraph, FullgraphSaysWhatWasRead) {
  auto m = std::make_shared<NarrowByCount>();
  torch::NoGradGuard no_grad;
  auto fast = torch::compile(m, torchcompile::CompileOptions("eager").with_fullgraph());
  try {
    fast(torch::randn({6, 4}), torch::full({1}, 3, torch::kInt));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("read the data of input"), std::string::npos) << e.what();
  }
}

// Host code that writes into a result through the pointer: the graph cannot compute what it
// wrote, so the signature runs eagerly (with a warning), and every call is eager's.
struct WritesThroughPointer : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = x * 2;
    float* p = y.data_ptr<float>();
    p[0] = p[0] > 0 ? 42.0f : -42.0f;
    return y + 1;
  }
};

TEST(DataReadsHostWrites, WriteThroughThePointerRunsEagerly) {
  auto m = std::make_shared<WritesThroughPointer>();
  torch::NoGradGuard no_grad;
  auto fast = torch::compile(m, "eager");
  ::testing::internal::CaptureStderr();
  for (int call = 0; call < 4; ++call) {
    torch::Tensor x = torch::randn({3, 2});
    EXPECT_TRUE(tensors_close(m->forward(x), fast(x))) << "call " << call;
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("wrote into the data of the result of aten::mul"), std::string::npos) << err;
  ASSERT_EQ(fast.state().entries().size(), 1u);
  EXPECT_TRUE(fast.state().entries().front()->runs_eagerly());
}

// A factory result host code fills through a pointer is no break: its contents are constants
// of the graph (as before), and reading a constant factory result is not a data read either.
struct FillsAFactory : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor w = torch::empty({2});
    float* p = w.data_ptr<float>();
    p[0] = 0.5f, p[1] = -1.5f;
    torch::Tensor z = torch::zeros({2});
    const float first = z.data_ptr<float>()[0];
    return x * w + first;
  }
};

TEST(DataReadsFactories, FilledFactoryIsAConstantWithoutABreak) {
  auto m = std::make_shared<FillsAFactory>();
  torch::NoGradGuard no_grad;
  auto fast = torch::compile(m, "eager");
  for (int call = 0; call < 3; ++call) {
    torch::Tensor x = torch::randn({3, 2});
    EXPECT_TRUE(tensors_close(m->forward(x), fast(x)));
  }
  ASSERT_EQ(fast.state().entries().size(), 1u);
  EXPECT_FALSE(fast.state().entries().front()->runs_eagerly());
  EXPECT_EQ(fast.state().entries().front()->num_breaks(), 0u);
}

}  // namespace
