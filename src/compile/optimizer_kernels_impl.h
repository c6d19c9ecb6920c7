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

void sgd(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n, const SgdStep& s) {
  const float wd = s.weight_decay, mom = s.momentum, damp = s.one_minus_dampening, neg_lr = s.neg_lr;
  if (!buf) {
    for (int64_t i = 0; i < n; ++i) {
      const float d = wd != 0.f ? __builtin_fmaf(p[i], wd, g[i]) : g[i];
      p[i] = __builtin_fmaf(d, neg_lr, p[i]);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    float d = wd != 0.f ? __builtin_fmaf(p[i], wd, g[i]) : g[i];
    const float b = s.first ? d : __builtin_fmaf(d, damp, buf[i] * mom);
    buf[i] = b;
    d = s.nesterov ? __builtin_fmaf(b, mom, d) : b;
    p[i] = __builtin_fmaf(d, neg_lr, p[i]);
  }
}

void adam(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
          float* __restrict vmax, int64_t n, const AdamStep& s) {
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i], gi = g[i];
    if (s.adamw) {
      pi = pi * s.decay;
    } else if (s.weight_decay != 0.f) {
      gi = __builtin_fmaf(pi, s.weight_decay, gi);
    }
    const float mi = __builtin_fmaf(gi, s.one_minus_beta1, m[i] * s.beta1);
    const float vd = v[i] * s.beta2, prod = s.one_minus_beta2 * gi;
    const float vi = s.addcmul_fused ? __builtin_fmaf(prod, gi, vd) : vd + prod * gi;
    m[i] = mi;
    v[i] = vi;
    float w = vi;
    if (vmax) {
      const float a = vi, b = vmax[i];
      w = a != a ? a : b != b ? b : a > b ? a : b;  // ATen's maximum: a NaN wins
      vmax[i] = w;
    }
    const float denom = __builtin_sqrtf(w) / s.sqrt_bc2 + s.eps;
    p[i] = pi + s.neg_step_size * mi / denom;
  }
}

}  // namespace

const OptimizerKernels& TC_OPTIMIZER_KERNELS() {
  static constexpr OptimizerKernels kernels{TC_OPTIMIZER_ISA, &sgd, &adam};
  return kernels;
}

}  // namespace torchcompile::compile_stage
