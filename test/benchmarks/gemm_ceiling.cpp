// See gemm_ceiling.h.
#include "gemm_ceiling.h"

#include "bench_context.h"

#include <torchcompile/support/isa.h>
#include <torchcompile/torchcompile.h>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#ifdef TC_BENCH_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

namespace bench_gemm {

namespace {

struct Shape {
  const char* model;
  const char* what;
  int64_t M, K, N;
};

// (M, K) x (K, N): the Linears of M1 (batch 64), M4 (8 x 128 tokens, d 256, ff 1024) and M5
// (32 x 128 tokens, 512 -> 2048 -> 512).
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {"M1", "fc1", 64, 784, 512},         {"M1", "fc2", 64, 512, 512},
      {"M1", "fc3", 64, 512, 10},          {"M4", "in_proj", 1024, 256, 768},
      {"M4", "out_proj", 1024, 256, 256},  {"M4", "ff1", 1024, 256, 1024},
      {"M4", "ff2", 1024, 1024, 256},      {"M5", "fc1", 4096, 512, 2048},
      {"M5", "fc2", 4096, 2048, 512},
  };
  return s;
}

std::string name_of(const Shape& s, const char* lib) {
  return std::string("GEMM/") + s.model + " " + s.what + " " + std::to_string(s.M) + "x" + std::to_string(s.K) + "x" +
         std::to_string(s.N) + "/" + lib;
}

const char* const kPeak = "FMA-peak";
constexpr int64_t kPeakIters = 1 << 22;  // per thread
constexpr int kAcc = 12;                 // independent accumulators (hides the FMA latency)

// kAcc chains of fused multiply-adds on vectors of `V` (GCC vector extensions; the caller's ISA
// makes them zmm or ymm registers and the product-sum one FMA instruction), summed into `out`.
template <class V>
__attribute__((always_inline)) inline void fma_loop(float* out) {
  constexpr int lanes = sizeof(V) / sizeof(float);
  V acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = V{} + (1.0f + i * 1e-3f);
  const V a = V{} + 0.999999f, b = V{} + 1e-7f;
  for (int64_t it = 0; it < kPeakIters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = acc[i] * a + b;  // kept in registers
  }
  float s = 0;
  for (int i = 0; i < kAcc; ++i)
    for (int l = 0; l < lanes; ++l) s += acc[i][l];
  *out = s;
}

typedef float V16 __attribute__((vector_size(64)));
typedef float V8 __attribute__((vector_size(32)));
__attribute__((target("avx512f,fma"))) void fma_loop_avx512(float* out) { fma_loop<V16>(out); }
__attribute__((target("avx2,fma"))) void fma_loop_avx2(float* out) { fma_loop<V8>(out); }

// The widest FMA this CPU (and TORCHCOMPILE_ISA) has: its lanes, or 0 without one.
int peak_lanes() {
  switch (torchcompile::support::selected_isa()) {
    case torchcompile::support::Isa::Avx512: return 16;
    case torchcompile::support::Isa::Avx2: return 8;
    default: return 0;
  }
}

double time_s(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Times `f` once per iteration and reports the median as the `median_ms` counter (what
// bench_models' collector reads).
void timed(benchmark::State& state, const std::function<void()>& f) {
  std::vector<double> times;
  for (auto _ : state) {
    times.push_back(time_s(f));
    state.SetIterationTime(times.back());
  }
  if (times.empty()) return;
  std::sort(times.begin(), times.end());
  state.counters["median_ms"] = times[times.size() / 2] * 1e3;
}

void run_peak(benchmark::State& state) {
  const int lanes = peak_lanes();
  if (!lanes) {
    state.SkipWithError("no FMA on this CPU");
    return;
  }
  const int threads = at::get_num_threads();
  std::vector<float> sink(threads);
  timed(state, [&] {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { lanes == 16 ? fma_loop_avx512(&sink[t]) : fma_loop_avx2(&sink[t]); });
    for (auto& th : pool) th.join();
  });
  benchmark::DoNotOptimize(sink.data());
}

void run_openblas(benchmark::State& state, Shape s) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randn({s.M, s.K}), b = torch::randn({s.K, s.N}), c = torch::empty({s.M, s.N});
  timed(state, [&] { at::mm_out(c, a, b); });
}

void run_default(benchmark::State& state, Shape s) {
  torch::NoGradGuard no_grad;
  torch::nn::Linear lin(torch::nn::LinearOptions(s.K, s.N).bias(false));
  auto fast = torch::compile(lin.ptr(), "default");
  torch::Tensor a = torch::randn({s.M, s.K});
  fast(a);
  timed(state, [&] { fast(a); });
}

#ifdef TC_BENCH_HAVE_DNNL
void run_onednn(benchmark::State& state, Shape s) {
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  md a({s.M, s.K}, dt::f32, tag::ab), b({s.K, s.N}, dt::f32, tag::any), c({s.M, s.N}, dt::f32, tag::ab);
#if DNNL_VERSION_MAJOR >= 3
  dnnl::matmul::primitive_desc pd(engine, a, b, c);
#else
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
#endif
  dnnl::matmul prim(pd);
  torch::Tensor ta = torch::randn({s.M, s.K}), tc = torch::empty({s.M, s.N});
  dnnl::memory ma(a, engine, ta.data_ptr()), mb(pd.weights_desc(), engine), mc(c, engine, tc.data_ptr());
  std::fill_n(static_cast<float*>(mb.get_data_handle()), pd.weights_desc().get_size() / sizeof(float), 0.01f);
  timed(state, [&] {
    prim.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream.wait();
  });
  state.SetLabel(pd.impl_info_str());
}
#endif

std::string gflops(double flop, double ms) {
  if (std::isnan(ms) || ms <= 0) return "?";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", flop / (ms * 1e-3) / 1e9);
  return buf;
}

}  // namespace

void register_benchmarks() {
  benchmark::RegisterBenchmark(kPeak, run_peak)->UseManualTime()->Unit(benchmark::kMillisecond)->ComputeStatistics("min", tc_bench::least);
  for (const Shape& s : shapes()) {
    benchmark::RegisterBenchmark(name_of(s, "openblas").c_str(), run_openblas, s)->UseManualTime()->Unit(benchmark::kMillisecond)->ComputeStatistics("min", tc_bench::least);
#ifdef TC_BENCH_HAVE_DNNL
    benchmark::RegisterBenchmark(name_of(s, "onednn").c_str(), run_onednn, s)->UseManualTime()->Unit(benchmark::kMillisecond)->ComputeStatistics("min", tc_bench::least);
#endif
    benchmark::RegisterBenchmark(name_of(s, "default").c_str(), run_default, s)->UseManualTime()->Unit(benchmark::kMillisecond)->ComputeStatistics("min", tc_bench::least);
  }
}

std::string table(const std::function<double(const std::string&)>& median_ms) {
  std::ostringstream os;
  const int lanes = peak_lanes();
  const double peak_ms = median_ms(kPeak);
  const double peak_flop = 2.0 * lanes * kAcc * static_cast<double>(kPeakIters) * at::get_num_threads();
  os << "\n## GEMM ceiling: GFLOP/s per shape, same run\n\n"
     << "Multiply-add peak of this CPU (" << at::get_num_threads() << " threads, " << lanes * 32
     << "-bit FMA on registers, " << kAcc << " independent accumulators): " << gflops(peak_flop, peak_ms)
     << " GFLOP/s. OpenBLAS: `at::mm_out` (eager LibTorch's GEMM); oneDNN: its matmul with prepacked weights; "
        "`default`: a compiled `Linear` without bias, everything a call costs included.\n\n"
     << "| model | GEMM | M x K x N | OpenBLAS | oneDNN | `default` |\n|---|---|---|---:|---:|---:|\n";
  for (const Shape& s : shapes()) {
    const double flop = 2.0 * s.M * s.K * s.N;
    os << "| " << s.model << " | " << s.what << " | " << s.M << " x " << s.K << " x " << s.N << " | "
       << gflops(flop, median_ms(name_of(s, "openblas"))) << " | " << gflops(flop, median_ms(name_of(s, "onednn")))
       << " | " << gflops(flop, median_ms(name_of(s, "default"))) << " |\n";
  }
  return os.str();
}

}  // namespace bench_gemm
