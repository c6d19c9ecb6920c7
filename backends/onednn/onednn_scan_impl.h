// The onednn backend's own loops (the NaN / infinity scan, a transposed convolution's gather),
// compiled once per ISA: onednn_scan_avx512.cpp,
// onednn_scan_avx2.cpp and onednn_scan_sse2.cpp each define TC_ONEDNN_SCAN_KERNELS (the name of
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

// Adds the `len` floats at `src` to `acc` (a fixed `len` when it is kVec: vectorized).
constexpr int64_t kVec = 16;
inline void add_to(float* __restrict acc, const float* __restrict src, int64_t len) {
  for (int64_t q = 0; q < len; ++q) acc[q] += src[q];
}

// Channels [c0, c0 + len) of output pixel (n, oy, ox) into `acc`: the bias, then each tap's
// contribution, then the relu.
inline void gather_pixel(const float* cols, const float* bias, const Col2im& s, int64_t n, int64_t oy, int64_t ox,
                         int64_t c0, int64_t len, float* __restrict acc) {
  const int64_t taps_oc = s.KH * s.KW * s.OC;
  for (int64_t q = 0; q < len; ++q) acc[q] = bias[c0 + q];
  for (int32_t j = s.row_begin[oy]; j < s.row_begin[oy + 1]; ++j) {
    const int64_t ky = s.row_taps[2 * j], iy = s.row_taps[2 * j + 1];
    const float* row = cols + (n * s.IH + iy) * s.IW * taps_oc + ky * s.KW * s.OC + c0;
    for (int32_t i = s.col_begin[ox]; i < s.col_begin[ox + 1]; ++i) {
      const float* src = row + s.col_taps[2 * i + 1] * taps_oc + s.col_taps[2 * i] * s.OC;
      if (len == kVec) {
        add_to(acc, src, kVec);
      } else {
        add_to(acc, src, len);
      }
    }
  }
  if (s.relu)
    for (int64_t q = 0; q < len; ++q) acc[q] = acc[q] < 0.f ? 0.f : acc[q];
}

void col2im(const float* cols, const float* bias, float* out, const Col2im& s, int64_t r0, int64_t r1) {
  alignas(64) float acc[kVec];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / s.OH, oy = r % s.OH;
    for (int64_t ox = 0; ox < s.OW; ++ox) {
      for (int64_t c0 = 0; c0 < s.OC; c0 += kVec) {
        const int64_t len = s.OC - c0 < kVec ? s.OC - c0 : kVec;
        gather_pixel(cols, bias, s, n, oy, ox, c0, len, acc);
        if (s.nchw) {
          float* dst = out + ((n * s.OC + c0) * s.OH + oy) * s.OW + ox;
          for (int64_t q = 0; q < len; ++q) dst[q * s.OH * s.OW] = acc[q];
        } else {
          float* dst = out + (r * s.OW + ox) * s.OC + c0;
          for (int64_t q = 0; q < len; ++q) dst[q] = acc[q];
        }
      }
    }
  }
}

}  // namespace

const ScanKernels& TC_ONEDNN_SCAN_KERNELS() {
  static constexpr ScanKernels kernels{TC_ONEDNN_SCAN_NAME, &magnitude_above, &col2im};
  return kernels;
}

}  // namespace torchcompile::backends::onednn::detail
