// The functions of backends/fused/vecmath.h as array loops, one copy per ISA, for test_vecmath.cpp.
//
// Included without TC_VEC_BYTES (by test_vecmath.cpp) it declares the function ids and the three entry points. Each of
// vecmath_ulp_avx512.cpp, vecmath_ulp_avx2.cpp and vecmath_ulp_sse2.cpp defines TC_VEC_BYTES and TC_VECMATH_APPLY (the
// entry point's name) and includes it again with its ISA's compiler flags: that defines the entry point.
#pragma once

#include <cstdint>

namespace tc_vecmath_test {

enum Fn : int { kExp, kExpm1, kLog, kLog1p, kTanh, kSigmoid, kErf, kSin, kCos, kGeluErf, kGeluTanh, kSilu, kFnCount };

inline const char* fn_name(int fn) {
  static const char* const names[kFnCount] = {"exp", "expm1", "log", "log1p",    "tanh",      "sigmoid",
                                              "erf", "sin",   "cos", "gelu_erf", "gelu_tanh", "silu"};
  return names[fn];
}

}  // namespace tc_vecmath_test

// out[i] = f(in[i]) for i < n with vecmath's function `fn` (a tc_vecmath_test::Fn), built for one ISA. n need not be a
// multiple of the vector width. The CPU must support the ISA.
void tc_vecmath_apply_avx512(int fn, const float* in, float* out, int64_t n);
void tc_vecmath_apply_avx2(int fn, const float* in, float* out, int64_t n);
void tc_vecmath_apply_sse2(int fn, const float* in, float* out, int64_t n);

#if defined(TC_VEC_BYTES) && defined(TC_VECMATH_APPLY)

#include "vecmath.h"

namespace tc_vecmath_test {
namespace {

using namespace torchcompile::fused;

template <vf (*F)(vf)>
void map(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) storeu(out + i, F(loadu(in + i)));
  if (i < n) {  // the tail, in a zero-padded vector
    float buf[kLanes] = {};
    __builtin_memcpy(buf, in + i, static_cast<size_t>(n - i) * sizeof(float));
    storeu(buf, F(loadu(buf)));
    __builtin_memcpy(out + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace
}  // namespace tc_vecmath_test

void TC_VECMATH_APPLY(int fn, const float* in, float* out, int64_t n) {
  using namespace tc_vecmath_test;
  switch (fn) {
    case kExp: map<v_exp>(in, out, n); break;
    case kExpm1: map<v_expm1>(in, out, n); break;
    case kLog: map<v_log>(in, out, n); break;
    case kLog1p: map<v_log1p>(in, out, n); break;
    case kTanh: map<v_tanh>(in, out, n); break;
    case kSigmoid: map<v_sigmoid>(in, out, n); break;
    case kErf: map<v_erf>(in, out, n); break;
    case kSin: map<v_sin>(in, out, n); break;
    case kCos: map<v_cos>(in, out, n); break;
    case kGeluErf: map<v_gelu_erf>(in, out, n); break;
    case kGeluTanh: map<v_gelu_tanh>(in, out, n); break;
    case kSilu: map<v_silu>(in, out, n); break;
    default: break;
  }
}

#endif
