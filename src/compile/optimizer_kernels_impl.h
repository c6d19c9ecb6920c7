// The compiled optimizer step's loops for one ISA (optimizer_kernels.h): each per-ISA file
// defines TC_OPTIMIZER_KERNELS (the table's function) and TC_OPTIMIZER_ISA (its name) and
// includes this file. The loops have internal linkage and call no inline function of a library
// header; the file is compiled with -ffp-contract=off, so each fused multiply-add is the explicit
// __builtin_fmaf where LibTorch's kernels have one.
#pragma once

#if !defined(TC_OPTIMIZER_KERNELS) || !defined(TC_OPTIMIZER_ISA)
#error "define TC_OPTIMIZER_KERNELS and TC_OPTIMIZER_ISA before including optimizer_kernels_impl.h"
#endif

#include "compile/optimizer_kernels.h"

namespace torchcompile::compile_stage {
namespace {

template <bool kDecay, bool kFirst, bool kNesterov>
void sgd_momentum(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n, const SgdStep& s) {
  const float wd = s.weight_decay, mom = s.momentum, damp = s.one_minus_dampening, neg_lr = s.neg_lr;
  for (int64_t i = 0; i < n; ++i) {
    float d = kDecay ? __builtin_fmaf(p[i], wd, g[i]) : g[i];
    const float b = kFirst ? d : __builtin_fmaf(d, damp, buf[i] * mom);
    buf[i] = b;
    d = kNesterov ? __builtin_fmaf(b, mom, d) : b;
    p[i] = __builtin_fmaf(d, neg_lr, p[i]);
  }
}

template <bool kDecay>
void sgd_plain(float* __restrict p, const float* __restrict g, int64_t n, const SgdStep& s) {
  const float wd = s.weight_decay, neg_lr = s.neg_lr;
  for (int64_t i = 0; i < n; ++i) {
    const float d = kDecay ? __builtin_fmaf(p[i], wd, g[i]) : g[i];
    p[i] = __builtin_fmaf(d, neg_lr, p[i]);
  }
}

template <bool kDecay>
void sgd_1(float* p, const float* g, float* buf, int64_t n, const SgdStep& s) {
  if (!buf) return sgd_plain<kDecay>(p, g, n, s);
  if (s.first) {
    return s.nesterov ? sgd_momentum<kDecay, true, true>(p, g, buf, n, s) : sgd_momentum<kDecay, true, false>(p, g, buf, n, s);
  }
  return s.nesterov ? sgd_momentum<kDecay, false, true>(p, g, buf, n, s) : sgd_momentum<kDecay, false, false>(p, g, buf, n, s);
}

void sgd(float* p, const float* g, float* buf, int64_t n, const SgdStep& s) {
  if (s.weight_decay != 0.f) {
    sgd_1<true>(p, g, buf, n, s);
  } else {
    sgd_1<false>(p, g, buf, n, s);
  }
}

// One variant per combination of the step's switches, each a loop without branches (vectorized);
// the scalars are copied out of `s` first (the stores could alias it otherwise).
template <bool kAdamW, bool kDecay, bool kAmsgrad, bool kFusedAddcmul>
void adam_loop(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
               float* __restrict vmax, int64_t n, const AdamStep& s) {
  const float wd = s.weight_decay, decay = s.decay, b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2,
              c2 = s.one_minus_beta2, sqrt_bc2 = s.sqrt_bc2, eps = s.eps, neg_step = s.neg_step_size;
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i], gi = g[i];
    if (kAdamW && kDecay) pi = pi * decay;
    if (!kAdamW && kDecay) gi = __builtin_fmaf(pi, wd, gi);
    const float mi = __builtin_fmaf(gi, c1, m[i] * b1);
    const float vd = v[i] * b2, prod = c2 * gi;
    const float vi = kFusedAddcmul ? __builtin_fmaf(prod, gi, vd) : vd + prod * gi;
    m[i] = mi;
    v[i] = vi;
    float w = vi;
    if (kAmsgrad) {
      const float a = vi, b = vmax[i];
      w = a != a ? a : b != b ? b : a > b ? a : b;  // ATen's maximum: a NaN wins
      vmax[i] = w;
    }
    const float denom = __builtin_sqrtf(w) / sqrt_bc2 + eps;
    p[i] = pi + neg_step * mi / denom;
  }
}

template <bool kAdamW, bool kDecay, bool kAmsgrad>
void adam_3(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamStep& s) {
  if (s.addcmul_fused) {
    adam_loop<kAdamW, kDecay, kAmsgrad, true>(p, g, m, v, vmax, n, s);
  } else {
    adam_loop<kAdamW, kDecay, kAmsgrad, false>(p, g, m, v, vmax, n, s);
  }
}

template <bool kAdamW, bool kDecay>
void adam_2(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamStep& s) {
  if (vmax) {
    adam_3<kAdamW, kDecay, true>(p, g, m, v, vmax, n, s);
  } else {
    adam_3<kAdamW, kDecay, false>(p, g, m, v, vmax, n, s);
  }
}

template <bool kAdamW>
void adam_1(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamStep& s) {
  if (kAdamW ? s.decay != 1.f : s.weight_decay != 0.f) {
    adam_2<kAdamW, true>(p, g, m, v, vmax, n, s);
  } else {
    adam_2<kAdamW, false>(p, g, m, v, vmax, n, s);
  }
}

void adam(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamStep& s) {
  if (s.adamw) {
    adam_1<true>(p, g, m, v, vmax, n, s);
  } else {
    adam_1<false>(p, g, m, v, vmax, n, s);
  }
}

}  // namespace

const OptimizerKernels& TC_OPTIMIZER_KERNELS() {
  static constexpr OptimizerKernels kernels{TC_OPTIMIZER_ISA, &sgd, &adam};
  return kernels;
}

}  // namespace torchcompile::compile_stage
