#include "runtime/guards.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/nn/module.h>

#include <sstream>

namespace torchcompile::runtime {

namespace {

const char* kind_name(ArgItem::Kind k) {
  switch (k) {
    case ArgItem::Tensor: return "Tensor";
    case ArgItem::TensorList: return "std::vector<Tensor>";
    case ArgItem::Int: return "int";
    case ArgItem::Double: return "double";
    case ArgItem::Bool: return "bool";
  }
  return "?";
}

std::string item_value(const ArgItem& it) {
  std::ostringstream os;
  switch (it.kind) {
    case ArgItem::Double: os << it.d; break;
    case ArgItem::Bool: os << (it.i ? "true" : "false"); break;
    default: os << it.i; break;
  }
  return os.str();
}

template <typename T>
std::string join(const T& xs) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
  os << "]";
  return os.str();
}

}  // namespace

std::vector<std::string> tensor_input_names(const CallArgs& args, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t k = 0; k < args.items.size(); ++k) {
    const ArgItem& it = args.items[k];
    std::string base = k < names.size() ? names[k] : "arg" + std::to_string(k);
    switch (it.kind) {
      case ArgItem::Tensor:
        if (it.i) out.push_back(base);
        break;
      case ArgItem::TensorList:
        for (int64_t i = 0; i < it.i; ++i) out.push_back(base + "_" + std::to_string(i));
        break;
      default: break;
    }
  }
  return out;
}

std::unique_ptr<GuardSet> GuardSet::build(const CallArgs& args, const std::shared_ptr<torch::nn::Module>& root,
                                          std::vector<std::string> input_names) {
  auto g = std::make_unique<GuardSet>();
  g->items_ = args.items;
  g->tensor_names_ = tensor_input_names(args, input_names);
  for (size_t i = 0; i < args.tensors.size(); ++i) {
    const at::Tensor& t = args.tensors[i];
    TensorGuard tg{t.defined(), c10::ScalarType::Undefined, c10::Device(c10::DeviceType::CPU), false, {}, {}};
    if (t.defined()) {
      tg.dtype = t.scalar_type();
      tg.device = t.device();
      tg.requires_grad = t.requires_grad();
      tg.sizes.assign(t.sizes().begin(), t.sizes().end());
      if (t.layout() == c10::kStrided) tg.strides.assign(t.strides().begin(), t.strides().end());
      for (size_t j = 0; j < i; ++j) {
        if (args.tensors[j].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          g->same_tensor_.emplace_back(static_cast<uint32_t>(j), static_cast<uint32_t>(i));
          break;
        }
      }
    }
    g->tensors_.push_back(std::move(tg));
  }
  g->grad_mode_ = at::GradMode::is_enabled();
  g->inference_mode_ = c10::InferenceMode::is_enabled();
  if (root) {
    for (const auto& item : root->named_modules(/*name_prefix=*/"", /*include_self=*/true))
      g->modules_.push_back({item.value(), item.key().empty() ? std::string("<root>") : item.key(), item.value()->is_training()});
  }
  return g;
}

bool GuardSet::check(const CallArgs& args) const { return evaluate(args, nullptr); }

std::string GuardSet::failure_reason(const CallArgs& args) const {
  std::string reason;
  evaluate(args, &reason);
  return reason;
}

bool GuardSet::evaluate(const CallArgs& args, std::string* reason) const {
  auto fail = [&](auto&&... parts) {
    if (reason) {
      std::ostringstream os;
      (os << ... << parts);
      *reason = os.str();
    }
    return false;
  };
  if (args.items.size() != items_.size())
    return fail("argument count mismatch: expected ", items_.size(), ", got ", args.items.size());
  for (size_t k = 0; k < items_.size(); ++k) {
    const ArgItem& e = items_[k];
    const ArgItem& a = args.items[k];
    if (e.kind != a.kind) return fail("argument ", k, " type mismatch: expected ", kind_name(e.kind), ", got ", kind_name(a.kind));
    if (!(e == a)) {
      const char* what = e.kind == ArgItem::TensorList ? " length" : e.kind == ArgItem::Tensor ? " presence" : "";
      return fail("argument ", k, what, " mismatch: expected ", item_value(e), ", got ", item_value(a));
    }
  }
  if (args.tensors.size() != tensors_.size())
    return fail("tensor input count mismatch: expected ", tensors_.size(), ", got ", args.tensors.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorGuard& g = tensors_[i];
    const at::Tensor& t = args.tensors[i];
    const std::string& name = tensor_names_[i];
    if (t.defined() != g.defined) return fail("tensor '", name, "' definedness mismatch");
    if (!g.defined) continue;
    if (t.scalar_type() != g.dtype) return fail("tensor '", name, "' dtype mismatch: expected ", g.dtype, ", got ", t.scalar_type());
    if (t.device() != g.device) return fail("tensor '", name, "' device mismatch: expected ", g.device, ", got ", t.device());
    if (t.requires_grad() != g.requires_grad)
      return fail("tensor '", name, "' requires_grad mismatch: expected ", g.requires_grad, ", got ", t.requires_grad());
    auto sizes = t.sizes();
    if (sizes.size() != g.sizes.size())
      return fail("tensor '", name, "' dimensionality mismatch: expected ", g.sizes.size(), ", got ", sizes.size());
    for (size_t d = 0; d < sizes.size(); ++d)
      if (sizes[d] != g.sizes[d])
        return fail("tensor '", name, "' size mismatch at index ", d, ": expected ", g.sizes[d], ", got ", sizes[d]);
    if (!g.strides.empty()) {
      auto strides = t.strides();
      for (size_t d = 0; d < strides.size(); ++d)
        if (strides[d] != g.strides[d])
          return fail("tensor '", name, "' stride mismatch at index ", d, ": expected ", g.strides[d], ", got ", strides[d]);
    }
  }
  for (const auto& [i, j] : same_tensor_)
    if (args.tensors[i].unsafeGetTensorImpl() != args.tensors[j].unsafeGetTensorImpl())
      return fail("tensor '", tensor_names_[j], "' was the same tensor as '", tensor_names_[i], "' when traced");
  if (at::GradMode::is_enabled() != grad_mode_)
    return fail("grad mode mismatch: expected ", grad_mode_, ", got ", !grad_mode_);
  if (c10::InferenceMode::is_enabled() != inference_mode_)
    return fail("inference mode mismatch: expected ", inference_mode_, ", got ", !inference_mode_);
  for (const ModuleGuard& m : modules_)
    if (m.module->is_training() != m.training)
      return fail("module '", m.path, "' training flag mismatch: expected ", m.training, ", got ", !m.training);
  return true;
}

std::vector<std::string> GuardSet::describe() const {
  std::vector<std::string> out;
  for (size_t k = 0; k < items_.size(); ++k) {
    const ArgItem& it = items_[k];
    if (it.kind == ArgItem::Tensor && it.i) continue;
    out.push_back("argument " + std::to_string(k) + " is " + kind_name(it.kind) + " " + item_value(it));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorGuard& g = tensors_[i];
    std::ostringstream os;
    os << "tensor '" << tensor_names_[i] << "': ";
    if (!g.defined) {
      os << "undefined";
    } else {
      os << g.dtype << ", " << g.device << ", sizes " << join(g.sizes) << ", strides " << join(g.strides)
         << ", requires_grad " << g.requires_grad;
    }
    out.push_back(os.str());
  }
  for (const auto& [i, j] : same_tensor_)
    out.push_back("tensor '" + tensor_names_[j] + "' is tensor '" + tensor_names_[i] + "'");
  out.push_back(std::string("grad mode ") + (grad_mode_ ? "enabled" : "disabled"));
  out.push_back(std::string("inference mode ") + (inference_mode_ ? "enabled" : "disabled"));
  for (const ModuleGuard& m : modules_) out.push_back("module '" + m.path + "' training=" + (m.training ? "true" : "false"));
  return out;
}

}  // namespace torchcompile::runtime
