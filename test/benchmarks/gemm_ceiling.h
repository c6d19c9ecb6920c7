// The GEMM ceiling of this machine, measured in every bench_models run: GFLOP/s of OpenBLAS
// (at::mm_out, what eager LibTorch calls), of oneDNN's matmul with prepacked weights (what the
// onednn backend and `default` run) and of `default` itself (a compiled Linear, all overhead in)
// on the GEMM shapes of M1, M4 and M5, beside the CPU's multiply-add peak (a loop of independent
// fused multiply-adds on registers, on LibTorch's intra-op thread count).
#pragma once

#include <functional>
#include <string>

namespace bench_gemm {

/// Registers the Google Benchmark cases "GEMM/<model> <M>x<K>x<N>/<library>" and "FMA-peak".
void register_benchmarks();

/// The markdown table, from each case's median ms (NaN if it did not run).
std::string table(const std::function<double(const std::string& name)>& median_ms);

}  // namespace bench_gemm
