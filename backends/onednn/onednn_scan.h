// Private to the onednn backend: its own loops, compiled once per ISA like the fused backend's
// kernels: the NaN / infinity scan that AtenFallback's checks and the weight packing run, the
// gather of a transposed convolution computed as a GEMM (TConvStep), and an EmbeddingBag's sums
// (EmbeddingBagStep). The files
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

/// A transposed convolution's gather (TConvStep). `cols` holds, for each input pixel (n, iy, ix)
/// in that order, its contribution to each of the KH x KW output pixels it reaches, OC floats per
/// kernel tap (ky, kx): the (N*IH*IW, IC) channels-last source times the (IC, KH*KW*OC) weights.
/// Output pixel (n, oy, ox) is the bias plus the contributions that reach it: from the pairs
/// (ky, iy) of output row oy, row_taps[2 * j] and row_taps[2 * j + 1] for j from row_begin[oy] to
/// row_begin[oy + 1] (in that order), and the columns ix, kx with ix * SW - PW + kx * DW == ox.
struct Col2im {
  int64_t IH = 0, IW = 0, OC = 0, KH = 0, KW = 0, OH = 0, OW = 0;
  int64_t SW = 1, PW = 0, DW = 1;  // the columns' stride, padding and dilation
  const int32_t *row_taps = nullptr, *row_begin = nullptr;
  bool relu = false;  // then max(x, 0), a NaN kept as ATen's relu keeps it
  bool nchw = false;  // the output in NCHW layout (through `scratch`); else channels-last (NHWC)
};

/// An EmbeddingBag of mode sum or mean (EmbeddingBagStep): bag b is the rows `indices[t]` of the
/// (rows x dim) `weight` for t in [offsets[b], end), end being offsets[b + 1], or for the last
/// bag `last_end`; rows equal to `padding_idx` (when it is >= 0) are skipped. The sum runs in
/// index order from zero, as ATen's; a mean divides by the rows summed (1 if none).
struct BagReduce {
  const float* weight = nullptr;
  int64_t rows = 0, dim = 0, row_stride = 0;
  const int64_t* indices = nullptr;
  const int64_t* offsets = nullptr;
  int64_t bags = 0, last_end = 0;
  int64_t padding_idx = -1;
  bool mean = false;
};

/// The loops compiled for one ISA.
struct ScanKernels {
  const char* name;  // "avx512", "avx2" or "scalar (sse2)" (the fused backend's names)
  /// Whether one of the `n` floats at `p` has a magnitude whose bits exceed `limit`.
  bool (*magnitude_above)(const void* p, size_t n, int32_t limit);
  /// Output rows [r0, r1) (row r = n * OH + oy) of the transposed convolution `s` into `out`;
  /// `scratch` holds OW x OC floats (used for an NCHW output).
  void (*col2im)(const float* cols, const float* bias, float* out, float* scratch, const Col2im& s, int64_t r0,
                 int64_t r1);
  /// Bags [b0, b1) of `s` into rows [b0, b1) of the contiguous (bags x dim) `out`. Returns -1,
  /// or the position in `indices` of an index outside [0, rows) (that bag is left unfinished).
  int64_t (*bag_reduce)(const BagReduce& s, float* out, int64_t b0, int64_t b1);
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
