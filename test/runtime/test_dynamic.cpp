// Dynamic shapes: one entry serves many sizes. When the forward's host code does not read them,
// each new size records the captured graph again; when it reads them (or the trace cannot tell),
// each new size runs the forward again — never a wrong result. Results are compared with eager
// LibTorch at every size.
#include "support/test_util.h"
#include "support/seed_models.h"

#include <torchcompile/backends/registry.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/parser.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/runtime/mark_dynamic.h>
#include <torchcompile/support/logging.h>

#include "capture/observed.h"
#include "ir/effects.h"
#include "runtime/dynamic_entry.h"
#include "runtime/guards.h"

#include <cstdlib>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <sstream>

using tc_test::CompileCounter;
using tc_test::tensors_close;

namespace {

namespace tcr = torchcompile::runtime;

struct Mlp : torch::nn::Module {  // M1's shape
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 128));
    fc3 = register_module("fc3", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    return torch::log_softmax(fc3(torch::relu(fc2(torch::gelu(fc1(x))))), 1);
  }
};

struct ConvNet : torch::nn::Module {  // M3's shape, any image size: conv-bn-relu, global pooling
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::BatchNorm2d b1{nullptr}, b2{nullptr};
  torch::nn::Linear fc{nullptr};
  ConvNet() {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)));
    b1 = register_module("b1", torch::nn::BatchNorm2d(16));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1).stride(2)));
    b2 = register_module("b2", torch::nn::BatchNorm2d(32));
    fc = register_module("fc", torch::nn::Linear(32, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(b1(c1(x)));
    x = torch::relu(b2(c2(x)));
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
};

// Reads sizes in host code: its integers depend on them.
struct Reads : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  Reads() { fc = register_module("fc", torch::nn::Linear(32, 32)); }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t B = x.size(0), T = x.size(1), H = 4, D = 8;
    auto h = fc(x).view({B, T, H, D}).transpose(1, 2).reshape({B * H, T, D});
    auto pos = torch::arange(T, x.options()).view({1, T, 1});
    return (h + pos).view({x.size(0), -1});
  }
};

// Branches on a size in host code.
struct Branches : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x.size(0) > 8 ? torch::relu(x) * 2 : torch::sigmoid(x) - 1; }
};

int64_t random_size(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Calls `fast` and `eager` at `n` random sizes from `make_input`; every result must match.
template <typename Fast, typename Eager, typename Make>
void expect_matches_at_random_sizes(Fast& fast, Eager&& eager, Make&& make_input, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int k = 0; k < n; ++k) {
    torch::Tensor x = make_input(rng);
    torch::Tensor expected = eager(x);
    torch::Tensor got = fast(x);
    ASSERT_EQ(got.sizes(), expected.sizes()) << "input sizes " << x.sizes();
    ASSERT_TRUE(tensors_close(got, expected, 1e-4, 1e-5)) << "input sizes " << x.sizes();
  }
}

std::vector<std::string> backends_to_test() {
  std::vector<std::string> out = {"eager", "aot_eager", "default"};
  for (const char* b : {"onednn", "fused"})
    if (torchcompile::has_backend(b)) out.push_back(b);
  return out;
}

class DynamicBackends : public ::testing::TestWithParam<std::string> {};

TEST_P(DynamicBackends, AutomaticDynamicMlpBatchCompilesTwice) {
  torch::NoGradGuard no_grad;
  auto net = std::make_shared<Mlp>();
  net->eval();
  auto fast = torch::compile(net, GetParam());
  expect_matches_at_random_sizes(fast, [&](const torch::Tensor& x) { return net->forward(x); },
                                 [](std::mt19937& rng) { return torch::randn({random_size(rng, 2, 64), 784}); }, 20, 1);
  EXPECT_LE(fast.state().num_entries(), 2u);
}

TEST_P(DynamicBackends, DynamicTrueConvNetBatchAndImageSizeCompilesOnce) {
  torch::NoGradGuard no_grad;
  auto net = std::make_shared<ConvNet>();
  net->eval();
  auto fast = torch::compile(net, torchcompile::CompileOptions(GetParam()).with_dynamic(true));
  expect_matches_at_random_sizes(fast, [&](const torch::Tensor& x) { return net->forward(x); },
                                 [](std::mt19937& rng) {
                                   const int64_t hw = random_size(rng, 8, 40);
                                   return torch::randn({random_size(rng, 2, 16), 3, hw, hw});
                                 },
                                 20, 2);
  EXPECT_EQ(fast.state().num_entries(), 1u);
}

// nn::LSTM reads its input's batch and feature sizes in host code, not the sequence length: one
// entry serves every length (with `onednn` and `default`, an RNN primitive per length).
TEST_P(DynamicBackends, LstmSequenceLengthCompilesOnce) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(16, 24).num_layers(2).bidirectional(true));
  lstm->eval();
  auto lstm_out = [&](torch::Tensor x) { return std::get<0>(lstm->forward(x)); };
  for (bool automatic : {false, true}) {
    SCOPED_TRACE(automatic ? "automatic dynamic" : "dynamic = true");
    auto opts = torchcompile::CompileOptions(GetParam());
    if (!automatic) opts = opts.with_dynamic(true);
    auto fast = torch::compile(lstm_out, opts);
    expect_matches_at_random_sizes(fast, lstm_out,
                                   [](std::mt19937& rng) { return torch::randn({random_size(rng, 2, 40), 3, 16}); },
                                   20, 4);
    EXPECT_EQ(fast.state().num_entries(), automatic ? 2u : 1u);
  }
}

TEST_P(DynamicBackends, MarkDynamicCompilesOnce) {
  torch::NoGradGuard no_grad;
  auto net = std::make_shared<Mlp>();
  net->eval();
  auto fast = torch::compile(net, GetParam());
  auto first = torch::randn({8, 784});
  torchcompile::mark_dynamic(first, 0);
  EXPECT_TRUE(tensors_close(fast(first), net->forward(first), 1e-4, 1e-5));
  expect_matches_at_random_sizes(fast, [&](const torch::Tensor& x) { return net->forward(x); },
                                 [](std::mt19937& rng) { return torch::randn({random_size(rng, 2, 64), 784}); }, 20, 3);
  EXPECT_EQ(fast.state().num_entries(), 1u);
}

TEST(Dynamic, OneTraceServesEverySizeWithTheBackendCalledOnce) {
  torch::NoGradGuard no_grad;
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a, torch::Tensor b) { return (a * 2 + b).relu().sum(1); },
                             torchcompile::CompileOptions(cc.backend()).with_dynamic(true));
  for (int64_t n : {4, 7, 4, 9, 7}) {
    auto a = torch::randn({n, 5}), b = torch::randn({n, 5});
    EXPECT_TRUE(tensors_close(fast(a, b), (a * 2 + b).relu().sum(1)));
  }
  EXPECT_EQ(fast.state().num_entries(), 1u);
  EXPECT_EQ(cc.frames(), 1);  // one graph with the size symbol s0 serves sizes 4, 7 and 9
  ASSERT_EQ(cc.graphs().size(), 1u);
  EXPECT_NE(cc.graphs()[0].find("%s0 : Sym(4, [2, inf]) = placeholder[target=s0]"), std::string::npos) << cc.graphs()[0];
  EXPECT_NE(cc.graphs()[0].find("%arg0 : f32[s0, s1]{s1, 1} = placeholder"), std::string::npos) << cc.graphs()[0];
}

// A backend that compiles a graph with size symbols for its example sizes only (it returns a
// result of those sizes whatever it is given) is caught at the first call at other sizes: an
// error naming the backend, the sizes and what the graph's expressions say, not a wrong result.
TEST(Dynamic, BackendIgnoringTheSymbolsIsAnErrorAtOtherSizes) {
  torch::NoGradGuard no_grad;
  torchcompile::Backend for_example_sizes = [](torchcompile::GraphModule& gm, const std::vector<torch::Tensor>& ex) {
    const std::vector<torch::Tensor> at_example = gm.forward(ex);
    return torchcompile::CompiledFn([at_example](std::vector<torch::Tensor>) {
      std::vector<torch::Tensor> out;
      for (const auto& t : at_example) out.push_back(t.clone());
      return out;
    });
  };
  auto fast = torch::compile([](torch::Tensor a) { return a * 2; },
                             torchcompile::CompileOptions(for_example_sizes).with_dynamic(true));
  auto a = torch::randn({4, 3});
  fast(a);
  EXPECT_TRUE(tensors_close(fast(a), a * 2));  // at the example sizes
  // A compiled graph remembers the sizes it last found right: another object's
  // right results at [6, 3] just before must not excuse this one's, nor its own error the next call.
  auto right = torch::compile([](torch::Tensor a) { return a * 2; }, torchcompile::CompileOptions("eager").with_dynamic(true));
  for (int k = 0; k < 3; ++k) right(torch::randn({6, 3}));
  for (int k = 0; k < 2; ++k) {
    try {
      fast(torch::randn({6, 3}));
      ADD_FAILURE() << "expected an error (call " << k << ")";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_THAT(msg, ::testing::HasSubstr("compiled a graph with size symbols, but with s0=6"));
      EXPECT_THAT(msg, ::testing::HasSubstr("has sizes [4, 3] where the graph says [s0=6, s1=3]"));
    }
  }
  // The sizes found right are remembered as one word of both values: [3, 4] is not [4, 3].
  try {
    fast(torch::randn({3, 4}));
    ADD_FAILURE() << "expected an error at [3, 4]";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), ::testing::HasSubstr("where the graph says [s0=3, s1=4]"));
  }
}

// A backend registered by name that counts its calls, around a built-in one.
struct CountingBackend {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::string name;
  explicit CountingBackend(const std::string& inner) : name("count_calls_" + inner) {
    if (!torchcompile::has_backend(name)) {
      auto calls_of = counters();
      (*calls_of)[name] = calls;
      torchcompile::register_backend(name, [inner, name = name, calls_of](torchcompile::GraphModule& gm,
                                                                           const std::vector<torch::Tensor>& ex) {
        ++*(*calls_of)[name];
        // Every graph with size symbols round-trips through the text format.
        if (!gm.graph().symbols().empty()) {
          const std::string text = torchcompile::ir::to_text(gm.graph());
          EXPECT_EQ(torchcompile::ir::to_text(*torchcompile::ir::parse_graph(text)), text);
        }
        return torchcompile::lookup_backend(inner)(gm, ex);
      });
    }
    calls = (*counters())[name];
    *calls = 0;
  }
  static std::shared_ptr<std::map<std::string, std::shared_ptr<std::atomic<int>>>> counters() {
    static auto m = std::make_shared<std::map<std::string, std::shared_ptr<std::atomic<int>>>>();
    return m;
  }
  int count() const { return *calls; }
};

// The acceptance: with dynamic = true or mark_dynamic the backend is called once for
// every size, with automatic dynamic at most twice (the static first size, then the symbols),
// for forwards whose host code reads no size; every result is eager's.
TEST_P(DynamicBackends, BackendIsCalledOnceForEverySize) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  auto mlp = std::make_shared<Mlp>();
  mlp->eval();
  auto mlp_input = [](std::mt19937& rng) { return torch::randn({random_size(rng, 2, 64), 784}); };
  for (bool automatic : {false, true}) {
    SCOPED_TRACE(automatic ? "MLP, automatic dynamic" : "MLP, dynamic = true");
    CountingBackend counter(GetParam());
    auto opts = torchcompile::CompileOptions(counter.name);
    if (!automatic) opts = opts.with_dynamic(true);
    auto fast = torch::compile(mlp, opts);
    expect_matches_at_random_sizes(fast, [&](const torch::Tensor& x) { return mlp->forward(x); }, mlp_input, 20, 21);
    if (automatic) EXPECT_LE(counter.count(), 2);
    else EXPECT_EQ(counter.count(), 1);
  }
  {
    SCOPED_TRACE("MLP, mark_dynamic");
    CountingBackend counter(GetParam());
    auto fast = torch::compile(mlp, counter.name);
    auto first = torch::randn({8, 784});
    torchcompile::mark_dynamic(first, 0);
    EXPECT_TRUE(tensors_close(fast(first), mlp->forward(first), 1e-4, 1e-5));
    expect_matches_at_random_sizes(fast, [&](const torch::Tensor& x) { return mlp->forward(x); }, mlp_input, 10, 22);
    EXPECT_EQ(counter.count(), 1);
  }
  {
    SCOPED_TRACE("conv net, batch and image size, dynamic = true");
    auto net = std::make_shared<ConvNet>();
    net->eval();
    CountingBackend counter(GetParam());
    auto fast = torch::compile(net, torchcompile::CompileOptions(counter.name).with_dynamic(true));
    expect_matches_at_random_sizes(fast, [&](const torch::Tensor& x) { return net->forward(x); },
                                   [](std::mt19937& rng) {
                                     const int64_t hw = random_size(rng, 8, 40);
                                     return torch::randn({random_size(rng, 2, 16), 3, hw, hw});
                                   },
                                   20, 23);
    EXPECT_EQ(counter.count(), 1);
  }
  {
    SCOPED_TRACE("LSTM, sequence length, dynamic = true");
    torch::nn::LSTM lstm(torch::nn::LSTMOptions(16, 24).num_layers(2));
    lstm->eval();
    auto lstm_out = [&](torch::Tensor x) { return std::get<0>(lstm->forward(x)); };
    CountingBackend counter(GetParam());
    auto fast = torch::compile(lstm_out, torchcompile::CompileOptions(counter.name).with_dynamic(true));
    expect_matches_at_random_sizes(fast, lstm_out,
                                   [](std::mt19937& rng) { return torch::randn({random_size(rng, 2, 40), 3, 16}); },
                                   20, 24);
    EXPECT_EQ(counter.count(), 1);
  }
}

TEST(Dynamic, HostSizeReadsRunTheForwardAgainInOneEntry) {
  torch::NoGradGuard no_grad;
  auto net = std::make_shared<Reads>();
  for (bool dyn : {false, true}) {
    CompileCounter cc;
    auto fast = torch::compile(net, torchcompile::CompileOptions(cc.backend()).with_dynamic(dyn).with_cache_size_limit(64));
    expect_matches_at_random_sizes(fast, [&](const torch::Tensor& x) { return net->forward(x); },
                                   [](std::mt19937& rng) {
                                     return torch::randn({random_size(rng, 2, 6), random_size(rng, 2, 9), 32});
                                   },
                                   20, 4);
    // dynamic = false: an entry per size; true: one, tracing per new size all the same.
    EXPECT_EQ(fast.state().num_entries(), dyn ? 1u : static_cast<size_t>(cc.frames()));
  }
}

TEST(Dynamic, BranchOnSizeGivesEagersResultOnBothSides) {
  torch::NoGradGuard no_grad;
  auto net = std::make_shared<Branches>();
  for (std::optional<bool> dyn : {std::optional<bool>(), std::optional<bool>(true)}) {
    torchcompile::CompileOptions options("eager");
    options.dynamic = dyn;
    options.cache_size_limit = 64;
    auto fast = torch::compile(net, options);
    for (int64_t n : {4, 12, 5, 20, 8, 9, 2, 30}) {
      auto x = torch::randn({n, 3});
      EXPECT_TRUE(tensors_close(fast(x), net->forward(x))) << "size " << n;
    }
  }
}

TEST(Dynamic, SizesZeroAndOneAreSpecialized) {
  torch::NoGradGuard no_grad;
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a) { return a.exp() + 1; },
                             torchcompile::CompileOptions(cc.backend()).with_dynamic(true).with_input_names({"a"}));
  auto one = torch::randn({1, 3});
  EXPECT_TRUE(tensors_close(fast(one), one.exp() + 1));
  auto five = torch::randn({5, 3});
  EXPECT_TRUE(tensors_close(fast(five), five.exp() + 1));  // size 1 was static: a new entry
  EXPECT_EQ(fast.state().num_entries(), 2u);
  auto six = torch::randn({6, 3});
  EXPECT_TRUE(tensors_close(fast(six), six.exp() + 1));  // the dynamic entry
  EXPECT_EQ(fast.state().num_entries(), 2u);
  auto empty = torch::randn({0, 3});
  EXPECT_EQ(fast(empty).sizes(), empty.sizes());
  EXPECT_EQ(fast.state().num_entries(), 3u);
  EXPECT_THAT(fast.state().last_recompile_reason(),
              ::testing::HasSubstr("tensor 'a' size at index 0 (symbol s0): expected a size in [2, inf), got 0"));
}

TEST(Dynamic, EqualDimensionsShareASymbolAndAreGuardedEqual) {
  torch::NoGradGuard no_grad;
  auto fast = torch::compile([](torch::Tensor a, torch::Tensor b) { return a.sum() + b.sum(); },
                             torchcompile::CompileOptions("eager").with_dynamic(true).with_input_names({"a", "b"}));
  fast(torch::randn({4, 3}), torch::randn({4, 5}));
  ASSERT_EQ(fast.state().num_entries(), 1u);
  const auto lines = fast.state().entries().front()->guards().describe();
  EXPECT_THAT(lines, ::testing::Contains("symbol s0: size 0 of 'a' in [2, inf)"));
  EXPECT_THAT(lines, ::testing::Contains("symbol s0: size 0 of 'b' equal to size 0 of 'a'"));
  EXPECT_THAT(lines, ::testing::Contains("symbol s1: size 1 of 'a' in [2, inf)"));
  auto a = torch::randn({7, 3}), b = torch::randn({7, 5});
  EXPECT_TRUE(tensors_close(fast(a, b), a.sum() + b.sum()));
  EXPECT_EQ(fast.state().num_entries(), 1u);
  a = torch::randn({7, 3}), b = torch::randn({6, 5});
  EXPECT_TRUE(tensors_close(fast(a, b), a.sum() + b.sum()));
  EXPECT_EQ(fast.state().num_entries(), 2u);
  EXPECT_EQ(fast.state().last_recompile_reason(),
            "tensor 'b' size at index 0 is symbol s0, equal to size 0 of 'a' when traced: expected 7, got 6");
}

TEST(Dynamic, MarkDynamicRangeAndMarkStatic) {
  torch::NoGradGuard no_grad;
  auto fn = [](torch::Tensor a) { return a.cos() * 3; };
  auto fast = torch::compile(fn, torchcompile::CompileOptions("eager").with_input_names({"a"}));
  auto x = torch::randn({8, 4});
  torchcompile::mark_dynamic(x, 0, 2, 16);
  torchcompile::mark_static(x, 1);
  fast(x);
  auto y = torch::randn({16, 4});
  EXPECT_TRUE(tensors_close(fast(y), fn(y)));
  EXPECT_EQ(fast.state().num_entries(), 1u);
  auto z = torch::randn({17, 4});
  EXPECT_TRUE(tensors_close(fast(z), fn(z)));
  EXPECT_EQ(fast.state().num_entries(), 2u);
  EXPECT_THAT(fast.state().last_recompile_reason(),
              ::testing::HasSubstr("tensor 'a' size at index 0 (symbol s0): expected a size in [2, 16], got 17"));
  auto w = torch::randn({8, 5});  // dimension 1 is static
  EXPECT_TRUE(tensors_close(fast(w), fn(w)));
  EXPECT_EQ(fast.state().num_entries(), 3u);
  EXPECT_THROW(torchcompile::mark_dynamic(x, 0, 10, 4), c10::Error);
  EXPECT_THROW(torchcompile::mark_dynamic(x, 2), c10::Error);
}

// While autograd records (training), the trace still counts size reads: results autograd
// recorded are observed through copies sharing their gradient edge. An MLP's training forward
// reads no size, so its entry has one graph with symbols; `aot_eager` gives it one joint graph
// with the symbol. An input that requires grad cannot be observed:
// that entry runs the forward again at each new size, and says so.
TEST(Dynamic, WhileAutogradRecordsSizeReadsAreStillCounted) {
  for (bool input_requires_grad : {false, true}) {
    SCOPED_TRACE(input_requires_grad ? "input requires grad" : "parameters require grad");
    auto net = std::make_shared<Mlp>();
    auto ref = std::make_shared<Mlp>();
    tc_test::copy_parameters(*net, *ref);
    torchcompile::logging::set_logs("dynamic");
    ::testing::internal::CaptureStderr();
    auto fast = torch::compile(net, torchcompile::CompileOptions("aot_eager").with_dynamic(true));
    for (int64_t n : {4, 9, 4, 6}) {
      auto x = torch::randn({n, 784});
      auto x_ref = x.clone();
      if (input_requires_grad) x.requires_grad_(), x_ref.requires_grad_();
      net->zero_grad();
      ref->zero_grad();
      auto y = fast(x);
      auto expected = ref->forward(x_ref);
      ASSERT_TRUE(tensors_close(y, expected, 1e-4, 1e-5)) << "batch " << n;
      y.sum().backward();
      expected.sum().backward();
      for (size_t i = 0; i < net->parameters().size(); ++i)
        ASSERT_TRUE(tensors_close(net->parameters()[i].grad(), ref->parameters()[i].grad(), 1e-4, 1e-5))
            << "gradient " << i << ", batch " << n;
      if (input_requires_grad) ASSERT_TRUE(tensors_close(x.grad(), x_ref.grad(), 1e-4, 1e-5)) << "batch " << n;
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    torchcompile::logging::set_logs("");
    ASSERT_EQ(fast.state().num_entries(), 1u);
    const auto entry = fast.state().entries().front();
    if (input_requires_grad) {
      // The forward runs again at each new size; from the second on, one graph with size
      // expressions (here none: the MLP's integers do not depend on the batch) serves them.
      EXPECT_TRUE(entry->symbolic_graph());
      EXPECT_EQ(entry->num_specializations(), 3u);  // 4, 9, 6 traced
      EXPECT_THAT(err, ::testing::HasSubstr("each new size runs the forward again: not every size read can be seen: "
                                            "input 'arg0' requires grad"));
    } else {
      EXPECT_TRUE(entry->symbolic_graph());
      EXPECT_EQ(entry->num_specializations(), 1u);
      EXPECT_THAT(err, ::testing::HasSubstr("Mlp): the backend receives the graph with size symbols"));
      // aot_eager: one joint graph for every size, so new sizes compile nothing.
      EXPECT_THAT(err, ::testing::HasSubstr("aot_autograd: one joint graph for every size"));
      EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr("compile_per_shape: new sizes")));
    }
  }
}

TEST(Dynamic, LogsSayWhatBecameASymbolAndHow) {
  torch::NoGradGuard no_grad;
  auto net = std::make_shared<Reads>();
  torchcompile::logging::set_logs("dynamic");
  ::testing::internal::CaptureStderr();
  auto fast = torch::compile(net, torchcompile::CompileOptions("eager").with_input_names({"x"}));
  fast(torch::randn({2, 3, 32}));
  fast(torch::randn({5, 3, 32}));
  auto mlp = std::make_shared<Mlp>();
  auto fast_mlp = torch::compile(mlp, torchcompile::CompileOptions("eager").with_input_names({"x"}));
  fast_mlp(torch::randn({2, 784}));
  fast_mlp(torch::randn({5, 784}));
  fast_mlp(torch::randn({9, 784}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::set_logs("");
  EXPECT_THAT(err, ::testing::HasSubstr("size 0 of 'x' may be a symbol (automatic: it changed since the first trace "
                                        "(2 then 5))"));
  EXPECT_THAT(err, ::testing::HasSubstr("size 0 of 'x': host code read it (size(0) of input 'x'); a symbol whose new "
                                        "sizes run the forward again"));
  EXPECT_THAT(err, ::testing::HasSubstr("each new size runs the forward again: host code read size(0) of input 'x'"));
  EXPECT_THAT(err, ::testing::HasSubstr("symbol s0 = size 0 of 'x' (traced 5), range [2, inf)"));
  EXPECT_THAT(err, ::testing::HasSubstr("Mlp): the backend receives the graph with size symbols"));
}

TEST(Dynamic, ExplainShowsTheSymbolsAndTheirGuards) {
  torch::NoGradGuard no_grad;
  auto net = std::make_shared<Mlp>();
  auto x = torch::randn({8, 784});
  torchcompile::mark_dynamic(x, 0);
  const auto e = torchcompile::explain(torchcompile::CompileOptions("eager").with_input_names({"x"}), net, x);
  EXPECT_EQ(e.size_symbols, std::vector<std::string>{"s0 = size 0 of 'x' (traced 8), range [2, inf)"});
  EXPECT_THAT(e.guards, ::testing::Contains("tensor 'x': Float, cpu, Strided, sizes [s0, 784], contiguous, "
                                            "requires_grad false"));
  EXPECT_THAT(e.guards, ::testing::Contains("symbol s0: size 0 of 'x' in [2, inf)"));
  EXPECT_THAT(e.str(), ::testing::HasSubstr("Dynamic Shapes (1 compiled function for every size: the graph has size "
                                            "symbols):\n  s0 = size 0 of 'x'"));
  EXPECT_THAT(e.graphs.at(0), ::testing::HasSubstr("%x : f32[s0, 784]{784, 1} = placeholder[target=x]"));
}

TEST(Dynamic, ConcurrentCallsAtDifferentSizesShareOneEntry) {
  auto net = std::make_shared<Mlp>();
  net->eval();
  auto fast = torch::compile(net, torchcompile::CompileOptions("default").with_dynamic(true));
  {
    torch::NoGradGuard no_grad;
    fast(torch::randn({4, 784}));
  }
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      torch::NoGradGuard no_grad;
      std::mt19937 rng(100 + t);
      for (int i = 0; i < 12; ++i) {
        auto x = torch::randn({random_size(rng, 2, 9), 784});
        if (!tensors_close(net->forward(x), fast(x), 1e-4, 1e-5)) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(fast.state().num_entries(), 1u);
  EXPECT_LE(fast.state().entries().front()->num_specializations(), 8u);  // sizes 2..9
}

// LibTorch's attention reads its input sizes in host code, and so does Reads (view, arange and
// reshape from the sizes it read): each new size runs the forward again, in one entry.
// Forwards whose host code reads sizes (an encoder layer's attention, a module doing
// `view({B, T, H, D})`, `reshape({B * H, T, D})`, `arange(T)`): one entry, the forward traced at
// each new size. The backend is called at most 3 times: for the first size, then once the traces
// show which integers are which expressions of the sizes, for the graph with size expressions,
// which every later size's trace records. The encoder layer's attention has graph breaks
// (`torch::equal(query, key)`, `torch::equal(key, value)`): each segment of its tree gets size
// expressions (the segments before the breaks have no operator: the backend never sees them).
TEST_P(DynamicBackends, ModulesThatReadTheirSizesCompileAtMostThreeTimes) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  torch::nn::TransformerEncoderLayer enc(torch::nn::TransformerEncoderLayerOptions(32, 4).dim_feedforward(64).dropout(0.0));
  enc->eval();
  auto reads = std::make_shared<Reads>();
  auto enc_fn = [&](const torch::Tensor& x) { return enc->forward(x); };
  auto reads_fn = [&](const torch::Tensor& x) { return reads->forward(x); };
  auto make = [](std::mt19937& rng) { return torch::randn({random_size(rng, 2, 12), random_size(rng, 2, 9), 32}); };
  for (bool automatic : {false, true}) {
    SCOPED_TRACE(automatic ? "automatic dynamic" : "dynamic = true");
    auto opts = torchcompile::CompileOptions(GetParam());
    if (!automatic) opts = opts.with_dynamic(true);
    CountingBackend enc_counter(GetParam());
    opts.backend = enc_counter.name;
    auto fast_enc = torch::compile(enc, opts);
    expect_matches_at_random_sizes(fast_enc, enc_fn, make, 20, 5);
    EXPECT_LE(enc_counter.count(), 3);
    EXPECT_TRUE(fast_enc.state().entries().front()->symbolic_graph());
    EXPECT_GE(fast_enc.state().entries().front()->num_breaks(), 2u);
    CountingBackend reads_counter(GetParam());
    opts.backend = reads_counter.name;
    auto fast_reads = torch::compile(reads, opts);
    expect_matches_at_random_sizes(fast_reads, reads_fn, make, 20, 6);
    EXPECT_LE(reads_counter.count(), 3);
    EXPECT_EQ(fast_enc.state().num_entries(), automatic ? 2u : 1u);
    EXPECT_EQ(fast_reads.state().num_entries(), automatic ? 2u : 1u);
    const auto entry = fast_reads.state().entries().front();
    EXPECT_TRUE(entry->symbolic_graph());
    const auto symbols = entry->size_symbols();
    ASSERT_FALSE(symbols.empty());  // the symbols, why each new size runs the forward, the graph for every size
    EXPECT_THAT(symbols.back(), ::testing::HasSubstr("one graph with size expressions"));
  }
}

// The graph with size expressions as a backend receives it: integers host code computed from
// sizes are expressions of the symbols (`view(%linear, [%s0, %s1, 4, 8])`, `arange(%s1)`,
// `reshape(..., [%(4*s0), %s1, 8])`); it round-trips through the text format and the parsed graph
// runs equal to eager (CompileCounter checks both) at every size.
TEST(Dynamic, HostComputedIntegersBecomeSizeExpressions) {
  torch::NoGradGuard no_grad;
  auto net = std::make_shared<Reads>();
  CompileCounter cc;
  auto fast = torch::compile(net, torchcompile::CompileOptions(cc.backend()).with_dynamic(true));
  for (auto sizes : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {6, 2}, {4, 7}, {9, 3}, {2, 2}, {5, 11}}) {
    auto x = torch::randn({sizes.first, sizes.second, 32});
    EXPECT_TRUE(tensors_close(fast(x), net->forward(x), 1e-4, 1e-5)) << x.sizes();
  }
  EXPECT_EQ(cc.frames(), 2);  // the first size, then the graph with size expressions
  const std::string& text = cc.graphs().back();
  EXPECT_THAT(text, ::testing::HasSubstr("[%s0, %s1, 4, 8]")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("[%(4*s0), %s1, 8]")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("aten::arange](args = (%s1,)")) << text;
  EXPECT_TRUE(fast.state().entries().front()->symbolic_graph());
}

// A GPT-style model (nanoGPT's shape) generating 24 tokens one at a time: the sequence grows by
// one per step, and the forward reads its length for `arange(T)`, the causal mask's `[:T, :T]`
// and the heads' `view({B, T, H, D})`. The backend, registered by name and counting its calls, is
// called at most 3 times under automatic dynamic (the first length, the dynamic entry's first
// length, the graph with size expressions) and with dynamic = true; every step's logits are
// eager's, whichever way the new lengths are checked (TORCHCOMPILE_NEW_SIZES: a trace of shapes
// then the compiled call, a real trace, or the cheaper so far).
TEST_P(DynamicBackends, GptGenerationCompilesAtMostThreeTimes) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(17);
  tc_test::TinyGpt gpt;
  gpt->eval();
  auto prompt = torch::randint(0, 96, {1, 5});
  auto tokens = tc_test::generate([&](const torch::Tensor& idx) { return gpt->forward(idx); }, prompt, 24);
  for (auto [automatic, check] : std::vector<std::pair<bool, const char*>>{
           {true, ""}, {false, ""}, {true, "shapes"}, {true, "trace"}}) {
    SCOPED_TRACE(std::string(automatic ? "automatic dynamic" : "dynamic = true") + ", TORCHCOMPILE_NEW_SIZES=" + check);
    tc_test::ScopedEnv new_sizes("TORCHCOMPILE_NEW_SIZES", check);
    CountingBackend counter(GetParam());
    auto opts = torchcompile::CompileOptions(counter.name);
    if (!automatic) opts = opts.with_dynamic(true);
    auto fast = torch::compile(gpt.ptr(), opts);
    for (int64_t t = 5; t < 5 + 24; ++t) {
      auto idx = tokens.slice(1, 0, t);
      ASSERT_TRUE(tensors_close(fast(idx), gpt->forward(idx), 1e-4, 1e-5)) << "length " << t;
    }
    // Automatic dynamic: the first length's trace and the second's make the graph with size
    // expressions, compiled at the second length (FirstStaticTraceMakesTheGraphForEverySize).
    if (automatic) EXPECT_EQ(counter.count(), 2);
    EXPECT_LE(counter.count(), 3);
    EXPECT_TRUE(fast.state().entries().front()->symbolic_graph());
  }
}

// Under automatic dynamic, a forward whose host code reads its sizes gets its graph with size
// expressions at the second size: the first (static) entry's trace and the dynamic entry's first
// trace are the two traces it is generalized from, so the backend is called twice (the first
// size, then that graph) and no later size compiles. Where the first trace's inputs differ in
// more than the symbols' sizes (here its strides: a transposed input), it is no such trace: the
// graph is made from the next new size's trace, as before (three calls). Every result is eager's.
TEST_P(DynamicBackends, FirstStaticTraceMakesTheGraphForEverySize) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(29);
  auto net = std::make_shared<Reads>();
  net->eval();
  for (bool first_transposed : {false, true}) {
    SCOPED_TRACE(first_transposed ? "first input transposed" : "contiguous inputs");
    CountingBackend counter(GetParam());
    auto fast = torch::compile(net, torchcompile::CompileOptions(counter.name));
    torchcompile::logging::set_logs("dynamic");
    ::testing::internal::CaptureStderr();
    for (int64_t T : {5, 6, 7, 9, 4, 12}) {
      torch::Tensor x = torch::randn({3, T, 32});
      if (T == 5 && first_transposed) x = torch::randn({32, T, 3}).permute({2, 1, 0});
      ASSERT_TRUE(tensors_close(fast(x), net->forward(x), 1e-4, 1e-5)) << "T " << T;
    }
    const std::string log = ::testing::internal::GetCapturedStderr();
    torchcompile::logging::set_logs("");
    EXPECT_EQ(counter.count(), first_transposed ? 3 : 2) << log;
    const auto entry = fast.state().entries().front();
    EXPECT_TRUE(entry->symbolic_graph());
    EXPECT_EQ(log.find("with the first trace, made one graph with size expressions") != std::string::npos,
              !first_transposed)
        << log;
  }
}

// Serving an EmbeddingBag text classifier over 200 requests of random batch sizes (1-64 bags of
// 1-30 tokens). LibTorch's nn::EmbeddingBag checks its offsets on the host at every call
// (`offsets[0].item()` and `offsets[-1].item()` in F::embedding_bag): two data reads, graph breaks
// keyed by the values read, and the last offset is the number of tokens, new on nearly every
// request: each request traces (and compiles) its own branch, and gets eager's result. A forward
// that calls the ATen operator `torch::embedding_bag` (what the module calls after its checks)
// reads nothing on the host: the backend is called at most 3 times for all 200 requests.
TEST_P(DynamicBackends, EmbeddingBagServingGivesEagerResultsAndCompilesAtMostThreeTimes) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(23);
  const auto requests = tc_test::bag_requests(200, 5);
  for (bool aten_op : {true, false}) {
    SCOPED_TRACE(aten_op ? "torch::embedding_bag" : "nn::EmbeddingBag");
    tc_test::BagClassifier model(aten_op);
    model->eval();
    CountingBackend counter(GetParam());
    auto fast = torch::compile(model.ptr(), counter.name);
    const size_t n = aten_op ? requests.size() : 40;  // the module's path compiles per request: fewer
    for (size_t i = 0; i < n; ++i) {
      const auto& [text, offsets] = requests[i];
      ASSERT_TRUE(tensors_close(fast(text, offsets), model->forward(text, offsets), 1e-4, 1e-5)) << "request " << i;
    }
    if (aten_op) EXPECT_LE(counter.count(), 3);
  }
}

// `default` gives a graph with size symbols to its parts once: a new number of tokens or of bags
// builds nothing: the oneDNN part (the embedding_bag as the backend's own loop, then the Linear)
// is one program whose loop reads the sizes and whose GEMM takes its rows at each call.
TEST(Dynamic, DefaultBuildsOnlyThePartsWhoseSizesChanged) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(29);
  tc_test::BagClassifier model(/*aten_op=*/true);
  model->eval();
  torchcompile::logging::set_logs("dynamic");
  ::testing::internal::CaptureStderr();
  auto fast = torch::compile(model.ptr(), torchcompile::CompileOptions("default").with_dynamic(true));
  for (int64_t bags : {3, 5, 7}) {
    for (int64_t per_bag : {2, 4, 6, 8}) {  // no number of tokens equals a number of bags
      auto text = torch::randint(0, 1000, {bags * per_bag});
      auto offsets = torch::arange(0, bags * per_bag, per_bag);
      ASSERT_TRUE(tensors_close(fast(text, offsets), model->forward(text, offsets), 1e-4, 1e-5))
          << bags << " bags of " << per_bag;
    }
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::set_logs("");
  size_t builds = 0;
  for (size_t at = err.find("compile_per_shape: new sizes"); at != std::string::npos;
       at = err.find("compile_per_shape: new sizes", at + 1))
    ++builds;
  EXPECT_EQ(builds, 0u) << err;
  EXPECT_THAT(err, ::testing::HasSubstr("onednn: one program for every size (1 GEMM(s) with run-time rows)"));
  ASSERT_EQ(fast.state().num_entries(), 1u);
}

// The graph with size expressions is a guess from the first sizes: every new size runs the
// forward's host code (on meta tensors) and uses the graph only if that run records it. Host code
// that branches on a size past the first sizes (T > 8), or reads data only at some sizes (a graph
// break at T > 12: the meta trace stops there), gets its own trace at those sizes; every result is
// eager's, under every backend.
TEST_P(DynamicBackends, SizeExpressionGraphIsCheckedAtEveryNewSize) {
  torch::NoGradGuard no_grad;
  auto fn = [](const torch::Tensor& x) {
    const int64_t T = x.size(1);
    auto y = x.view({x.size(0) * T, -1});
    if (T > 8) y = torch::relu(y);
    if (T > 12 && x.sum().item<float>() > 0) y = y * 2;
    return y + T;
  };
  for (const char* check : {"shapes", "trace"}) {
    SCOPED_TRACE(std::string("TORCHCOMPILE_NEW_SIZES=") + check);
    tc_test::ScopedEnv new_sizes("TORCHCOMPILE_NEW_SIZES", check);
    CountingBackend counter(GetParam());
    auto fast = torch::compile(fn, torchcompile::CompileOptions(counter.name).with_dynamic(true));
    for (int64_t t : {3, 4, 5, 6, 9, 10, 13, 14, 7, 11, 15, 4}) {
      auto x = torch::randn({2, t, 16});  // no size equal to another (duck sizing)
      auto got = fast(x), expected = fn(x);
      ASSERT_EQ(got.sizes(), expected.sizes()) << "T = " << t;
      ASSERT_TRUE(tensors_close(got, expected, 1e-5, 1e-6)) << "T = " << t;
    }
    // dynamic = true keeps the T host code read static in the first entry (its feature size is the
    // symbol); T changing makes the second entry, whose graph has size expressions.
    EXPECT_EQ(fast.state().num_entries(), 2u);
    EXPECT_TRUE(fast.state().entries().front()->symbolic_graph());
  }
}

// How a new size is checked (NewSizeCosts): by a trace of shapes until both ways have a cost,
// then by the cheaper so far (running means, so a way whose cost grows past the other's gives
// way to it; the 8th, 64th ... new size measures the dearer way again where it cost at most 1.5x
// the cheaper, and the 1st where that is the trace of shapes); TORCHCOMPILE_NEW_SIZES
// forces one and a misspelt value fails at torch::compile.
TEST(Dynamic, NewSizesAreCheckedTheCheaperWay) {
  tcr::NewSizeCosts costs;
  EXPECT_TRUE(costs.use_shapes());  // nothing measured
  costs.add_traced(500);
  EXPECT_TRUE(costs.use_shapes());  // shapes not measured yet
  costs.add_shapes(2000);
  EXPECT_FALSE(costs.use_shapes());  // a GPT step: the real trace costs less
  costs.add_traced(3500);            // the forward's work grows: (500 + 3500) / 2
  EXPECT_DOUBLE_EQ(costs.traced_us, 2000);
  EXPECT_TRUE(costs.use_shapes());  // as cheap again: shapes
  costs.add_shapes(4000);
  EXPECT_FALSE(costs.use_shapes());
  // Decisions by cost: the 8th, 64th, 512th ... take the dearer way, whose cost that call
  // replaces (a first measurement that paid one-time work does not decide for good), and so does
  // the 1st where the trace of shapes is the dearer way (its first measurement ran the compiled
  // graph's first call at a new size).
  ASSERT_EQ(tcr::NewSizeCosts::kFirstRetry, 8u);
  EXPECT_TRUE(costs.next_by_shapes());  // the 1st: shapes (3000 us against 2000) measured again
  EXPECT_NE(costs.str().find("measuring the dearer way again"), std::string::npos) << costs.str();
  costs.add_shapes(900);  // shapes' mean was (2000 + 4000) / 2: now this call's cost
  EXPECT_DOUBLE_EQ(costs.shapes_us, 900);
  EXPECT_TRUE(costs.next_by_shapes());  // the 2nd
  costs.add_shapes(1100);               // not a retry: the running mean
  EXPECT_DOUBLE_EQ(costs.shapes_us, 1000);
  for (unsigned i = 3; i < 8; ++i) EXPECT_TRUE(costs.next_by_shapes()) << i;
  // The 8th: the real trace (2000 us) costs more than 1.5x shapes (1000 us): no retry.
  ASSERT_EQ(tcr::NewSizeCosts::kRetryWithin, 1.5);
  EXPECT_TRUE(costs.next_by_shapes());
  EXPECT_EQ(costs.str().find("measuring"), std::string::npos) << costs.str();
  costs.traced_us = 1500;  // within 1.5x
  for (unsigned i = 9; i < 64; ++i) EXPECT_TRUE(costs.next_by_shapes()) << i;
  EXPECT_FALSE(costs.next_by_shapes());  // the 64th: the real trace measured again
  costs.add_traced(700);
  EXPECT_DOUBLE_EQ(costs.traced_us, 700);
  for (unsigned i = 65; i < 512; ++i) EXPECT_FALSE(costs.next_by_shapes()) << i;
  EXPECT_TRUE(costs.next_by_shapes());  // the 512th: shapes (1000 us, within 1.5x of 700) measured again
  costs.add_shapes(600);
  EXPECT_TRUE(costs.next_by_shapes());  // the 513th: shapes (600 us) cost less than the real trace (700 us)
  // Shapes the cheaper way at the first decision: no early retry; at the 8th a retry where the
  // real trace costs at most 1.5x shapes.
  for (double traced : {5000.0, 7000.0}) {
    tcr::NewSizeCosts cheap;
    cheap.add_traced(traced);
    cheap.add_shapes(4000);
    for (unsigned i = 1; i < 8; ++i) {
      EXPECT_TRUE(cheap.next_by_shapes()) << i;
      EXPECT_EQ(cheap.str().find("measuring"), std::string::npos) << i << ": " << cheap.str();
    }
    EXPECT_EQ(cheap.next_by_shapes(), traced > 6000) << "the 8th, real trace " << traced << " us";
  }
  costs.forced = tcr::NewSizeCosts::Forced::Shapes;
  EXPECT_TRUE(costs.use_shapes());
  costs.forced = tcr::NewSizeCosts::Forced::Trace;
  costs.shapes_us = 1;
  EXPECT_FALSE(costs.use_shapes());
  {
    tc_test::ScopedEnv env("TORCHCOMPILE_NEW_SIZES", "trace");
    EXPECT_EQ(tcr::NewSizeCosts::forced_from_env(), tcr::NewSizeCosts::Forced::Trace);
  }
  tc_test::ScopedEnv env("TORCHCOMPILE_NEW_SIZES", "meta");
  auto fn = [](const torch::Tensor& x) { return x + 1; };
  try {
    torch::compile(fn, "eager");
    ADD_FAILURE() << "a misspelt TORCHCOMPILE_NEW_SIZES compiled";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("TORCHCOMPILE_NEW_SIZES: expected 'shapes'"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("got 'meta'"));
  }
}

// A forward with graph breaks whose host code reads sizes: each segment of its tree gets size
// expressions and is compiled once, for every size whose trace records those segments. A call
// whose break reads a value that tree has not seen (the sign of a sum: random here) gets a tree
// of its own for its sizes, traced from that call; the tree for every size stays as it was. Every
// result is eager's, under every backend.
TEST_P(DynamicBackends, GraphBreaksWithSizeExpressionsMatchEagerForEveryValueRead) {
  torch::NoGradGuard no_grad;
  auto fn = [](const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1);
    auto y = x.reshape({B * T, -1}).tanh();
    if ((y.sum() > 0).item<bool>()) y = y * 2;
    auto z = y.view({B, T, -1}).sum(1);
    if (torch::equal(x, x)) z = z + torch::arange(T).sum();  // false only with a NaN
    return z - B;
  };
  CountingBackend counter(GetParam());
  auto fast = torch::compile(fn, torchcompile::CompileOptions(counter.name).with_dynamic(true));
  std::mt19937 rng(5);
  auto check = [&](int64_t b, int64_t t, float sign) {
    auto x = torch::rand({b, t, 6}) * sign;
    auto got = fast(x), expected = fn(x);
    ASSERT_EQ(got.sizes(), expected.sizes()) << b << "x" << t;
    ASSERT_TRUE(tensors_close(got, expected, 1e-5, 1e-6)) << b << "x" << t << ", sign " << sign;
  };
  // dynamic = true keeps B and T static in the first entry (host code reads them); the second
  // entry, at the second (B, T), makes them symbols.
  // Batch sizes 2..5 and sequence lengths 7..11, 6 features: no two sizes equal (duck sizing).
  auto batch = [&] { return random_size(rng, 2, 5); };
  auto length = [&] { return random_size(rng, 7, 11); };
  for (int i = 0; i < 12; ++i) check(batch(), length(), 1.0f);
  ASSERT_EQ(fast.state().num_entries(), 2u);
  const auto entry = fast.state().entries().front();
  EXPECT_TRUE(entry->symbolic_graph());
  const int after_positive = counter.count();
  // Three segments per tree (the first entry's, the dynamic entry's first sizes', the one with
  // size expressions); at most one more for a trace kept to tell two expressions apart.
  EXPECT_LE(after_positive, 9);
  for (int i = 0; i < 6; ++i) check(batch(), length(), 1.0f);
  EXPECT_EQ(counter.count(), after_positive);  // sizes seen or new: no compile
  for (int i = 0; i < 30; ++i) check(batch(), length(), std::uniform_int_distribution<int>(0, 1)(rng) ? 1.0f : -1.0f);
  EXPECT_EQ(fast.state().num_entries(), 2u);
}

// A segment ending after an operator whose result sizes depend on the data (`nonzero`) has no
// graph for every size, even when two traces at different sizes read the same count: at the same
// sizes another call's count differs (the dynamic fuzzer, seed 20140: the result's sizes were
// fitted as an expression of the batch, and the next call threw).
TEST_P(DynamicBackends, ResultSizesThatDependOnTheDataAreNoSizeExpressions) {
  torch::NoGradGuard no_grad;
  auto fn = [](const torch::Tensor& x) {
    auto rows = torch::nonzero(x.select(1, 0) > 0.5).squeeze(1);
    return x.index_select(0, rows).sum(0, /*keepdim=*/true).expand({x.size(0), x.size(1)}) + x;
  };
  auto fast = torch::compile(fn, torchcompile::CompileOptions(GetParam()).with_dynamic(true));
  // (batch, rows selected): the same count at batches 4 and 5 (3 is the first, static entry's),
  // then another at 5.
  for (auto [b, count] :
       std::vector<std::pair<int64_t, int64_t>>{{3, 2}, {4, 2}, {5, 2}, {5, 3}, {6, 2}, {7, 4}, {4, 3}, {8, 2}}) {
    auto x = torch::rand({b, 3}) * 0.4;
    x.select(1, 0).narrow(0, 0, count).fill_(1.0);
    auto got = fast(x), expected = fn(x);
    ASSERT_TRUE(tensors_close(got, expected, 1e-5, 1e-6)) << "batch " << b << ", " << count << " rows";
  }
}

// Copies the parameters and buffers of `from` into `to` (same module type).
void copy_state(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto p = from.parameters(), q = to.parameters();
  for (size_t i = 0; i < p.size(); ++i) q[i].copy_(p[i]);
  auto b = from.buffers(), c = to.buffers();
  for (size_t i = 0; i < b.size(); ++i) c[i].copy_(b[i]);
}

// 12 training steps (forward, loss, backward, SGD with momentum) of `net` compiled and of `ref`
// (a copy) eagerly, at random input sizes from `make`: one entry with `dynamic = true`, two with
// automatic dynamic; losses, parameters and buffers (BatchNorm's running statistics) as eager's.
// For a forward whose host code reads no size, the backend (registered by name, counting its
// calls) is called once with `dynamic = true`, at most twice with automatic dynamic; for one that
// reads sizes, at most 3 times.
template <typename M, typename Make>
void expect_training_matches_at_random_sizes(const std::string& backend, Make&& make, bool reads_sizes) {
  for (bool automatic : {false, true}) {
    SCOPED_TRACE(automatic ? "automatic dynamic" : "dynamic = true");
    torch::manual_seed(4);
    auto net = std::make_shared<M>();
    auto ref = std::make_shared<M>();
    copy_state(*net, *ref);
    CountingBackend counter(backend);
    auto opts = torchcompile::CompileOptions(counter.name);
    if (!automatic) opts = opts.with_dynamic(true);
    auto fast = torch::compile(net, opts);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD opt_ref(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    std::mt19937 rng(11);
    for (int step = 0; step < 12; ++step) {
      auto x = make(rng);
      opt.zero_grad();
      opt_ref.zero_grad();
      auto out = fast(x), out_ref = ref->forward(x);
      auto target = torch::randint(0, 10, {out_ref.size(0)});
      auto loss = torch::cross_entropy_loss(out, target);
      auto loss_ref = torch::cross_entropy_loss(out_ref, target);
      ASSERT_TRUE(tensors_close(loss, loss_ref, 1e-4, 1e-5)) << "step " << step << ", input " << x.sizes();
      loss.backward();
      loss_ref.backward();
      opt.step();
      opt_ref.step();
    }
    auto p = net->parameters(), q = ref->parameters();
    for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(tensors_close(p[i], q[i], 1e-4, 1e-5)) << "parameter " << i;
    auto b = net->buffers(), c = ref->buffers();
    for (size_t i = 0; i < b.size(); ++i) EXPECT_TRUE(tensors_close(b[i], c[i], 1e-4, 1e-5)) << "buffer " << i;
    EXPECT_EQ(fast.state().num_entries(), automatic ? 2u : 1u);
    if (!reads_sizes) EXPECT_EQ(counter.count(), automatic ? 2 : 1);
    else EXPECT_LE(counter.count(), 3);
  }
}

// An encoder layer (M4's shape, attention reading its sizes in host code) over a mean-pooled
// sequence, for a classification loss.
struct EncoderClassifier : torch::nn::Module {
  torch::nn::TransformerEncoderLayer enc{nullptr};
  torch::nn::Linear fc{nullptr};
  EncoderClassifier() {
    enc = register_module(
        "enc", torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(32, 4).dim_feedforward(64).dropout(0.0)));
    fc = register_module("fc", torch::nn::Linear(32, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return fc(enc(x).mean(0)); }
};

// Training steps at random sizes: M1 (batch), M3's shape (batch and image size, BatchNorm in
// training mode), an encoder layer (sequence length and batch).
TEST_P(DynamicBackends, TrainingStepsAtRandomSizesMatchEager) {
  expect_training_matches_at_random_sizes<Mlp>(
      GetParam(), [](std::mt19937& rng) { return torch::randn({random_size(rng, 2, 40), 784}); }, false);
  expect_training_matches_at_random_sizes<ConvNet>(GetParam(), [](std::mt19937& rng) {
    const int64_t hw = random_size(rng, 8, 24);
    return torch::randn({random_size(rng, 2, 8), 3, hw, hw});
  }, /*reads_sizes=*/true);  // F::batch_norm reads its input's sizes in training (a check)
  expect_training_matches_at_random_sizes<EncoderClassifier>(GetParam(), [](std::mt19937& rng) {
    return torch::randn({random_size(rng, 2, 9), random_size(rng, 2, 6), 32});
  }, true);
}

INSTANTIATE_TEST_SUITE_P(Backends, DynamicBackends, ::testing::ValuesIn(backends_to_test()),
                         [](const auto& info) { return info.param; });

TEST(Dynamic, AForwardReturningItsInputReturnsTheInputItself) {
  torch::NoGradGuard no_grad;
  auto fn = [](torch::Tensor a, torch::Tensor b) { return std::make_tuple(a, a * b); };
  auto fast = torch::compile(fn, torchcompile::CompileOptions("eager").with_dynamic(true));
  for (int64_t n : {3, 5, 7}) {
    auto a = torch::randn({n, 2}), b = torch::randn({n, 2});
    auto [same, prod] = fast(a, b);
    EXPECT_TRUE(same.is_same(a)) << "size " << n;
    EXPECT_TRUE(tensors_close(prod, a * b));
  }
  EXPECT_EQ(fast.state().num_entries(), 1u);
  EXPECT_EQ(fast.state().entries().front()->size_symbols().size(), 2u);  // n and 2
}

// Hand-written time loops over `unbind` and `split`, and `chunk`: the number of tensors they
// return is a size, so a dynamic entry runs the forward again per size (a graph per count) instead
// of replaying one count's graph; every result must be eager's.
struct ListLoops : torch::nn::Module {
  torch::nn::Linear step{nullptr};
  ListLoops() { step = register_module("step", torch::nn::Linear(6, 6)); }
  torch::Tensor forward(torch::Tensor x) {  // [B, T, 6]
    torch::Tensor h = torch::zeros({x.size(0), 6});
    for (const torch::Tensor& xt : x.unbind(1)) h = torch::tanh(step->forward(xt) + h);
    torch::Tensor parts = torch::zeros({x.size(0), 6});
    for (const torch::Tensor& p : x.split(2, 1)) parts = parts + p.sum(1);
    torch::Tensor halves = torch::zeros({x.size(0), 6});
    for (const torch::Tensor& c : x.chunk(3, 1)) halves = halves * 0.5 + c.mean(1);
    return h + parts + halves;
  }
};

TEST_P(DynamicBackends, LoopsOverUnbindSplitAndChunkMatchEagerAtEverySize) {
  torch::NoGradGuard no_grad;
  auto m = std::make_shared<ListLoops>();
  for (bool dynamic : {true, false}) {
    auto fast = torch::compile(m, torchcompile::CompileOptions(GetParam()).with_dynamic(dynamic));
    expect_matches_at_random_sizes(
        fast, [&](torch::Tensor x) { return m->forward(x); },
        [](std::mt19937& rng) { return torch::randn({random_size(rng, 1, 5), random_size(rng, 1, 9), 6}); }, 12,
        dynamic ? 71 : 72);
  }
}

TEST(Dynamic, ReadOfAnIntermediateSizeRunsTheForwardAgainPerSize) {
  torch::NoGradGuard no_grad;
  auto fn = [](torch::Tensor a) {
    auto h = a * 2;
    return h.view({h.size(0), -1}).sum(1);
  };
  CompileCounter cc;
  auto fast = torch::compile(fn, torchcompile::CompileOptions(cc.backend()).with_dynamic(true));
  for (int64_t n : {5, 4, 6, 4}) {  // never 2 or 3: duck sizing would share a symbol
    auto a = torch::randn({n, 2, 3});
    EXPECT_TRUE(tensors_close(fast(a), fn(a)));
  }
  EXPECT_EQ(fast.state().num_entries(), 1u);
  // One trace per size; compiled: the first size, then at the second the graph with size
  // expressions (`view(%mul, [%s0, -1])`), which the trace at 6 records too.
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_THAT(cc.graphs().back(), ::testing::HasSubstr("[%s0, -1]"));
}

TEST(Dynamic, InPlaceMetadataChangeOfAnInputIsEagers) {
  torch::NoGradGuard no_grad;
  auto fn = [](torch::Tensor a) {
    a.unsqueeze_(0);
    return a * 2;
  };
  auto fast = torch::compile(fn, torchcompile::CompileOptions("eager").with_dynamic(true));
  for (int64_t n : {3, 4}) {
    auto a = torch::randn({n, 2}), b = a.clone();
    auto expected = fn(b);
    auto got = fast(a);
    EXPECT_TRUE(tensors_close(got, expected));
    EXPECT_EQ(a.sizes(), b.sizes());
  }
}

}  // namespace

namespace {

using torchcompile::capture::ObservedTensorImpl;

TEST(Dynamic, ObservedTensorsCountHostReadsOnlyWhileObserving) {
  auto reads = std::make_shared<torchcompile::capture::SizeReads>();
  auto a = torch::randn({4, 5, 6});
  auto o = ObservedTensorImpl::make(a, reads, {1, 2, 0}, "input 'a'");
  EXPECT_EQ(o.sizes(), a.sizes());  // before start(): not counted
  EXPECT_EQ(reads->read(), 0u);
  reads->start();
  EXPECT_EQ(o.size(-2), 5);  // one dimension
  EXPECT_EQ(reads->read(), 2u);
  EXPECT_EQ(o.dim(), 3);  // the rank is not a size read
  EXPECT_TRUE(o.is_contiguous());
  EXPECT_EQ(reads->read(), 2u);
  EXPECT_EQ(o.numel(), 120);  // all dimensions
  EXPECT_EQ(reads->read(), 3u);
  EXPECT_EQ(reads->first_reads()[1], "size(1) of input 'a'");
  EXPECT_EQ(reads->first_reads()[0], "numel() of input 'a'");
  EXPECT_THROW(o.size(3), c10::Error);
  ObservedTensorImpl::of(o)->set_observing(false);  // while an op runs on it
  EXPECT_TRUE(tensors_close(o * 2, a * 2));
  EXPECT_EQ(o.data_ptr(), a.data_ptr());
  auto detached = o.detach();
  EXPECT_EQ(ObservedTensorImpl::of(detached), nullptr);
  reads->finish();
  EXPECT_FALSE(reads->active());
  o.resize_({2, 3});  // an ordinary tensor again
  EXPECT_EQ(o.numel(), 6);
}

}  // namespace

// ---- a randomized differential test ----------------------------------------------------------
//
// Random forwards over a batch-sized input x [B, 6]: pointwise ops, reductions broadcast back,
// matmuls, softmax, views with constant sizes, cat/narrow, transposes, in-place updates (of the
// input too), and — in some programs — host code that reads a size (as an integer argument, or
// in a branch) or branches on data, ops whose result sizes depend on the data (masked_select,
// nonzero, boolean indexing, unique: results used on the device, or their sizes read on the
// host) and loops over lists whose length is a size (unbind, split). Each program is compiled
// with automatic and with `dynamic = true` under every built-in backend (and a checking one) and
// called at random batch sizes (1 included) next to eager: every output and the input after the
// call must match. Programs whose host code reads a size (or breaks the graph) run the forward
// again at each new size: they trace more, but in one entry (two with automatic dynamic, one
// more for batch 1), and never return a wrong result.
//
//   TORCHCOMPILE_DYNAMIC_FUZZ_PROGRAMS  programs (default 40); TORCHCOMPILE_DYNAMIC_FUZZ_SEED first seed;
//   TORCHCOMPILE_DYNAMIC_FUZZ_BACKEND   one backend for every program (to reproduce a failure)
namespace {

constexpr int64_t kF = 6;

struct DynInstr {
  int kind, d, a, b, k;
};

struct DynProgram {
  std::vector<DynInstr> code;
  int out1 = 0, out2 = 1;
  std::string text;
};

constexpr int kDynKinds = 18;

DynProgram random_dyn_program(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  DynProgram p;
  const int n = 4 + pick(10);
  std::ostringstream os;
  for (int i = 0; i < n; ++i) {
    DynInstr in{pick(kDynKinds), pick(4), pick(4), pick(4), pick(4)};
    if (in.kind >= 12 && pick(3) != 0) in.kind = pick(12);  // size reads and breaks: rarer
    os << in.kind << ":" << in.d << in.a << in.b << in.k << " ";
    p.code.push_back(in);
  }
  p.out1 = pick(4), p.out2 = pick(4);
  p.text = os.str();
  return p;
}

struct DynModule : torch::nn::Module {
  DynProgram prog;
  torch::Tensor w, bias;
  explicit DynModule(DynProgram p) : prog(std::move(p)) {
    w = register_parameter("w", torch::randn({kF, kF}) * 0.3);
    bias = register_buffer("bias", torch::randn({kF}));
  }
  std::vector<torch::Tensor> forward(torch::Tensor x) {
    torch::Tensor r[4] = {x * 1, x.sigmoid(), x - 0.5, x.tanh()};
    for (const DynInstr& in : prog.code) {
      torch::Tensor &d = r[in.d], &a = r[in.a], &b = r[in.b];
      switch (in.kind) {
        case 0: d = in.k % 2 ? a.relu() : torch::gelu(a); break;
        case 1: d = in.k % 2 ? a + b * 0.5 : a * b; break;
        case 2: d = a - a.sum(1, /*keepdim=*/true) / kF; break;                 // [B, 1] broadcast
        case 3: d = a + a.mean(0, /*keepdim=*/true); break;                     // [1, F] broadcast
        case 4: d = torch::matmul(a, w) + bias; break;
        case 5: d = torch::softmax(a, 1); break;
        case 6: d = a.reshape({-1}).view({-1, kF}) * 2; break;                  // constant sizes
        case 7: d = torch::cat({a, b}, 1).narrow(1, in.k % 3, kF); break;
        case 8: d = a.t().contiguous().t() + 1; break;
        case 9: d = a.narrow(0, 0, 1).expand_as(b) + b; break;                  // size 1, expanded
        case 10: in.k == 0 ? x.add_(0.25) : d.mul_(0.5); break;                  // in place (the input too)
        case 11: d = a.unsqueeze(0).squeeze(0).flip({0}); break;
        case 12:  // host code reads a size: an integer argument, or a branch
          if (in.k % 2) {
            d = a.reshape({a.size(0), 2, kF / 2}).sum(2).repeat({1, 3});
          } else {
            d = a.size(0) > 5 ? a.exp().clamp_max(5) : a.cos();
          }
          break;
        // A data-dependent break; not at 0, where the sum of a centered tensor is rounding noise
        // whose sign differs between kernels. The value read is the sum (another at every call),
        // or the comparison (a bool: the same tree may serve every size).
        case 13:
          if (in.k % 2) {
            d = a.sum().item<float>() > 0.25 ? a * 2 : a * -1;
          } else {
            d = (a.sum() > 0.25).item<bool>() ? a * 2 : a * -1;
          }
          break;
        // Results whose sizes depend on the data, used on the device or read on the host.
        case 14:
          if (in.k % 2) {
            d = a + (a - b).masked_select(a > b).pow(2).sum();                  // a masked loss
          } else {
            d = a * static_cast<double>(a.masked_select(a > 0).size(0) % 5 + 1);  // its size read
          }
          break;
        case 15:
          if (in.k % 2) {
            d = a + a.index_select(0, torch::nonzero(b.select(1, 0) > 0).squeeze(1)).sum(0, true);
          } else {
            d = a + a.index({a > 0.2}).sum() * static_cast<double>(torch::nonzero(b > 0).size(0));
          }
          break;
        case 16: {  // a loop over a list whose length is a size
          if (in.k % 2) {
            torch::Tensor acc = torch::zeros({kF});
            for (const torch::Tensor& row : a.unbind(0)) acc = acc + row.relu();
            d = b + acc;
          } else {
            std::vector<torch::Tensor> parts = a.split(3, 0);
            std::reverse(parts.begin(), parts.end());
            d = torch::cat(parts, 0) + b;
          }
          break;
        }
        case 17: {
          torch::Tensor u = std::get<0>(torch::_unique(a.round()));
          d = in.k % 2 ? a + u.sum() : a - static_cast<double>(u.size(0));
          break;
        }
      }
    }
    return {r[prog.out1], r[prog.out2] + 0};
  }
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// Whether an entry of `state` runs the forward again at each new size.
bool replays_forward(const tcr::CompiledFunction& state) {
  for (const auto& e : state.entries())
    for (const std::string& line : e->size_symbols())
      if (line.rfind("each new size runs the forward again", 0) == 0) return true;
  return false;
}

namespace tci = torchcompile::ir;

// A backend for compile_per_shape's metadata at new sizes: its static part compares the metadata
// of every value of the graph it receives (at the example sizes: the traced graph; at new sizes:
// from meta tensors, for pure graphs) with the metadata of a real run of the graph on copies of
// the inputs, notes every difference, and counts the calls of the functions it returns.
struct MetadataCheck {
  std::mutex mutex;
  std::vector<std::string> differences;
  std::string program;  // what the test is running (said with each difference)
  std::atomic<int> graphs{0}, calls{0};
};
MetadataCheck& metadata_check() {
  static MetadataCheck c;
  return c;
}

void register_metadata_check_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    torchcompile::register_backend("per_shape_metadata_check", [](torchcompile::GraphModule& gm,
                                                                  const std::vector<at::Tensor>& example) {
      return torchcompile::compile_per_shape(gm, example, [](torchcompile::GraphModule& g,
                                                             const std::vector<at::Tensor>& inputs)
                                                              -> torchcompile::CompiledFn {
        MetadataCheck& check = metadata_check();
        ++check.graphs;
        if (!torchcompile::ir::effects_of(g).any()) {
          std::map<std::string, std::vector<tci::TensorMeta>> real;
          tci::Interpreter run(g);
          run.override_if([](const tci::Node&) { return true; },
                          [&real](const tci::Node& n, const std::vector<c10::IValue>& args) {
                            std::vector<at::Tensor> out = tci::run_target(n, args);
                            for (const at::Tensor& t : out) real[n.name()].push_back(tci::TensorMeta::of(t));
                            return out;
                          });
          std::vector<at::Tensor> copies;
          for (const at::Tensor& t : inputs)  // with the inputs' strides (clone makes a narrowed view contiguous)
            copies.push_back(t.defined() ? at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t) : t);
          run.run(copies);
          for (const auto& n : g.graph().nodes()) {
            auto it = real.find(n->name());
            if (it == real.end()) continue;
            for (size_t i = 0; i < it->second.size() && i < n->num_outputs(); ++i) {
              const tci::TensorMeta &want = it->second[i], &got = n->output_meta()[i];
              if (!want.defined) continue;
              if (want.sizes != got.sizes || want.dtype != got.dtype || want.device != got.device ||
                  (want.strides != got.strides && want.sizes == got.sizes &&
                   std::find(want.sizes.begin(), want.sizes.end(), 1) == want.sizes.end())) {
                std::lock_guard<std::mutex> lock(check.mutex);
                check.differences.push_back("node " + n->name() + " (" + n->target() + "): graph has " + got.str() +
                                            ", a real run gives " + want.str() + "; " + check.program);
              }
            }
          }
        }
        auto fn = tci::interpreter_fn(g);
        return [fn](std::vector<at::Tensor> in) {
          ++metadata_check().calls;
          return fn(std::move(in));
        };
      });
    });
  });
}

// A fuzz program's module to compile, its eager twin with the same weights, and the same program
// in float64 (the reference that tells rounding from a wrong result, see output_matches).
struct FuzzModules {
  std::shared_ptr<DynModule> compiled, eager, float64;
};
FuzzModules fuzz_modules(const DynProgram& prog, uint32_t seed) {
  auto float64 = std::make_shared<DynModule>(prog);  // made before the seed: the draws after it are the same
  torch::manual_seed(seed);
  auto compiled = std::make_shared<DynModule>(prog), eager = std::make_shared<DynModule>(prog);
  torch::NoGradGuard no_grad;
  eager->w.copy_(compiled->w);
  eager->bias.copy_(compiled->bias);
  float64->w.copy_(compiled->w);
  float64->bias.copy_(compiled->bias);
  float64->to(torch::kDouble);
  return {compiled, eager, float64};
}

// An output of a fuzz program is eager's (rtol 1e-4, atol 1e-5) or, where the program's float
// arithmetic is ill-conditioned, at least as accurate as eager's against the same program run in
// float64: element by element (tensors_close_or_as_accurate: within 4x eager's error there, or
// how far eager's result moves when the input moves by one ULP), or over the whole output, as
// PyTorch's tests compare with a float64 reference: where eager's largest error exceeds the
// tolerance, the compiled output's largest error is at most 4x eager's and its root mean square
// error at most 2x eager's. Seed 18199 needs the latter: a data-dependent sum times a count (~900)
// added to every element, then removed by centering; the elements' rounding at that magnitude
// (ulp 6e-5) is what remains, eager's worst error is 1.0e-4 and its RMS 4.2e-5, `default`'s
// 1.2e-4 and 4.3e-5 (its reductions add in another order), but at one element eager's is 5e-6
// and `default`'s 7e-5.
// The references of one call, run only when an output is not eager's: the float64 program, and
// eager's on inputs moved by one ULP (both from the input as it was before the calls).
struct CallReferences {
  const FuzzModules& modules;
  torch::Tensor x_float64, x_nudged;
  std::vector<torch::Tensor> float64, nudged;
  CallReferences(const FuzzModules& m, const torch::Tensor& x, uint32_t nudge_seed)
      : modules(m), x_float64(x.to(torch::kDouble)), x_nudged(tc_test::nudged_by_one_ulp(x, nudge_seed)) {}
  void run() {
    if (!float64.empty()) return;
    torch::NoGradGuard no_grad;
    float64 = modules.float64->forward(x_float64);
    nudged = modules.eager->forward(x_nudged);
  }
};

::testing::AssertionResult output_matches(const torch::Tensor& expected, const torch::Tensor& got,
                                          CallReferences& refs, size_t output) {
  constexpr double rtol = 1e-4, atol = 1e-5;
  if (auto close = tensors_close(expected, got, rtol, atol)) return close;
  refs.run();
  const torch::Tensor &float64 = refs.float64.at(output), &nudged = refs.nudged.at(output);
  auto by_element = tc_test::tensors_close_or_as_accurate(expected, got, float64, nudged, rtol, atol);
  if (by_element || !expected.is_floating_point() || expected.sizes() != got.sizes() ||
      got.scalar_type() != expected.scalar_type() || !got.isfinite().all().item<bool>())
    return by_element;
  const torch::Tensor eager_error = expected.to(torch::kDouble) - float64, error = got.to(torch::kDouble) - float64;
  const double eager_max = eager_error.abs().max().item<double>(), eager_rms = eager_error.pow(2).mean().sqrt().item<double>();
  const double max = error.abs().max().item<double>(), rms = error.pow(2).mean().sqrt().item<double>();
  const double tolerance = atol + rtol * float64.abs().max().item<double>();
  if (eager_max > tolerance && max <= 4 * eager_max + atol && rms <= 2 * eager_rms + atol)
    return ::testing::AssertionSuccess();
  return by_element << "; over the output, against float64: largest error " << max << " (eager's " << eager_max
                    << "), root mean square " << rms << " (eager's " << eager_rms << ")";
}

torchcompile::CompileOptions fuzz_options(const std::string& backend, std::optional<bool> dyn) {
  torchcompile::CompileOptions options(backend);
  options.dynamic = dyn;
  options.cache_size_limit = 64;
  return options;
}

TEST(DynamicFuzz, RandomProgramsAtRandomSizesMatchEager) {
  torch::NoGradGuard no_grad;
  const int programs = env_int("TORCHCOMPILE_DYNAMIC_FUZZ_PROGRAMS", 40);
  const uint32_t first = static_cast<uint32_t>(env_int("TORCHCOMPILE_DYNAMIC_FUZZ_SEED", 1));
  register_metadata_check_backend();
  metadata_check().differences.clear();
  // per_shape_metadata_check: every new size's static graph from compile_per_shape has the
  // metadata a real run at those sizes gives (sizes, dtypes, devices; strides where no size is 1).
  const std::vector<std::string> backends = {"eager", "aot_eager", "default", "onednn", "fused",
                                             "per_shape_metadata_check"};
  // Programs whose host code reads no size, breaks no graph and has no op whose result sizes
  // depend on the data, and those of them whose dynamic=true run needed a single entry for
  // sizes >= 2 without running the forward again.
  int plain = 0, one_entry = 0;
  const char* only = std::getenv("TORCHCOMPILE_DYNAMIC_FUZZ_BACKEND");
  for (int k = 0; k < programs; ++k) {
    const uint32_t seed = first + k;
    const DynProgram prog = random_dyn_program(seed);
    const std::string backend = only ? only : backends[k % backends.size()];
    for (std::optional<bool> dyn : {std::optional<bool>(), std::optional<bool>(true)}) {
      const FuzzModules modules = fuzz_modules(prog, seed);
      const std::shared_ptr<DynModule>& compiled_module = modules.compiled, &eager_module = modules.eager;
      auto fast = torch::compile(compiled_module, fuzz_options(backend, dyn));
      metadata_check().program = "seed " + std::to_string(seed) + ", dynamic " + (dyn ? "true" : "automatic") +
                                 ", program " + prog.text;
      std::mt19937 rng(seed * 7 + 1);
      int64_t first_batch = 0;
      for (int call = 0; call < 8; ++call) {
        const int64_t b = call == 5 ? 1 : random_size(rng, 2, 12);
        if (call == 0) first_batch = b;
        torch::Tensor x = torch::randn({b, kF});
        torch::Tensor x_eager = x.clone();
        CallReferences refs(modules, x, seed + call);
        auto expected = eager_module->forward(x_eager);
        auto got = fast(x);
        const std::string where = "seed " + std::to_string(seed) + ", backend " + backend + ", dynamic " +
                                  (dyn ? "true" : "automatic") + ", call " + std::to_string(call) + ", batch " +
                                  std::to_string(b) + ", program " + prog.text;
        ASSERT_EQ(got.size(), expected.size()) << where;
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i].sizes(), expected[i].sizes()) << where;
          ASSERT_TRUE(output_matches(expected[i], got[i], refs, i)) << "output " << i << ", " << where;
        }
        ASSERT_TRUE(tensors_close(x_eager, x, 1e-4, 1e-5)) << "input after the call, " << where;
      }
      // The batch-1 call has an entry of its own, automatic dynamic one static entry; with
      // `dynamic = true` a first batch of kF shares its symbol with the feature dimension
      // (duck sizing), so the next batch size needs another entry.
      const size_t most = dyn ? 2 + (first_batch == kF) : 3;
      EXPECT_LE(fast.state().num_entries(), most) << "seed " << seed << ", backend " << backend;
      const bool is_plain = std::all_of(prog.code.begin(), prog.code.end(), [](const DynInstr& in) { return in.kind < 12; });
      if (dyn && is_plain) {
        ++plain;
        if (fast.state().num_entries() <= most && !replays_forward(fast.state())) ++one_entry;
      }
    }
  }
  // A program that reads no size: its captured graph must have served every size.
  EXPECT_EQ(one_entry, plain) << one_entry << " of " << plain << " programs without size reads ran without replays";
  MetadataCheck& check = metadata_check();
  if (!only || std::string(only) == "per_shape_metadata_check") EXPECT_GT(check.graphs.load(), 0);
  for (const std::string& d : check.differences) ADD_FAILURE() << d;
}

// The same random programs trained: `w` requires grad, the outputs' mean squares are the loss,
// and after each backward `w`'s gradient must be eager's, at random sizes, under the backends
// that train through AOT. A graph with size symbols gets one joint graph for every size where its
// recordings at four sizes generalize (aot/symbolic_joint.cpp): an integer or size fitted wrongly
// would give another loss or gradient at the sizes this draws.
// One program of the training fuzzer under `backend`; counts the backward passes compared.
void expect_program_trains_as_eager(uint32_t seed, const std::string& backend, int& trained) {
  const DynProgram prog = random_dyn_program(seed);
  for (std::optional<bool> dyn : {std::optional<bool>(), std::optional<bool>(true)}) {
    const FuzzModules modules = fuzz_modules(prog, seed);
    const std::shared_ptr<DynModule>& compiled_module = modules.compiled, &eager_module = modules.eager;
    auto fast = torch::compile(compiled_module, fuzz_options(backend, dyn));
    std::mt19937 rng(seed * 7 + 1);
    for (int call = 0; call < 8; ++call) {
      const int64_t b = call == 5 ? 1 : random_size(rng, 2, 12);
      const std::string where = "seed " + std::to_string(seed) + ", backend " + backend + ", dynamic " +
                                (dyn ? "true" : "automatic") + ", call " + std::to_string(call) + ", batch " +
                                std::to_string(b) + ", program " + prog.text;
      torch::Tensor x = torch::randn({b, kF});
      torch::Tensor x_eager = x.clone();
      CallReferences refs(modules, x, seed + call);
      compiled_module->w.mutable_grad() = torch::Tensor();
      eager_module->w.mutable_grad() = torch::Tensor();
      auto expected = eager_module->forward(x_eager);
      auto got = fast(x);
      ASSERT_EQ(got.size(), expected.size()) << where;
      torch::Tensor loss_expected, loss_got;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].sizes(), expected[i].sizes()) << where;
        ASSERT_TRUE(output_matches(expected[i], got[i], refs, i)) << "output " << i << ", " << where;
        if (!expected[i].requires_grad()) continue;
        ASSERT_TRUE(got[i].requires_grad()) << "output " << i << " has no gradient, " << where;
        auto add = [](torch::Tensor& sum, const torch::Tensor& o) {
          torch::Tensor term = o.pow(2).mean();
          sum = sum.defined() ? sum + term : term;
        };
        add(loss_expected, expected[i]);
        add(loss_got, got[i]);
      }
      if (!loss_expected.defined()) continue;
      try {
        loss_expected.backward();
      } catch (const c10::Error&) {
        continue;  // not a program eager can train (an in-place update of a value its backward saved)
      }
      try {
        loss_got.backward();
      } catch (const c10::Error& e) {
        FAIL() << "the compiled backward threw where eager's did not: " << e.what_without_backtrace() << ", " << where;
      }
      ++trained;
      const torch::Tensor &want = eager_module->w.grad(), &have = compiled_module->w.grad();
      ASSERT_EQ(want.defined(), have.defined()) << "w's gradient, " << where;
      if (want.defined()) ASSERT_TRUE(tensors_close(want, have, 1e-3, 1e-4)) << "w's gradient, " << where;
    }
  }
}

TEST(DynamicFuzz, RandomProgramsTrainAtRandomSizesAsEager) {
  const int programs = env_int("TORCHCOMPILE_DYNAMIC_FUZZ_PROGRAMS", 40);
  const uint32_t first = static_cast<uint32_t>(env_int("TORCHCOMPILE_DYNAMIC_FUZZ_SEED", 1));
  const std::vector<std::string> backends = {"aot_eager", "default"};
  const char* only = std::getenv("TORCHCOMPILE_DYNAMIC_FUZZ_BACKEND");
  int trained = 0;
  for (int k = 0; k < programs && !::testing::Test::HasFatalFailure() && !::testing::Test::HasFailure(); ++k)
    expect_program_trains_as_eager(first + k, only ? only : backends[k % backends.size()], trained);
  EXPECT_GT(trained, 0);
}

// Programs of the training fuzzer that found defects, under both backends: 20310 (an input without
// a gradient was an edge of the compiled node), 70189 (a value the forward saved for the backward
// was a result the caller updated in place after a graph break: AOT now saves such values as
// copies; the compiled backward threw where eager's did not), and 18199 (a defect of the test:
// ill-conditioned float arithmetic where eager is 3e-4 from the float64 result, and `default`'s
// closer to it, failed a fixed tolerance).
TEST(DynamicFuzz, ProgramsThatFoundDefectsTrainAsEager) {
  int trained = 0;
  for (uint32_t seed : {20310u, 70189u, 18199u})
    for (const char* backend : {"aot_eager", "default"}) {
      expect_program_trains_as_eager(seed, backend, trained);
      if (HasFailure()) return;
    }
  EXPECT_GT(trained, 0);
}

// compile_per_shape at a new size: the static backend's function computes that call (it is not
// run by the interpreter first), once per size.
TEST(Dynamic, PerShapeSpecializationComputesTheCallThatMadeIt) {
  torch::NoGradGuard no_grad;
  register_metadata_check_backend();
  auto net = std::make_shared<Mlp>();
  auto fast = torch::compile(net, torchcompile::CompileOptions("per_shape_metadata_check").with_dynamic(true));
  MetadataCheck& check = metadata_check();
  check.differences.clear();
  fast(torch::randn({4, 784}));
  const int graphs = check.graphs.load(), calls = check.calls.load();
  for (int64_t n : {9, 5, 9, 13}) {
    auto x = torch::randn({n, 784});
    ASSERT_TRUE(tensors_close(fast(x), net->forward(x), 1e-4, 1e-5)) << "batch " << n;
  }
  EXPECT_EQ(check.graphs.load() - graphs, 3);  // 9, 5, 13
  EXPECT_EQ(check.calls.load() - calls, 4);    // every call ran a compiled function
  EXPECT_TRUE(check.differences.empty()) << check.differences.front();
}

}  // namespace

// Seed 003's SimpleNN compiled with dynamic = true: the debug backend prints the graph with the
// batch size as `placeholder s0` (the 2 input features stay static: fc1's weight fixes them).
TEST(Dynamic, DebugBackendPrintsSeedSimpleNnWithPlaceholderS0) {
  torch::NoGradGuard no_grad;
  tc_test::SimpleNN model(2);
  auto fast = torch::compile(model, torchcompile::CompileOptions("debug").with_dynamic(true).with_input_names({"x"}));
  ::testing::internal::CaptureStdout();
  auto inputs = torch::ones({10, 2});
  auto first = fast(inputs);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(tensors_close(first, model->forward(inputs)));
  EXPECT_THAT(printed, ::testing::ContainsRegex("placeholder +s0 +s0 +\\(\\) +\\{\\}"));
  EXPECT_THAT(printed, ::testing::ContainsRegex("placeholder +x +x +\\(\\) +\\{\\}"));
  EXPECT_LT(printed.find("s0"), printed.find("placeholder    x"));
  // One compile serves other batch sizes: nothing more is printed.
  ::testing::internal::CaptureStdout();
  for (int64_t n : {3, 17, 64}) {
    auto x = torch::randn({n, 2});
    EXPECT_TRUE(tensors_close(fast(x), model->forward(x)));
  }
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  const auto entries = fast.state().entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0]->symbolic_graph());
}

