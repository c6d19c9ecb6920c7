// The compiled optimizer step's loops (compile_optimizer, optimizer.cpp), compiled once per ISA:
// optimizer_kernels_avx512.cpp, _avx2.cpp and _sse2.cpp include optimizer_kernels_impl.h with
// their ISA's flags (src/CMakeLists.txt; -ffp-contract=off: a multiply and an add are fused only
// where LibTorch's kernels fuse them, written as an explicit fma), and
// selected_optimizer_kernels() picks one from the CPU and TORCHCOMPILE_ISA. No LibTorch header
// here or in the per-ISA files (an inline LibTorch function compiled with AVX-512 flags could be
// the copy the linker keeps).
#pragma once

#include <cstdint>

namespace torchcompile::compile_stage {

/// One SGD step of a parameter, with LibTorch's operations (torch::optim::SGD::step):
///   d = g; if weight_decay: d = d.add(p, weight_decay)            -> fma(p, wd, g)
///   momentum: buf = d (first step) or buf.mul_(momentum).add_(d, 1 - dampening)
///                                                                   -> fma(d, 1 - damp, buf * m)
///             d = nesterov ? d.add(buf, momentum) : buf             -> fma(buf, m, d)
///   p.add_(d, -lr)                                                  -> fma(d, -lr, p)
/// (ATen's add with a scalar factor is a fused multiply-add.)
struct SgdStep {
  float weight_decay = 0, momentum = 0, one_minus_dampening = 1, neg_lr = 0;
  bool nesterov = false;
  bool first = false;  // the momentum buffer is created by this step
};

/// One Adam / AdamW step of a parameter (torch::optim::Adam::step, AdamW::step):
///   AdamW: p.mul_(1 - lr * weight_decay); Adam: g = g.add(p, weight_decay)
///   m.mul_(beta1).add_(g, 1 - beta1)
///   v.mul_(beta2).addcmul_(g, g, 1 - beta2)      (self + value * t1 * t2)
///   amsgrad: vmax = max(v, vmax)
///   denom = (sqrt(v or vmax) / sqrt(bias_correction2)).add_(eps)
///   p.addcdiv_(m, denom, -lr / bias_correction1)  (self + value * t1 / t2)
struct AdamStep {
  bool adamw = false;  // amsgrad: the kernel is given a `vmax`
  float weight_decay = 0;  // Adam: on the gradient
  float decay = 1;         // AdamW: the factor 1 - lr * weight_decay (1: none)
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0, sqrt_bc2 = 1, eps = 0, neg_step_size = 0;
  /// Whether this LibTorch build's addcmul fuses its add with the last product (GCC contracts
  /// `self + value * t1 * t2` into a fused multiply-add in ATen's FMA kernels): probed once.
  bool addcmul_fused = true;
};

struct OptimizerKernels {
  const char* name;  // "avx512", "avx2" or "scalar (sse2)"
  /// Elements [0, n): `buf` is null without momentum.
  void (*sgd)(float* p, const float* g, float* buf, int64_t n, const SgdStep& s);
  /// Elements [0, n): `vmax` is null without amsgrad.
  void (*adam)(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamStep& s);
};

const OptimizerKernels& optimizer_kernels_avx512();
const OptimizerKernels& optimizer_kernels_avx2();
const OptimizerKernels& optimizer_kernels_sse2();
/// Those of support::selected_isa().
const OptimizerKernels& selected_optimizer_kernels();

}  // namespace torchcompile::compile_stage
