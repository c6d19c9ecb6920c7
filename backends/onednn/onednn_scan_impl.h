// The onednn backend's own loops (the NaN / infinity scan, a transposed convolution's gather, an
// EmbeddingBag's sums), compiled once per ISA: onednn_scan_avx512.cpp, onednn_scan_avx2.cpp and
// onednn_scan_sse2.cpp each define TC_ONEDNN_SCAN_KERNELS (the name of
// the function returning the ISA's table) and TC_ONEDNN_SCAN_NAME, and include this file with
// their ISA's compiler flags (CMakeLists.txt). The loops have internal linkage, so the linker
// never merges the three copies; they call no inline function of a library header.
#pragma once

#if !defined(TC_ONEDNN_SCAN_KERNELS) || !defined(TC_ONEDNN_SCAN_NAME)
#error "define TC_ONEDNN_SCAN_KERNELS and TC_ONEDNN_SCAN_NAME before including onednn_scan_impl.h"
#endif

#include "onednn_scan.h"

namespace torchcompile::backends::onednn::detail {
namespace {

// One pass of integer compares over the floats' bits, without an early exit, so that the compiler
// vectorizes it (~0.1 ms for 2 M floats with AVX-512).
bool magnitude_above(const void* p, size_t n, int32_t limit) {
  typedef int32_t __attribute__((may_alias)) word;  // float data read as integers
  const word* bits = static_cast<const word*>(p);
  int32_t found = 0;
  for (size_t i = 0; i < n; ++i) found |= (bits[i] & 0x7fffffff) > limit;
  return found != 0;
}

inline void add_to(float* __restrict acc, const float* __restrict src, int64_t len) {
  for (int64_t q = 0; q < len; ++q) acc[q] += src[q];
}

// Row by row: the row's accumulator (OW x OC floats, channels last: the output itself when it is
// channels-last, else `scratch`) starts as the bias; each row tap (ky, iy) adds, for each input
// column ix, that pixel's KW x OC block of contributions to output columns ox = ix * sx - px +
// kx * dx (one run of floats when dx is 1: kx then channel, as the columns hold them), clipped to
// the row; then the relu, and an NCHW output is written from the accumulator.
void col2im(const float* cols, const float* bias, float* out, float* scratch, const Col2im& s, int64_t r0,
            int64_t r1) {
  const int64_t OC = s.OC, KW = s.KW, OW = s.OW, taps_oc = s.KH * KW * OC;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / s.OH, oy = r % s.OH;
    float* __restrict acc = s.nchw ? scratch : out + r * OW * OC;
    for (int64_t ox = 0; ox < OW; ++ox)
      for (int64_t q = 0; q < OC; ++q) acc[ox * OC + q] = bias[q];
    for (int32_t j = s.row_begin[oy]; j < s.row_begin[oy + 1]; ++j) {
      const int64_t ky = s.row_taps[2 * j], iy = s.row_taps[2 * j + 1];
      const float* src_row = cols + (n * s.IH + iy) * s.IW * taps_oc + ky * KW * OC;
      for (int64_t ix = 0; ix < s.IW; ++ix) {
        const float* src = src_row + ix * taps_oc;
        const int64_t ox0 = ix * s.SW - s.PW;
        if (s.DW == 1) {
          const int64_t lo = ox0 < 0 ? -ox0 : 0, hi = OW - ox0 < KW ? OW - ox0 : KW;
          if (lo < hi) add_to(acc + (ox0 + lo) * OC, src + lo * OC, (hi - lo) * OC);
        } else {
          for (int64_t kx = 0; kx < KW; ++kx) {
            const int64_t ox = ox0 + kx * s.DW;
            if (ox >= 0 && ox < OW) add_to(acc + ox * OC, src + kx * OC, OC);
          }
        }
      }
    }
    if (s.relu)
      for (int64_t i = 0; i < OW * OC; ++i) acc[i] = acc[i] < 0.f ? 0.f : acc[i];
    if (s.nchw) {
      for (int64_t q = 0; q < OC; ++q) {
        float* __restrict dst = out + ((n * OC + q) * s.OH + oy) * OW;
        for (int64_t ox = 0; ox < OW; ++ox) dst[ox] = acc[ox * OC + q];
      }
    }
  }
}

int64_t bag_reduce(const BagReduce& s, float* out, int64_t b0, int64_t b1) {
  const int64_t D = s.dim;
  for (int64_t b = b0; b < b1; ++b) {
    float* __restrict acc = out + b * D;
    for (int64_t q = 0; q < D; ++q) acc[q] = 0.f;
    const int64_t begin = s.offsets[b], end = b + 1 < s.bags ? s.offsets[b + 1] : s.last_end;
    int64_t summed = 0;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row = s.indices[t];
      if (static_cast<uint64_t>(row) >= static_cast<uint64_t>(s.rows)) return t;
      if (row == s.padding_idx) continue;
      add_to(acc, s.weight + row * s.row_stride, D);
      ++summed;
    }
    if (s.mean) {
      const float count = static_cast<float>(summed > 0 ? summed : 1);
      for (int64_t q = 0; q < D; ++q) acc[q] /= count;
    }
  }
  return -1;
}

}  // namespace

const ScanKernels& TC_ONEDNN_SCAN_KERNELS() {
  static constexpr ScanKernels kernels{TC_ONEDNN_SCAN_NAME, &magnitude_above, &col2im, &bag_reduce};
  return kernels;
}

}  // namespace torchcompile::backends::onednn::detail
