// The onednn backend's NaN / infinity scan, compiled once per ISA: onednn_scan_avx512.cpp,
// onednn_scan_avx2.cpp and onednn_scan_sse2.cpp each define TC_ONEDNN_SCAN_KERNELS (the name of
// the function returning the ISA's table) and TC_ONEDNN_SCAN_NAME, and include this file with
// their ISA's compiler flags (CMakeLists.txt). The loop has internal linkage, so the linker
// never merges the three copies.
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

}  // namespace

const ScanKernels& TC_ONEDNN_SCAN_KERNELS() {
  static constexpr ScanKernels kernels{TC_ONEDNN_SCAN_NAME, &magnitude_above};
  return kernels;
}

}  // namespace torchcompile::backends::onednn::detail
