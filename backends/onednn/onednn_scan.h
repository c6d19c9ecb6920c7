// Private to the onednn backend: the NaN / infinity scan that AtenFallback's checks and the
// weight packing run, compiled once per ISA like the fused backend's kernels:
// onednn_scan_avx512.cpp, onednn_scan_avx2.cpp and onednn_scan_sse2.cpp include
// onednn_scan_impl.h with their ISA's compiler flags (CMakeLists.txt), and onednn_scan.cpp picks
// one from the CPU and TORCHCOMPILE_ISA. No LibTorch header here or in the per-ISA files (an
// inline LibTorch function compiled with AVX-512 flags could be the copy the linker keeps).
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchcompile::backends::onednn::detail {

/// Limits for ScanKernels::magnitude_above, on a float's bits without its sign: above
/// kNanAbove (the bits of infinity) is a NaN; above kNonFiniteAbove (FLT_MAX) a NaN or an infinity.
constexpr int32_t kNanAbove = 0x7f800000;
constexpr int32_t kNonFiniteAbove = 0x7f7fffff;

/// The scan compiled for one ISA.
struct ScanKernels {
  const char* name;  // "avx512", "avx2" or "scalar (sse2)" (the fused backend's names)
  /// Whether one of the `n` floats at `p` has a magnitude whose bits exceed `limit`.
  bool (*magnitude_above)(const void* p, size_t n, int32_t limit);
};

const ScanKernels& scan_kernels_avx512();
const ScanKernels& scan_kernels_avx2();
const ScanKernels& scan_kernels_sse2();

/// The scan of the best ISA this CPU runs (cpuid), unless TORCHCOMPILE_ISA (`avx512`, `avx2`,
/// `scalar` or `sse2`) asks for another; asking for one the CPU lacks, or an unknown name, is an
/// error (c10::Error), as in the fused backend. Read at each call: compile() calls it once per
/// graph, whose steps keep that scan.
const ScanKernels& selected_scan();

}  // namespace torchcompile::backends::onednn::detail
