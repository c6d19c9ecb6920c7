// Shared set-up of the benchmark programs: 2 intra-op threads, and the settings that change
// eager timings (thread count, glibc malloc thresholds, variables that select kernels) recorded
// in the benchmark context.
#pragma once

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace tc_bench {

inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

/// The environment variables set in this process that choose which kernels LibTorch, OpenBLAS,
/// oneDNN, OpenMP, glibc's malloc or torchcompile run ("NAME=value, ..."; "(none)" if none is
/// set). A run with OPENBLAS_CORETYPE=Haswell, say, times eager's GEMMs with AVX2 kernels while
/// oneDNN (in the compiled modes) still uses AVX-512: its ratios compare other kernels.
inline std::string kernel_settings() {
  static const char* const kPrefixes[] = {"OPENBLAS_", "GOTO", "BLIS_", "ONEDNN_", "DNNL_", "ATEN_CPU_CAPABILITY",
                                          "TORCHCOMPILE_ISA", "OMP_", "GOMP_", "KMP_", "MKL_", "GLIBC_TUNABLES"};
  std::string out;
  for (char** e = environ; e && *e; ++e) {
    for (const char* prefix : kPrefixes) {
      if (std::strncmp(*e, prefix, std::strlen(prefix)) != 0) continue;
      out += (out.empty() ? "" : ", ") + std::string(*e);
      break;
    }
  }
  return out.empty() ? "(none)" : out;
}

/// The least of a benchmark's repetitions: the "min" aggregate (`->ComputeStatistics("min", least)`;
/// Google Benchmark computes mean, median, stddev and cv), which bench_models reports by default.
inline double least(const std::vector<double>& v) {
  return v.empty() ? NAN : *std::min_element(v.begin(), v.end());
}

inline void set_up_context() {
  torch::set_num_threads(2);
  benchmark::AddCustomContext("torch_num_threads", std::to_string(torch::get_num_threads()));
  benchmark::AddCustomContext("MALLOC_MMAP_THRESHOLD_", env_or("MALLOC_MMAP_THRESHOLD_", "(glibc default)"));
  benchmark::AddCustomContext("MALLOC_TRIM_THRESHOLD_", env_or("MALLOC_TRIM_THRESHOLD_", "(glibc default)"));
  benchmark::AddCustomContext("kernel_settings", kernel_settings());
}

}  // namespace tc_bench
