#include "runtime/call_state.h"

#include <torchcompile/ir/op_properties.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <functional>
#include <mutex>

namespace torchcompile::runtime {

GraphEffects effects_of(const ir::GraphModule& gm) {
  GraphEffects e;
  const ir::Graph& g = gm.graph();
  const auto placeholders = g.placeholders();
  std::function<void(const ir::Argument&)> note_argument;
  auto note_written = [&](const ir::Value& v) {
    const ir::Value base = ir::memory_base(v);
    if (base.node->kind() == ir::NodeKind::CallModule) {
      // A module called opaquely may return (views of) its arguments.
      for (const auto& a : base.node->args()) note_argument(a);
      return;
    }
    if (base.node->kind() == ir::NodeKind::Placeholder) {
      const size_t pos = std::find(placeholders.begin(), placeholders.end(), base.node) - placeholders.begin();
      if (pos < placeholders.size() &&
          std::find(e.written_inputs.begin(), e.written_inputs.end(), pos) == e.written_inputs.end())
        e.written_inputs.push_back(pos);
    } else if (base.node->kind() == ir::NodeKind::GetAttr) {
      const std::string& name = base.node->target();
      if (std::find(e.written_attributes.begin(), e.written_attributes.end(), name) == e.written_attributes.end())
        e.written_attributes.push_back(name);
    }
  };
  note_argument = [&](const ir::Argument& a) {
    if (a.is_value()) note_written(a.value());
    if (a.is_list())
      for (const auto& v : a.list())
        if (v) note_written(*v);
  };
  for (const auto& n : g.nodes()) {
    if (n->kind() == ir::NodeKind::CallModule) {
      e.opaque = e.random = true;
      for (const auto& a : n->args()) note_argument(a);
      continue;
    }
    if (n->kind() != ir::NodeKind::CallFunction) continue;
    e.random |= ir::node_is_random(*n);
    for (size_t i : ir::written_arguments(*n)) note_argument(n->args()[i]);
  }
  return e;
}

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
