// The onednn backend: each fusion pattern fires (the fusion report says so) and matches eager
// LibTorch; prepacked weights follow optimizer steps and in-place copies; unmatched ops, training
// graphs and concurrent calls stay correct.
#include "support/test_util.h"

#include "onednn_backend.h"
#include <oneapi/dnnl/dnnl_version.h>
#include "examples/models.h"
#include <torchcompile/support/logging.h>

#include <ATen/Parallel.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <functional>
#include <limits>
#include <random>
#include <thread>

namespace {

namespace od = torchcompile::backends::onednn;

// oneDNN (AVX-512, other summation order, its own erf/tanh) against LibTorch's kernels in fp32.
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

// A backend compiling with od::compile and keeping each graph's report.
struct Recorder {
  struct Entry {
    std::vector<std::string> fused;
    size_t blocked_values = 0;
    size_t winograd_convs = 0;
    bool declined = false;  // an empty function (compile() called torchcompile::decline)
    std::string reason;
    std::string scan_isa;
    std::vector<std::string> impls;
  };
  std::shared_ptr<std::vector<Entry>> entries = std::make_shared<std::vector<Entry>>();
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();

  torchcompile::Backend backend() const {
    auto e = entries;
    auto m = mutex;
    return [e, m](torchcompile::GraphModule& gm, const std::vector<at::Tensor>& inputs) {
      od::Compiled c = od::compile(gm, inputs);
      std::lock_guard<std::mutex> lock(*m);
      e->push_back({c.fused, c.blocked_values, c.winograd_convs, !c.fn, c.reason, c.scan_isa, c.impls});
      return c.fn;
    };
  }
  // All fused labels of all graphs.
  std::vector<std::string> fused() const {
    std::vector<std::string> all;
    for (const auto& e : *entries) all.insert(all.end(), e.fused.begin(), e.fused.end());
    return all;
  }
};

torchcompile::CompileOptions opts(const Recorder& r) {
  return torchcompile::CompileOptions(r.backend()).with_fullgraph();
}

// A module applying `fn` to its input with the given submodules' parameters registered.
struct FnModule : torch::nn::Module {
  std::function<torch::Tensor(FnModule&, torch::Tensor)> fn;
  torch::Tensor forward(torch::Tensor x) { return fn(*this, x); }
};

// Compiled and eager, called `calls` times (the first call traces) on fresh inputs.
template <typename M>
void expect_matches_eager(M& model, const std::function<torch::Tensor()>& make_input, const Recorder& r,
                          int calls = 3, double rtol = kRtol, double atol = kAtol) {
  auto fast = torch::compile(model, opts(r));
  for (int i = 0; i < calls; ++i) {
    torch::Tensor x = make_input();
    torch::Tensor expected = model->forward(x);
    torch::Tensor actual = fast(x);
    EXPECT_TRUE(tc_test::tensors_close(expected, actual, rtol, atol)) << "call " << i;
  }
}

std::shared_ptr<FnModule> linear_then(std::function<torch::Tensor(torch::Tensor)> act, int64_t in = 24, int64_t out = 40) {
  auto m = std::make_shared<FnModule>();
  auto lin = m->register_module("lin", torch::nn::Linear(in, out));
  m->fn = [lin, act](FnModule&, torch::Tensor x) { return act(lin->forward(x)); };
  return m;
}

TEST(OneDnnBackend, IsRegisteredAndDefaultUsesIt) {
  EXPECT_TRUE(torchcompile::has_backend("onednn"));
  auto names = torchcompile::list_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "onednn"), names.end());
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU());
  torchcompile::logging::set_logs("passes");
  ::testing::internal::CaptureStderr();
  auto fast = torch::compile(net, "default");
  auto x = torch::randn({4, 8});
  fast(x);
  torch::Tensor y = fast(x);
  std::string err = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::reset_logs();
  EXPECT_THAT(err, ::testing::HasSubstr("compiled by onednn"));
  EXPECT_THAT(err, ::testing::HasSubstr("part: onednn: linear+bias+relu"));
  EXPECT_TRUE(tc_test::tensors_close(net->forward(x), y, kRtol, kAtol));
}

TEST(OneDnnBackend, LinearReluFuses) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(24, 40), torch::nn::ReLU(), torch::nn::Linear(40, 8));
  Recorder r;
  expect_matches_eager(net, [] { return torch::randn({16, 24}); }, r);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear+bias+relu", "linear+bias"}));
}

TEST(OneDnnBackend, LinearWithEachEltwiseFuses) {
  torch::NoGradGuard no_grad;
  struct Case {
    std::string label;
    std::function<torch::Tensor(torch::Tensor)> act;
  };
  std::vector<Case> cases = {
      {"relu", [](torch::Tensor t) { return torch::relu(t); }},
      {"gelu", [](torch::Tensor t) { return torch::gelu(t); }},
      {"gelu_tanh", [](torch::Tensor t) { return torch::gelu(t, "tanh"); }},
      {"sigmoid", [](torch::Tensor t) { return torch::sigmoid(t); }},
      {"tanh", [](torch::Tensor t) { return torch::tanh(t); }},
      {"silu", [](torch::Tensor t) { return torch::silu(t); }},
      {"hardswish", [](torch::Tensor t) { return torch::hardswish(t); }},
      {"clamp", [](torch::Tensor t) { return torch::clamp(t, -0.3, 0.4); }},
      {"clamp", [](torch::Tensor t) { return torch::hardtanh(t, -0.5, 0.25); }},
      {"clamp", [](torch::Tensor t) { return torch::clamp(t, c10::nullopt, 0.3); }},
      {"leaky_relu", [](torch::Tensor t) { return torch::leaky_relu(t, 0.1); }},
      {"relu", [](torch::Tensor t) { return t.relu_(); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    torch::manual_seed(1);
    auto m = linear_then(c.act);
    Recorder r;
    expect_matches_eager(m, [] { return torch::randn({12, 24}) * 2; }, r);
    auto fused = r.fused();
    ASSERT_FALSE(fused.empty());
    EXPECT_EQ(fused[0].rfind("linear+bias+" + c.label, 0), 0u) << fused[0];
  }
}

TEST(OneDnnBackend, LinearGeluErfAndTanhOn3dInputs) {
  // LibTorch's Linear on 3-D input: t + matmul + add_(bias); both gelu flavours.
  torch::NoGradGuard no_grad;
  for (std::string approx : {"none", "tanh"}) {
    torch::manual_seed(2);
    auto m = linear_then([approx](torch::Tensor t) { return torch::gelu(t, approx); }, 32, 64);
    Recorder r;
    expect_matches_eager(m, [] { return torch::randn({3, 5, 32}); }, r);
    EXPECT_EQ(r.fused(), std::vector<std::string>{approx == "none" ? "linear+bias+gelu" : "linear+bias+gelu_tanh"});
  }
}

TEST(OneDnnBackend, LinearResidualAddFuses) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  auto m = std::make_shared<FnModule>();
  auto lin = m->register_module("lin", torch::nn::Linear(32, 32));
  m->fn = [lin](FnModule&, torch::Tensor x) { return torch::relu(x + lin->forward(x)); };
  Recorder r;
  expect_matches_eager(m, [] { return torch::randn({4, 6, 32}); }, r);
  EXPECT_EQ(r.fused(), std::vector<std::string>{"linear+bias+add+relu"});
}

TEST(OneDnnBackend, LinearEltwiseThenResidualAddFuses) {
  // The residual add is the second post-op: its operand is passed at that post-op's index.
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  auto m = std::make_shared<FnModule>();
  auto lin = m->register_module("lin", torch::nn::Linear(32, 32));
  m->fn = [lin](FnModule&, torch::Tensor x) { return torch::gelu(lin->forward(x)) + x; };
  Recorder r;
  expect_matches_eager(m, [] { return torch::randn({4, 6, 32}); }, r);
  EXPECT_EQ(r.fused(), std::vector<std::string>{"linear+bias+gelu+add"});
}

TEST(OneDnnBackend, IntermediateWithAnotherUserIsNotFused) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  auto m = std::make_shared<FnModule>();
  auto lin = m->register_module("lin", torch::nn::Linear(16, 16));
  m->fn = [lin](FnModule&, torch::Tensor x) {
    torch::Tensor y = lin->forward(x);
    return torch::relu(y) * y;
  };
  Recorder r;
  expect_matches_eager(m, [] { return torch::randn({8, 16}); }, r);
  EXPECT_EQ(r.fused(), std::vector<std::string>{"linear+bias"});
}

TEST(OneDnnBackend, BmmMatmulAndBaddbmm) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  auto f = [](torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    torch::Tensor s = torch::bmm(a, b);
    torch::Tensor t = torch::relu(torch::matmul(a, b.transpose(1, 2).contiguous().transpose(1, 2)));
    torch::Tensor u = torch::baddbmm(c, a, b);
    return s * t * u;  // (a residual add would be fused into the first bmm)
  };
  Recorder r;
  auto fast = torch::compile(f, opts(r));
  for (int i = 0; i < 3; ++i) {
    auto a = torch::randn({4, 8, 16}), b = torch::randn({4, 16, 12}), c = torch::randn({4, 8, 12});
    EXPECT_TRUE(tc_test::tensors_close(f(a, b, c), fast(a, b, c), kRtol, kAtol));
  }
  auto fused = r.fused();
  ASSERT_EQ(fused.size(), 3u);
  EXPECT_EQ(fused[0], "bmm");
  EXPECT_EQ(fused[1], "matmul+relu");
  EXPECT_EQ(fused[2].rfind("bmm+add", 0), 0u) << fused[2];
}

TEST(OneDnnBackend, ConvBiasReluFuses) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU());
  Recorder r;
  expect_matches_eager(net, [] { return torch::randn({2, 3, 12, 12}); }, r);
  EXPECT_EQ(r.fused(), std::vector<std::string>{"conv+bias+relu"});
}

TEST(OneDnnBackend, ConvStridedGroupedDilatedMatchEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).stride(2).padding(1).bias(false)),
                            torch::nn::SiLU(),
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(2).dilation(2).groups(4)),
                            torch::nn::Sigmoid());
  Recorder r;
  expect_matches_eager(net, [] { return torch::randn({2, 8, 15, 13}); }, r);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+silu", "conv+bias+sigmoid"}));
}

TEST(OneDnnBackend, ConvBatchNormEvalFoldsAndReluFuses) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(8);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::BatchNorm2d(16),
                            torch::nn::ReLU(), torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 8, 1).bias(false)),
                            torch::nn::BatchNorm2d(8), torch::nn::ReLU6());
  // Non-trivial running statistics and affine parameters.
  for (auto& buf : net->named_buffers()) {
    if (buf.key().find("running_mean") != std::string::npos) buf.value().normal_(0, 0.5);
    if (buf.key().find("running_var") != std::string::npos) buf.value().uniform_(0.5, 2);
  }
  for (auto& p : net->named_parameters())
    if (p.key().rfind("1.", 0) == 0 || p.key().rfind("4.", 0) == 0) p.value().uniform_(0.5, 1.5);
  net->eval();
  Recorder r;
  expect_matches_eager(net, [] { return torch::randn({2, 3, 10, 10}); }, r);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+bn+relu", "conv+bn+clamp"}));
}

TEST(OneDnnBackend, TrainingModeBatchNormIsNotFolded) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(9);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)), torch::nn::BatchNorm2d(8));
  net->train();
  Recorder r;
  auto fast = torch::compile(net, opts(r));
  auto x = torch::randn({2, 3, 8, 8});
  // Each call updates the running statistics: compare against an eager copy stepping alongside.
  torch::nn::Sequential ref(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)), torch::nn::BatchNorm2d(8));
  ref->train();
  for (size_t i = 0; i < net->parameters().size(); ++i) ref->parameters()[i].copy_(net->parameters()[i]);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(tc_test::tensors_close(ref->forward(x), fast(x), kRtol, kAtol));
  }
  EXPECT_TRUE(tc_test::tensors_close(ref->named_buffers()["1.running_mean"], net->named_buffers()["1.running_mean"],
                                     kRtol, kAtol));
  EXPECT_EQ(r.fused(), std::vector<std::string>{"conv+bias"});
}

// Evaluation, then training (which updates the running statistics; LibTorch 1.13's batch_norm
// does so without bumping their versions, eagerly or compiled), then evaluation again: the
// evaluation program's folded BatchNorm follows the new statistics. Under `onednn` and `default`,
// with the training calls compiled and run eagerly.
TEST(OneDnnBackend, FoldedBatchNormFollowsStatisticsUpdatedInTraining) {
  torch::NoGradGuard no_grad;
  for (const std::string backend : {"onednn", "default"}) {
    for (bool train_compiled : {true, false}) {
      SCOPED_TRACE(backend + (train_compiled ? ", training compiled" : ", training eager"));
      torch::manual_seed(11);
      auto make = [] {
        return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)),
                                     torch::nn::BatchNorm2d(8), torch::nn::ReLU());
      };
      auto net = make();
      auto ref = make();
      for (size_t i = 0; i < net->parameters().size(); ++i) ref->parameters()[i].copy_(net->parameters()[i]);
      net->eval();
      ref->eval();
      auto fast = torch::compile(net, backend);
      auto x = torch::randn({2, 3, 12, 12});
      EXPECT_TRUE(tc_test::tensors_close(ref->forward(x), tc_test::second_call(fast, x), kRtol, kAtol));
      net->train();
      ref->train();
      for (int i = 0; i < 2; ++i) {
        auto y = torch::randn({4, 3, 12, 12}) * 2 + 1;
        auto expected = ref->forward(y);
        EXPECT_TRUE(tc_test::tensors_close(expected, train_compiled ? fast(y) : net->forward(y), kRtol, kAtol));
      }
      net->eval();
      ref->eval();
      EXPECT_TRUE(tc_test::tensors_close(ref->forward(x), fast(x), kRtol, kAtol));
    }
  }
}

TEST(OneDnnBackend, ConvResidualAddReluFuses) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(10);
  auto m = std::make_shared<FnModule>();
  auto c1 = m->register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1)));
  auto bn = m->register_module("bn", torch::nn::BatchNorm2d(16));
  auto c2 = m->register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1)));
  m->fn = [c1, bn, c2](FnModule&, torch::Tensor x) {
    torch::Tensor y = torch::relu(bn->forward(c1->forward(x)));
    return torch::relu(c2->forward(y) + y);  // residual: both convs' layouts
  };
  m->eval();
  Recorder r;
  expect_matches_eager(m, [] { return torch::randn({2, 16, 9, 9}); }, r);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+bn+relu", "conv+bias+add+relu"}));
  // And with a plain (graph input) residual.
  auto m2 = std::make_shared<FnModule>();
  auto c3 = m2->register_module("c", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1)));
  m2->fn = [c3](FnModule&, torch::Tensor x) { return torch::relu(x + c3->forward(x)); };
  Recorder r2;
  expect_matches_eager(m2, [] { return torch::randn({2, 16, 9, 9}); }, r2);
  EXPECT_EQ(r2.fused(), std::vector<std::string>{"conv+bias+add+relu"});
}

TEST(OneDnnBackend, ConsecutiveConvsKeepTheBlockedLayout) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)), torch::nn::ReLU(),
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3).padding(1)), torch::nn::ReLU(),
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 16, 1)), torch::nn::Tanh(),
                            torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten());
  Recorder r;
  expect_matches_eager(net, [] { return torch::randn({2, 16, 14, 14}); }, r);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+relu", "conv+bias+relu", "conv+bias+tanh", "avgpool"}));
  ASSERT_EQ(r.entries->size(), 1u);
  EXPECT_EQ(r.entries->at(0).blocked_values, 3u);
  // A plain tensor is still produced where ATen needs one (here: a conv output read by sum()).
  auto m = std::make_shared<FnModule>();
  auto a = m->register_module("a", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
  auto b = m->register_module("b", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 16, 3).padding(1)));
  m->fn = [a, b](FnModule&, torch::Tensor x) {
    torch::Tensor y = torch::relu(a->forward(x));
    return b->forward(y) * y.mean();
  };
  Recorder r2;
  expect_matches_eager(m, [] { return torch::randn({2, 16, 7, 7}); }, r2);
  EXPECT_EQ(r2.fused(), (std::vector<std::string>{"conv+bias+relu", "conv+bias"}));
}

TEST(OneDnnBackend, UnmatchedOpsRunThroughATen) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(12);
  auto m = std::make_shared<FnModule>();
  auto lin = m->register_module("lin", torch::nn::Linear(16, 16));
  m->fn = [lin](FnModule&, torch::Tensor x) {
    torch::Tensor y = lin->forward(torch::sin(x).view({-1, 16}));
    auto parts = y.chunk(2, 1);
    return torch::cat({parts[1].cos(), parts[0] * 2}, 1).softmax(-1) + torch::layer_norm(y, {16});
  };
  Recorder r;
  expect_matches_eager(m, [] { return torch::randn({4, 2, 16}); }, r);
  EXPECT_EQ(r.fused(), std::vector<std::string>{"linear+bias"});

  // Other dtypes and graphs without GEMM/conv run with the interpreter.
  auto f = [](torch::Tensor a) { return torch::relu(a.cos() * 2); };
  Recorder r2;
  auto fast = torch::compile(f, opts(r2));
  auto x = torch::randn({5, 5});
  fast(x);
  EXPECT_TRUE(tc_test::tensors_close(f(x), fast(x)));
  ASSERT_EQ(r2.entries->size(), 1u);
  EXPECT_TRUE(r2.entries->at(0).declined);
  torch::nn::Sequential dnet(torch::nn::Linear(8, 8), torch::nn::ReLU());
  dnet->to(torch::kDouble);
  Recorder r3;
  expect_matches_eager(dnet, [] { return torch::randn({3, 8}, torch::kDouble); }, r3);
  EXPECT_TRUE(r3.fused().empty());
}

// The optimizer step and in-place copies after compilation: prepacked weights must follow.
TEST(OneDnnBackend, OptimizerStepUpdatesPrepackedWeights) {
  torch::manual_seed(13);
  auto m = std::make_shared<FnModule>();
  auto conv = m->register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
  auto bn = m->register_module("bn", torch::nn::BatchNorm2d(8));
  auto lin = m->register_module("lin", torch::nn::Linear(8, 4));
  m->fn = [conv, bn, lin](FnModule&, torch::Tensor x) {
    torch::Tensor y = torch::relu(bn->forward(conv->forward(x)));
    return lin->forward(y.mean({2, 3}));
  };
  m->eval();
  Recorder r;
  auto fast = torch::compile(m, opts(r));
  auto x = torch::randn({2, 3, 8, 8});
  torch::Tensor before;
  {
    torch::NoGradGuard no_grad;
    fast(x);
    before = fast(x);
    EXPECT_TRUE(tc_test::tensors_close(m->forward(x), before, kRtol, kAtol));
  }
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+bn+relu", "avgpool", "linear+bias"}));
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    m->forward(x).pow(2).sum().backward();  // eager training step
    opt.step();
    torch::NoGradGuard no_grad;
    torch::Tensor expected = m->forward(x);
    torch::Tensor actual = fast(x);
    EXPECT_TRUE(tc_test::tensors_close(expected, actual, kRtol, kAtol)) << "step " << step;
    EXPECT_FALSE(torch::allclose(before, actual));
    before = actual;
  }
  // An inference call between backward and the optimizer step, then one after the step.
  opt.zero_grad();
  m->forward(x).pow(2).sum().backward();
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(tc_test::tensors_close(m->forward(x), fast(x), kRtol, kAtol));
  }
  opt.step();
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(tc_test::tensors_close(m->forward(x), fast(x), kRtol, kAtol));
  }
  // A load_state_dict-style in-place copy, including BatchNorm's running statistics.
  torch::NoGradGuard no_grad;
  conv->weight.copy_(torch::randn_like(conv->weight));
  bn->running_var.copy_(torch::rand_like(bn->running_var) + 0.5);
  bn->running_mean.fill_(0.25);
  lin->weight.mul_(-1);
  EXPECT_TRUE(tc_test::tensors_close(m->forward(x), fast(x), kRtol, kAtol));
}

// `net` and a copy of it (same parameters), each trained two steps (loss: the sum of squares) on
// the same inputs, `net` through `compiled`: every gradient matches.
template <typename Compiled>
void expect_gradients_match_a_copy(torch::nn::Sequential& net, Compiled& compiled,
                                   const std::function<torch::Tensor()>& make_input) {
  auto ref = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
  for (int step = 0; step < 2; ++step) {
    torch::Tensor x = make_input();
    net->zero_grad();
    ref->zero_grad();
    compiled(x).pow(2).sum().backward();
    ref->forward(x).pow(2).sum().backward();
    for (size_t p = 0; p < net->parameters().size(); ++p)
      EXPECT_TRUE(tc_test::tensors_close(ref->parameters()[p].grad(), net->parameters()[p].grad(), kRtol, kAtol))
          << "step " << step << ", parameter " << p;
  }
}

TEST(OneDnnBackend, TrainingGraphsRunWithTheInterpreterAndGradientsMatch) {
  torch::manual_seed(14);
  torch::nn::Sequential net(torch::nn::Linear(10, 20), torch::nn::ReLU(), torch::nn::Linear(20, 3));
  Recorder r;
  auto fast = torch::compile(net, opts(r));
  auto x = torch::randn({6, 10});
  expect_gradients_match_a_copy(net, fast, [x] { return x; });
  ASSERT_FALSE(r.entries->empty());
  EXPECT_TRUE(r.entries->at(0).declined);
  EXPECT_THAT(r.entries->at(0).reason, ::testing::HasSubstr("grad"));
}

torch::nn::Sequential m1() {
  return torch::nn::Sequential(torch::nn::Linear(784, 512), torch::nn::ReLU(), torch::nn::Linear(512, 512),
                               torch::nn::ReLU(), torch::nn::Linear(512, 10));
}

torch::nn::Sequential m3() {
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).padding(1)), torch::nn::BatchNorm2d(32),
                            torch::nn::ReLU(), torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)),
                            torch::nn::BatchNorm2d(64), torch::nn::ReLU(), torch::nn::AdaptiveAvgPool2d(1),
                            torch::nn::Flatten(), torch::nn::Linear(64, 10));
  net->eval();
  return net;
}

struct M5 : torch::nn::Module {
  torch::nn::LayerNorm ln{torch::nn::LayerNormOptions({512})};
  torch::nn::Linear l1{512, 2048}, l2{2048, 512};
  M5() {
    register_module("ln", ln);
    register_module("l1", l1);
    register_module("l2", l2);
  }
  torch::Tensor forward(torch::Tensor x) { return x + l2(torch::gelu(l1(ln(x)))); }
};

TEST(OneDnnBackend, ModelM1MatchesEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  auto net = m1();
  Recorder r;
  expect_matches_eager(net, [] { return torch::randn({64, 784}); }, r);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear+bias+relu", "linear+bias+relu", "linear+bias"}));
}

TEST(OneDnnBackend, ModelM3MatchesEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  auto net = m3();
  Recorder r;
  expect_matches_eager(net, [] { return torch::randn({16, 3, 64, 64}); }, r, 2);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+bn+relu", "conv+bias+bn+relu", "avgpool", "linear+bias"}));
  EXPECT_EQ(r.entries->at(0).blocked_values, 2u);
  // The 32->64 conv runs with the Winograd algorithm where this oneDNN offers it (2.x on AVX-512).
  EXPECT_EQ(r.entries->at(0).winograd_convs, torchcompile::backends::onednn::winograd_available() ? 1u : 0u);
}

TEST(OneDnnBackend, WinogradConvolutionMatchesEagerAndCanBeTurnedOff) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(21);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)), torch::nn::ReLU(),
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 16, 3).padding(1)));
  net->eval();
  auto input = [] { return torch::randn({2, 16, 20, 20}); };
  for (const char* setting : {"1", "0"}) {
    setenv("TORCHCOMPILE_ONEDNN_WINOGRAD", setting, 1);
    Recorder r;
    expect_matches_eager(net, input, r);
    unsetenv("TORCHCOMPILE_ONEDNN_WINOGRAD");
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+relu", "conv+bias"}));
    const bool winograd = setting[0] == '1' && torchcompile::backends::onednn::winograd_available();
    EXPECT_EQ(r.entries->at(0).winograd_convs, winograd ? 2u : 0u) << "TORCHCOMPILE_ONEDNN_WINOGRAD=" << setting;
    EXPECT_EQ(r.entries->at(0).blocked_values, 1u);
  }
}

TEST(OneDnnBackend, ModelM4MatchesEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torch::nn::TransformerEncoderLayer net(
      torch::nn::TransformerEncoderLayerOptions(256, 4).dim_feedforward(1024).dropout(0.0));
  net->eval();
  Recorder r;
  auto fast = torch::compile(net, torchcompile::CompileOptions(r.backend()));
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({128, 8, 256});
    EXPECT_TRUE(tc_test::tensors_close(net->forward(x), fast(x), kRtol, 1e-4));
  }
  auto fused = r.fused();
  EXPECT_EQ(std::count(fused.begin(), fused.end(), "linear+bias+relu"), 1);
  EXPECT_EQ(std::count(fused.begin(), fused.end(), "linear+bias+add"), 2);
  EXPECT_EQ(std::count(fused.begin(), fused.end(), "bmm"), 2);
}

TEST(OneDnnBackend, ModelM5MatchesEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  auto net = std::make_shared<M5>();
  Recorder r;
  expect_matches_eager(net, [] { return torch::randn({8, 64, 512}); }, r, 2, kRtol, 1e-4);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear+bias+gelu", "linear+bias+add"}));
}

// After a first call, four threads call `fast` 25 times each on the inputs (rotating), all at once.
template <typename F>
void expect_four_threads_match(F& fast, const std::vector<torch::Tensor>& inputs,
                               const std::vector<torch::Tensor>& expected) {
  fast(inputs[0]);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      torch::NoGradGuard ng;
      for (int i = 0; i < 25; ++i) {
        size_t k = (t + i) % inputs.size();
        if (!torch::allclose(expected[k], fast(inputs[k]), kRtol, kAtol)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(OneDnnBackend, FourThreadsAtOnceMatchEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(15);
  auto m = std::make_shared<FnModule>();
  auto conv = m->register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 16, 3).padding(1)));
  auto conv2 = m->register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1)));
  auto lin = m->register_module("lin", torch::nn::Linear(16, 8));
  m->fn = [conv, conv2, lin](FnModule&, torch::Tensor x) {
    torch::Tensor y = torch::relu(conv->forward(x));
    y = torch::relu(conv2->forward(y) + y);
    return torch::gelu(lin->forward(y.mean({2, 3})));
  };
  Recorder r;
  auto fast = torch::compile(m, opts(r));
  std::vector<torch::Tensor> inputs, expected;
  for (int i = 0; i < 8; ++i) {
    inputs.push_back(torch::randn({3, 4, 10, 10}));
    expected.push_back(m->forward(inputs.back()));
  }
  expect_four_threads_match(fast, inputs, expected);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+relu", "conv+bias+add+relu", "avgpool", "linear+bias+gelu"}));
}

TEST(OneDnnBackend, ThreadsRepackWhileOthersRun) {
  // A weight changed between calls while four threads call: every result matches one of the
  // two weight versions' eager results, and calls after the change all see the new one.
  torch::NoGradGuard no_grad;
  torch::manual_seed(16);
  torch::nn::Linear lin(32, 32);
  Recorder r;
  auto fast = torch::compile(lin, opts(r));
  auto x = torch::randn({16, 32});
  fast(x);
  torch::Tensor old_expected = lin->forward(x);
  std::atomic<int> bad{0};
  std::atomic<bool> changed{false};
  torch::Tensor new_expected;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      torch::NoGradGuard ng;
      for (int i = 0; i < 50; ++i) {
        bool after = changed.load();
        torch::Tensor y = fast(x);
        if (after && !torch::allclose(new_expected, y, kRtol, kAtol)) ++bad;
        if (!after && !torch::allclose(old_expected, y, kRtol, kAtol) &&
            !(changed.load() && torch::allclose(new_expected, y, kRtol, kAtol)))
          ++bad;
      }
    });
  {
    torch::Tensor w = lin->weight.clone().mul_(2);
    new_expected = torch::nn::functional::linear(x, w, lin->bias);
    lin->weight.copy_(w);
    changed.store(true);
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_TRUE(tc_test::tensors_close(new_expected, fast(x), kRtol, kAtol));
}

}  // namespace

// ---- declines (fallback chains and `default`: test/compile/) -----------------------------------

TEST(OneDnnDeclines, CompileGivesTheReasonToDecline) {
  torch::NoGradGuard no_grad;
  // compile() itself declines through torchcompile::decline: a backend calling it directly (the
  // Recorder) passes the reason on to the pipeline by returning its empty function.
  Recorder r;
  auto pointwise = [](torch::Tensor x) { return (x * 2).sin() + 1; };
  auto e = torchcompile::explain(r.backend(), pointwise, torch::randn({8, 8}));
  ASSERT_EQ(r.entries->size(), 1u);
  EXPECT_TRUE(r.entries->at(0).declined);
  EXPECT_EQ(r.entries->at(0).reason, "nothing to fuse");
  ASSERT_EQ(e.compiled.size(), 1u);
  EXPECT_EQ(e.compiled[0].backend, "interpreter");
  ASSERT_EQ(e.compiled[0].attempts.size(), 1u);
  EXPECT_EQ(e.compiled[0].attempts[0].outcome, torchcompile::BackendAttempt::Outcome::Declined);
  EXPECT_EQ(e.compiled[0].attempts[0].reason, "nothing to fuse");
}

// ---- max pooling and transposed convolutions (the layers of MNIST CNNs and DCGAN generators) ----

TEST(OneDnnBackend, MaxPoolingAfterConvolutionsMatchesEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(31);
  // MNIST's shape: conv-relu-maxpool twice; the first pool's result stays blocked for conv2.
  auto m = std::make_shared<FnModule>();
  auto c1 = m->register_module("c1", torch::nn::Conv2d(1, 32, 3));
  auto c2 = m->register_module("c2", torch::nn::Conv2d(32, 64, 3));
  auto fc = m->register_module("fc", torch::nn::Linear(1600, 10));
  m->fn = [=](FnModule&, torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(c1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(c2->forward(x)), 2);
    return fc->forward(x.flatten(1));
  };
  m->eval();
  Recorder r;
  expect_matches_eager(m, [] { return torch::randn({8, 1, 28, 28}); }, r);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+relu", "maxpool", "conv+bias+relu", "maxpool", "linear+bias"}));
  EXPECT_GE(r.entries->at(0).blocked_values, 2u);
  // A NaN reaching a pooling from a convolution's blocked output: ATen's pooling, NaN kept.
  auto m2 = std::make_shared<FnModule>();
  m2->register_module("c1", c1);
  m2->fn = [=](FnModule&, torch::Tensor x) { return torch::max_pool2d(c1->forward(x), 2).sum({2, 3}); };
  Recorder r2;
  expect_matches_eager(m2, [] {
    torch::Tensor x = torch::randn({8, 1, 28, 28});
    x.index_put_({2, 0, 5, 7}, std::numeric_limits<float>::quiet_NaN());
    return x;
  }, r2);
}

TEST(OneDnnBackend, MaxPoolingShapesMatchEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(32);
  struct Case {
    std::vector<int64_t> kernel, stride, padding;
    bool ceil;
    std::vector<int64_t> input;
  };
  for (const Case& c : {Case{{3, 3}, {2, 2}, {1, 1}, false, {2, 16, 15, 15}}, Case{{2, 2}, {}, {0, 0}, true, {2, 8, 7, 9}},
                        Case{{3, 2}, {1, 2}, {1, 0}, false, {3, 5, 6, 6}}, Case{{3, 3}, {2, 2}, {0, 0}, true, {1, 16, 10, 10}}}) {
    SCOPED_TRACE(::testing::PrintToString(c.kernel) + " stride " + ::testing::PrintToString(c.stride) + " pad " +
                 ::testing::PrintToString(c.padding) + (c.ceil ? " ceil" : ""));
    auto m = std::make_shared<FnModule>();
    m->fn = [c](FnModule&, torch::Tensor x) {
      return torch::max_pool2d(x, c.kernel, c.stride, c.padding, /*dilation=*/1, c.ceil);
    };
    Recorder r;
    auto input = c.input;
    expect_matches_eager(m, [input] { return torch::randn(input); }, r);
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"maxpool"}));
  }
  // NaN propagates as in ATen, and -inf padding never wins.
  auto m = std::make_shared<FnModule>();
  m->fn = [](FnModule&, torch::Tensor x) { return torch::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}); };
  Recorder r;
  expect_matches_eager(m, [] {
    torch::Tensor x = -torch::rand({2, 16, 9, 9}) - 1;
    x.index_put_({0, 3, 4, 4}, std::numeric_limits<float>::quiet_NaN());
    x.index_put_({1, 0, 0, 0}, -std::numeric_limits<float>::infinity());
    return x;
  }, r);
}

// Random average poolings (kernel, stride, padding, ceil_mode, count_include_pad) against eager;
// the ceil_mode window past the padding with count_include_pad stays with ATen (its divisor
// differs from oneDNN's), as does a divisor override.
TEST(OneDnnBackend, RandomAveragePoolingsMatchEager) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(35);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int lowered = 0, declined = 0;
  for (int trial = 0; trial < 40; ++trial) {
    torch::manual_seed(trial);
    const std::vector<int64_t> kernel{pick(1, 4), pick(1, 4)};
    const std::vector<int64_t> stride{pick(1, 3), pick(1, 3)};
    const std::vector<int64_t> padding{pick(0, kernel[0] / 2), pick(0, kernel[1] / 2)};
    const bool ceil = pick(0, 1), include = pick(0, 1);
    const std::vector<int64_t> input{pick(1, 3), pick(1, 20), pick(kernel[0], 13), pick(kernel[1], 13)};
    SCOPED_TRACE(::testing::PrintToString(kernel) + " stride " + ::testing::PrintToString(stride) + " pad " +
                 ::testing::PrintToString(padding) + (ceil ? " ceil" : "") + (include ? " count_include_pad" : "") +
                 " input " + ::testing::PrintToString(input));
    auto m = std::make_shared<FnModule>();
    m->fn = [=](FnModule&, torch::Tensor x) { return torch::avg_pool2d(x, kernel, stride, padding, ceil, include); };
    Recorder r;
    expect_matches_eager(m, [input] { return torch::randn(input); }, r, 2);
    // Whether the last window reaches past the padded input (then ATen's divisor is smaller).
    bool overhang = false;
    for (size_t d = 0; d < 2; ++d) {
      const int64_t in = input[d + 2] + 2 * padding[d] - kernel[d];
      int64_t out = (ceil ? (in + stride[d] - 1) / stride[d] : in / stride[d]) + 1;
      if (ceil && (out - 1) * stride[d] >= input[d + 2] + padding[d]) --out;
      overhang |= (out - 1) * stride[d] + kernel[d] > input[d + 2] + 2 * padding[d];
    }
    if (include && overhang) {
      EXPECT_TRUE(r.fused().empty());
      ++declined;
    } else {
      EXPECT_EQ(r.fused(), (std::vector<std::string>{"avgpool"}));
      ++lowered;
    }
  }
  EXPECT_GT(lowered, 10);
  EXPECT_GT(declined, 0);
  auto m = std::make_shared<FnModule>();
  m->fn = [](FnModule&, torch::Tensor x) { return torch::avg_pool2d(x, {2, 2}, {2, 2}, {0, 0}, false, true, 3); };
  Recorder r;
  expect_matches_eager(m, [] { return torch::randn({2, 4, 6, 6}); }, r);
  EXPECT_TRUE(r.fused().empty());
}

// Transposed convolutions against eager in double precision (a copy of the model; ATen's own
// slow_conv_transpose2d): LibTorch 2.6's fp32 transposed convolution (oneDNN 3.7's jit kernel)
// gives wrong results, NaNs among them, for some of these shapes on AVX2 and AVX-512 CPUs, where
// the compiled calls (oneDNN's brgemm deconvolution) agree with double precision to ~1e-6. The
// first call traces, so its result is eager fp32's own: it is not compared.
void expect_deconvs_match_double(torch::nn::Sequential& net, const std::function<torch::Tensor()>& make_input,
                                 const Recorder& r, int calls = 3) {
  torch::nn::Sequential ref(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone()));
  ref->to(torch::kDouble);
  auto fast = torch::compile(net, opts(r));
  fast(make_input());
  for (int i = 0; i < calls; ++i) {
    torch::Tensor x = make_input();
    torch::Tensor expected = ref->forward(x.to(torch::kDouble)).to(torch::kFloat);
    EXPECT_TRUE(tc_test::tensors_close(expected, fast(x), kRtol, kAtol)) << "call " << i + 1;
  }
}

// Transposed convolutions run as oneDNN deconvolutions (TORCHCOMPILE_ONEDNN_DECONV=1, oneDNN 3's
// default) or as a GEMM and a gather (`gemm`, oneDNN 2's default); both are tested on every build.
const char* const kTransposedPaths[] = {"1", "gemm"};

TEST(OneDnnBackend, TransposedConvolutionsOfAGeneratorMatchEager) {
  torch::NoGradGuard no_grad;
  for (const char* path : kTransposedPaths) {
    SCOPED_TRACE(std::string("TORCHCOMPILE_ONEDNN_DECONV=") + path);
    tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DECONV", path);
    const bool gemm = std::string(path) == "gemm";
    torch::manual_seed(33);
    auto up = [](int64_t in, int64_t out, int64_t stride, int64_t pad) {
      return torch::nn::ConvTranspose2d(
          torch::nn::ConvTranspose2dOptions(in, out, 4).stride(stride).padding(pad).bias(false));
    };
    torch::nn::Sequential net(up(20, 32, 1, 0), torch::nn::BatchNorm2d(32), torch::nn::ReLU(), up(32, 16, 2, 1),
                              torch::nn::BatchNorm2d(16), torch::nn::ReLU(), up(16, 3, 2, 1), torch::nn::Tanh());
    for (auto& b : net->buffers())
      if (b.is_floating_point()) b.uniform_(0.5, 1.5);  // running statistics worth folding
    net->eval();
    Recorder r;
    expect_deconvs_match_double(net, [] { return torch::randn({4, 20, 1, 1}); }, r);
    // The gather fuses relu only: the tanh runs in ATen after it.
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"deconv+bn+relu", "deconv+bn+relu", gemm ? "deconv" : "deconv+tanh"}));
    // Intermediates stay channels-last (gemm) or blocked (oneDNN) between the layers; the last
    // result, read by the graph's output or by the tanh left out of the group, is written plain.
    EXPECT_EQ(r.entries->at(0).blocked_values, 2u);
  }
}

// Random transposed convolutions (channels, kernel, stride, padding, output padding, dilation,
// bias, a relu after them, input sizes down to 1x1, batches of 1-3) against eager in double
// precision, on both paths; a NaN in the input stays a NaN through the relu as in ATen. The gemm
// path takes every one; oneDNN's deconvolution declines an output padding beyond the padding
// (its right padding would be negative), which then runs in ATen.
TEST(OneDnnBackend, RandomTransposedConvolutionsMatchEager) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(34);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (const char* path : kTransposedPaths) {
    tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DECONV", path);
    const bool gemm = std::string(path) == "gemm";
    int lowered = 0, declined = 0;
    for (int trial = 0; trial < 30; ++trial) {
      torch::manual_seed(trial);
      const int64_t in = pick(1, 20), out = pick(1, 20), kernel = pick(1, 5), stride = pick(1, 3),
                    dilation = pick(1, 2), padding = pick(0, (kernel - 1) * dilation / 2);
      const int64_t output_padding = pick(0, std::max(stride, dilation) - 1);
      const bool bias = pick(0, 1), relu = pick(0, 1), nan = trial % 7 == 3;
      const std::vector<int64_t> input{pick(1, 3), in, pick(1, 9), pick(1, 9)};
      SCOPED_TRACE(std::string("path ") + path + ", trial " + std::to_string(trial) + ": " + std::to_string(in) +
                   " -> " + std::to_string(out) + " k " + std::to_string(kernel) + " stride " + std::to_string(stride) +
                   " pad " + std::to_string(padding) + " outpad " + std::to_string(output_padding) + " dil " +
                   std::to_string(dilation) + (bias ? " bias" : "") + (relu ? " relu" : "") + " input " +
                   ::testing::PrintToString(input));
      torch::nn::Sequential net(torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(in, out, kernel)
                                                               .stride(stride)
                                                               .padding(padding)
                                                               .output_padding(output_padding)
                                                               .dilation(dilation)
                                                               .bias(bias)));
      if (relu) net->push_back(torch::nn::ReLU());
      net->eval();
      Recorder r;
      expect_deconvs_match_double(net, [&] {
        torch::Tensor x = torch::randn(input);
        if (nan) x.view(-1)[x.numel() / 2] = std::numeric_limits<float>::quiet_NaN();
        return x;
      }, r);
      const bool negative_right_pad =
          (input[2] - 1) * stride + (kernel - 1) * dilation + 1 - ((input[2] - 1) * stride - 2 * padding +
                                                                   dilation * (kernel - 1) + output_padding + 1) -
                  padding < 0 ||
          output_padding > padding;
      if (gemm || !negative_right_pad) {
        EXPECT_EQ(r.fused(), (std::vector<std::string>{std::string("deconv") + (bias ? "+bias" : "") + (relu ? "+relu" : "")}))
            << (r.entries->empty() ? "" : r.entries->at(0).reason);
        ++lowered;
      } else {
        EXPECT_TRUE(r.fused().empty());
        ++declined;
      }
    }
    EXPECT_GT(lowered, 15);
    if (!gemm) EXPECT_GT(declined, 0);
  }
}

// A transposed convolution's channels-last result read by a convolution and a max pooling, and a
// convolution's blocked result read by a transposed convolution (reordered to channels-last).
TEST(OneDnnBackend, TransposedConvolutionsBetweenConvolutionsMatchEager) {
  torch::NoGradGuard no_grad;
  for (const char* path : kTransposedPaths) {
    SCOPED_TRACE(std::string("TORCHCOMPILE_ONEDNN_DECONV=") + path);
    tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DECONV", path);
    torch::manual_seed(36);
    torch::nn::Sequential net(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
        torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(16, 8, 4).stride(2).padding(1)), torch::nn::ReLU(),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)),
        torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(16, 4, 3).stride(2)), torch::nn::ReLU(),
        torch::nn::MaxPool2d(2));
    net->eval();
    Recorder r;
    expect_deconvs_match_double(net, [] { return torch::randn({2, 3, 10, 10}); }, r);
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+relu", "deconv+bias+relu", "conv+bias",
                                                   "deconv+bias+relu", "maxpool"}));
    EXPECT_GE(r.entries->at(0).blocked_values, 4u);
  }
}

// Turned off (TORCHCOMPILE_ONEDNN_DECONV=0), and grouped, transposed convolutions stay with ATen
// (and still match).
TEST(OneDnnBackend, TransposedConvolutionsOffOrGroupedStayWithAten) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(37);
  {
    tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DECONV", "0");
    torch::nn::Sequential net(torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(4, 4, 3).stride(2)));
    Recorder off;
    expect_matches_eager(net, [] { return torch::randn({2, 4, 5, 5}); }, off);
    EXPECT_TRUE(off.fused().empty());
  }
  for (const char* path : kTransposedPaths) {
    tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DECONV", path);
    torch::nn::Sequential grouped(
        torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(8, 8, 3).stride(2).groups(2)));
    Recorder r;
    expect_matches_eager(grouped, [] { return torch::randn({2, 8, 5, 5}); }, r);
    EXPECT_TRUE(r.fused().empty());
  }
  // An unknown setting is an error (the call runs eagerly with a warning, as for any backend error).
  tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DECONV", "fast");
  torch::nn::Sequential net(torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(4, 4, 3).stride(2)));
  auto e = torchcompile::explain("onednn", net, torch::randn({2, 4, 5, 5}));
  EXPECT_NE(e.str().find("TORCHCOMPILE_ONEDNN_DECONV: expected 0, 1 or gemm, got 'fast'"), std::string::npos) << e;
}

// GEMMs whose second operand is not a module attribute (it cannot be prepacked) go to oneDNN only
// where its brgemm kernels run them; elsewhere ATen does (TORCHCOMPILE_ONEDNN_DYNAMIC_GEMM=1 / 0
// overrides). Random shapes and layouts (transposed operands as training graphs have them, 3-D
// activations, a bias, a fused relu), each setting, against eager; a module's Linear (prepacked)
// is taken under both. Then a training step under `default`: forward and backward graphs.
TEST(OneDnnBackend, DynamicWeightGemmsFollowTheSettingAndMatchEager) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(2411);
  auto dim = [&] { return std::uniform_int_distribution<int64_t>(1, 70)(rng); };
  for (const char* setting : {"0", "1"}) {
    tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DYNAMIC_GEMM", setting);
    const bool taken = std::string(setting) == "1";
    for (int c = 0; c < 24; ++c) {
      const int64_t M = dim(), K = dim(), N = dim();
      const int form = c % 5;
      const bool relu = (c / 5) % 2;
      SCOPED_TRACE("setting " + std::string(setting) + ", case " + std::to_string(c) + " (form " + std::to_string(form) +
                   ", M " + std::to_string(M) + ", K " + std::to_string(K) + ", N " + std::to_string(N) + ")");
      torch::Tensor x = form == 2 ? torch::randn({K, M}).t() : form == 4 ? torch::randn({3, M, K}) : torch::randn({M, K});
      torch::Tensor w = form == 0 || form == 2 ? torch::randn({K, N}) : torch::randn({N, K}).t();
      torch::Tensor b = torch::randn({N});
      auto f = [form, relu](torch::Tensor x, torch::Tensor w, torch::Tensor b) {
        torch::Tensor y = form == 3 ? torch::addmm(b, x, w) : form == 4 ? torch::matmul(x, w) : x.mm(w);
        return relu ? torch::relu(y) : y;
      };
      Recorder r;
      auto fast = torch::compile(f, opts(r));
      for (int call = 0; call < 2; ++call) EXPECT_TRUE(tc_test::tensors_close(f(x, w, b), fast(x, w, b), kRtol, kAtol));
      const std::vector<std::string> fused = r.fused();
      if (taken) {
        ASSERT_EQ(fused.size(), 1u);
        EXPECT_THAT(fused[0], ::testing::StartsWith("linear"));
      } else {
        EXPECT_TRUE(fused.empty()) << fused[0];
      }
    }
    Recorder r;
    auto lin = linear_then([](torch::Tensor y) { return torch::relu(y); });
    expect_matches_eager(lin, [] { return torch::randn({5, 24}); }, r);
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear+bias+relu"}));
  }
  // A training step: the weights are inputs of AOT's graphs; the backward's GEMMs have
  // transposed operands.
  torch::AutoGradMode grad(true);
  for (const char* setting : {"0", "1"}) {
    SCOPED_TRACE(std::string("training, setting ") + setting);
    tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DYNAMIC_GEMM", setting);
    torch::manual_seed(7);
    torch::nn::Sequential net(torch::nn::Linear(30, 48), torch::nn::ReLU(), torch::nn::Linear(48, 5));
    auto e = torchcompile::explain("default", net, torch::randn({9, 30}));
    ASSERT_EQ(e.compiled.size(), 1u);
    const auto onednn_linear = ::testing::Contains(::testing::HasSubstr("onednn: linear"));
    if (std::string(setting) == "1") {
      EXPECT_THAT(e.compiled[0].partition, onednn_linear);
    } else {
      EXPECT_THAT(e.compiled[0].partition, ::testing::Not(onednn_linear));
    }
    auto fast = torch::compile(net, "default");
    expect_gradients_match_a_copy(net, fast, [] { return torch::randn({9, 30}); });
  }
}

// ---- NaN and infinity through fused activations ----------------------------------------------------
// oneDNN's relu and clip post-ops map NaN to a number; ATen keeps it. A group fusing one runs its
// nodes through ATen on a call whose inputs (or weights) hold a NaN or an infinity.
TEST(OneDnnBackend, NonFiniteValuesThroughFusedActivationsMatchEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(41);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto poison = [&](torch::Tensor x, int64_t which) {
    auto flat = x.view({-1});
    if (which == 1) flat[3] = nan;
    if (which == 2) flat[5] = inf;
    if (which == 3) flat[7] = -inf;
    return x;
  };
  // Linear + relu / relu6 / clamp, and a residual after the activation.
  auto m = std::make_shared<FnModule>();
  auto l1 = m->register_module("l1", torch::nn::Linear(16, 32));
  auto l2 = m->register_module("l2", torch::nn::Linear(32, 32));
  auto l3 = m->register_module("l3", torch::nn::Linear(32, 8));
  m->fn = [=](FnModule&, torch::Tensor x) {
    torch::Tensor h = torch::relu(l1->forward(x));
    h = torch::relu6(l2->forward(h)) + h;
    return torch::clamp(l3->forward(h), -0.5, 0.5);
  };
  for (int64_t which : {0, 1, 2, 3}) {
    SCOPED_TRACE("input case " + std::to_string(which));
    Recorder r;
    expect_matches_eager(m, [&] { return poison(torch::randn({4, 16}), which); }, r);
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear+bias+relu", "linear+bias+clamp+add", "linear+bias+clamp"}));
  }
  // Convolutions (blocked between them) with BatchNorm folded and relu, a NaN in the input or in a weight.
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::BatchNorm2d(16),
                            torch::nn::ReLU(), torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1)),
                            torch::nn::ReLU());
  net->eval();
  for (int64_t which : {0, 1, 2}) {
    SCOPED_TRACE("conv input case " + std::to_string(which));
    Recorder r;
    expect_matches_eager(net, [&] { return poison(torch::randn({2, 3, 8, 8}), which); }, r);
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"conv+bias+bn+relu", "conv+bias+relu"}));
  }
  {
    Recorder r;
    auto weight = net[3]->as<torch::nn::Conv2d>()->weight;
    torch::Tensor saved = weight.clone();
    weight.view({-1})[11] = nan;  // repacked before the next call
    expect_matches_eager(net, [] { return torch::randn({2, 3, 8, 8}); }, r);
    weight.copy_(saved);
  }
  // Weights as inputs (as training graphs pass them): transposed, and a view with gaps. oneDNN
  // takes such GEMMs only where its brgemm kernels run them: forced here, to check its path on
  // every machine. (Inputs no larger than 4x the result, so that relu stays fused: see below.)
  tc_test::ScopedEnv dynamic_gemms("TORCHCOMPILE_ONEDNN_DYNAMIC_GEMM", "1");
  auto relu_mm = [](torch::Tensor x, torch::Tensor w) { return torch::relu(x.mm(w.t())); };
  auto relu_mm_strided = [](torch::Tensor x, torch::Tensor w) { return torch::relu(x.mm(w.t().slice(1, 0, 40, 2))); };
  for (int64_t which : {0, 1, 2, 3}) {
    SCOPED_TRACE("weight input case " + std::to_string(which));
    Recorder r, rs;
    auto fast = torch::compile(relu_mm, opts(r));
    auto fast_strided = torch::compile(relu_mm_strided, opts(rs));
    for (int call = 0; call < 2; ++call) {
      torch::Tensor x = torch::randn({64, 16}), w = poison(torch::randn({24, 16}), which);
      EXPECT_TRUE(tc_test::tensors_close(relu_mm(x, w), fast(x, w), kRtol, kAtol));
      torch::Tensor w40 = torch::randn({40, 16});
      w40.view({-1})[2 * 16 + 3] = which ? nan : 1.f;  // in a row the strided view keeps
      EXPECT_TRUE(tc_test::tensors_close(relu_mm_strided(x, w40), fast_strided(x, w40), kRtol, kAtol));
    }
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear+relu"}));
    EXPECT_EQ(rs.fused(), (std::vector<std::string>{"linear+relu"}));
  }
}

// A relu fused into a GEMM whose weight is an input makes every call scan the inputs for NaN and
// infinities; where they are more than 4x the result (a training graph's first layer: a wide
// weight, few rows), the relu runs as its own pass over the result instead, NaN kept as ATen keeps
// it. A prepacked weight is scanned once, so inference keeps its fused relu.
TEST(OneDnnBackend, ActivationRunsAloneWhereScanningTheInputsCostsMore) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(43);
  tc_test::ScopedEnv dynamic_gemms("TORCHCOMPILE_ONEDNN_DYNAMIC_GEMM", "1");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto relu_mm = [](torch::Tensor x, torch::Tensor w) { return torch::relu(x.mm(w.t())); };
  for (int which : {0, 1, 2}) {
    SCOPED_TRACE("case " + std::to_string(which));
    Recorder r;
    auto fast = torch::compile(relu_mm, opts(r));
    for (int call = 0; call < 2; ++call) {
      // Scans 72 K floats for 128; the weight scaled as Linear's initialization scales it, so that
      // results are of order 1 (sums of 2048 products, rounded in another order than ATen's).
      torch::Tensor x = torch::randn({4, 2048}), w = torch::randn({32, 2048}) * 0.02;
      if (which == 1) x.view({-1})[3000] = nan;
      if (which == 2) w.view({-1})[7000] = nan;
      EXPECT_TRUE(tc_test::tensors_close(relu_mm(x, w), fast(x, w), kRtol, kAtol));
    }
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear"}));
  }
  // The same shapes with the weight a module attribute (prepacked, scanned when packed).
  auto m = std::make_shared<FnModule>();
  auto lin = m->register_module("lin", torch::nn::Linear(2048, 32));
  m->fn = [=](FnModule&, torch::Tensor x) { return torch::relu(lin->forward(x)); };
  Recorder r;
  expect_matches_eager(m, [] { return torch::randn({4, 2048}); }, r);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear+bias+relu"}));
}

// ---- the NaN / infinity scan, compiled per ISA and chosen with TORCHCOMPILE_ISA ------------------

// The scans this CPU runs: TORCHCOMPILE_ISA's name, and the scan's (od::scan_isa()).
std::vector<std::pair<std::string, std::string>> scans_of_this_cpu() {
  std::vector<std::pair<std::string, std::string>> out{{"scalar", "scalar (sse2)"}};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back({"avx2", "avx2"});
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
    out.push_back({"avx512", "avx512"});
  return out;
}

// Random floats (lengths 0 to 300 and a few thousand, so every vector tail; starting at
// unaligned offsets) with NaNs of both signs, infinities, the largest finite magnitudes and
// subnormals at random positions (the last one included): each scan finds a NaN, or a NaN or an
// infinity, exactly where a scalar loop does. Under TORCHCOMPILE_ISA=scalar / avx2 / avx512 the
// selected scan, and the one a compiled graph's steps run, is that ISA's, and NaN and infinities
// still reach the results as in eager.
TEST(OneDnnBackend, ScanIsChosenByTorchcompileIsaAndEveryScanAgrees) {
  torch::NoGradGuard no_grad;
  const auto scans = scans_of_this_cpu();
  std::mt19937 rng(43);
  auto pick = [&](size_t lo, size_t hi) { return std::uniform_int_distribution<size_t>(lo, hi)(rng); };
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 1e38f,
                            std::numeric_limits<float>::denorm_min(), -0.f};
  struct Case {
    std::vector<float> data;
    size_t offset, n;
    bool nan, nonfinite;
  };
  std::vector<Case> cases;
  std::normal_distribution<float> normal(0.f, 1e3f);
  for (size_t trial = 0; trial < 420; ++trial) {
    Case c;
    c.n = trial < 300 ? trial : pick(300, 5000);
    c.offset = pick(0, 3);
    c.data.resize(c.offset + c.n);
    for (float& v : c.data) v = normal(rng);
    const size_t k = c.n ? pick(0, 3) : 0;
    for (size_t i = 0; i < k; ++i)
      c.data[c.offset + (i == 0 && trial % 3 == 0 ? c.n - 1 : pick(0, c.n - 1))] = specials[pick(0, 8)];
    if (c.offset) c.data[0] = std::numeric_limits<float>::quiet_NaN();  // before the scanned range
    c.nan = c.nonfinite = false;
    for (size_t i = c.offset; i < c.data.size(); ++i) {
      c.nan |= std::isnan(c.data[i]);
      c.nonfinite |= !std::isfinite(c.data[i]);
    }
    cases.push_back(std::move(c));
  }
  int with_nan = 0, with_infinity_only = 0;
  for (const Case& c : cases) {
    with_nan += c.nan;
    with_infinity_only += c.nonfinite && !c.nan;
  }
  EXPECT_GT(with_nan, 50);
  EXPECT_GT(with_infinity_only, 30);

  for (const auto& [isa, name] : scans) {
    SCOPED_TRACE("TORCHCOMPILE_ISA=" + isa);
    tc_test::ScopedEnv env("TORCHCOMPILE_ISA", isa);
    EXPECT_EQ(std::string(od::scan_isa()), name);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const float* p = c.data.data() + c.offset;
      EXPECT_EQ(od::scan_finds(p, c.n, false), c.nan) << "case " << i << ", " << c.n << " floats";
      EXPECT_EQ(od::scan_finds(p, c.n, true), c.nonfinite) << "case " << i << ", " << c.n << " floats";
    }
    // The steps of a graph compiled now run this scan: linear + relu (NaN and infinity), max
    // pooling (NaN).
    auto m = std::make_shared<FnModule>();
    auto lin = m->register_module("lin", torch::nn::Linear(37, 21));
    m->fn = [lin](FnModule&, torch::Tensor x) {
      return torch::max_pool2d(torch::relu(lin->forward(x)).view({2, 3, 21, 1}), {2, 1});
    };
    Recorder r;
    int call = 0;
    expect_matches_eager(m, [&] {
      torch::Tensor x = torch::randn({6, 37});
      if (call % 3 == 1) x.index_put_({1, 36}, std::numeric_limits<float>::quiet_NaN());
      if (call % 3 == 2) x.index_put_({4, 5}, -std::numeric_limits<float>::infinity());
      ++call;
      return x;
    }, r, 6);
    EXPECT_EQ(r.fused(), (std::vector<std::string>{"linear+bias+relu", "maxpool"}));
    ASSERT_EQ(r.entries->size(), 1u);
    EXPECT_EQ(r.entries->at(0).scan_isa, name);
  }
}

// As for the fused backend: an unknown TORCHCOMPILE_ISA fails the compile with its message (the
// call runs eagerly, with a warning, as for any backend error).
TEST(OneDnnBackend, UnknownIsaIsAnError) {
  torch::NoGradGuard no_grad;
  tc_test::ScopedEnv isa("TORCHCOMPILE_ISA", "avx9000");
  const std::string message = "TORCHCOMPILE_ISA: expected one of avx512, avx2, scalar (or sse2), got 'avx9000'";
  try {
    od::scan_isa();
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(message));
  }
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU());
  auto e = torchcompile::explain("onednn", net, torch::randn({4, 8}));
  EXPECT_NE(e.str().find(message), std::string::npos) << e;
}

// ---- LSTM and GRU layers as oneDNN RNN primitives ------------------------------------------------
// A random stack (cell, layers, directions, batch-first, biases, sizes; zero or given initial
// states) compiled by onednn against eager in double precision: the sequence output and the final
// states, after an in-place update of a weight (repacked), with a NaN and infinities in the input.
struct RnnNet : torch::nn::Module {
  bool gru = false, given_states = false;
  torch::nn::LSTM lstm{nullptr};
  torch::nn::GRU gru_layer{nullptr};
  torch::Tensor h0, c0;
  std::vector<torch::Tensor> flat_weights() {
    std::vector<torch::Tensor> w;
    for (auto& p : parameters()) w.push_back(p);
    return w;
  }
  // The same stack in double precision with this one's current parameters and states: the
  // reference (ATen's own kernels). LibTorch 2.6 runs fp32 LSTMs with oneDNN 3.7's brgemm kernel,
  // which is wrong for some hidden sizes on AVX-512 CPUs (see onednn_rnn.cpp); a compiled
  // module's first call traces with those eager kernels, so the tests do not compare it.
  std::shared_ptr<RnnNet> double_copy() const {
    auto r = std::make_shared<RnnNet>();
    r->gru = gru;
    r->given_states = given_states;
    if (lstm)
      r->lstm = r->register_module("lstm", torch::nn::LSTM(std::dynamic_pointer_cast<torch::nn::LSTMImpl>(lstm->clone())));
    if (gru_layer)
      r->gru_layer = r->register_module("gru", torch::nn::GRU(std::dynamic_pointer_cast<torch::nn::GRUImpl>(gru_layer->clone())));
    if (h0.defined()) r->h0 = r->register_buffer("h0", h0.clone());
    if (c0.defined()) r->c0 = r->register_buffer("c0", c0.clone());
    r->to(torch::kDouble);
    return r;
  }
  torch::Tensor forward(torch::Tensor x) {
    if (gru) {
      auto r = given_states ? gru_layer->forward(x, h0) : gru_layer->forward(x);
      return torch::cat({std::get<0>(r).flatten(), std::get<1>(r).flatten()});
    }
    auto r = given_states ? lstm->forward(x, std::make_tuple(h0, c0)) : lstm->forward(x);
    auto states = std::get<1>(r);
    return torch::cat({std::get<0>(r).flatten(), std::get<0>(states).flatten(), std::get<1>(states).flatten()});
  }
};

TEST(OneDnnBackend, RandomLstmAndGruStacksMatchEager) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(2026);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 16; ++trial) {
    torch::manual_seed(trial);
    auto net = std::make_shared<RnnNet>();
    net->gru = trial % 2 == 1;
    const int64_t layers = pick(1, 3), in = pick(1, 24), hidden = pick(1, 40), seq = pick(1, 9), batch = pick(1, 5);
    const bool bidir = pick(0, 1), batch_first = pick(0, 1), bias = pick(0, 3) != 0;
    net->given_states = pick(0, 1);
    const int64_t dirs = bidir ? 2 : 1;
    std::string what = std::string(net->gru ? "gru" : "lstm") + " layers " + std::to_string(layers) + " in " +
                       std::to_string(in) + " hidden " + std::to_string(hidden) + " seq " + std::to_string(seq) +
                       " batch " + std::to_string(batch) + (bidir ? " bidirectional" : "") +
                       (batch_first ? " batch_first" : "") + (bias ? "" : " no-bias") +
                       (net->given_states ? " given states" : "");
    SCOPED_TRACE(what);
    if (net->gru)
      net->gru_layer = net->register_module(
          "gru", torch::nn::GRU(torch::nn::GRUOptions(in, hidden).num_layers(layers).bidirectional(bidir)
                                    .batch_first(batch_first).bias(bias).dropout(layers > 1 ? 0.5 : 0.0)));
    else
      net->lstm = net->register_module(
          "lstm", torch::nn::LSTM(torch::nn::LSTMOptions(in, hidden).num_layers(layers).bidirectional(bidir)
                                      .batch_first(batch_first).bias(bias).dropout(layers > 1 ? 0.5 : 0.0)));
    net->h0 = net->register_buffer("h0", torch::randn({layers * dirs, batch, hidden}));
    net->c0 = net->register_buffer("c0", torch::randn({layers * dirs, batch, hidden}));
    net->eval();  // dropout between layers only in training
    std::vector<int64_t> xs = batch_first ? std::vector<int64_t>{batch, seq, in} : std::vector<int64_t>{seq, batch, in};
    Recorder r;
    auto fast = torch::compile(net, opts(r));
    fast(torch::randn(xs));
    for (int call = 0; call < 4; ++call) {
      torch::Tensor x = torch::randn(xs);
      if (call == 2) net->flat_weights()[pick(0, static_cast<int64_t>(net->flat_weights().size()) - 1)].mul_(-0.5);
      if (call == 3) {
        x.view({-1})[pick(0, x.numel() - 1)] = nan;
        x.view({-1})[pick(0, x.numel() - 1)] = inf;
        x.view({-1})[pick(0, x.numel() - 1)] = -inf;
      }
      torch::Tensor expected = net->double_copy()->forward(x.to(torch::kDouble)).to(torch::kFloat);
      torch::Tensor actual = fast(x);
      EXPECT_TRUE(tc_test::tensors_close(expected, actual, kRtol, kAtol)) << "call " << call;
    }
    std::string label = std::string(net->gru ? "gru" : "lstm") + " (" + std::to_string(layers) + " layer" +
                        (layers > 1 ? "s" : "") + (bidir ? ", bidirectional" : "") + ")";
    EXPECT_EQ(r.fused(), (std::vector<std::string>{label}));
  }
}

TEST(OneDnnBackend, RnnLayersOutsideTheLoweringStayWithATen) {
  torch::manual_seed(51);
  // Dropout between layers in training mode, and TORCHCOMPILE_ONEDNN_RNN=0.
  auto net = std::make_shared<RnnNet>();
  net->lstm = net->register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(6, 8).num_layers(2).dropout(0.3)));
  torch::NoGradGuard no_grad;
  {
    Recorder r;
    auto fast = torch::compile(net, opts(r));
    torch::Tensor x = torch::randn({5, 2, 6});
    torch::manual_seed(1);
    torch::Tensor expected = net->forward(x);
    torch::manual_seed(1);
    EXPECT_TRUE(tc_test::tensors_close(expected, fast(x), kRtol, kAtol));
    EXPECT_TRUE(r.fused().empty());
  }
  net->eval();
  setenv("TORCHCOMPILE_ONEDNN_RNN", "0", 1);
  Recorder off;
  expect_matches_eager(net, [] { return torch::randn({5, 2, 6}); }, off);
  EXPECT_TRUE(off.fused().empty());
  unsetenv("TORCHCOMPILE_ONEDNN_RNN");
  Recorder on;
  auto fast = torch::compile(net, opts(on));
  fast(torch::randn({5, 2, 6}));  // traces
  for (int call = 0; call < 3; ++call) {
    torch::Tensor x = torch::randn({5, 2, 6});
    torch::Tensor expected = net->double_copy()->forward(x.to(torch::kDouble)).to(torch::kFloat);
    EXPECT_TRUE(tc_test::tensors_close(expected, fast(x), kRtol, kAtol)) << "call " << call;
  }
  EXPECT_EQ(on.fused(), (std::vector<std::string>{"lstm (2 layers)"}));
}

// One compiled LSTM + GRU stack called from four threads at once (shared primitives and packs;
// each call its own memory objects and scratchpad).
TEST(OneDnnBackend, RnnFourThreadsAtOnceMatchEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(52);
  auto m = std::make_shared<FnModule>();
  auto lstm = m->register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(6, 12).num_layers(2).bidirectional(true)));
  auto gru = m->register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(24, 8).batch_first(true)));
  m->fn = [lstm, gru](FnModule&, torch::Tensor x) {
    torch::Tensor h = std::get<0>(lstm->forward(x));
    return std::get<0>(gru->forward(h.transpose(0, 1).contiguous()));
  };
  m->eval();
  // Expected: the same layers in double precision (eager fp32 LSTMs are no reference on LibTorch
  // 2.6 with AVX-512: see RandomLstmAndGruStacksMatchEager).
  auto lstm_ref = std::dynamic_pointer_cast<torch::nn::LSTMImpl>(lstm->clone());
  auto gru_ref = std::dynamic_pointer_cast<torch::nn::GRUImpl>(gru->clone());
  lstm_ref->to(torch::kDouble);
  gru_ref->to(torch::kDouble);
  Recorder r;
  auto fast = torch::compile(m, opts(r));
  fast(torch::randn({7, 3, 6}));  // traces (with eager's kernels)
  std::vector<torch::Tensor> inputs, expected;
  for (int i = 0; i < 8; ++i) {
    inputs.push_back(torch::randn({7, 3, 6}));
    torch::Tensor h = std::get<0>(lstm_ref->forward(inputs.back().to(torch::kDouble)));
    expected.push_back(std::get<0>(gru_ref->forward(h.transpose(0, 1).contiguous())).to(torch::kFloat));
  }
  expect_four_threads_match(fast, inputs, expected);
  EXPECT_EQ(r.fused(), (std::vector<std::string>{"lstm (2 layers, bidirectional)", "gru (1 layer)"}));
}

// What `body` logs under TORCHCOMPILE_LOGS=dynamic (its stderr).
std::string dynamic_log_of(const std::function<void()>& body) {
  torchcompile::logging::set_logs("dynamic");
  ::testing::internal::CaptureStderr();
  body();
  const std::string log = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::set_logs("");
  return log;
}

// A graph with size symbols whose GEMMs' rows vary (the batch, or batch and sequence of a 3-D
// input) gets one program for every size (oneDNN matmuls with run-time rows): random stacks of
// Linear layers with fused activations, residual adds (not fused with run-time rows) and NaNs,
// called at random sizes, contiguous or not, under `onednn` and `default` with `dynamic = true`,
// match eager, and no size after the first builds primitives (compile_per_shape logs none).
TEST(OneDnnBackend, GemmsWithRunTimeRowsServeEverySizeAsEager) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(61);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  for (int program = 0; program < 12; ++program) {
    torch::manual_seed(program);
    const bool three_d = program % 3 == 2;
    const int64_t features = 8 + 8 * pick(4);
    auto m = std::make_shared<FnModule>();
    std::vector<torch::nn::Linear> layers;
    std::vector<int> acts, residual;
    int64_t width = features;
    const int depth = 1 + pick(3);
    for (int i = 0; i < depth; ++i) {
      const int64_t out = pick(2) ? width : 4 + 4 * pick(6);
      layers.push_back(m->register_module("l" + std::to_string(i), torch::nn::Linear(width, out)));
      acts.push_back(pick(5));
      residual.push_back(out == width && pick(2));
      width = out;
    }
    m->fn = [layers, acts, residual](FnModule&, torch::Tensor x) mutable {
      for (size_t i = 0; i < layers.size(); ++i) {
        torch::Tensor y = layers[i]->forward(x);
        switch (acts[i]) {
          case 0: y = torch::relu(y); break;
          case 1: y = torch::gelu(y); break;
          case 2: y = torch::tanh(y); break;
          case 3: y = torch::sigmoid(y); break;
          default: break;
        }
        x = residual[i] ? y + x : y;
      }
      return x;
    };
    m->eval();
    for (const char* backend : {"onednn", "default"}) {
      std::string failure;
      const std::string log = dynamic_log_of([&] {
        auto fast = torch::compile(m, torchcompile::CompileOptions(backend).with_dynamic(true));
        for (int call = 0; call < 8 && failure.empty(); ++call) {
          const int64_t rows = call == 0 ? 6 : pick(3) == 0 ? 6 : 1 + pick(40);
          torch::Tensor x = three_d ? torch::randn({rows, 1 + pick(5), features}) : torch::randn({rows, features});
          if (pick(4) == 0) x.view(-1)[pick(static_cast<int>(x.numel()))] = std::nanf("");
          if (pick(4) == 0) x = x.transpose(0, x.dim() - 1).contiguous().transpose(0, x.dim() - 1);  // not contiguous
          torch::Tensor expected = m->forward(x);
          torch::Tensor actual = fast(x);
          auto close = tc_test::tensors_close(expected, actual, kRtol, kAtol);
          if (!close)
            failure = std::string(backend) + ", program " + std::to_string(program) + ", call " +
                      std::to_string(call) + ", sizes " + c10::str(x.sizes()) + ": " + close.message();
        }
      });
      ASSERT_TRUE(failure.empty()) << failure;
      EXPECT_THAT(log, ::testing::HasSubstr("onednn: one program for every size")) << backend << ", program " << program;
      EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("compile_per_shape: new sizes")))
          << backend << ", program " << program;
    }
  }
}

// The weights of GEMMs with run-time rows are packed into oneDNN's plain (K, N) layout from every
// layout a module's weight can have: a Linear's (N, K) weight, contiguous or a transposed view,
// and a (K, N) parameter multiplied directly, contiguous or a transposed view; with widths whose
// rows get spaced (N = 128) and not. Called at random sizes, each matches eager.
TEST(OneDnnBackend, GemmsWithRunTimeRowsPackEveryWeightLayout) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(62);
  auto m = std::make_shared<FnModule>();
  auto a = m->register_module("a", torch::nn::Linear(24, 128));
  auto b = m->register_module("b", torch::nn::Linear(128, 40));
  b->weight.set_data(torch::randn({128, 40}).t());  // a Linear weight that is a transposed view
  torch::Tensor kn = m->register_parameter("kn", torch::randn({40, 128}) * 0.1);
  torch::Tensor kn_t = m->register_parameter("kn_t", (torch::randn({36, 40}) * 0.1).t());  // (40, 36), a view
  torch::Tensor bias = m->register_parameter("bias", torch::randn({36}));
  ASSERT_FALSE(b->weight.is_contiguous());
  ASSERT_FALSE(kn_t.is_contiguous());
  m->fn = [a, b, kn, kn_t, bias](FnModule&, torch::Tensor x) mutable {
    torch::Tensor y = b->forward(torch::relu(a->forward(x)));
    y = torch::tanh(y.matmul(kn));                    // (K, N) weight, rows 128 floats long
    return torch::addmm(bias, y.mm(kn.t()), kn_t);   // (K, N) weight that is a transposed view
  };
  m->eval();
  std::mt19937 rng(62);
  for (const char* backend : {"onednn", "default"}) {
    auto fast = torch::compile(m, torchcompile::CompileOptions(backend).with_dynamic(true));
    for (int call = 0; call < 6; ++call) {
      const int64_t rows = call == 0 ? 6 : 1 + static_cast<int64_t>(rng() % 40);
      torch::Tensor x = torch::randn({rows, 24});
      auto close = tc_test::tensors_close(m->forward(x), fast(x), kRtol, kAtol);
      ASSERT_TRUE(close) << backend << ", rows " << rows << ": " << close.message();
    }
  }
}

// Packed weights of several MiB: a Linear (static rows, and run-time rows packed by the tiled
// transpose), a convolution and an LSTM give eager's results, also after their weights change
// in place (packed again).
TEST(OneDnnBackend, LargePackedWeightsMatchEager) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(63);
  torch::nn::Linear fc(1024, 768);                                                       // 3 MiB
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(256, 256, 3).padding(1));             // 2.25 MiB
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(256, 512));                                // 6 MiB
  auto rnn = std::make_shared<FnModule>();
  rnn->register_module("lstm", lstm);
  rnn->fn = [lstm](FnModule&, torch::Tensor x) mutable { return std::get<0>(lstm->forward(x)); };
  fc->eval();
  conv->eval();
  rnn->eval();
  std::mt19937 rng(63);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "as made" : "after in-place updates");
    for (bool dynamic : {false, true}) {
      auto fast = torch::compile(fc, torchcompile::CompileOptions("onednn").with_dynamic(dynamic));
      for (int call = 0; call < 4; ++call) {
        torch::Tensor x = torch::randn({dynamic ? 1 + static_cast<int64_t>(rng() % 40) : 16, 1024});
        auto close = tc_test::tensors_close(fc->forward(x), fast(x), kRtol, kAtol);
        ASSERT_TRUE(close) << "Linear, dynamic " << dynamic << ": " << close.message();
      }
    }
    auto fast_conv = torch::compile(conv, torchcompile::CompileOptions("onednn"));
    torch::Tensor img = torch::randn({1, 256, 6, 6});
    auto close = tc_test::tensors_close(conv->forward(img), fast_conv(img), 1e-3, 1e-4);
    ASSERT_TRUE(close) << "Conv2d: " << close.message();
    auto fast_rnn = torch::compile(rnn, torchcompile::CompileOptions("onednn"));
    torch::Tensor seq = torch::randn({5, 2, 256});
    close = tc_test::tensors_close(rnn->forward(seq), fast_rnn(seq), 1e-4, 1e-5);
    ASSERT_TRUE(close) << "LSTM: " << close.message();
    for (auto& p : fc->parameters()) p.mul_(-0.5);
    for (auto& p : conv->parameters()) p.mul_(0.5);
    for (auto& p : lstm->parameters()) p.mul_(0.75);
  }
}

// Four threads call one program with run-time rows at different sizes at once.
TEST(OneDnnBackend, GemmsWithRunTimeRowsFourThreadsAtOnce) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(62);
  torch::nn::Sequential net(torch::nn::Linear(24, 48), torch::nn::ReLU(), torch::nn::Linear(48, 8));
  net->eval();
  auto fast = torch::compile(net, torchcompile::CompileOptions("onednn").with_dynamic(true));
  std::vector<torch::Tensor> inputs, expected;
  for (int64_t rows : {3, 17, 64, 1, 40, 9}) {
    inputs.push_back(torch::randn({rows, 24}));
    expected.push_back(net->forward(inputs.back()));
  }
  expect_four_threads_match(fast, inputs, expected);
}

// Where a primitive needs fixed sizes (a convolution), each size gets its own program, as the
// log says, and the results stay eager's.
TEST(OneDnnBackend, ConvolutionsWithSymbolicSizesArePerSize) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(63);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)), torch::nn::ReLU(),
                            torch::nn::Flatten(), torch::nn::Linear(8 * 6 * 6, 5));
  net->eval();
  torchcompile::logging::set_logs("dynamic");
  ::testing::internal::CaptureStderr();
  auto fast = torch::compile(net, torchcompile::CompileOptions("onednn").with_dynamic(true));
  for (int64_t batch : {2, 5, 2, 7}) {
    torch::Tensor x = torch::randn({batch, 3, 6, 6});
    EXPECT_TRUE(tc_test::tensors_close(net->forward(x), fast(x), kRtol, kAtol)) << "batch " << batch;
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::set_logs("");
  EXPECT_THAT(log, ::testing::HasSubstr("oneDNN builds this primitive for fixed sizes"));
  EXPECT_THAT(log, ::testing::HasSubstr("compile_per_shape: new sizes"));
}

// Programs built for other sizes of one graph borrow their large buffers (blocked activations of
// a MiB and more) from one pool: four threads calling a conv net at four batch sizes at once, each
// size its own program, match eager.
TEST(OneDnnBackend, ProgramsForManySizesShareBuffersFromFourThreads) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(64);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)),
                            torch::nn::BatchNorm2d(16), torch::nn::ReLU(),
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)), torch::nn::ReLU(),
                            torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(), torch::nn::Linear(32, 5));
  net->eval();
  auto fast = torch::compile(net, torchcompile::CompileOptions("onednn").with_dynamic(true));
  std::vector<torch::Tensor> inputs, expected;
  for (int64_t batch : {16, 18, 21, 24, 17}) {  // conv outputs of 1-3 MiB
    inputs.push_back(torch::randn({batch, 3, 32, 32}));
    expected.push_back(net->forward(inputs.back()));
  }
  expect_four_threads_match(fast, inputs, expected);
}

// Both programs of a graph with run-time rows (the example sizes' and every other size's) read the
// weights live: after in-place updates and after an optimizer step (through `.data()`, seen by the
// gradients' state; docs/limitations.md), calls at the example size and at other sizes match
// eager.
TEST(OneDnnBackend, GemmsWithRunTimeRowsFollowWeightUpdates) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(65);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 8));
  net->eval();
  auto fast = torch::compile(net, torchcompile::CompileOptions("onednn").with_dynamic(true));
  auto check = [&](const char* when) {
    for (int64_t rows : {5, 9, 5, 13}) {
      torch::Tensor x = torch::randn({rows, 16});
      EXPECT_TRUE(tc_test::tensors_close(net->forward(x), fast(x), kRtol, kAtol)) << when << ", rows " << rows;
    }
  };
  check("before");
  for (auto& p : net->parameters()) p.mul_(-0.5);
  check("after in-place updates");
  {
    torch::AutoGradMode grad(true);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    net->forward(torch::randn({7, 16})).pow(2).sum().backward();
    sgd.step();
  }
  check("after an optimizer step");
}

// ---- the intra-op thread count ------------------------------------------------------------------

namespace {

// CPU time (clock ticks) of each thread of this process, by thread id (/proc/self/task/*/stat).
std::map<int, long> thread_ticks() {
  std::map<int, long> ticks;
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return ticks;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');  // the name may hold spaces
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    long utime = 0, stime = 0;
    for (int k = 3; k <= 15 && rest >> field; ++k) {  // fields 14 and 15: utime, stime
      if (k == 14) utime = std::stol(field);
      if (k == 15) stime = std::stol(field);
    }
    ticks[std::atoi(e->d_name)] = utime + stime;
  }
  closedir(dir);
  return ticks;
}

// How many threads were busy while `f` ran for about `ms` milliseconds: those that used at least
// a quarter of the busiest one's CPU time.
int busy_threads(const std::function<void()>& f, int ms = 400) {
  const auto before = thread_ticks();
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(ms)) f();
  const auto after = thread_ticks();
  long most = 0;
  std::vector<long> used;
  for (const auto& [tid, t] : after) {
    auto it = before.find(tid);
    used.push_back(t - (it == before.end() ? 0 : it->second));
    most = std::max(most, used.back());
  }
  int busy = 0;
  for (long u : used) busy += most > 0 && 4 * u >= most;
  return busy;
}

struct Threads {
  int saved = at::get_num_threads();
  ~Threads() { at::set_num_threads(saved); }
};

}  // namespace

// A graph compiled while LibTorch runs 2 intra-op threads uses 1 after at::set_num_threads(1)
// (oneDNN's primitives keep the count they were created with: the program is rebuilt for the new
// count), and 2 again after going back; so do the int8 kernels of Precision::Int8Dynamic.
TEST(OneDnnBackend, CompiledCallsFollowTheIntraOpThreadCount) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs 2 cores";
  Threads restore;
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  auto lin1 = torch::nn::Linear(1024, 1024), lin2 = torch::nn::Linear(1024, 1024);
  auto fn = [&](torch::Tensor x) { return lin2(torch::relu(lin1(x))); };
  auto x = torch::randn({256, 1024});
  for (const char* backend : {"onednn", "default", "default int8"}) {
    at::set_num_threads(2);
    const bool int8 = std::string(backend) == "default int8";
    auto fast = torch::compile(fn, torchcompile::CompileOptions("default").with_backend(int8 ? "default" : backend)
                                       .with_precision(int8 ? torchcompile::Precision::Int8Dynamic
                                                            : torchcompile::Precision::Float32));
    fast(x);
    fast(x);
    EXPECT_EQ(busy_threads([&] { fast(x); }), 2) << backend << ": compiled with 2 threads";
    at::set_num_threads(1);
    EXPECT_EQ(busy_threads([&] { fn(x); }), 1) << "eager with 1 thread";
    EXPECT_EQ(busy_threads([&] { fast(x); }), 1) << backend << " after at::set_num_threads(1)";
    if (!int8) EXPECT_TRUE(torch::allclose(fast(x), fn(x), 1e-4, 1e-4)) << backend;
    at::set_num_threads(2);
    EXPECT_EQ(busy_threads([&] { fast(x); }), 2) << backend << " back at 2 threads";
  }
}

// oneDNN's f32 GEMM for AVX2 CPUs (`gemm:jit`) reads a prepacked weight in the plain (K, N)
// layout and slows down by up to 1.7x when its rows are a multiple of 512 bytes apart, so such a
// weight is kept with rows 16 floats longer (with_spaced_weight_rows): Linears with and without a
// transposed weight, and a transposed convolution's GEMM (its N is kernel taps x channels), of
// every kind of N, results as eager's. Where oneDNN picks a blocked layout (its AVX-512 kernels)
// nothing is spaced; CTest `onednn_gemm_as_on_avx2` runs this test with ONEDNN_MAX_CPU_ISA=AVX2.
TEST(OneDnnBackend, PlainWeightRowsAreSpacedOffMultiplesOf512Bytes) {
  torch::NoGradGuard no_grad;
  auto expect_label = [](const std::string& impl, int64_t n) {
    const bool plain_kernel = impl.rfind("gemm:jit", 0) == 0;
    const bool spaced = impl.find(", weight rows " + std::to_string(n + 16) + " apart") != std::string::npos;
    EXPECT_EQ(spaced, plain_kernel && n % 128 == 0) << impl << ", N = " << n;
  };
  size_t spaced_seen = 0;
  std::string kernel;
  for (int64_t out : {1024, 512, 384, 1000, 100, 10}) {
    for (bool transposed : {false, true}) {
      SCOPED_TRACE("N = " + std::to_string(out) + (transposed ? ", x.matmul(w.t())" : ", Linear"));
      torch::manual_seed(out);
      auto m = std::make_shared<FnModule>();
      auto lin = m->register_module("lin", torch::nn::Linear(96, out));
      m->fn = [lin, transposed](FnModule&, torch::Tensor x) {
        return torch::relu(transposed ? x.matmul(lin->weight.t()) + lin->bias : lin->forward(x));
      };
      Recorder r;
      expect_matches_eager(m, [] { return torch::randn({37, 96}); }, r);
      ASSERT_EQ(r.entries->size(), 1u);
      ASSERT_EQ(r.entries->at(0).impls.size(), 1u);
      expect_label(r.entries->at(0).impls[0], out);
      spaced_seen += r.entries->at(0).impls[0].find("weight rows") != std::string::npos;
      kernel = r.entries->at(0).impls[0];
    }
  }
  {
    tc_test::ScopedEnv env("TORCHCOMPILE_ONEDNN_DECONV", "gemm");
    torch::manual_seed(7);
    torch::nn::Sequential net(torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(8, 64, 4).stride(2).padding(1)),
                              torch::nn::ReLU());
    net->eval();
    Recorder r;
    expect_deconvs_match_double(net, [] { return torch::randn({2, 8, 5, 5}); }, r);
    ASSERT_EQ(r.entries->at(0).impls.size(), 1u);
    expect_label(r.entries->at(0).impls[0], 4 * 4 * 64);
  }
  std::cout << "[ info ] " << spaced_seen << " of 12 Linear weights spaced (last kernel: " << kernel << ")\n";
}

// A static GEMM of at most 32 rows in a graph whose weights exceed 32 MiB (read from memory at
// every call) reads its prepacked weight in the layout the same weight's GEMM with run-time rows
// reads (oneDNN 2.6: the plain layout, rows spaced, for `gemm:jit`), where oneDNN takes it with
// that kernel, so the programs of a module's first sizes and of every size share one pack: the
// static and the run-time-rows programs report the same kernel and layout at 1-32 rows for N a
// multiple of 128. Where fixed rows get brgemm and run-time rows `gemm:jit` (oneDNN 2.6 on
// AVX-512), at 33 and more rows, for N = 100 (whose plain layout oneDNN gives to brgemm) and in a
// graph of small weights the static GEMMs keep brgemm. Results as eager's. (With oneDNN 3.7 the
// fixed rows get another kernel for that layout: nothing is shared there.)
TEST(OneDnnBackend, FewRowGemmsOfLargeProgramsReadTheLayoutOfRunTimeRows) {
  // oneDNN 3.7 gives fixed rows another kernel than run-time rows' `gemm:jit:f32` for that
  // layout (measured with LibTorch 2.6): there the rule takes nothing, and only the other side
  // is checked.
  constexpr bool kFixedRowsTakeGemmJitsLayout = DNNL_VERSION_MAJOR < 3;
  torch::NoGradGuard no_grad;
  Recorder rows_r;
  auto rows_backend = [e = rows_r.entries](torchcompile::GraphModule& gm, const std::vector<at::Tensor>& inputs) {
    od::Compiled c = od::compile_rows(gm, inputs);
    e->push_back({c.fused, c.blocked_values, c.winograd_convs, !c.fn, c.reason, c.scan_isa, c.impls});
    return c.fn;
  };
  struct Case {
    int64_t in, hidden, out;
    bool large;
  };
  for (const Case& k : {Case{3072, 3072, 100, true}, Case{96, 384, 1152, false}}) {
    torch::manual_seed(k.in);
    auto m = std::make_shared<FnModule>();
    auto a = m->register_module("a", torch::nn::Linear(k.in, k.hidden));
    auto b = m->register_module("b", torch::nn::Linear(k.hidden, k.out));
    m->fn = [a, b](FnModule&, torch::Tensor x) { return b->forward(torch::gelu(a->forward(x))); };
    m->eval();
    rows_r.entries->clear();
    auto rows_fast = torch::compile(m, torchcompile::CompileOptions(rows_backend).with_fullgraph());
    const torch::Tensor probe = torch::randn({7, k.in});
    EXPECT_TRUE(tc_test::tensors_close(m->forward(probe), rows_fast(probe), kRtol, kAtol));
    ASSERT_EQ(rows_r.entries->size(), 1u);
    const std::vector<std::string> rows_impls = rows_r.entries->at(0).impls;
    ASSERT_EQ(rows_impls.size(), 2u);
    bool host_has_brgemm = false;
    for (int64_t rows : {64, 33, 32, 17, 5, 1}) {
      SCOPED_TRACE(std::to_string(k.in) + " -> " + std::to_string(k.hidden) + " -> " + std::to_string(k.out) + ", " +
                   std::to_string(rows) + " rows");
      Recorder r;
      expect_matches_eager(m, [&] { return torch::randn({rows, k.in}); }, r, 2, 1e-3, 1e-4);
      ASSERT_EQ(r.entries->size(), 1u);
      ASSERT_EQ(r.entries->at(0).impls.size(), 2u);
      if (rows == 64) host_has_brgemm = r.entries->at(0).impls[0].rfind("brg", 0) == 0;
      for (size_t i = 0; i < 2; ++i) {
        const int64_t n = i == 0 ? k.hidden : k.out;
        const std::string& static_impl = r.entries->at(0).impls[i];
        // Where the run-time rows take `gemm:jit` and fixed rows brgemm (oneDNN 2.6 on AVX-512),
        // only the rule makes them alike.
        const bool kernels_differ = host_has_brgemm && rows_impls[i].rfind("gemm:jit", 0) == 0;
        if (k.large && rows <= 32 && n % 128 == 0) {
          if (kFixedRowsTakeGemmJitsLayout) EXPECT_EQ(static_impl, rows_impls[i]) << "GEMM " << i;
        }
        else if (kernels_differ)
          EXPECT_NE(static_impl, rows_impls[i]) << "GEMM " << i;
      }
    }
  }
}

// oneDNN runs every matmul in an OpenMP region of every thread, which costs a small GEMM more than
// its arithmetic: GEMMs of at most 2^19 multiply-adds are created and run at one thread
// (runs_on_one_thread; OpenBLAS runs up to 2^18 so). A Linear with tanh keeps one thread busy on
// small shapes, as eager does, and two on a large one; results as eager's. CTest
// `onednn_gemm_as_on_avx2` runs this test with ONEDNN_MAX_CPU_ISA=AVX2 (`gemm:jit`).
TEST(OneDnnBackend, SmallGemmsRunOnOneThread) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs 2 cores";
  Threads restore;
  at::set_num_threads(2);
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{8, 16, 32}, {32, 64, 64}, {256, 512, 512}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(in) + " x " + std::to_string(out));
    auto m = linear_then([](torch::Tensor h) { return torch::tanh(h); }, in, out);
    Recorder r;
    auto fast = torch::compile(m, opts(r));
    auto x = torch::randn({rows, in});
    fast(x);
    EXPECT_TRUE(tc_test::tensors_close(m->forward(x), fast(x), kRtol, kAtol));
    ASSERT_EQ(r.entries->size(), 1u);
    const std::string impl = r.entries->at(0).impls.at(0);
    const bool small = rows * in * out <= (int64_t(1) << 19);
    EXPECT_EQ(impl.find(", one thread") != std::string::npos, small) << impl;
    EXPECT_EQ(busy_threads([&] { fast(x); }), small ? 1 : 2) << impl;
  }
}

// ---- EmbeddingBag -------------------------------------------------------------------------------

// torch::embedding_bag with the given settings over the module's table, optionally followed by
// a Linear (one program: the bags' sums feed the GEMM).
struct BagModule : torch::nn::Module {
  BagModule(int64_t rows, int64_t dim, int64_t mode, bool include_last, std::optional<int64_t> padding, bool linear)
      : mode(mode), include_last(include_last), padding(padding) {
    weight = register_parameter("weight", torch::randn({rows, dim}));
    if (linear) fc = register_module("fc", torch::nn::Linear(dim, 5));
  }
  torch::Tensor forward(torch::Tensor indices, torch::Tensor offsets) {
    torch::Tensor y = std::get<0>(torch::embedding_bag(weight, indices, offsets, /*scale_grad_by_freq=*/false, mode,
                                                       /*sparse=*/false, /*per_sample_weights=*/{}, include_last,
                                                       padding ? c10::optional<int64_t>(*padding) : c10::nullopt));
    return fc ? fc->forward(y) : y;
  }
  int64_t mode;
  bool include_last;
  std::optional<int64_t> padding;
  torch::Tensor weight;
  torch::nn::Linear fc{nullptr};
};

// `bags` bags of 0-`max_len` indices into `rows` rows (a quarter of them `padding` when given):
// (indices, offsets), offsets with the end appended when `include_last`.
std::pair<torch::Tensor, torch::Tensor> random_bags(std::mt19937& rng, int64_t bags, int64_t max_len, int64_t rows,
                                                    bool include_last, std::optional<int64_t> padding) {
  std::vector<int64_t> indices, offsets;
  for (int64_t b = 0; b < bags; ++b) {
    offsets.push_back(static_cast<int64_t>(indices.size()));
    const int64_t len = std::uniform_int_distribution<int64_t>(0, max_len)(rng);
    for (int64_t t = 0; t < len; ++t)
      indices.push_back(padding && rng() % 4 == 0 ? *padding : std::uniform_int_distribution<int64_t>(0, rows - 1)(rng));
  }
  if (include_last) offsets.push_back(static_cast<int64_t>(indices.size()));
  return {torch::tensor(indices, torch::kLong), torch::tensor(offsets, torch::kLong)};
}

// Random tables, modes (sum, mean), include_last_offset, padding rows, empty bags and bag counts
// (up to 3000 bags: the parallel loop): the backend's own loop gives eager's bits, alone and
// before a Linear; each configuration is compiled as one embedding_bag group.
TEST(OneDnnBackend, RandomEmbeddingBagsMatchEagerBitForBit) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(71);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const int64_t dims[] = {1, 3, 16, 32, 33, 100};
  for (int config = 0; config < 40; ++config) {
    torch::manual_seed(config);
    const int64_t rows = 2 + pick(300), dim = dims[pick(6)], mode = pick(2);
    const bool include_last = pick(2), linear = pick(3) == 0;
    std::optional<int64_t> padding;
    if (pick(3) == 0) padding = pick(static_cast<int>(rows));
    auto m = std::make_shared<BagModule>(rows, dim, mode, include_last, padding, linear);
    m->eval();
    Recorder r;
    auto fast = torch::compile(m, opts(r).with_dynamic(false));
    const std::string where = "config " + std::to_string(config) + ": rows " + std::to_string(rows) + ", dim " +
                              std::to_string(dim) + ", mode " + std::to_string(mode) + ", include_last " +
                              std::to_string(include_last) + ", padding " + (padding ? std::to_string(*padding) : "none");
    for (int call = 0; call < 4; ++call) {
      const int64_t bags = call == 3 && config % 4 == 0 ? 3000 : pick(40);
      auto [indices, offsets] = random_bags(rng, bags, pick(2) ? 12 : 2, rows, include_last, padding);
      if (include_last && offsets.numel() == 0) continue;
      torch::Tensor expected = m->forward(indices, offsets);
      fast(indices, offsets);  // new sizes: traced (the tracing call's result is eager's)
      torch::Tensor actual = fast(indices, offsets);
      if (linear) {
        EXPECT_TRUE(tc_test::tensors_close(expected, actual, kRtol, kAtol)) << where << ", " << bags << " bags";
      } else {
        ASSERT_TRUE(torch::equal(expected, actual)) << where << ", " << bags << " bags: max difference "
                                                    << (expected - actual).abs().max().item<float>();
      }
    }
    for (const auto& e : *r.entries)
      EXPECT_EQ(e.fused.front(), std::string("embedding_bag (") + (mode ? "mean" : "sum") + ")") << where;
    EXPECT_FALSE(r.entries->empty()) << where;
  }
}

// What the loop does not take runs ATen's operator in the program, as eager: int32 indices (not
// matched), offsets out of order, and an index out of range (ATen's error, from the compiled call).
TEST(OneDnnBackend, EmbeddingBagInputsTheLoopDoesNotTakeAreATens) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  auto m = std::make_shared<BagModule>(10, 8, /*mode=*/1, false, std::nullopt, false);
  Recorder r;
  auto fast = torch::compile(m, opts(r).with_dynamic(false));
  auto indices = torch::tensor({1, 2, 3, 4, 5, 6}, torch::kLong);
  auto offsets = torch::tensor({0, 2, 5}, torch::kLong);
  fast(indices, offsets);  // traced: the compiled program runs from the second call
  EXPECT_TRUE(torch::equal(fast(indices, offsets), m->forward(indices, offsets)));
  EXPECT_EQ(r.fused(), std::vector<std::string>{"embedding_bag (mean)"});
  // Offsets out of order: ATen's error (an index past the end of a bag, for LibTorch 1.13).
  auto unordered = torch::tensor({0, 4, 2}, torch::kLong);
  bool eager_throws = false;
  torch::Tensor eager_result;
  try {
    eager_result = m->forward(indices, unordered);
  } catch (const c10::Error&) {
    eager_throws = true;
  }
  if (eager_throws) {
    EXPECT_THROW(fast(indices, unordered), c10::Error);
  } else {
    EXPECT_TRUE(torch::equal(fast(indices, unordered), eager_result));
  }
  // An index out of range: ATen's error.
  auto bad = torch::tensor({1, 2, 3, 10, 5, 6}, torch::kLong);
  EXPECT_THROW(m->forward(bad, offsets), c10::Error);
  EXPECT_THROW(fast(bad, offsets), c10::Error);
  // int32 indices and offsets: ATen's operator.
  Recorder r32;
  auto fast32 = torch::compile(m, opts(r32).with_dynamic(false));
  auto i32 = indices.to(torch::kInt), o32 = offsets.to(torch::kInt);
  fast32(i32, o32);
  EXPECT_TRUE(torch::equal(fast32(i32, o32), m->forward(i32, o32)));
  for (const auto& e : *r32.entries) EXPECT_TRUE(e.declined) << e.reason;
}

// With size symbols for the indices and the bags, `onednn` and `default` keep one program for
// every size: nothing is built at a new size.
TEST(OneDnnBackend, EmbeddingBagThenLinearIsOneProgramForEverySize) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  std::mt19937 rng(7);
  auto m = std::make_shared<BagModule>(100, 32, /*mode=*/1, false, std::nullopt, true);
  m->eval();
  for (const char* backend : {"onednn", "default"}) {
    std::string failure;
    const std::string log = dynamic_log_of([&] {
      auto fast = torch::compile(m, torchcompile::CompileOptions(backend).with_dynamic(true));
      for (int call = 0; call < 12 && failure.empty(); ++call) {
        auto [indices, offsets] = random_bags(rng, 2 + static_cast<int64_t>(rng() % 40), 9, 100, false, std::nullopt);
        auto close = tc_test::tensors_close(m->forward(indices, offsets), fast(indices, offsets), kRtol, kAtol);
        if (!close) failure = std::string(backend) + ", call " + std::to_string(call) + ": " + close.message();
      }
    });
    ASSERT_TRUE(failure.empty()) << failure;
    EXPECT_THAT(log, ::testing::HasSubstr("onednn: one program for every size")) << backend << "\n" << log;
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("compile_per_shape: new sizes"))) << backend << "\n" << log;
  }
}
