// Module hooks for the LibTorch C++ frontend (PyTorch's nn.Module hooks), and state_dict with
// hooks (docs/hooks.md).
//
//     auto h = torchcompile::register_forward_hook(net->fc1,
//         [&](torch::nn::Module&, const Tensors& inputs, const Tensors& outputs) { feats["fc1"] = outputs[0]; });
//     y = torchcompile::call(net->fc1, x);   // inside Net::forward: fires fc1's hooks
//     h.remove();
//
// Where hooks fire. The C++ frontend has no call boundary of its own (`fc1->forward(x)` and
// `fc1(x)` call the forward directly), so hooks fire when a module is called through
// `torchcompile::call(module, args...)`, and for the top-level module of `torch::compile`.
// Eager and compiled calls fire the same hooks in the same order with the same tensors.
//
// What a hook sees. The forward's arguments and results are flattened into tensors, in order:
// a `Tensor` is one, a `std::vector<Tensor>` its elements, a `c10::optional<Tensor>` one if
// present; tuples and pairs of results are flattened element by element. Scalar arguments are
// not shown to hooks. A hook that replaces tensors returns as many as it was given; returning
// `std::nullopt` (or nothing, for hooks written as `void` lambdas) keeps them.
//
// Compiled modules. A hook registered with `HookOptions().traceable(true)` promises to only
// transform tensors (no host side effects); it is inlined into the captured graph. Any other
// hook, and every backward hook, runs on every compiled call with the real tensors: the module
// it is registered on becomes one opaque `call_module` node of its parent's graph, and its own
// forward is compiled as a graph of its own. Registering or removing a hook after compilation
// is noticed by the next call (a guard that costs one atomic load while no hook changed).
//
// Handles. A RemovableHandle removes its hook on remove(); dropping the handle keeps the hook
// registered (as in PyTorch, where the hook lives until removed).
//
// Thread safety. Registration and removal are thread-safe. A call that is running when a hook
// is registered or removed may or may not see the change; the next call does.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace torchcompile {

/// The tensors of a call, flattened (see the header comment).
using Tensors = std::vector<at::Tensor>;

/// `hook(module, inputs)`: runs before the forward; may return replacement inputs.
using ForwardPreHook = std::function<std::optional<Tensors>(torch::nn::Module& module, const Tensors& inputs)>;
/// `hook(module, inputs, outputs)`: runs after the forward; may return replacement outputs.
using ForwardHook =
    std::function<std::optional<Tensors>(torch::nn::Module& module, const Tensors& inputs, const Tensors& outputs)>;
/// `hook(module, grad_output)`: runs when the gradients of the module's outputs are computed,
/// before those of its inputs; may return replacement grad_output. Undefined tensors stand for
/// outputs that received no gradient.
using BackwardPreHook = std::function<std::optional<Tensors>(torch::nn::Module& module, const Tensors& grad_output)>;
/// `hook(module, grad_input, grad_output)`: runs when the gradients of the module's tensor
/// inputs are computed; may return replacement grad_input. If no input requires grad, it runs
/// with undefined grad_input once grad_output is known (as PyTorch does).
using BackwardHook = std::function<std::optional<Tensors>(torch::nn::Module& module, const Tensors& grad_input,
                                                          const Tensors& grad_output)>;

/// Registration options, as PyTorch's keyword arguments.
struct HookOptions {
  /// Fire before the hooks already registered (PyTorch's `prepend=True`).
  bool prepend_ = false;
  /// Forward hooks only: also fire when the forward throws, with empty outputs, before the
  /// exception propagates (PyTorch's `always_call=True`).
  bool always_call_ = false;
  /// Forward pre-hooks and forward hooks only: the hook only transforms tensors (no host side
  /// effects, same tensor calls for the same inputs), so a compiled module inlines it.
  bool traceable_ = false;

  HookOptions& prepend(bool v = true) { prepend_ = v; return *this; }
  HookOptions& always_call(bool v = true) { always_call_ = v; return *this; }
  HookOptions& traceable(bool v = true) { traceable_ = v; return *this; }
};

namespace detail {
struct HookTable;
}  // namespace detail

/// Removes one registered hook. Copyable; all copies refer to the same hook.
class RemovableHandle {
 public:
  RemovableHandle() = default;
  /// Remove the hook (no effect if already removed or never registered).
  void remove();
  /// Whether the hook is still registered.
  bool active() const;
  /// The hook's id, unique in the process.
  uint64_t id() const { return id_; }

 private:
  friend struct detail::HookTable;
  RemovableHandle(std::shared_ptr<detail::HookTable> table, uint64_t id) : table_(std::move(table)), id_(id) {}
  std::shared_ptr<detail::HookTable> table_;
  uint64_t id_ = 0;
};

// ---- state_dict -----------------------------------------------------------------------------

/// Parameters and buffers by qualified name, in `named_parameters()` then `named_buffers()`
/// order per module, modules in pre-order (as PyTorch's state_dict).
using StateDict = torch::OrderedDict<std::string, at::Tensor>;

/// What load_state_dict did not match.
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;     ///< the module's keys absent from the dict
  std::vector<std::string> unexpected_keys;  ///< the dict's keys the module does not have
};

/// `hook(module, prefix)`: before `module`'s entries are saved.
using StateDictPreHook = std::function<void(torch::nn::Module& module, const std::string& prefix)>;
/// `hook(module, state_dict, prefix)`: after `module`'s and its submodules' entries are saved;
/// may edit the dict.
using StateDictPostHook =
    std::function<void(torch::nn::Module& module, StateDict& state_dict, const std::string& prefix)>;
/// `hook(module, state_dict, prefix)`: before `module`'s entries are loaded; may edit the dict
/// (rename or convert keys of an older checkpoint).
using LoadStateDictPreHook =
    std::function<void(torch::nn::Module& module, StateDict& state_dict, const std::string& prefix)>;
/// `hook(module, incompatible_keys)`: after the whole load, once per module; may clear keys
/// (before `strict` turns them into an error).
using LoadStateDictPostHook = std::function<void(torch::nn::Module& module, IncompatibleKeys& keys)>;

/// The module's state (tensors detached unless `keep_vars`), running the state_dict hooks of
/// every module in the tree.
StateDict state_dict(torch::nn::Module& module, bool keep_vars = false);

/// Copy `state_dict` into the module's existing parameters and buffers (in place, without
/// grad: a compiled module sees the new values on its next call and does not recompile),
/// running the load hooks. With `strict`, missing or unexpected keys left after the post
/// hooks throw, listing them; a shape mismatch always throws, naming the key and both shapes.
IncompatibleKeys load_state_dict(torch::nn::Module& module, const StateDict& state_dict, bool strict = true);

// ---- registration ----------------------------------------------------------------------------

/// Keep `module` as one `call_module` node run eagerly inside the graph of any compiled module
/// that calls it through torchcompile::call (for forwards the tracer cannot follow). Its hooks
/// still fire.
void mark_leaf(torch::nn::Module& module, bool leaf = true);
bool is_leaf(const torch::nn::Module& module);

namespace detail {

inline torch::nn::Module& as_module(torch::nn::Module& m) { return m; }
template <typename M>
torch::nn::Module& as_module(const std::shared_ptr<M>& m) {
  TORCH_CHECK(m != nullptr, "torchcompile: hook registration on a null module");
  return *m;
}
template <typename Impl>
torch::nn::Module& as_module(const torch::nn::ModuleHolder<Impl>& h) {
  return *h.ptr();
}

RemovableHandle add_forward_pre_hook(torch::nn::Module& m, ForwardPreHook hook, const HookOptions& o);
RemovableHandle add_forward_hook(torch::nn::Module& m, ForwardHook hook, const HookOptions& o);
RemovableHandle add_backward_pre_hook(torch::nn::Module& m, BackwardPreHook hook, const HookOptions& o);
RemovableHandle add_backward_hook(torch::nn::Module& m, BackwardHook hook, const HookOptions& o);
RemovableHandle add_state_dict_pre_hook(torch::nn::Module& m, StateDictPreHook hook, const HookOptions& o);
RemovableHandle add_state_dict_post_hook(torch::nn::Module& m, StateDictPostHook hook, const HookOptions& o);
RemovableHandle add_load_state_dict_pre_hook(torch::nn::Module& m, LoadStateDictPreHook hook, const HookOptions& o);
RemovableHandle add_load_state_dict_post_hook(torch::nn::Module& m, LoadStateDictPostHook hook, const HookOptions& o);

// A hook written as a `void` callable keeps the tensors: wrap it to return std::nullopt.
template <typename F, typename... A>
auto optional_result(F&& f) {
  using R = std::invoke_result_t<std::decay_t<F>&, A...>;
  if constexpr (std::is_void_v<R>) {
    return [g = std::forward<F>(f)](A... a) mutable -> std::optional<Tensors> {
      g(std::forward<A>(a)...);
      return std::nullopt;
    };
  } else {
    return std::forward<F>(f);
  }
}

}  // namespace detail

/// Register `hook(module, inputs)` to run before each call's forward. `module` may be a
/// `torch::nn::Module&`, a `std::shared_ptr` to one, or a ModuleHolder (`torch::nn::Linear`).
template <typename M, typename F>
RemovableHandle register_forward_pre_hook(M&& module, F&& hook, HookOptions options = {}) {
  return detail::add_forward_pre_hook(
      detail::as_module(module),
      detail::optional_result<F, torch::nn::Module&, const Tensors&>(std::forward<F>(hook)), options);
}

/// Register `hook(module, inputs, outputs)` to run after each call's forward.
template <typename M, typename F>
RemovableHandle register_forward_hook(M&& module, F&& hook, HookOptions options = {}) {
  return detail::add_forward_hook(
      detail::as_module(module),
      detail::optional_result<F, torch::nn::Module&, const Tensors&, const Tensors&>(std::forward<F>(hook)), options);
}

/// Register `hook(module, grad_output)` (PyTorch's register_full_backward_pre_hook).
template <typename M, typename F>
RemovableHandle register_full_backward_pre_hook(M&& module, F&& hook, HookOptions options = {}) {
  return detail::add_backward_pre_hook(
      detail::as_module(module),
      detail::optional_result<F, torch::nn::Module&, const Tensors&>(std::forward<F>(hook)), options);
}

/// Register `hook(module, grad_input, grad_output)` (PyTorch's register_full_backward_hook).
template <typename M, typename F>
RemovableHandle register_full_backward_hook(M&& module, F&& hook, HookOptions options = {}) {
  return detail::add_backward_hook(
      detail::as_module(module),
      detail::optional_result<F, torch::nn::Module&, const Tensors&, const Tensors&>(std::forward<F>(hook)), options);
}

template <typename M>
RemovableHandle register_state_dict_pre_hook(M&& module, StateDictPreHook hook, HookOptions options = {}) {
  return detail::add_state_dict_pre_hook(detail::as_module(module), std::move(hook), options);
}
template <typename M>
RemovableHandle register_state_dict_post_hook(M&& module, StateDictPostHook hook, HookOptions options = {}) {
  return detail::add_state_dict_post_hook(detail::as_module(module), std::move(hook), options);
}
template <typename M>
RemovableHandle register_load_state_dict_pre_hook(M&& module, LoadStateDictPreHook hook, HookOptions options = {}) {
  return detail::add_load_state_dict_pre_hook(detail::as_module(module), std::move(hook), options);
}
template <typename M>
RemovableHandle register_load_state_dict_post_hook(M&& module, LoadStateDictPostHook hook,
                                                   HookOptions options = {}) {
  return detail::add_load_state_dict_post_hook(detail::as_module(module), std::move(hook), options);
}

/// state_dict / load_state_dict / mark_leaf for a ModuleHolder or shared_ptr.
template <typename M, typename = std::enable_if_t<!std::is_base_of_v<torch::nn::Module, std::decay_t<M>>>>
StateDict state_dict(const M& module, bool keep_vars = false) {
  return state_dict(detail::as_module(module), keep_vars);
}
template <typename M, typename = std::enable_if_t<!std::is_base_of_v<torch::nn::Module, std::decay_t<M>>>>
IncompatibleKeys load_state_dict(const M& module, const StateDict& dict, bool strict = true) {
  return load_state_dict(detail::as_module(module), dict, strict);
}
template <typename M, typename = std::enable_if_t<!std::is_base_of_v<torch::nn::Module, std::decay_t<M>>>>
void mark_leaf(const M& module, bool leaf = true) {
  mark_leaf(detail::as_module(module), leaf);
}

}  // namespace torchcompile
