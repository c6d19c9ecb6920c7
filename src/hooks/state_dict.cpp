// state_dict / load_state_dict with PyTorch's hook points.
#include "hooks/hooks_internal.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <set>
#include <sstream>

namespace torchcompile {

namespace {

void save(torch::nn::Module& m, const std::string& prefix, bool keep_vars, StateDict& out) {
  auto hooks = detail::hooks_of(m);
  if (hooks)
    for (const auto& h : hooks->state_dict_pre) h.fn(m, prefix);
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    out.insert(prefix + p.key(), keep_vars ? p.value() : p.value().detach());
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    if (b.value().defined()) out.insert(prefix + b.key(), keep_vars ? b.value() : b.value().detach());
  for (const auto& c : m.named_children()) save(*c.value(), prefix + c.key() + ".", keep_vars, out);
  if (hooks)
    for (const auto& h : hooks->state_dict_post) h.fn(m, out, prefix);
}

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

void load(torch::nn::Module& m, const std::string& prefix, StateDict& dict, std::set<std::string>& used,
          IncompatibleKeys& keys, std::vector<std::string>& errors) {
  auto hooks = detail::hooks_of(m);
  if (hooks)
    for (const auto& h : hooks->load_pre) h.fn(m, dict, prefix);
  auto copy_in = [&](const std::string& name, at::Tensor& dst) {
    const std::string key = prefix + name;
    const at::Tensor* src = dict.find(key);
    if (src == nullptr) {
      keys.missing_keys.push_back(key);
      return;
    }
    used.insert(key);
    if (src->sizes() != dst.sizes()) {
      errors.push_back("size mismatch for " + key + ": copying a param with shape " + shape_str(*src) +
                       " from checkpoint, the shape in current model is " + shape_str(dst) + ".");
      return;
    }
    at::NoGradGuard no_grad;
    dst.copy_(*src);  // in place: identities (and compiled entries' guards) stay valid
  };
  for (auto& p : m.named_parameters(/*recurse=*/false)) copy_in(p.key(), p.value());
  for (auto& b : m.named_buffers(/*recurse=*/false))
    if (b.value().defined()) copy_in(b.key(), b.value());
  for (const auto& c : m.named_children()) load(*c.value(), prefix + c.key() + ".", dict, used, keys, errors);
}

void post_hooks(torch::nn::Module& m, IncompatibleKeys& keys) {
  if (auto hooks = detail::hooks_of(m))
    for (const auto& h : hooks->load_post) h.fn(m, keys);
  for (const auto& c : m.children()) post_hooks(*c, keys);
}

std::string quoted_list(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
  return s;
}

}  // namespace

StateDict state_dict(torch::nn::Module& module, bool keep_vars) {
  StateDict out("state_dict");
  save(module, "", keep_vars, out);
  return out;
}

IncompatibleKeys load_state_dict(torch::nn::Module& module, const StateDict& state_dict, bool strict) {
  StateDict dict = state_dict;  // pre hooks may edit it; the caller's dict is left alone
  std::set<std::string> used;
  IncompatibleKeys keys;
  std::vector<std::string> errors;
  load(module, "", dict, used, keys, errors);
  for (const auto& item : dict)
    if (!used.count(item.key())) keys.unexpected_keys.push_back(item.key());
  post_hooks(module, keys);
  if (strict) {
    if (!keys.unexpected_keys.empty())
      errors.insert(errors.begin(), "Unexpected key(s) in state_dict: " + quoted_list(keys.unexpected_keys) + ".");
    if (!keys.missing_keys.empty())
      errors.insert(errors.begin(), "Missing key(s) in state_dict: " + quoted_list(keys.missing_keys) + ".");
  }
  if (!errors.empty()) {
    std::string msg = "Error(s) in loading state_dict for " + module.name() + ":";
    for (const auto& e : errors) msg += "\n\t" + e;
    TORCH_CHECK(false, msg);
  }
  return keys;
}

}  // namespace torchcompile
