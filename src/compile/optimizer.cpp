// compile_optimizer (compile/optimizer.h): LibTorch's SGD, Adam and AdamW steps as one pass per
// parameter (the loops are in optimizer_kernels_impl.h), on the optimizer's own state.
#include <torchcompile/compile/optimizer.h>

#include "compile/optimizer_kernels.h"

#include <torchcompile/compat.h>
#include <torchcompile/support/isa.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

// at::parallel_for is an `omp parallel` region inline in LibTorch's headers: without OpenMP this
// file's parallel loops would silently run on one thread (CMakeLists.txt adds the flag).
#ifndef _OPENMP
#error "compile this file with OpenMP (at::parallel_for)"
#endif
#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <typeinfo>

namespace torchcompile {

namespace compile_stage {

const OptimizerKernels& selected_optimizer_kernels() {
  switch (support::selected_isa()) {
    case support::Isa::Avx512: return optimizer_kernels_avx512();
    case support::Isa::Avx2: return optimizer_kernels_avx2();
    case support::Isa::Sse2: return optimizer_kernels_sse2();
  }
  return optimizer_kernels_sse2();
}

}  // namespace compile_stage

namespace {

using compile_stage::AdamStep;
using compile_stage::OptimizerKernels;
using compile_stage::SgdStep;

enum class Kind { Sgd, Adam, AdamW };

// Whether ATen's addcmul rounds `self + value * t1 * t2` once for the last product and the sum
// (a fused multiply-add, as GCC contracts it in the FMA kernels) or twice: values where the two
// differ, in a tensor long enough for the vectorized loop.
bool addcmul_is_fused() {
  static const bool fused = [] {
    at::NoGradGuard no_grad;
    const int64_t n = 64;
    at::Tensor self = at::full({n}, 1.0f), t = at::full({n}, 1.0f + std::ldexp(1.0f, -12));
    // 1 + (1 + 2^-12)^2 = 2 + 2^-11 + 2^-24: the product rounded first (to 1 + 2^-11) loses the
    // 2^-24 that a fused operation keeps until the final rounding (of 2 + 2^-11 + 2^-24, to
    // 2 + 2^-11 + 2^-22 or 2 + 2^-11: apart by one unit).
    at::Tensor r = self.addcmul(t, t, 1.0);
    const float fused_value = std::fma(t[0].item<float>(), t[0].item<float>(), 1.0f);
    return r[n / 2].item<float>() == fused_value;
  }();
  return fused;
}

// A parameter the loops take: float32 on the CPU, dense, its gradient and state tensors
// contiguous like it.
bool fast(const at::Tensor& p, const at::Tensor& g, std::initializer_list<const at::Tensor*> state) {
  auto ok = [&](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat &&
           t.is_contiguous() && t.sizes() == p.sizes() && !t.is_neg() && !t.is_conj();
  };
  if (!ok(p) || !ok(g)) return false;
  for (const at::Tensor* t : state)
    if (t && !ok(*t)) return false;
  return true;
}

// Runs `body(begin, end)` over [0, n) in chunks: inline below ATen's grain size (an OpenMP region
// costs more than a small parameter's pass).
template <class F>
void for_range(int64_t n, const F& body) {
  if (n < at::internal::GRAIN_SIZE) {
    body(0, n);
  } else {
    at::parallel_for(0, n, at::internal::GRAIN_SIZE / 2, body);
  }
}

void bump(const at::Tensor& t) { t.unsafeGetTensorImpl()->bump_version(); }

}  // namespace

struct CompiledOptimizer::Impl {
  torch::optim::Optimizer* opt = nullptr;
  Kind kind = Kind::Sgd;
  const OptimizerKernels* kernels = nullptr;

  template <class State>
  State* find_state(const at::Tensor& p) {
    auto& map = opt->state();
    auto it = map.find(compat::optimizer_state_key<std::decay_t<decltype(map)>>(p.unsafeGetTensorImpl()));
    return it == map.end() ? nullptr : static_cast<State*>(it->second.get());
  }
  template <class State>
  State& new_state(const at::Tensor& p) {
    auto& map = opt->state();
    auto state = std::make_unique<State>();
    State& ref = *state;
    map[compat::optimizer_state_key<std::decay_t<decltype(map)>>(p.unsafeGetTensorImpl())] = std::move(state);
    return ref;
  }

  void sgd(const torch::optim::SGDOptions& o, at::Tensor& p) {
    const at::Tensor& grad = p.grad();
    torch::optim::SGDParamState* state = o.momentum() != 0 ? find_state<torch::optim::SGDParamState>(p) : nullptr;
    const bool first = o.momentum() != 0 && !state;
    at::Tensor buf = state ? state->momentum_buffer() : at::Tensor();
    if (first) buf = at::empty_like(grad, at::MemoryFormat::Preserve);
    if (!grad.is_sparse() && fast(p, grad, {o.momentum() != 0 ? &buf : nullptr})) {
      SgdStep s;
      s.weight_decay = static_cast<float>(o.weight_decay());
      s.momentum = static_cast<float>(o.momentum());
      s.one_minus_dampening = static_cast<float>(1 - o.dampening());
      s.neg_lr = static_cast<float>(-1 * o.lr());
      s.nesterov = o.nesterov();
      s.first = first;
      float *pp = p.data_ptr<float>(), *bp = buf.defined() ? buf.data_ptr<float>() : nullptr;
      const float* gp = grad.data_ptr<float>();
      for_range(p.numel(), [&](int64_t b, int64_t e) {
        kernels->sgd(pp + b, gp + b, bp ? bp + b : nullptr, e - b, s);
      });
      if (buf.defined() && !first) bump(buf);
    } else {  // LibTorch's operations
      at::Tensor d_p = grad;
      if (o.weight_decay() != 0) d_p = d_p.add(p, o.weight_decay());
      if (o.momentum() != 0) {
        if (first) {
          buf = at::clone(d_p).detach();
        } else {
          buf.mul_(o.momentum()).add_(d_p, 1 - o.dampening());
        }
        d_p = o.nesterov() ? d_p.add(buf, o.momentum()) : buf;
      }
      p.data().add_(d_p, -1 * o.lr());
    }
    if (first) new_state<torch::optim::SGDParamState>(p).momentum_buffer(buf);
  }

  template <class Options, class State>
  void adam(const Options& o, at::Tensor& p) {
    const at::Tensor& grad = p.grad();
    TORCH_CHECK(!grad.is_sparse(), kind == Kind::Adam ? "Adam" : "AdamW",
                " does not support sparse gradients");  // LibTorch's own check
    const bool adamw = kind == Kind::AdamW;
    State* state = find_state<State>(p);
    if (!state) {
      state = &new_state<State>(p);
      state->step(0);
      state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (o.amsgrad()) state->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    }
    at::Tensor &m = state->exp_avg(), &v = state->exp_avg_sq(), &vmax = state->max_exp_avg_sq();
    state->step(state->step() + 1);
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    const double bias_correction1 = 1 - std::pow(beta1, state->step());
    const double bias_correction2 = 1 - std::pow(beta2, state->step());
    const double step_size = o.lr() / bias_correction1;
    if (fast(p, grad, {&m, &v, o.amsgrad() ? &vmax : nullptr})) {
      AdamStep s;
      s.adamw = adamw;
      if (adamw) {
        s.decay = o.weight_decay() != 0 ? static_cast<float>(1 - o.lr() * o.weight_decay()) : 1.f;
      } else {
        s.weight_decay = static_cast<float>(o.weight_decay());
      }
      s.beta1 = static_cast<float>(beta1);
      s.one_minus_beta1 = static_cast<float>(1 - beta1);
      s.beta2 = static_cast<float>(beta2);
      s.one_minus_beta2 = static_cast<float>(1 - beta2);
      s.sqrt_bc2 = static_cast<float>(std::sqrt(bias_correction2));
      s.eps = static_cast<float>(o.eps());
      s.neg_step_size = static_cast<float>(-step_size);
      s.addcmul_fused = addcmul_is_fused();
      float *pp = p.data_ptr<float>(), *mp = m.data_ptr<float>(), *vp = v.data_ptr<float>(),
            *xp = o.amsgrad() ? vmax.data_ptr<float>() : nullptr;
      const float* gp = grad.data_ptr<float>();
      for_range(p.numel(), [&](int64_t b, int64_t e) {
        kernels->adam(pp + b, gp + b, mp + b, vp + b, xp ? xp + b : nullptr, e - b, s);
      });
      for (const at::Tensor* t : {&p, &m, &v, o.amsgrad() ? &vmax : nullptr})
        if (t) bump(*t);
    } else {  // LibTorch's operations (AdamW's decay comes first there; nothing between reads p)
      if (adamw && o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
      at::Tensor g = grad;
      if (!adamw && o.weight_decay() != 0) g = g.add(p, o.weight_decay());
      m.mul_(beta1).add_(g, 1 - beta1);
      v.mul_(beta2).addcmul_(g, g, 1 - beta2);
      at::Tensor denom;
      if (o.amsgrad()) {
        at::max_out(vmax, v, vmax);
        denom = (vmax.sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
      } else {
        denom = (v.sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
      }
      p.addcdiv_(m, denom, -step_size);
    }
  }
};

CompiledOptimizer::CompiledOptimizer(torch::optim::Optimizer& optimizer) : impl_(std::make_shared<Impl>()) {
  impl_->opt = &optimizer;
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) {
    impl_->kind = Kind::Sgd;
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    impl_->kind = Kind::AdamW;
  } else if (dynamic_cast<torch::optim::Adam*>(&optimizer)) {
    impl_->kind = Kind::Adam;
  } else {
    TORCH_CHECK(false, "compile_optimizer: expected a torch::optim::SGD, Adam or AdamW, got ",
                c10::demangle(typeid(optimizer).name()));
  }
  impl_->kernels = &compile_stage::selected_optimizer_kernels();
}

void CompiledOptimizer::step() {
  Impl& im = *impl_;
  at::NoGradGuard no_grad;
  for (auto& group : im.opt->param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      switch (im.kind) {
        case Kind::Sgd: im.sgd(static_cast<const torch::optim::SGDOptions&>(group.options()), p); break;
        case Kind::Adam:
          im.adam<torch::optim::AdamOptions, torch::optim::AdamParamState>(
              static_cast<const torch::optim::AdamOptions&>(group.options()), p);
          break;
        case Kind::AdamW:
          im.adam<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
              static_cast<const torch::optim::AdamWOptions&>(group.options()), p);
          break;
      }
    }
  }
}

torch::optim::Optimizer& CompiledOptimizer::optimizer() const { return *impl_->opt; }

const char* CompiledOptimizer::kind() const {
  switch (impl_->kind) {
    case Kind::Sgd: return "SGD";
    case Kind::Adam: return "Adam";
    case Kind::AdamW: return "AdamW";
  }
  return "";
}

CompiledOptimizer compile_optimizer(torch::optim::Optimizer& optimizer) { return CompiledOptimizer(optimizer); }

}  // namespace torchcompile
