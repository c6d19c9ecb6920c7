// The kernels, compiled once per ISA: kernels_avx512.cpp, kernels_avx2.cpp and kernels_sse2.cpp
// each define TC_VEC_BYTES and TC_ISA_KERNELS (the name of the function returning the ISA's
// table) and include this file with their ISA's compiler flags. Everything but that function has
// internal linkage (vecmath.h's unnamed namespace and the one below), so the three copies are
// never merged by the linker.
//
// One instruction runs as one vector loop over the tile (two vectors per iteration, so that the
// polynomial chains of two vectors overlap); the tail of a tile shorter than a vector is computed
// in a zero-padded vector and only its `n` elements are stored.
#pragma once

#ifndef TC_VEC_BYTES
#error "define TC_VEC_BYTES (64, 32 or 16) before including kernels_impl.h"
#endif

#include "tile_ops.h"
#include "vecmath.h"

#include <immintrin.h>

#include <array>
#include <cmath>
#include <utility>

namespace torchcompile::fused {
namespace {

// (GCC 12 warns that _mm512_sqrt_ps's internal _mm512_undefined_ps() may be uninitialized.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline vf v_sqrt(vf x) {
#if TC_VEC_BYTES == 64
  return (vf)_mm512_sqrt_ps((__m512)x);
#elif TC_VEC_BYTES == 32
  return (vf)_mm256_sqrt_ps((__m256)x);
#else
  return (vf)_mm_sqrt_ps((__m128)x);
#endif
}
#pragma GCC diagnostic pop

inline vf v_is_nan_select(vf r, vf a) { return a != a ? a : r; }

// maximum / minimum as ATen's: a NaN operand gives NaN.
inline vf v_max(vf a, vf b) { return v_is_nan_select(v_is_nan_select(a > b ? a : b, a), b); }
inline vf v_min(vf a, vf b) { return v_is_nan_select(v_is_nan_select(a < b ? a : b, a), b); }

// Partial vectors: the first `n` (< kLanes) floats, the rest zero.
inline vf load_partial(const float* p, int64_t n) {
  vf v = splat(0.f);
  __builtin_memcpy(&v, p, static_cast<size_t>(n) * sizeof(float));
  return v;
}
inline void store_partial(float* p, vf v, int64_t n) { __builtin_memcpy(p, &v, static_cast<size_t>(n) * sizeof(float)); }

template <class F>
inline void map1(float* d, const float* a, int64_t n, F f) {  // d may be a (in place)
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    vf x0 = loadu(a + i), x1 = loadu(a + i + kLanes);
    storeu(d + i, f(x0));
    storeu(d + i + kLanes, f(x1));
  }
  for (; i + kLanes <= n; i += kLanes) storeu(d + i, f(loadu(a + i)));
  if (i < n) store_partial(d + i, f(load_partial(a + i, n - i)), n - i);
}

template <class F>
inline void map2(float* d, const float* a, const float* b, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    vf x0 = loadu(a + i), x1 = loadu(a + i + kLanes);
    vf y0 = loadu(b + i), y1 = loadu(b + i + kLanes);
    storeu(d + i, f(x0, y0));
    storeu(d + i + kLanes, f(x1, y1));
  }
  for (; i + kLanes <= n; i += kLanes) storeu(d + i, f(loadu(a + i), loadu(b + i)));
  if (i < n) store_partial(d + i, f(load_partial(a + i, n - i), load_partial(b + i, n - i)), n - i);
}

// gelu'(x) for the erf form, as ATen's gelu_backward: cdf(x) + x * pdf(x).
inline vf v_gelu_erf_grad(vf x) {
  const vf cdf = splat(0.5f) * (splat(1.f) + v_erf(x * splat(0.70710678118654752f)));
  const vf pdf = v_exp(splat(-0.5f) * x * x) * splat(0.39894228040143268f);
  return cdf + x * pdf;
}

template <class F>
inline void map3(float* d, const float* a, const float* b, const float* c, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) storeu(d + i, f(loadu(a + i), loadu(b + i), loadu(c + i)));
  if (i < n) {
    store_partial(d + i, f(load_partial(a + i, n - i), load_partial(b + i, n - i), load_partial(c + i, n - i)), n - i);
  }
}

template <Arith Op>
inline vf arith(vf x, vf y) {
  if constexpr (Op == Arith::Add) return x + y;
  if constexpr (Op == Arith::Sub) return x - y;
  if constexpr (Op == Arith::Mul) return x * y;
  return x / y;
}

// d = (a op1 b) op2 c, or c op2 (a op1 b).
template <int Code>
void arith2(float* d, const float* a, const float* b, const float* c, int64_t n) {
  constexpr Arith op1 = static_cast<Arith>(Code / 8), op2 = static_cast<Arith>(Code / 2 % 4);
  constexpr bool t_right = Code % 2;
  map3(d, a, b, c, n, [](vf x, vf y, vf z) {
    vf t = arith<op1>(x, y);
    __asm__("" : "+x"(t));  // t is rounded: the compiler may not contract it into an FMA
    return t_right ? arith<op2>(z, t) : arith<op2>(t, z);
  });
}

// A comparison's lanes (all ones or zero) as 1.0f or 0.0f.
inline vf as_mask(vi m) { return (vf)(m & (vi)splat(1.f)); }

inline vf compare(vf x, vf y, CmpKind k) {
  switch (k) {
    case CmpKind::Lt: return as_mask(x < y);
    case CmpKind::Le: return as_mask(x <= y);
    case CmpKind::Gt: return as_mask(x > y);
    case CmpKind::Ge: return as_mask(x >= y);
    case CmpKind::Eq: return as_mask(x == y);
    case CmpKind::Ne: return as_mask(x != y);
  }
  return x;
}

template <CmpKind K>
void compare_tile(float* d, const float* a, const float* b, vf p0, bool scalar, int64_t n) {
  if (scalar) {
    map1(d, a, n, [=](vf x) { return compare(x, p0, K); });
  } else {
    map2(d, a, b, n, [](vf x, vf y) { return compare(x, y, K); });
  }
}

void compare_any(float* d, const float* a, const float* b, vf p0, bool scalar, CmpKind k, int64_t n) {
  switch (k) {
    case CmpKind::Lt: compare_tile<CmpKind::Lt>(d, a, b, p0, scalar, n); break;
    case CmpKind::Le: compare_tile<CmpKind::Le>(d, a, b, p0, scalar, n); break;
    case CmpKind::Gt: compare_tile<CmpKind::Gt>(d, a, b, p0, scalar, n); break;
    case CmpKind::Ge: compare_tile<CmpKind::Ge>(d, a, b, p0, scalar, n); break;
    case CmpKind::Eq: compare_tile<CmpKind::Eq>(d, a, b, p0, scalar, n); break;
    case CmpKind::Ne: compare_tile<CmpKind::Ne>(d, a, b, p0, scalar, n); break;
  }
}

using Arith2Fn = void (*)(float*, const float*, const float*, const float*, int64_t);
template <int... Codes>
constexpr std::array<Arith2Fn, sizeof...(Codes)> arith2_table(std::integer_sequence<int, Codes...>) {
  return {&arith2<Codes>...};
}
constexpr auto kArith2 = arith2_table(std::make_integer_sequence<int, kArith2Variants>{});

void run_tile(const TileInstr* code, size_t count, float* const* regs, int64_t n) {
  for (size_t k = 0; k < count; ++k) {
    const TileInstr& in = code[k];
    float* d = regs[in.dst];
    const float* a = regs[in.a];
    const float* b = regs[in.b];
    const vf p0 = splat(in.p0), p1 = splat(in.p1);
    const vf zero = splat(0.f), one = splat(1.f);
    switch (in.op) {
      case TileOp::Neg: map1(d, a, n, [](vf x) { return -x; }); break;
      case TileOp::Abs: map1(d, a, n, [](vf x) { return (vf)((vi)x & 0x7fffffff); }); break;
      // NaN stays NaN (NaN < 0 is false), as ATen's clamp_min(0).
      case TileOp::Relu: map1(d, a, n, [=](vf x) { return lower_clamp(x, zero); }); break;
      case TileOp::Sigmoid: map1(d, a, n, [](vf x) { return v_sigmoid(x); }); break;
      case TileOp::Tanh: map1(d, a, n, [](vf x) { return v_tanh(x); }); break;
      case TileOp::Exp: map1(d, a, n, [](vf x) { return v_exp(x); }); break;
      case TileOp::Expm1: map1(d, a, n, [](vf x) { return v_expm1(x); }); break;
      case TileOp::Log: map1(d, a, n, [](vf x) { return v_log(x); }); break;
      case TileOp::Log1p: map1(d, a, n, [](vf x) { return v_log1p(x); }); break;
      case TileOp::Sqrt: map1(d, a, n, [](vf x) { return v_sqrt(x); }); break;
      case TileOp::Rsqrt: map1(d, a, n, [=](vf x) { return one / v_sqrt(x); }); break;
      case TileOp::Reciprocal: map1(d, a, n, [=](vf x) { return one / x; }); break;
      case TileOp::Sin: map1(d, a, n, [](vf x) { return v_sin(x); }); break;
      case TileOp::Cos: map1(d, a, n, [](vf x) { return v_cos(x); }); break;
      case TileOp::Erf: map1(d, a, n, [](vf x) { return v_erf(x); }); break;
      case TileOp::GeluErf:
        if (in.p0 != 0) {  // NaN at +inf, as LibTorch 2.x (fused_program.cpp)
          map1(d, a, n, [](vf x) { return x == __builtin_inff() ? splat(__builtin_nanf("")) : v_gelu_erf(x); });
        } else {
          map1(d, a, n, [](vf x) { return v_gelu_erf(x); });
        }
        break;
      case TileOp::GeluTanh: map1(d, a, n, [](vf x) { return v_gelu_tanh(x); }); break;
      case TileOp::Silu: map1(d, a, n, [](vf x) { return v_silu(x); }); break;
      case TileOp::Square: map1(d, a, n, [](vf x) { return x * x; }); break;
      case TileOp::Cube: map1(d, a, n, [](vf x) { return x * x * x; }); break;
      // ATen: min(max(x + 3, 0), 6) / 6, and x * that for hardswish.
      case TileOp::Hardsigmoid:
        map1(d, a, n, [=](vf x) { return v_min(v_max(x + splat(3.f), zero), splat(6.f)) / splat(6.f); });
        break;
      case TileOp::Hardswish:
        map1(d, a, n, [=](vf x) { return x * v_min(v_max(x + splat(3.f), zero), splat(6.f)) / splat(6.f); });
        break;
      case TileOp::Copy: map1(d, a, n, [](vf x) { return x; }); break;
      case TileOp::LeakyRelu: map1(d, a, n, [=](vf x) { return x > zero ? x : x * p0; }); break;
      case TileOp::Clamp:
        map1(d, a, n, [=](vf x) {
          return upper_clamp(lower_clamp(x, p0), p1);  // NaN kept
        });
        break;
      case TileOp::AddS: map1(d, a, n, [=](vf x) { return x + p0; }); break;
      case TileOp::MulS: map1(d, a, n, [=](vf x) { return x * p0; }); break;
      case TileOp::MulAddS:
        map1(d, a, n, [=](vf x) {
          vf t = x * p0;
          __asm__("" : "+x"(t));  // the product is rounded: the compiler may not contract it into an FMA
          return t + p1;
        });
        break;
      case TileOp::RSubS: map1(d, a, n, [=](vf x) { return p0 - x; }); break;
      case TileOp::DivS: map1(d, a, n, [=](vf x) { return x / p0; }); break;
      case TileOp::RDivS: map1(d, a, n, [=](vf x) { return p0 / x; }); break;
      case TileOp::Add: map2(d, a, b, n, [](vf x, vf y) { return x + y; }); break;
      case TileOp::AddMul: map2(d, a, b, n, [=](vf x, vf y) { return x + p0 * y; }); break;
      case TileOp::Sub: map2(d, a, b, n, [](vf x, vf y) { return x - y; }); break;
      case TileOp::Mul: map2(d, a, b, n, [](vf x, vf y) { return x * y; }); break;
      case TileOp::Div: map2(d, a, b, n, [](vf x, vf y) { return x / y; }); break;
      case TileOp::Max: map2(d, a, b, n, [](vf x, vf y) { return v_max(x, y); }); break;
      case TileOp::Min: map2(d, a, b, n, [](vf x, vf y) { return v_min(x, y); }); break;
      case TileOp::ThresholdBackward: map2(d, a, b, n, [=](vf g, vf x) { return x <= p0 ? zero : g; }); break;
      case TileOp::SigmoidBackward: map2(d, a, b, n, [=](vf g, vf y) { return g * (one - y) * y; }); break;
      case TileOp::TanhBackward: map2(d, a, b, n, [=](vf g, vf y) { return g * (one - y * y); }); break;
      case TileOp::GeluErfBackward: map2(d, a, b, n, [](vf g, vf x) { return g * v_gelu_erf_grad(x); }); break;
      case TileOp::CmpS: compare_any(d, a, b, p0, true, static_cast<CmpKind>(in.sub), n); break;
      case TileOp::Cmp: compare_any(d, a, b, p0, false, static_cast<CmpKind>(in.sub), n); break;
      case TileOp::LogicalNot: map1(d, a, n, [=](vf x) { return as_mask(x == zero); }); break;
      case TileOp::LogicalAnd: map2(d, a, b, n, [=](vf x, vf y) { return as_mask((x != zero) & (y != zero)); }); break;
      case TileOp::LogicalOr: map2(d, a, b, n, [=](vf x, vf y) { return as_mask((x != zero) | (y != zero)); }); break;
      case TileOp::MaskedFillS: map2(d, a, b, n, [=](vf x, vf m) { return m != zero ? p0 : x; }); break;
      case TileOp::Arith2: kArith2[in.sub](d, a, b, regs[in.c], n); break;
      case TileOp::Where: map3(d, a, b, regs[in.c], n, [=](vf m, vf x, vf y) { return m != zero ? x : y; }); break;
    }
  }
}

// ---- row kernels: a reduction along a row, then a pointwise pass that uses it ---------------------

inline float hsum(vf v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}
inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m || v[i] != v[i] ? v[i] : m;
  return m;
}

// Sum of f(x) over a row, with four vector accumulators (a tail lane contributes f of nothing:
// masked out).
template <class F>
inline float row_sum(const float* x, int64_t n, F f) {
  vf s0 = splat(0.f), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    s0 += f(loadu(x + i));
    s1 += f(loadu(x + i + kLanes));
    s2 += f(loadu(x + i + 2 * kLanes));
    s3 += f(loadu(x + i + 3 * kLanes));
  }
  for (; i + kLanes <= n; i += kLanes) s0 += f(loadu(x + i));
  float s = hsum((s0 + s1) + (s2 + s3));
  for (; i < n; ++i) {
    vf one = f(splat(x[i]));
    s += one[0];
  }
  return s;
}

// Softmax over rows: the row's maximum (NaN if any element is NaN), then exp(x - max) into `out`
// with its sum, then a scaling pass (log-softmax: x - max - log(sum)).
void softmax_rows(const float* in, float* out, int64_t rows, int64_t cols, bool log) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * cols;
    float* y = out + r * cols;
    vf m = splat(-__builtin_inff());
    int64_t i = 0;
    for (; i + kLanes <= cols; i += kLanes) {
      vf v = loadu(x + i);
      m = v > m || v != v ? v : m;
    }
    float mx = hmax(m);
    for (; i < cols; ++i) mx = x[i] > mx || x[i] != x[i] ? x[i] : mx;
    // A row of -inf (or with +inf) gives NaN, as ATen: exp(-inf - -inf).
    const vf vmx = splat(mx);
    if (log) {
      const float sum = row_sum(x, cols, [&](vf v) { return v_exp(v - vmx); });
      const vf shift = splat(mx + std::log(sum));
      map1(y, x, cols, [&](vf v) { return v - shift; });
    } else {
      map1(y, x, cols, [&](vf v) { return v_exp(v - vmx); });
      const float sum = row_sum(y, cols, [](vf v) { return v; });
      const vf inv = splat(1.f / sum);
      map1(y, y, cols, [&](vf v) { return v * inv; });
    }
  }
}

void softmax_backward_rows(const float* grad, const float* y, float* out, int64_t rows, int64_t cols, bool log) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = grad + r * cols;
    const float* yr = y + r * cols;
    float* o = out + r * cols;
    if (log) {
      const vf s = splat(row_sum(g, cols, [](vf v) { return v; }));
      map2(o, g, yr, cols, [&](vf gv, vf yv) { return gv - v_exp(yv) * s; });
    } else {
      // sum(g y): a row_sum over the products, vector by vector (row_sum reads one array).
      vf a0 = splat(0.f), a1 = a0;
      int64_t i = 0;
      for (; i + 2 * kLanes <= cols; i += 2 * kLanes) {
        a0 += loadu(g + i) * loadu(yr + i);
        a1 += loadu(g + i + kLanes) * loadu(yr + i + kLanes);
      }
      for (; i + kLanes <= cols; i += kLanes) a0 += loadu(g + i) * loadu(yr + i);
      float dot = hsum(a0 + a1);
      for (; i < cols; ++i) dot += g[i] * yr[i];
      const vf s = splat(dot);
      map2(o, g, yr, cols, [&](vf gv, vf yv) { return yv * (gv - s); });
    }
  }
}

void layer_norm_rows(const float* in, float* out, const float* weight, const float* bias, int64_t rows,
                     int64_t cols, float eps, float* mean_out, float* rstd_out) {
  const float inv_n = 1.f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * cols;
    float* y = out + r * cols;
    const float mean = row_sum(x, cols, [](vf v) { return v; }) * inv_n;
    const vf vmean = splat(mean);
    const float var = row_sum(x, cols, [&](vf v) {
                        vf d = v - vmean;
                        return d * d;
                      }) * inv_n;
    // A variance that overflows float (values near 1e19 and above) makes the row NaN, as in eager
    // (whose running moments meet inf - inf), instead of a silent row of zeros.
    const float rstd_value = var == __builtin_inff() ? __builtin_nanf("") : 1.f / std::sqrt(var + eps);
    const vf rstd = splat(rstd_value);
    if (mean_out) mean_out[r] = mean, rstd_out[r] = rstd_value;
    if (weight && bias) {
      map2(y, x, weight, cols, [&](vf v, vf w) { return (v - vmean) * rstd * w; });
      map2(y, y, bias, cols, [](vf v, vf b) { return v + b; });
    } else if (weight) {
      map2(y, x, weight, cols, [&](vf v, vf w) { return (v - vmean) * rstd * w; });
    } else {
      map1(y, x, cols, [&](vf v) { return (v - vmean) * rstd; });
      if (bias) map2(y, y, bias, cols, [](vf v, vf b) { return v + b; });
    }
  }
}

void layer_norm_backward_rows(const float* grad, const float* x, const float* mean, const float* rstd,
                              const float* weight, float* dx, float* dweight, float* dbias, int64_t rows,
                              int64_t cols) {
  const float inv_n = 1.f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = grad + r * cols;
    const float* xr = x + r * cols;
    const vf m = splat(mean[r]), s = splat(rstd[r]);
    auto xhat = [&](int64_t i) { return (loadu(xr + i) - m) * s; };
    auto gw = [&](int64_t i) { return weight ? loadu(g + i) * loadu(weight + i) : loadu(g + i); };
    if (dx) {
      // mean(gw) and mean(gw xhat) over the row, then dx.
      vf a = splat(0.f), b = splat(0.f);
      int64_t i = 0;
      for (; i + kLanes <= cols; i += kLanes) {
        const vf v = gw(i);
        a += v;
        b += v * xhat(i);
      }
      float sa = hsum(a), sb = hsum(b);
      for (; i < cols; ++i) {
        const float v = weight ? g[i] * weight[i] : g[i];
        sa += v;
        sb += v * (xr[i] - mean[r]) * rstd[r];
      }
      const vf ma = splat(sa * inv_n), mb = splat(sb * inv_n);
      float* d = dx + r * cols;
      i = 0;
      for (; i + kLanes <= cols; i += kLanes) storeu(d + i, s * (gw(i) - ma - xhat(i) * mb));
      for (; i < cols; ++i) {
        const float v = weight ? g[i] * weight[i] : g[i];
        d[i] = rstd[r] * (v - ma[0] - (xr[i] - mean[r]) * rstd[r] * mb[0]);
      }
    }
    int64_t i = 0;
    for (; i + kLanes <= cols; i += kLanes) {
      const vf gv = loadu(g + i);
      if (dweight) storeu(dweight + i, loadu(dweight + i) + gv * xhat(i));
      if (dbias) storeu(dbias + i, loadu(dbias + i) + gv);
    }
    for (; i < cols; ++i) {
      if (dweight) dweight[i] += g[i] * (xr[i] - mean[r]) * rstd[r];
      if (dbias) dbias[i] += g[i];
    }
  }
}

// Reduction along the rows of a (red, inner) block. With inner == 1 a column is contiguous: vector
// accumulators run along it; otherwise vectors run across the columns, row by row. Sums are taken
// in blocks of kSumBlock rows whose partial sums are then added (error grows with the block size
// plus the number of blocks, not with `red`).
constexpr int64_t kSumBlock = 128;

template <class Combine>
float reduce_contiguous(const float* x, int64_t n, float init, Combine c) {
  vf a0 = splat(init), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    a0 = c(a0, loadu(x + i));
    a1 = c(a1, loadu(x + i + kLanes));
    a2 = c(a2, loadu(x + i + 2 * kLanes));
    a3 = c(a3, loadu(x + i + 3 * kLanes));
  }
  for (; i + kLanes <= n; i += kLanes) a0 = c(a0, loadu(x + i));
  vf a = c(c(a0, a1), c(a2, a3));
  float r = a[0];
  for (int l = 1; l < kLanes; ++l) r = c(splat(r), splat(a[l]))[0];
  for (; i < n; ++i) r = c(splat(r), splat(x[i]))[0];
  return r;
}

inline vf v_max_nan(vf a, vf b) { return v_max(a, b); }
inline vf v_min_nan(vf a, vf b) { return v_min(a, b); }

// The variance (sum of squared deviations over `divisor`), or its square root, of `width`
// (<= kLanes) adjacent columns of a (red, stride) block, in double as ATen's CPU kernel
// accumulates: the mean first, then the squared deviations. Lanes past `width` are 0.
std::array<double, kLanes> column_variance(const float* in, int64_t red, int64_t stride, int64_t width,
                                           double divisor, bool root) {
  std::array<double, kLanes> mean{}, var{};
  for (int64_t r = 0; r < red; ++r)
    for (int64_t l = 0; l < width; ++l) mean[l] += in[r * stride + l];
  for (int64_t l = 0; l < width; ++l) mean[l] /= static_cast<double>(red);
  for (int64_t r = 0; r < red; ++r) {
    for (int64_t l = 0; l < width; ++l) {
      const double d = in[r * stride + l] - mean[l];
      var[l] += d * d;
    }
  }
  for (int64_t l = 0; l < width; ++l) var[l] = root ? std::sqrt(var[l] / divisor) : var[l] / divisor;
  return var;
}

void reduce_block(const float* in, float* out, int64_t red, int64_t inner, int64_t i0, int64_t i1, ReduceOp op,
                  double divisor) {
  const bool variance = op == ReduceOp::Variance || op == ReduceOp::StdDev;
  if (inner == 1) {
    for (int64_t i = i0; i < i1; ++i) {  // i1 - i0 <= 1 here
      auto blocked_sum = [&](auto f) {
        float total = 0;
        for (int64_t r = 0; r < red; r += kSumBlock * 16) total += row_sum(in + r, std::min(kSumBlock * 16, red - r), f);
        return total;
      };
      if (op == ReduceOp::Sum) {
        out[i - i0] = blocked_sum([](vf v) { return v; });
      } else if (variance) {
        out[i - i0] = static_cast<float>(column_variance(in, red, 1, 1, divisor, op == ReduceOp::StdDev)[0]);
      } else {
        out[i - i0] = op == ReduceOp::Max ? reduce_contiguous(in, red, -__builtin_inff(), v_max_nan)
                                          : reduce_contiguous(in, red, __builtin_inff(), v_min_nan);
      }
    }
    return;
  }
  // Columns in vectors: each output vector accumulates over the rows.
  auto columns = [&](int64_t c0, int64_t width) {
    auto load = [&](int64_t r) { return width == kLanes ? loadu(in + r * inner + c0) : load_partial(in + r * inner + c0, width); };
    auto blocked_sum = [&](auto f) {
      vf total = splat(0.f);
      for (int64_t r0 = 0; r0 < red; r0 += kSumBlock) {
        vf part = splat(0.f);
        for (int64_t r = r0; r < std::min(red, r0 + kSumBlock); ++r) part += f(load(r));
        total += part;
      }
      return total;
    };
    vf acc;
    if (op == ReduceOp::Sum) {
      acc = blocked_sum([](vf v) { return v; });
    } else if (variance) {
      const auto var = column_variance(in + c0, red, inner, width, divisor, op == ReduceOp::StdDev);
      for (int l = 0; l < kLanes; ++l) acc[l] = static_cast<float>(var[l]);
    } else {
      acc = load(0);
      for (int64_t r = 1; r < red; ++r) acc = op == ReduceOp::Max ? v_max(acc, load(r)) : v_min(acc, load(r));
    }
    if (width == kLanes) {
      storeu(out + c0 - i0, acc);
    } else {
      store_partial(out + c0 - i0, acc, width);
    }
  };
  int64_t c = i0;
  for (; c + kLanes <= i1; c += kLanes) columns(c, kLanes);
  if (c < i1) columns(c, i1 - c);
}

}  // namespace

const IsaKernels& TC_ISA_KERNELS() {
  static const IsaKernels k{&run_tile,        &softmax_rows,           &softmax_backward_rows,
                            &layer_norm_rows, &layer_norm_backward_rows, &reduce_block};
  return k;
}

}  // namespace torchcompile::fused
