// Per-call overhead of torch::compile's `eager` backend (cache lookup + guards + graph replay
// by the interpreter) against plain eager LibTorch.
//
// Models (the benchmark models of bench_models.cpp): M8, 50 chained tiny ops on (8, 8), where the per-op
// cost of the replay dominates; M1, the MLP on (64, 784), where the GEMMs dominate; and
// OneOp, a single x + 1 on (8, 8), which shows the fixed cost of one compiled call. The
// *_FirstCall rows compile afresh in every iteration: the cost of a trace and its compile.
//
// Each *_Compiled benchmark interleaves, in every iteration, one untimed-by-the-framework eager
// call with the timed compiled call (alternating which goes first), and times both with
// std::chrono. The reported Time is the compiled call alone (manual time); the counters compare
// the two medians from the same iterations of the same run, so load changes on a shared machine
// hit both alike:
//   eager_us, compiled_us   median per-call times
//   ratio_vs_eager          compiled_us / eager_us
//   overhead_us_per_call    compiled_us - eager_us
// The CPU column of *_Compiled includes the interleaved eager calls; read Time instead.
//
// Run with glibc malloc tuned (scripts/bench.sh sets MALLOC_MMAP_THRESHOLD_ and
// MALLOC_TRIM_THRESHOLD_).
#include "bench_context.h"
#include "test/support/seed_models.h"

#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <torchcompile/torchcompile.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "examples/models.h"

namespace {

using torchcompile_examples::Mlp;

using Clock = std::chrono::steady_clock;

// ---- models ----------------------------------------------------------------------------------

using torchcompile_examples::chain50;  // M8

torch::Tensor one_op(torch::Tensor x) { return x + 1; }

// A model: its eager callable, its compiled callable (backend "eager") and its input. Built
// once per process; the first compiled call (the trace) happens in the constructor.
struct Case {
  std::function<torch::Tensor(const torch::Tensor&)> eager;
  std::function<torch::Tensor(const torch::Tensor&)> compiled;
  torch::Tensor input;
  std::string error;  // non-empty if the compiled result differs from eager

  void check() {
    torch::NoGradGuard no_grad;
    torch::Tensor want = eager(input);
    torch::Tensor first = compiled(input);   // traces
    torch::Tensor second = compiled(input);  // cache hit
    // The tolerance of the tests for backends with kernels of their own (oneDNN's GEMMs differ from
    // ATen's in the last bits).
    if (!torch::allclose(first, want, 1e-4, 1e-5) || !torch::allclose(second, want, 1e-4, 1e-5))
      error = "compiled result differs from eager";
  }
};

Case& m1() {
  static Case c = [] {
    torch::manual_seed(0);
    torch::NoGradGuard no_grad;
    Mlp net;
    net->eval();
    auto fast = std::make_shared<decltype(torch::compile(net, "eager"))>(torch::compile(net, "eager"));
    Case k{[net](const torch::Tensor& x) mutable { return net(x); },
           [fast](const torch::Tensor& x) { return (*fast)(x); }, torch::randn({64, 784}), {}};
    k.check();
    return k;
  }();
  return c;
}

Case& m8() {
  static Case c = [] {
    torch::manual_seed(0);
    auto fast = std::make_shared<decltype(torch::compile(chain50, "eager"))>(torch::compile(chain50, "eager"));
    Case k{[](const torch::Tensor& x) { return chain50(x); }, [fast](const torch::Tensor& x) { return (*fast)(x); },
           torch::randn({8, 8}), {}};
    k.check();
    return k;
  }();
  return c;
}

// The first call of a fresh compiled object (backend "eager"): the trace, which runs the forward
// for real while it records (on observed tensors: host reads of their data are graph breaks),
// plus the compile of the captured graph, against the forward run eagerly. What tracing costs.
Case& m8_first_call() {
  static Case c = [] {
    torch::manual_seed(0);
    Case k{[](const torch::Tensor& x) { return chain50(x); },
           [](const torch::Tensor& x) {
             auto fast = torch::compile(chain50, "eager");
             return fast(x);
           },
           torch::randn({8, 8}), {}};
    k.check();
    return k;
  }();
  return c;
}

Case& m1_first_call() {
  static Case c = [] {
    torch::manual_seed(0);
    Mlp net;
    net->eval();
    Case k{[net](const torch::Tensor& x) mutable { return net(x); },
           [net](const torch::Tensor& x) {
             auto fast = torch::compile(net, "eager");
             return fast(x);
           },
           torch::randn({64, 784}), {}};
    k.check();
    return k;
  }();
  return c;
}

// A new size of a dynamic entry whose graph has size symbols (`dynamic = true`, backend
// `default`: its built-ins build programs and primitives per concrete size inside one compiled
// function). In the case below, "eager" is the warm call: the entry called at 32 sizes it has
// seen (batch 48..79), and "compiled" the call at a new size: 100 sizes in turn (batch 14..113,
// the same mean), more than the 64 the entry keeps, so every call builds for its size. The ratio
// is new size / warm call.
template <typename M>
Case make_new_size_case(M net, std::function<torch::Tensor(int64_t)> make_input) {
  using C = decltype(torch::compile(net, torchcompile::CompileOptions()));
  auto warm = std::make_shared<C>(torch::compile(net, torchcompile::CompileOptions("default").with_dynamic(true)));
  auto fresh = std::make_shared<C>(torch::compile(net, torchcompile::CompileOptions("default").with_dynamic(true)));
  auto warm_inputs = std::make_shared<std::vector<torch::Tensor>>();
  auto fresh_inputs = std::make_shared<std::vector<torch::Tensor>>();
  for (int64_t b = 48; b < 80; ++b) warm_inputs->push_back(make_input(b));
  for (int64_t b = 14; b < 114; ++b) fresh_inputs->push_back(make_input(b));
  {
    torch::NoGradGuard no_grad;
    for (const auto& x : *warm_inputs) (*warm)(x);
    (*fresh)((*fresh_inputs)[0]);
  }
  auto warm_next = std::make_shared<size_t>(0), fresh_next = std::make_shared<size_t>(0);
  Case k{[warm, warm_inputs, warm_next](const torch::Tensor&) {
           return (*warm)((*warm_inputs)[(*warm_next)++ % warm_inputs->size()]);
         },
         [fresh, fresh_inputs, fresh_next](const torch::Tensor&) {
           return (*fresh)((*fresh_inputs)[(*fresh_next)++ % fresh_inputs->size()]);
         },
         make_input(64), {}};
  return k;
}

Case& m1_new_size() {
  static Case c = [] {
    torch::manual_seed(0);
    Mlp net;
    net->eval();
    return make_new_size_case(net, [](int64_t b) { return torch::randn({b, 784}); });
  }();
  return c;
}

Case& m3_new_size() {
  static Case c = [] {
    torch::manual_seed(0);
    torchcompile_examples::ConvNet net;
    net->eval();
    return make_new_size_case(net, [](int64_t b) { return torch::randn({b, 3, 16, 16}); });
  }();
  return c;
}

// Serving an EmbeddingBag text classifier (tc_test::BagClassifier calling `torch::embedding_bag`,
// so that nothing is read on the host) over 200 requests of random batch sizes, automatic dynamic:
// one call of the case serves all 200 (their outputs concatenated). "Warm": the same compiled
// object serves them again; "fresh": a new torch::compile per pass (every trace and compile in).
Case make_bag_case(const std::string& backend, bool fresh) {
  torch::manual_seed(0);
  tc_test::BagClassifier model(/*aten_op=*/true);
  model->eval();
  auto requests = std::make_shared<std::vector<std::pair<torch::Tensor, torch::Tensor>>>(tc_test::bag_requests(200, 5));
  auto eager = [model, requests](const torch::Tensor&) mutable {
    std::vector<torch::Tensor> out;
    for (const auto& [text, offsets] : *requests) out.push_back(model->forward(text, offsets));
    return torch::cat(out);
  };
  using Fast = decltype(torch::compile(model.ptr(), backend));
  auto fast = std::make_shared<Fast>(torch::compile(model.ptr(), backend));
  auto compiled = [model, fast, requests, backend, fresh](const torch::Tensor&) {
    if (fresh) *fast = torch::compile(model.ptr(), backend);
    std::vector<torch::Tensor> out;
    for (const auto& [text, offsets] : *requests) out.push_back((*fast)(text, offsets));
    return torch::cat(out);
  };
  Case k{eager, compiled, torch::Tensor(), {}};
  k.check();
  return k;
}
Case& bag_default_warm() {
  static Case c = make_bag_case("default", false);
  return c;
}
Case& bag_eager_warm() {
  static Case c = make_bag_case("eager", false);
  return c;
}
Case& bag_default_fresh() {
  static Case c = make_bag_case("default", true);
  return c;
}

// GPT-style generation of 24 tokens one at a time from a 5-token prompt (the sequence grows by
// one per call; the forward reads its length): `default` with automatic dynamic. "Warm": the
// same compiled object generates again (every length seen); "fresh": a new torch::compile per
// generation, so the time includes every trace and compile (the static first length, the
// dynamic entry, the graph with size expressions, and a trace of shapes per new length).
// `TinyGpt` has 2 layers of 64 features (host code and dispatch dominate its step); the "char"
// cases use nanoGPT's shakespeare-char configuration (6 layers, 6 heads, 384 features, block 256,
// vocabulary 65), whose step is GEMM work.
struct GptConfig {
  int64_t vocab = 96, block = 64, layers = 2, heads = 4, features = 64;
};
constexpr GptConfig kNanoGptChar{65, 256, 6, 6, 384};

// `dynamic`: unset is automatic dynamic, true marks every dimension dynamic from the first call;
// a size host code reads (the GPT's length) stays static until it changes under both, so both
// compile the first length's graph static and the second's with size expressions.
Case make_gpt_case(bool fresh, GptConfig cfg = {}, std::optional<bool> dynamic = std::nullopt) {
  torch::manual_seed(0);
  tc_test::TinyGpt gpt(cfg.vocab, cfg.block, cfg.layers, cfg.heads, cfg.features);
  gpt->eval();
  auto eager = [gpt](const torch::Tensor& prompt) mutable {
    return tc_test::generate([&](const torch::Tensor& idx) { return gpt->forward(idx); }, prompt, 24);
  };
  torchcompile::CompileOptions options("default");
  options.dynamic = dynamic;
  using Fast = decltype(torch::compile(gpt.ptr(), options));
  auto fast = std::make_shared<Fast>(torch::compile(gpt.ptr(), options));
  auto compiled = [gpt, fast, fresh, options](const torch::Tensor& prompt) {
    if (fresh) *fast = torch::compile(gpt.ptr(), options);
    return tc_test::generate([&](const torch::Tensor& idx) { return (*fast)(idx); }, prompt, 24);
  };
  Case k{eager, compiled, torch::randint(0, cfg.vocab, {1, 5}), {}};
  k.check();
  return k;
}
Case& gpt_warm() {
  static Case c = make_gpt_case(false);
  return c;
}
Case& gpt_fresh() {
  static Case c = make_gpt_case(true);
  return c;
}
Case& gpt_char_warm() {
  static Case c = make_gpt_case(false, kNanoGptChar);
  return c;
}
Case& gpt_char_fresh() {
  static Case c = make_gpt_case(true, kNanoGptChar);
  return c;
}
Case& gpt_char_fresh_dynamic() {
  static Case c = make_gpt_case(true, kNanoGptChar, true);
  return c;
}

// M8 and OneOp compiled while TORCHCOMPILE_REPRO_AFTER=backend, TORCHCOMPILE_REPRO_LEVEL=<level>
// (read when a graph compiles). Level 1 only acts on a compile error: the call path is the one
// without the setting. Levels 2-4 watch every call (2: a copy of the inputs; 4: also the
// interpreter in float32 and float64 for the comparison).
template <typename F>
Case make_repro_case(F fn, const char* level, torch::Tensor input) {
  setenv("TORCHCOMPILE_REPRO_AFTER", "backend", 1);
  setenv("TORCHCOMPILE_REPRO_LEVEL", level, 1);
  auto fast = std::make_shared<decltype(torch::compile(fn, "eager"))>(torch::compile(fn, "eager"));
  Case k{[fn](const torch::Tensor& x) { return fn(x); }, [fast](const torch::Tensor& x) { return (*fast)(x); },
         std::move(input), {}};
  k.check();  // traces and compiles with the setting
  unsetenv("TORCHCOMPILE_REPRO_AFTER");
  unsetenv("TORCHCOMPILE_REPRO_LEVEL");
  return k;
}
Case& m8_repro1() {
  static Case c = make_repro_case(chain50, "1", (torch::manual_seed(0), torch::randn({8, 8})));
  return c;
}
Case& m8_repro2() {
  static Case c = make_repro_case(chain50, "2", (torch::manual_seed(0), torch::randn({8, 8})));
  return c;
}
Case& m8_repro4() {
  static Case c = make_repro_case(chain50, "4", (torch::manual_seed(0), torch::randn({8, 8})));
  return c;
}
Case& oneop_repro1() {
  static Case c = make_repro_case(one_op, "1", (torch::manual_seed(0), torch::randn({8, 8})));
  return c;
}

Case& oneop() {
  static Case c = [] {
    torch::manual_seed(0);
    auto fast = std::make_shared<decltype(torch::compile(one_op, "eager"))>(torch::compile(one_op, "eager"));
    Case k{[](const torch::Tensor& x) { return one_op(x); }, [fast](const torch::Tensor& x) { return (*fast)(x); },
           torch::randn({8, 8}), {}};
    k.check();
    return k;
  }();
  return c;
}

// A module whose forward does nothing: the whole cost of a compiled call (guards, cache hit,
// an empty graph) against calling its forward directly.
struct NoOpImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x; }
};
TORCH_MODULE(NoOp);

Case& noop() {
  static Case c = [] {
    NoOp m;
    auto fast = std::make_shared<decltype(torch::compile(m, "eager"))>(torch::compile(m, "eager"));
    Case k{[m](const torch::Tensor& x) mutable { return m->forward(x); }, [fast](const torch::Tensor& x) { return (*fast)(x); },
           torch::randn({8, 8}), {}};
    k.check();
    return k;
  }();
  return c;
}

// M7: seed 000's toy_example with its data-dependent branch (a graph break). `b` is fixed, so
// every call takes an already traced branch: the cost of a break on the hit path. (With a new
// float every call the branch value is never known and the forward re-runs; see docs/limitations.md, "Graph breaks".)
torch::Tensor toy_example(torch::Tensor a, torch::Tensor b) {
  auto x = a / (torch::abs(a) + 1);
  if (b.sum().item<float>() < 0) b = b * -1;
  return x * b;
}

Case& m7() {
  static Case c = [] {
    torch::manual_seed(0);
    auto b = torch::randn({10});
    auto fast = std::make_shared<decltype(torch::compile(toy_example, "eager"))>(torch::compile(toy_example, "eager"));
    Case k{[b](const torch::Tensor& x) { return toy_example(x, b); }, [fast, b](const torch::Tensor& x) { return (*fast)(x, b); },
           torch::randn({10}), {}};
    k.check();
    return k;
  }();
  return c;
}

// A graph break after a training-mode BatchNorm and dropout: a call of an entry with breaks
// saves what its segments change (the running statistics, the random generator) before they
// run, so that a new branch value can undo them and run the forward again. The input is fixed,
// so every call takes the traced branch: this is the saving's cost on the hit path.
struct BreakStateImpl : torch::nn::Module {
  BreakStateImpl()
      : bn(register_module("bn", torch::nn::BatchNorm1d(16))), drop(register_module("drop", torch::nn::Dropout(0.1))) {}
  torch::Tensor forward(torch::Tensor x) {
    auto h = drop(bn(x));
    if ((h.mean() > -10).item<bool>()) return h.relu();
    return h;
  }
  torch::nn::BatchNorm1d bn;
  torch::nn::Dropout drop;
};
TORCH_MODULE(BreakState);

Case& break_state() {
  static Case c = [] {
    torch::manual_seed(0);
    BreakState eager_net, compiled_net;
    auto fast = std::make_shared<decltype(torch::compile(compiled_net, "eager"))>(torch::compile(compiled_net, "eager"));
    Case k{[eager_net](const torch::Tensor& x) mutable { return eager_net(x); },
           [fast](const torch::Tensor& x) { return (*fast)(x); }, torch::randn({32, 16}), {}};
    // (Dropout draws differ between the two calls of check(): compare shapes only.)
    torch::Tensor first = k.compiled(k.input), second = k.compiled(k.input);
    if (first.sizes() != k.eager(k.input).sizes() || second.sizes() != first.sizes()) k.error = "shape mismatch";
    return k;
  }();
  return c;
}

// Hooks (issue 4): a tiny three-layer MLP whose layers are called through torchcompile::call,
// so their hooks fire. Every case compares against the same MLP run eagerly without hooks:
//   Hooks0          compiled, no hooks
//   Hooks100Tr      compiled, 100 traceable forward (pre-)hooks spread over the layers and the
//                   root: inlined at trace time, so the compiled call should cost the same
//   Hooks1NonTr     compiled, one forward hook with a side effect on the middle layer: it
//                   becomes an opaque call_module node running the hook and its own graph
// (8, 8) inputs keep the GEMMs small, so what is measured is the machinery.
struct TinyMlpImpl : torch::nn::Module {
  TinyMlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 8))),
        fc2(register_module("fc2", torch::nn::Linear(8, 8))),
        fc3(register_module("fc3", torch::nn::Linear(8, 8))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torchcompile::call(fc1, x));
    x = torch::relu(torchcompile::call(fc2, x));
    return torchcompile::call(fc3, x);
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(TinyMlp);

enum class HookSetup { None, Traceable100, NonTraceable1 };

Case make_hooks_case(HookSetup setup) {
  torch::manual_seed(0);
  TinyMlp plain, hooked;
  {
    torch::NoGradGuard no_grad;
    auto src = plain->parameters(), dst = hooked->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  static std::atomic<int64_t> side_effect{0};
  if (setup == HookSetup::Traceable100) {
    std::vector<std::shared_ptr<torch::nn::Module>> targets{hooked.ptr(), hooked->fc1.ptr(), hooked->fc2.ptr(),
                                                            hooked->fc3.ptr()};
    for (int i = 0; i < 100; ++i) {
      auto& m = targets[static_cast<size_t>(i) % targets.size()];
      if (i % 2) {
        torchcompile::register_forward_hook(
            m, [](torch::nn::Module&, const torchcompile::Tensors&, const torchcompile::Tensors&) {},
            torchcompile::HookOptions().traceable());
      } else {
        torchcompile::register_forward_pre_hook(
            m, [](torch::nn::Module&, const torchcompile::Tensors&) {}, torchcompile::HookOptions().traceable());
      }
    }
  } else if (setup == HookSetup::NonTraceable1) {
    torchcompile::register_forward_hook(hooked->fc2, [](torch::nn::Module&, const torchcompile::Tensors&,
                                                        const torchcompile::Tensors&) { ++side_effect; });
  }
  auto fast = std::make_shared<decltype(torch::compile(hooked, "eager"))>(torch::compile(hooked, "eager"));
  Case k{[plain](const torch::Tensor& x) mutable { return plain->forward(x); },
         [fast](const torch::Tensor& x) { return (*fast)(x); }, torch::randn({8, 8}), {}};
  k.check();
  return k;
}

Case& hooks0() {
  static Case c = make_hooks_case(HookSetup::None);
  return c;
}
Case& hooks100() {
  static Case c = make_hooks_case(HookSetup::Traceable100);
  return c;
}
Case& hooks1() {
  static Case c = make_hooks_case(HookSetup::NonTraceable1);
  return c;
}

// ---- measurement -----------------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  return v[mid];
}

template <typename F>
double time_call_s(F& f, const torch::Tensor& x) {
  const auto t0 = Clock::now();
  torch::Tensor y = f(x);
  benchmark::DoNotOptimize(y);
  const auto t1 = Clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

// The last measurement of each model, for the summary printed after the run.
struct Summary {
  double eager_us = 0, compiled_us = 0;
  int64_t iterations = 0;
};
std::map<std::string, Summary>& summaries() {
  static std::map<std::string, Summary> s;
  return s;
}

constexpr int kWarmup = 10;

void run_eager(benchmark::State& state, Case& (*get)()) {
  torch::NoGradGuard no_grad;
  Case& c = get();
  for (int i = 0; i < kWarmup; ++i) benchmark::DoNotOptimize(c.eager(c.input));
  std::vector<double> times;
  times.reserve(static_cast<size_t>(state.max_iterations));
  for (auto _ : state) {
    const double t = time_call_s(c.eager, c.input);
    state.SetIterationTime(t);
    times.push_back(t);
  }
  state.counters["median_us"] = median(times) * 1e6;
}

void run_compiled(benchmark::State& state, Case& (*get)(), const char* model) {
  torch::NoGradGuard no_grad;
  Case& c = get();
  if (!c.error.empty()) {
    state.SkipWithError(c.error.c_str());
    for (auto _ : state) {
    }
    return;
  }
  for (int i = 0; i < kWarmup; ++i) {
    benchmark::DoNotOptimize(c.eager(c.input));
    benchmark::DoNotOptimize(c.compiled(c.input));
  }
  std::vector<double> eager_times, compiled_times;
  eager_times.reserve(static_cast<size_t>(state.max_iterations));
  compiled_times.reserve(static_cast<size_t>(state.max_iterations));
  bool eager_first = true;
  for (auto _ : state) {
    double te, tc;
    if (eager_first) {
      te = time_call_s(c.eager, c.input);
      tc = time_call_s(c.compiled, c.input);
    } else {
      tc = time_call_s(c.compiled, c.input);
      te = time_call_s(c.eager, c.input);
    }
    eager_first = !eager_first;
    state.SetIterationTime(tc);
    eager_times.push_back(te);
    compiled_times.push_back(tc);
  }
  const double eager_us = median(eager_times) * 1e6;
  const double compiled_us = median(compiled_times) * 1e6;
  state.counters["eager_us"] = eager_us;
  state.counters["compiled_us"] = compiled_us;
  state.counters["ratio_vs_eager"] = eager_us > 0 ? compiled_us / eager_us : 0;
  state.counters["overhead_us_per_call"] = compiled_us - eager_us;
  summaries()[model] = Summary{eager_us, compiled_us, static_cast<int64_t>(state.iterations())};
}

void BM_M8_Chain50_Eager(benchmark::State& s) { run_eager(s, m8); }
void BM_M8_Chain50_Compiled(benchmark::State& s) { run_compiled(s, m8, "M8 chain50 (8,8)"); }
void BM_M1_MLP_Eager(benchmark::State& s) { run_eager(s, m1); }
void BM_M1_MLP_Compiled(benchmark::State& s) { run_compiled(s, m1, "M1 MLP (64,784)"); }
void BM_OneOp_Eager(benchmark::State& s) { run_eager(s, oneop); }
void BM_OneOp_Compiled(benchmark::State& s) { run_compiled(s, oneop, "OneOp x+1 (8,8)"); }

BENCHMARK(BM_M8_Chain50_Eager)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M8_Chain50_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M1_MLP_Eager)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M1_MLP_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
void BM_M8_Chain50_FirstCall_Compiled(benchmark::State& s) { run_compiled(s, m8_first_call, "M8 first call"); }
void BM_M1_MLP_FirstCall_Compiled(benchmark::State& s) { run_compiled(s, m1_first_call, "M1 first call"); }
BENCHMARK(BM_M8_Chain50_FirstCall_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M1_MLP_FirstCall_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
// "eager_us" is the warm call of the dynamic entry here, "ratio_vs_eager" new size / warm.
void BM_M1_MLP_NewSizeVsWarm_Compiled(benchmark::State& s) { run_compiled(s, m1_new_size, "M1 new size vs warm"); }
void BM_M3_Conv_NewSizeVsWarm_Compiled(benchmark::State& s) { run_compiled(s, m3_new_size, "M3 new size vs warm"); }
BENCHMARK(BM_M1_MLP_NewSizeVsWarm_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M3_Conv_NewSizeVsWarm_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
void BM_EmbeddingBag_Serve200_Default_Warm_Compiled(benchmark::State& s) {
  run_compiled(s, bag_default_warm, "EmbeddingBag 200 requests, default, warm");
}
void BM_EmbeddingBag_Serve200_EagerBackend_Warm_Compiled(benchmark::State& s) {
  run_compiled(s, bag_eager_warm, "EmbeddingBag 200 requests, eager backend, warm");
}
void BM_EmbeddingBag_Serve200_Default_Fresh_Compiled(benchmark::State& s) {
  run_compiled(s, bag_default_fresh, "EmbeddingBag 200 requests, default, fresh");
}
BENCHMARK(BM_EmbeddingBag_Serve200_Default_Warm_Compiled)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EmbeddingBag_Serve200_EagerBackend_Warm_Compiled)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EmbeddingBag_Serve200_Default_Fresh_Compiled)->UseManualTime()->Unit(benchmark::kMillisecond);
void BM_Gpt_Generate24_Warm_Compiled(benchmark::State& s) { run_compiled(s, gpt_warm, "GPT generate 24, warm"); }
void BM_Gpt_Generate24_Fresh_Compiled(benchmark::State& s) { run_compiled(s, gpt_fresh, "GPT generate 24, fresh"); }
BENCHMARK(BM_Gpt_Generate24_Warm_Compiled)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt_Generate24_Fresh_Compiled)->UseManualTime()->Unit(benchmark::kMillisecond);
void BM_GptChar_Generate24_Warm_Compiled(benchmark::State& s) {
  run_compiled(s, gpt_char_warm, "GPT (nanoGPT char config) generate 24, warm");
}
void BM_GptChar_Generate24_Fresh_Compiled(benchmark::State& s) {
  run_compiled(s, gpt_char_fresh, "GPT (nanoGPT char config) generate 24, fresh");
}
BENCHMARK(BM_GptChar_Generate24_Warm_Compiled)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GptChar_Generate24_Fresh_Compiled)->UseManualTime()->Unit(benchmark::kMillisecond);
void BM_GptChar_Generate24_FreshDynamic_Compiled(benchmark::State& s) {
  run_compiled(s, gpt_char_fresh_dynamic, "GPT (nanoGPT char config) generate 24, fresh, dynamic = true");
}
BENCHMARK(BM_GptChar_Generate24_FreshDynamic_Compiled)->UseManualTime()->Unit(benchmark::kMillisecond);
void BM_NoOp_Eager(benchmark::State& s) { run_eager(s, noop); }
void BM_NoOp_Compiled(benchmark::State& s) { run_compiled(s, noop, "NoOp module (8,8)"); }
void BM_M7_Toy_Eager(benchmark::State& s) { run_eager(s, m7); }
void BM_M7_Toy_Compiled(benchmark::State& s) { run_compiled(s, m7, "M7 toy_example (10,)"); }
BENCHMARK(BM_NoOp_Eager)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NoOp_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M7_Toy_Eager)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M7_Toy_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
void BM_BreakState_Eager(benchmark::State& s) { run_eager(s, break_state); }
void BM_BreakState_Compiled(benchmark::State& s) { run_compiled(s, break_state, "Break after BN+dropout"); }
BENCHMARK(BM_BreakState_Eager)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BreakState_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_OneOp_Eager)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_OneOp_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
// TORCHCOMPILE_REPRO_*: level 1 against the unset runs above; 2 and 4 are what watching costs.
void BM_M8_Chain50_ReproLevel1_Compiled(benchmark::State& s) { run_compiled(s, m8_repro1, "M8 repro level 1"); }
void BM_M8_Chain50_ReproLevel2_Compiled(benchmark::State& s) { run_compiled(s, m8_repro2, "M8 repro level 2"); }
void BM_M8_Chain50_ReproLevel4_Compiled(benchmark::State& s) { run_compiled(s, m8_repro4, "M8 repro level 4"); }
void BM_OneOp_ReproLevel1_Compiled(benchmark::State& s) { run_compiled(s, oneop_repro1, "OneOp repro level 1"); }
BENCHMARK(BM_M8_Chain50_ReproLevel1_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M8_Chain50_ReproLevel2_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_M8_Chain50_ReproLevel4_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_OneOp_ReproLevel1_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
void BM_Hooks_Eager(benchmark::State& s) { run_eager(s, hooks0); }
void BM_Hooks0_Compiled(benchmark::State& s) { run_compiled(s, hooks0, "Hooks 0 (tiny MLP)"); }
void BM_Hooks100Traceable_Compiled(benchmark::State& s) { run_compiled(s, hooks100, "Hooks 100 traceable"); }
void BM_Hooks1NonTraceable_Compiled(benchmark::State& s) { run_compiled(s, hooks1, "Hooks 1 non-traceable"); }
BENCHMARK(BM_Hooks_Eager)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Hooks0_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Hooks100Traceable_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Hooks1NonTraceable_Compiled)->UseManualTime()->Unit(benchmark::kMicrosecond);


}  // namespace

int main(int argc, char** argv) {
  tc_bench::set_up_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  if (!summaries().empty()) {
    std::printf("\nSummary (medians of interleaved calls in the same run; backend \"eager\" = graph replay)\n");
    std::printf("%-20s %12s %14s %10s %22s %10s\n", "model", "eager_us", "compiled_us", "ratio", "overhead_us_per_call",
                "calls");
    for (const auto& [model, s] : summaries())
      std::printf("%-20s %12.3f %14.3f %10.3f %22.3f %10lld\n", model.c_str(), s.eager_us, s.compiled_us,
                  s.eager_us > 0 ? s.compiled_us / s.eager_us : 0.0, s.compiled_us - s.eager_us,
                  static_cast<long long>(s.iterations));
  }
  return 0;
}
