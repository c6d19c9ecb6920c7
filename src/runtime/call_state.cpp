#include "runtime/call_state.h"

#include <torchcompile/ir/op_properties.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <functional>
#include <mutex>

namespace torchcompile::runtime {

StateSnapshot::Saved* StateSnapshot::find(const at::Tensor& t) {
  for (Saved& s : tensors_)
    if (s.live.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return &s;
  return nullptr;
}

// A view's grad_fn as stored: grad_fn() would build a new one from its base when the version
// moved. A tensor that is not a view has no other.
StateSnapshot::Saved StateSnapshot::history_of(const at::Tensor& t) {
  Saved s;
  s.live = t;
  s.view = t.is_view();
  if (const auto* meta = torch::autograd::impl::get_autograd_meta(t)) {
    s.grad_fn = meta->grad_fn_;
    s.output_nr = meta->output_nr_;
  }
  return s;
}

void StateSnapshot::save(const at::Tensor& t) {
  if (!t.defined()) return;
  Saved* known = find(t);
  if (known != nullptr && known->contents) return;
  Saved s = known != nullptr ? *known : history_of(t);  // the history as first seen
  s.contents = true;
  {
    at::NoGradGuard no_grad;
    s.copy = t.clone();
  }
  if (known != nullptr) {
    *known = std::move(s);
  } else {
    tensors_.push_back(std::move(s));
  }
}

void StateSnapshot::save_history(const at::Tensor& t) {
  if (!t.defined() || find(t) != nullptr) return;
  Saved s = history_of(t);
  s.contents = false;
  tensors_.push_back(std::move(s));
}

void StateSnapshot::save_rng() {
  if (rng_) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  rng_ = gen.clone();
}

void StateSnapshot::restore() const {
  {
    at::NoGradGuard no_grad;
    // Newest first: where two saved tensors share memory (a buffer, then a view of it saved
    // after a segment changed it), the oldest copy is what was there when the call began.
    for (auto it = tensors_.rbegin(); it != tensors_.rend(); ++it)
      if (it->contents) it->live.copy_(it->copy);
  }
  for (const Saved& s : tensors_) {
    if (!s.view) {
      if (s.live.grad_fn() != s.grad_fn)
        torch::autograd::impl::set_gradient_edge(s.live, torch::autograd::Edge(s.grad_fn, s.output_nr));
      continue;
    }
    // Not set_gradient_edge, which also marks a view's grad_fn current for its version: with
    // the stored one back (none, mostly), autograd rebuilds it from the restored base if that
    // base requires grad, and otherwise leaves the view without history, as it was.
    auto* meta = torch::autograd::impl::get_autograd_meta(s.live);
    if (meta != nullptr && meta->grad_fn_ != s.grad_fn) {
      meta->grad_fn_ = s.grad_fn;
      meta->output_nr_ = s.output_nr;
    }
  }
  if (rng_) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    at::Tensor state = rng_->get_state();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
}

}  // namespace torchcompile::runtime
