// Vectorized single-precision math for the fused backend's tile kernels: exp, expm1, log, log1p, tanh, sigmoid, erf,
// sin, cos, and the activations gelu (erf and tanh forms) and silu.
//
// Written with GCC vector extensions, so that one source serves three ISAs: a translation unit defines TC_VEC_BYTES to
// 64 (compiled with -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma), 32 (-mavx2 -mfma) or 16 (x86-64
// baseline, SSE2) and then includes this header. Everything is in an unnamed namespace: the same inline functions are
// compiled for three ISAs in three translation units, and the linker must never merge them (internal linkage).
//
// Maximum errors over all 2^32 floats, against double-precision references (measured exhaustively for the AVX-512
// and the SSE2 builds; backends/fused/tests/test_vecmath.cpp checks every 409th float and the special values on each
// ISA, and asserts bounds just above these):
//   exp 1.04 ULP   expm1 1.66   log 0.89   log1p 1.03   tanh 5.60 (6.61 SSE2)   sigmoid 2.40   erf 5.90 (7.24 SSE2)
//   sin 1.58   cos 1.58   gelu_erf 3.29 (3.34 SSE2; x >= 0, absolute error below 9.7e-7 for x < 0)   gelu_tanh 3.46
//   silu 3.39
// tanh and erf are rational approximations (one division, no exp): their error, a few ULP just below 1, is the price
// of being twice as fast as the exp-based forms. gelu_erf is ATen's formula, whose 1 + erf cancels for x < 0 as
// eager's does; gelu_tanh and silu keep relative accuracy down to underflow. Accuracy does not depend on the
// floating-point environment beyond the default (round to nearest, denormals not flushed). Contracting a * b + c into
// fused multiply-adds (AVX2 and AVX-512 builds) changes the errors only as the SSE2 figures show.
//
// Cost, in vector instructions: exp, expm1 and log are one exp (about 16), tanh and erf about 14 and a division,
// sigmoid and silu 1.2 exp, log1p 2, gelu_erf about 17 and a division, sin, cos and gelu_tanh 2.5 exp (their argument reduction is in
// double).
//
// The polynomial coefficients are weighted minimax fits (Remez exchange in mpmath, 50 digits), rounded to float one
// coefficient at a time with the remaining ones refitted; tanh's and erf's rational fits (linearized Remez for
// relative error in mpmath) are rounded to float directly, which costs them less than 0.2 ULP. Each is written as
// the fit printed it.
//
// Special values are as C99 Annex F (NaN in gives NaN out, exp(-inf) = 0, log(0) = -inf, tanh(-0) = -0, ...). The
// activations take eager ATen's definitions at infinities: gelu(-inf) and silu(-inf) are NaN there (-inf * 0), and so
// here.
#pragma once

#if !defined(TC_VEC_BYTES) || (TC_VEC_BYTES != 64 && TC_VEC_BYTES != 32 && TC_VEC_BYTES != 16)
#error "define TC_VEC_BYTES (64, 32 or 16) before including vecmath.h"
#endif

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace torchcompile::fused {
namespace {

constexpr int kLanes = TC_VEC_BYTES / 4;
typedef float vf __attribute__((vector_size(TC_VEC_BYTES)));
typedef int32_t vi __attribute__((vector_size(TC_VEC_BYTES)));

inline vf splat(float v) { return vf{} + v; }
inline vf loadu(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void storeu(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }

// x > hi ? hi : x and x < lo ? lo : x, NaN kept, as one minps / maxps: those return their second operand when
// either is NaN (the compiler writes a comparison and a blend for the conditional expression).
// (GCC 12 warns that the AVX-512 intrinsics' internal _mm512_undefined_ps() is uninitialized.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline vf upper_clamp(vf x, vf hi) {
#if TC_VEC_BYTES == 64
  return (vf)_mm512_min_ps((__m512)hi, (__m512)x);
#elif TC_VEC_BYTES == 32
  return (vf)_mm256_min_ps((__m256)hi, (__m256)x);
#else
  return (vf)_mm_min_ps((__m128)hi, (__m128)x);
#endif
}
inline vf lower_clamp(vf x, vf lo) {
#if TC_VEC_BYTES == 64
  return (vf)_mm512_max_ps((__m512)lo, (__m512)x);
#elif TC_VEC_BYTES == 32
  return (vf)_mm256_max_ps((__m256)lo, (__m256)x);
#else
  return (vf)_mm_max_ps((__m128)lo, (__m128)x);
#endif
}
#pragma GCC diagnostic pop
inline vf upper_clamp(vf x, float hi) { return upper_clamp(x, splat(hi)); }
inline vf lower_clamp(vf x, float lo) { return lower_clamp(x, splat(lo)); }

namespace vecmath_detail {

inline vi splati(int32_t v) { return vi{} + v; }
inline vf as_f(vi v) { return (vf)v; }
inline vi as_i(vf v) { return (vi)v; }
inline vf abs(vf x) { return as_f(as_i(x) & 0x7fffffff); }
inline vi sign_bit(vf x) { return as_i(x) & splati(INT32_MIN); }
inline vf or_bits(vf x, vi bits) { return as_f(as_i(x) | bits); }
inline vf xor_bits(vf x, vi bits) { return as_f(as_i(x) ^ bits); }
// 2^n for integer n in [-126, 127] (the bits of the float).
inline vf pow2i(vi n) { return as_f((n + 127) << 23); }

// True when some lane of the mask (all ones or all zeros per lane) is set.
inline bool any(vi m) {
#if TC_VEC_BYTES == 64
  return _mm512_movepi32_mask((__m512i)m) != 0;
#elif TC_VEC_BYTES == 32
  return _mm256_movemask_ps((__m256)m) != 0;
#else
  return _mm_movemask_ps((__m128)m) != 0;
#endif
}

// c0 + x (c1 + x (c2 + ...)), Horner's scheme.
inline vf poly(vf, float c0) { return splat(c0); }
template <class... C>
inline vf poly(vf x, float c0, C... cs) {
  return poly(x, cs...) * x + c0;
}

// ---- lanes in double ------------------------------------------------------------------------------------------------
// Where an argument needs more than float's 24 bits (the sin / cos reduction, gelu-tanh's exponent), the lanes go
// through double as two half-width vectors.
#if TC_VEC_BYTES == 64
#define TC_VM_LO 0, 1, 2, 3, 4, 5, 6, 7
#define TC_VM_HI 8, 9, 10, 11, 12, 13, 14, 15
#define TC_VM_ALL 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
#elif TC_VEC_BYTES == 32
#define TC_VM_LO 0, 1, 2, 3
#define TC_VM_HI 4, 5, 6, 7
#define TC_VM_ALL 0, 1, 2, 3, 4, 5, 6, 7
#else
#define TC_VM_LO 0, 1
#define TC_VM_HI 2, 3
#define TC_VM_ALL 0, 1, 2, 3
#endif
typedef double vd __attribute__((vector_size(TC_VEC_BYTES)));
typedef float vfh __attribute__((vector_size(TC_VEC_BYTES / 2)));
typedef int32_t vih __attribute__((vector_size(TC_VEC_BYTES / 2)));

inline vd lo_half(vf x) { return __builtin_convertvector((vfh)__builtin_shufflevector(x, x, TC_VM_LO), vd); }
inline vd hi_half(vf x) { return __builtin_convertvector((vfh)__builtin_shufflevector(x, x, TC_VM_HI), vd); }
inline vf join_f(vd lo, vd hi) {
  return __builtin_shufflevector(__builtin_convertvector(lo, vfh), __builtin_convertvector(hi, vfh), TC_VM_ALL);
}
// lo and hi hold integers in int32's range.
inline vi join_i(vd lo, vd hi) {
  return __builtin_shufflevector(__builtin_convertvector(lo, vih), __builtin_convertvector(hi, vih), TC_VM_ALL);
}
#undef TC_VM_LO
#undef TC_VM_HI
#undef TC_VM_ALL

constexpr double kRoundMagicD = 0x1.8p52;  // adding it rounds |v| < 2^51 to an integer

// ---- exp family -----------------------------------------------------------------------------------------------------
// x = n ln2 + r with n = round(x / ln2), |r| <= ln2 / 2 (Cody-Waite: ln2 = kLn2Hi + kLn2Lo, kLn2Hi has 15 significant
// bits so n * kLn2Hi and x - n * kLn2Hi are exact for |n| < 2^9). n comes from the magic-number rounding (valid for
// |x / ln2| < 2^22); x must not be infinite (NaN is fine: it gives r = NaN).
constexpr float kLog2e = 1.44269502f;
constexpr float kLn2Hi = 0x1.62e4p-1f;
constexpr float kLn2Lo = 1.42860677e-06f;  // ln2 - kLn2Hi
constexpr float kRoundMagic = 0x1.8p23f;   // adding it rounds |v| < 2^22 to an integer
constexpr int32_t kRoundMagicBits = 0x4b400000;

struct Reduced {
  vf r;
  vi n;
};
inline Reduced exp_reduce(vf x) {
  const vf t = x * kLog2e + kRoundMagic;  // the low bits of t hold n
  const vf nf = t - kRoundMagic;
  vf r = x - nf * kLn2Hi;
  r = r - nf * kLn2Lo;
  return {r, as_i(t) - kRoundMagicBits};
}

// expm1(r) = r + r^2 P(r) on |r| <= ln2/2: relative error of the fit 2^-26.1 (exp(r) = 1 + this is within 2^-27).
inline vf expm1_kernel(vf r) {
  const vf p = poly(r, 4.999999702e-01f, 1.666653901e-01f, 4.166775569e-02f, 8.367102593e-03f, 1.383639290e-03f);
  return r * r * p + r;
}

// exp(y) for y in [-87, 88] (no overflow or denormal handling; NaN propagates through the multiplication).
inline vf exp_bounded(vf y) {
  const Reduced red = exp_reduce(y);
  return (expm1_kernel(red.r) + 1.f) * pow2i(red.n);
}

// exp(-a) * 2^64 for a in [0, +inf] or NaN: exact scaling, so that exp(-a) down to the smallest denormal keeps full
// relative precision. Above a = 132.5 (where exp(-a) * 2^64 < 2^-127 would need a denormal scale) it is exactly 0,
// so that x * exp(-|x|) is NaN at x = -inf as in ATen.
inline vf exp_neg_scaled(vf a) {
  a = upper_clamp(a, 132.5f);  // n = -191 there: the scale 2^(n + 64) encodes as +0
  const Reduced red = exp_reduce(-a);
  return (expm1_kernel(red.r) + 1.f) * as_f((red.n + (64 + 127)) << 23);
}

// x sigmoid(w) = x / (1 + e) for w >= 0 and x e / (1 + e) for w < 0, given e64 = exp(-|w|) 2^64: no overflow, no
// cancellation, and a denormal result rounded only once (the final scaling). Shared by silu (w = x) and gelu-tanh.
inline vf x_sigmoid(vf x, vf e64, vi w_negative) {
  const vf num = w_negative ? x * e64 : x;
  return num / (e64 * 0x1p-64f + 1.f) * (w_negative ? splat(0x1p-64f) : splat(1.f));
}

// ---- gelu -----------------------------------------------------------------------------------------------------------
// gelu-tanh as x sigmoid(w), w = x (k0 + k1 x^2), k0 = sqrt(8/pi), k1 = 0.044715 k0. An absolute error d in w is a
// relative error d in exp(-|w|), and |w| goes up to 132 before the result underflows: w in float would cost about
// 2|w| ULP. So w and the reduction -|w| = n ln2 + r are computed in double, and only r is rounded to float.
constexpr double kGeluK0 = 1.5957691216057308;
constexpr double kGeluK1 = 0.07135481627260025;
constexpr double kLog2eD = 1.4426950408889634;
constexpr double kLn2D = 0.6931471805599453;
inline vd gelu_tanh_reduce(vd a, vd& n) {  // a = |x|
  vd w = a * (a * a * kGeluK1 + kGeluK0);
  w = w > 132.5 ? vd{} + 132.5 : w;  // as exp_neg_scaled
  n = (w * -kLog2eD + kRoundMagicD) - kRoundMagicD;
  return -w - n * kLn2D;
}
// exp(-|w|) 2^64.
inline vf gelu_tanh_e64(vf x) {
  const vf a = abs(x);
  vd nlo, nhi;
  const vd rlo = gelu_tanh_reduce(lo_half(a), nlo), rhi = gelu_tanh_reduce(hi_half(a), nhi);
  return (expm1_kernel(join_f(rlo, rhi)) + 1.f) * as_f((join_i(nlo, nhi) + (64 + 127)) << 23);
}

// ---- log family -----------------------------------------------------------------------------------------------------
// log(1 + f) - f = f^2 Q(f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]: relative error of the fit 2^-27.7.
inline vf log1p_tail(vf f) {
  const vf q = poly(f, -4.999998808e-01f, 3.333333731e-01f, -2.500163913e-01f, 2.000120580e-01f, -1.660668999e-01f,
                    1.419614851e-01f, -1.328053176e-01f, 1.282393634e-01f, -7.421790063e-02f);
  return f * f * q;
}
constexpr float kLn2HiLog = 0.693359375f;      // 9 significant bits: e * kLn2HiLog is exact
constexpr float kLn2LoLog = -2.12194440e-4f;   // ln2 - kLn2HiLog
constexpr int32_t kSqrtHalfBits = 0x3f3504f3;  // sqrt(1/2)

// Splits a positive normal finite x into 2^e * m with m in [sqrt(1/2), sqrt(2)).
struct Split {
  vf m;
  vi e;
};
inline Split split_exponent(vf x) {
  const vi e = (as_i(x) - kSqrtHalfBits) >> 23;
  return {as_f(as_i(x) - (e << 23)), e};
}

// log(2^e (1 + f)) + tail: e ln2 + f + f^2 Q(f) + tail, summed smallest terms first (Cephes' order).
inline vf log_combine(vi e, vf f, vf tail) {
  const vf ef = __builtin_convertvector(e, vf);
  const vf lo = ef * kLn2LoLog + (log1p_tail(f) + tail);
  return ef * kLn2HiLog + (lo + f);
}

inline vf log_normal(vf x) {
  const Split s = split_exponent(x);
  return log_combine(s.e, s.m - 1.f, splat(0.f));
}

// ---- erf ------------------------------------------------------------------------------------------------------------
// erf(x) = x P(x^2) / Q(x^2) for |x| <= 3.93 (erf rounds to 1 above 3.92), P and Q of degree 5: relative error of the
// fit 2^-25.6 (the rounding of the evaluation in float dominates the error).
constexpr float kErfMax = 3.93f;
// ---- sin / cos ------------------------------------------------------------------------------------------------------
// |x| above this goes to the scalar std::sin / std::cos: the reduction below needs n = round(x * 2/pi) < 2^25.
constexpr float kTrigMax = 5.0e7f;

// pi/2 = kPio2Hi + kPio2Lo, kPio2Hi with 28 significant bits (n * kPio2Hi exact in double for |n| < 2^25).
constexpr double kPio2Hi = 0x1.921fb54p0;
constexpr double kPio2Lo = 0x1.10b4611a62633p-30;  // pi/2 - kPio2Hi
constexpr double kTwoOverPi = 0.63661977236758134308;

// x = n pi/2 + r in double for half of the lanes, r exact to about 2^-54 for |x| < 5e7 (x - n * kPio2Hi is exact,
// only n * kPio2Lo and the last subtraction round).
inline vd trig_reduce(vd x, vd& n) {
  n = (x * kTwoOverPi + kRoundMagicD) - kRoundMagicD;
  return (x - n * kPio2Hi) - n * kPio2Lo;
}

// sin(r) = r + r^3 S(r^2) and cos(r) = 1 - r^2/2 + r^4 C(r^2) on |r| <= pi/4: relative errors of the fits 2^-27.9
// and 2^-33. Quadrant q of x = q pi/2 + r gives sin(x) = sin r, cos r, -sin r, -cos r.
inline vf sin_quadrant(vf r, vi q) {
  const vf z = r * r;
  vf s = z * r * poly(z, -1.666665524e-01f, 8.332189173e-03f, -1.951828453e-04f) + r;
  s = or_bits(s, sign_bit(r));  // sin(-0) = -0 (the sum above gives +0); otherwise s has the sign of r already
  const vf c = z * z * poly(z, 4.166664556e-02f, -1.388730947e-03f, 2.443232734e-05f) + (1.f - 0.5f * z);
  const vf v = (q & 1) != 0 ? c : s;
  return xor_bits(v, (q & 2) << 30);
}

// sin (quadrant offset 0) or cos (offset 1) of every lane.
inline vf sincos(vf x, int offset) {
  vd nlo, nhi;
  const vd rlo = trig_reduce(lo_half(x), nlo), rhi = trig_reduce(hi_half(x), nhi);
  vf res = sin_quadrant(join_f(rlo, rhi), join_i(nlo, nhi) + offset);
  // Beyond kTrigMax (rare in practice; NaN compares false, +-inf gives NaN above already): scalar, lane by lane.
  const vi big = abs(x) > kTrigMax;
  if (any(big)) {
    float xs[kLanes], rs[kLanes];
    int32_t bs[kLanes];
    storeu(xs, x);
    storeu(rs, res);
    __builtin_memcpy(bs, &big, sizeof bs);
    for (int i = 0; i < kLanes; ++i) {
      if (bs[i]) rs[i] = offset ? std::cos(xs[i]) : std::sin(xs[i]);
    }
    res = loadu(rs);
  }
  return res;
}
}  // namespace vecmath_detail

// exp(x): Cody-Waite reduction x = n ln2 + r, exp(r) = 1 + r + r^2 P(r), then 2^n applied as two factors 2^(n/2) and
// 2^(n - n/2) so that results in the denormal range are rounded once and overflow gives inf. Clamping x to
// [-104, 89] makes exp(-inf) = 0 and exp(+inf) = inf. Max error 1.04 ULP.
inline vf v_exp(vf x) {
  using namespace vecmath_detail;
  x = lower_clamp(x, -104.f);  // NaN stays
  x = upper_clamp(x, 89.f);
  const Reduced red = exp_reduce(x);
  const vf p = expm1_kernel(red.r) + 1.f;
  const vi n1 = red.n >> 1;
  return p * pow2i(n1) * pow2i(red.n - n1);
}

// expm1(x) = 2^n (1 + s) - 1 with s = expm1(r), evaluated as 2 (v s + (v - 1/2)), v = 2^(n-1), which is exact for
// n = 0 (the result is then s, accurate near 0) and can reach the overflow threshold without overflowing early. x is
// clamped to [-18, 89] (expm1 rounds to -1 below -17.4); |x| < 2^-25 returns x (also gives -0 and denormals).
// Max error 1.66 ULP.
inline vf v_expm1(vf x) {
  using namespace vecmath_detail;
  vf xc = lower_clamp(x, -18.f);
  xc = upper_clamp(xc, 89.f);
  const Reduced red = exp_reduce(xc);
  const vf s = expm1_kernel(red.r);
  const vf v = as_f((red.n + 126) << 23);
  const vf y = (v * s + (v - 0.5f)) * 2.f;
  return abs(x) < 0x1p-25f ? x : y;
}

// log(x): x = 2^e m with m in [sqrt(1/2), sqrt(2)), log(m) = f + f^2 Q(f) with f = m - 1 (exact), plus e ln2 in two
// parts. Lanes that are not positive normal finite (denormals are scaled by 2^23 first) take a slower path only when
// present. Max error 0.89 ULP.
inline vf v_log(vf x) {
  using namespace vecmath_detail;
  const vi normal = (x >= 0x1p-126f) & (x <= 3.40282347e+38f);
  if (!any(~normal)) return log_normal(x);
  const vi denormal = x < 0x1p-126f;
  const vf xs = denormal ? x * 0x1p23f : x;
  const Split s = split_exponent(xs);
  vf res = log_combine(s.e - (denormal & 23), s.m - 1.f, splat(0.f));
  res = x == INFINITY ? x : res;
  res = x == 0.f ? splat(-INFINITY) : res;
  return x >= 0.f ? res : splat(NAN);  // negative or NaN
}

// log1p(x): u = 1 + x rounded, with its rounding error c (two-sum); u = 2^e (1 + f) as in log, and
// log1p(x) = e ln2 + log(1 + f) + d / (1 + f), d = c 2^-e, 1 / (1 + f) ~ 1 - f + f^2 (d is below an ulp of 1 + f).
// Near 0 (e = 0) f + d is x exactly. Max error 1.03 ULP.
inline vf v_log1p(vf x) {
  using namespace vecmath_detail;
  const vi ok = (x > -1.f) & (x <= 3.40282347e+38f);
  const vf xc = ok ? x : splat(0.f);
  const vf u = xc + 1.f;
  const vf bb = u - xc;
  const vf c = (1.f - bb) + (xc - (u - bb));  // (1 + x) - u exactly
  const Split s = split_exponent(u);
  const vf f = s.m - 1.f;
  const vi ed = s.e > 126 ? splati(126) : s.e;  // c 2^-e is negligible there
  const vf d = c * pow2i(-ed);
  const vf tail = d * ((f - 1.f) * f + 1.f);
  vf res = log_combine(s.e, f, tail);
  res = x == 0.f ? x : res;  // log1p(-0) = -0
  if (!any(~ok)) return res;
  res = x == INFINITY ? x : res;
  res = x == -1.f ? splat(-INFINITY) : res;
  return x >= -1.f ? res : splat(NAN);  // below -1 or NaN
}

// tanh(x) = x P(x^2) / Q(x^2) for |x| <= 9.02 (tanh rounds to 1 above 9.01), P and Q of degree 4, fitted for
// relative error (2^-25.5); one division and no exp, half the cost of the exp form E / (E + 2), E = expm1(2|x|). The
// sign of x is put back (tanh(-0) = -0). Max error 5.6 ULP (6.6 without FMA), near 1, where P and Q are large and
// each rounds a few times.
inline vf v_tanh(vf x) {
  using namespace vecmath_detail;
  vf a = abs(x);
  a = upper_clamp(a, 9.02f);  // NaN stays
  const vf z = a * a;
  const vf p = poly(z, 1.f, 1.337971736e-01f, 3.494033903e-03f, 2.058347158e-05f, 1.331906046e-08f);
  const vf q = poly(z, 1.f, 4.671303260e-01f, 2.587107062e-02f, 3.283091815e-04f, 7.762014344e-07f);
  vf r = a * p / q;
  r = upper_clamp(r, 1.f);  // without FMA (SSE2) the clamped end rounds to 1 + 2^-23
  return or_bits(r, sign_bit(x));
}

// sigmoid(x) = 1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0, e = exp(-|x|) (no overflow, no cancellation), scaled
// by 2^64 so that results down to the smallest denormal are rounded once. Max error 2.40 ULP.
inline vf v_sigmoid(vf x) {
  using namespace vecmath_detail;
  const vf e64 = exp_neg_scaled(abs(x));
  const vf num = x < 0.f ? e64 : splat(0x1p64f);
  return num / (e64 * 0x1p-64f + 1.f) * 0x1p-64f;
}

// silu(x) = x sigmoid(x), as sigmoid. Max error 3.39 ULP.
inline vf v_silu(vf x) {
  using namespace vecmath_detail;
  return x_sigmoid(x, exp_neg_scaled(abs(x)), x < 0.f);
}

// erf(x) = x P(x^2) / Q(x^2) (above), |x| clamped to 3.93 and the result to 1; one division and no exp, half the cost
// of the classic split into a small-argument polynomial and 1 - exp(R) for erfc. Max error 5.9 ULP (7.2 without FMA),
// near 1.
inline vf v_erf(vf x) {
  using namespace vecmath_detail;
  vf a = abs(x);
  a = upper_clamp(a, kErfMax);
  const vf z = a * a;
  const vf p = poly(z, 1.128379145f, 1.907840070e-01f, 5.279030986e-02f, 3.779617099e-03f, 2.848088305e-04f,
                    2.041969986e-06f);
  const vf q = poly(z, 1.f, 5.024106434e-01f, 1.142575957e-01f, 1.499745287e-02f, 1.165214733e-03f, 3.800407879e-05f);
  vf r = a * p / q;
  r = upper_clamp(r, 1.f);
  return or_bits(r, sign_bit(x));
}

// gelu(x) = x/2 (1 + erf(x / sqrt(2))) = x (1/2 + t), t = erf(x / sqrt(2)) / 2 evaluated as erf's rational
// approximation with the scalings folded into its coefficients (powers of 2 for x^2 / 2, exact; 1 / (2 sqrt(2)) in
// P's): x is clamped to +-5.8 (erf's approximation goes just past 1 there) and t to +-1/2. 20% faster than
// 0.5 x (1 + v_erf(x / sqrt(2))). For x >= 0 the error is a few ULP; for x < 0, 1/2 + t cancels as 1 + erf does in
// ATen's float computation (eager's own result carries the same cancellation): the absolute error stays below
// 9.7e-7, the relative error grows as gelu(x) goes to 0. Max error 3.3 ULP for x >= 0.
inline vf v_gelu_erf(vf x) {
  using namespace vecmath_detail;
  constexpr float c = 0.353553390593273762f;  // 1 / (2 sqrt(2))
  vf xc = lower_clamp(x, -5.8f);  // NaN stays
  xc = upper_clamp(xc, 5.8f);
  const vf z = xc * xc;
  const vf p = poly(z, 1.128379145f * c, 1.907840070e-01f / 2 * c, 5.279030986e-02f / 4 * c,
                    3.779617099e-03f / 8 * c, 2.848088305e-04f / 16 * c, 2.041969986e-06f / 32 * c);
  const vf q = poly(z, 1.f, 5.024106434e-01f / 2, 1.142575957e-01f / 4, 1.499745287e-02f / 8, 1.165214733e-03f / 16,
                    3.800407879e-05f / 32);
  vf t = xc * p / q;
  t = upper_clamp(t, 0.5f);
  t = lower_clamp(t, -0.5f);
  return x * (t + 0.5f);
}

// gelu with the tanh approximation: x/2 (1 + tanh(u)) = x sigmoid(2u), 2u = sqrt(8/pi) (x + 0.044715 x^3), with the
// exponent in double (gelu_tanh_e64). Max error 3.46 ULP.
inline vf v_gelu_tanh(vf x) {
  using namespace vecmath_detail;
  return x_sigmoid(x, gelu_tanh_e64(x), x < 0.f);
}

// sin(x), cos(x): x = n pi/2 + r reduced in double (exact to about 2^-54 for |x| < 5e7, so results near the zeros keep
// their relative precision), then r rounded to float and the polynomials on [-pi/4, pi/4] of the quadrant. Lanes with
// |x| > 5e7 (there only when present) are computed by std::sin / std::cos, lane by lane. Max error 1.58 ULP for both.
inline vf v_sin(vf x) { return vecmath_detail::sincos(x, 0); }
inline vf v_cos(vf x) { return vecmath_detail::sincos(x, 1); }

}  // namespace
}  // namespace torchcompile::fused
