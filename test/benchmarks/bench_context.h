// Shared set-up of the benchmark programs: 2 intra-op threads, and the settings that change
// eager timings (thread count, glibc malloc thresholds) recorded in the benchmark context.
#pragma once

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

namespace tc_bench {

inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

inline void set_up_context() {
  torch::set_num_threads(2);
  benchmark::AddCustomContext("torch_num_threads", std::to_string(torch::get_num_threads()));
  benchmark::AddCustomContext("MALLOC_MMAP_THRESHOLD_", env_or("MALLOC_MMAP_THRESHOLD_", "(glibc default)"));
  benchmark::AddCustomContext("MALLOC_TRIM_THRESHOLD_", env_or("MALLOC_TRIM_THRESHOLD_", "(glibc default)"));
}

}  // namespace tc_bench
