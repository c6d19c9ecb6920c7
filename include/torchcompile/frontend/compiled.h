// The compiled object (Compiled), torch::compile's overloads, and torchcompile::call, the
// module call boundary for a submodule's forward.
#pragma once

#include <torchcompile/frontend/codecs.h>
#include <torchcompile/runtime/compile_options.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchcompile {
namespace detail {

// ---- what gets called ------------------------------------------------------------------------

template <typename T>
struct is_module_holder : std::false_type {};
template <typename Impl>
struct is_module_holder<torch::nn::ModuleHolder<Impl>> : std::true_type {};

template <typename T>
struct is_module_ptr : std::false_type {};
template <typename M>
struct is_module_ptr<std::shared_ptr<M>> : std::is_base_of<torch::nn::Module, M> {};

// A TorchScript module (torch::jit::Module, frontend/script_module.h) is module-like too: it
// is compiled by its own overload, never as a function object.
template <typename T>
inline constexpr bool is_module_like_v =
    is_module_holder<T>::value || is_module_ptr<T>::value || std::is_base_of_v<torch::nn::Module, T> ||
    std::is_base_of_v<torch::detail::ModuleHolderIndicator, T> || std::is_base_of_v<torch::jit::Object, T>;

}  // namespace detail

/// A compiled module or function. Called like the original (`fast(x)`, `fast->forward(x)`),
/// returning the same type. Copies share one cache.
template <typename Callable>
class Compiled {
 public:
  Compiled(Callable callable, std::shared_ptr<torch::nn::Module> root, CompileOptions options, std::string name)
      : callable_(std::move(callable)),
        state_(std::make_shared<runtime::CompiledFunction>(std::move(options), std::move(root), std::move(name))) {}

  template <typename... Args>
  auto operator()(Args&&... args) {
    // The signature is checked first, so that an unsupported type gives one error naming it.
    if constexpr (!(detail::check_arg<detail::Site::Compile, false, detail::storage_t<Args>>() && ...)) {
      (detail::check_arg<detail::Site::Compile, true, detail::storage_t<Args>>(), ...);
      return detail::Rejected{};
    } else if constexpr (!std::is_invocable_v<Callable&, detail::storage_t<Args>&...> ||
                         !std::is_invocable_v<Callable&, Args&...>) {
      (void)detail::forward_not_callable_with<Callable, detail::storage_t<Args>...>::value;
      return detail::Rejected{};
    } else if constexpr (!detail::check_result<detail::Site::Compile, false,
                                               detail::call_result_t<Callable, Args...>>()) {
      detail::check_result<detail::Site::Compile, true, detail::call_result_t<Callable, Args...>>();
      return detail::Rejected{};
    } else {
      return invoke<detail::call_result_t<Callable, Args...>>(args...);
    }
  }

  /// Same as operator().
  template <typename... Args>
  auto forward(Args&&... args) {
    return (*this)(std::forward<Args>(args)...);
  }
  /// `fast->forward(x)`, as with a module holder.
  Compiled* operator->() { return this; }

  /// The cache and its statistics.
  runtime::CompiledFunction& state() const { return *state_; }

 private:
  template <typename R, typename... Args>
  R invoke(Args&... args) {
    using Skeleton = std::tuple<detail::storage_t<Args>...>;
    runtime::OutputSpec spec;
    std::vector<at::Tensor> flat;
    const std::shared_ptr<torch::nn::Module>& root = state_->root_ptr();
    if (root && runtime::hooks_run_outside(*root)) {
      // The root's hooks are not all traceable: they run on every call with the real tensors,
      // around the compiled graph of its forward.
      runtime::CallBody compiled = [&](const std::vector<at::Tensor>& inputs, runtime::OutputSpec& s) {
        Skeleton a(args...);
        detail::rebuild_args(a, inputs);
        return call_state<R>(a, s);
      };
      flat = runtime::run_with_hooks(*root, detail::flatten_args(Skeleton(args...)), compiled, spec);
    } else {
      flat = call_state<R>(std::forward_as_tuple(args...), spec);
    }
    return detail::unflatten_result<R>(flat, spec);
  }

  // One call of the cached, compiled forward with the arguments in `a` (a tuple).
  template <typename R, typename Tuple>
  std::vector<at::Tensor> call_state(const Tuple& a, runtime::OutputSpec& spec) {
    runtime::CallArgs ca;
    detail::add_arg(ca, a);
    // Runs the forward when the runtime needs it: to trace, to retrace a new branch, eagerly,
    // or twice in verify mode, so the arguments are passed as lvalues (never moved from).
    runtime::ForwardFn forward_impl = [&](runtime::OutputSpec& s) {
      using Skeleton = detail::storage_t<Tuple>;
      // A dynamic trace passes observed tensors in place of the arguments' own.
      const std::vector<at::Tensor>* substituted = runtime::take_substituted_inputs();
      const std::shared_ptr<torch::nn::Module>& root = state_->root_ptr();
      if (!root || runtime::hooks_run_outside(*root)) {
        std::vector<at::Tensor> out;
        if (substituted) {
          Skeleton skeleton(a);
          detail::rebuild_args(skeleton, *substituted);
          detail::OutputCodec<R>::flatten(std::apply(callable_, skeleton), out, s);
        } else {
          detail::OutputCodec<R>::flatten(std::apply(callable_, a), out, s);
        }
        return out;
      }
      // A module root goes through the call boundary: its traceable hooks are traced with it,
      // and its ops get their module paths. An opaque call_module node (a leaf root) keeps the
      // body, so a copyable callable is copied into it; a mutable or move-only one (never a
      // module root in practice) is referenced, keeping its one state.
      Skeleton skeleton(a);
      if (substituted) detail::rebuild_args(skeleton, *substituted);
      std::vector<at::Tensor> inputs = detail::flatten_args(skeleton);
      runtime::CallBody body;
      if constexpr (std::is_copy_constructible_v<Callable> &&
                    detail::invocable_with_tuple<const Callable&, Skeleton>::value) {
        body = detail::make_body<R>(callable_, std::move(skeleton));
      } else {
        body = detail::make_body<R>(std::ref(callable_), std::move(skeleton));
      }
      return runtime::call_module(root, std::move(inputs), body, s);
    };
    runtime::ForwardFn forward = [&](runtime::OutputSpec& s) {
      std::vector<at::Tensor> out = forward_impl(s);
      s.result_type = detail::result_type_name<R>();  // what a saved package rebuilds
      return out;
    };
    return state_->call(ca, forward, spec);
  }

  Callable callable_;
  std::shared_ptr<runtime::CompiledFunction> state_;
};

/// Calls `module->forward(args...)`.
template <typename M>
struct ModuleForward {
  std::shared_ptr<M> module;
  template <typename... Args>
  auto operator()(Args&&... args) const -> decltype(module->forward(std::forward<Args>(args)...)) {
    return module->forward(std::forward<Args>(args)...);
  }
};

/// Compile a module given as `std::shared_ptr<M>` (M derives from torch::nn::Module).
template <typename M, typename = std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>>>
Compiled<ModuleForward<M>> compile(std::shared_ptr<M> module, CompileOptions options = {}) {
  std::string name = module->name();
  std::shared_ptr<torch::nn::Module> root = module;
  return Compiled<ModuleForward<M>>(ModuleForward<M>{std::move(module)}, std::move(root), std::move(options),
                                    std::move(name));
}

/// Compile a module given as a ModuleHolder (`torch::nn::Linear`, a TORCH_MODULE type).
template <typename Impl>
Compiled<ModuleForward<Impl>> compile(const torch::nn::ModuleHolder<Impl>& holder, CompileOptions options = {}) {
  return compile(holder.ptr(), std::move(options));
}

/// Compile a lambda, function object or function pointer taking tensors.
template <typename F, typename = std::enable_if_t<!detail::is_module_like_v<std::decay_t<F>>>>
Compiled<std::decay_t<F>> compile(F&& fn, CompileOptions options = {}) {
  return Compiled<std::decay_t<F>>(std::forward<F>(fn), nullptr, std::move(options), "function");
}

namespace detail {
template <typename M>
std::shared_ptr<M> module_shared(const std::shared_ptr<M>& m) {
  TORCH_CHECK(m != nullptr, "torchcompile::call: null module");
  return m;
}
template <typename Impl>
std::shared_ptr<Impl> module_shared(const torch::nn::ModuleHolder<Impl>& h) {
  return h.ptr();
}
}  // namespace detail

/// Call `module->forward(args...)` through the module call boundary: fires the module's hooks
/// (torchcompile/hooks/hooks.h), eagerly or in a compiled forward, and gives the ops it records
/// their module path. `module` is a `std::shared_ptr` to a module or a ModuleHolder. Without
/// hooks and outside a trace it costs a lookup that is lock-free while no module has hooks.
///
///     torch::Tensor forward(torch::Tensor x) { return torchcompile::call(fc2, torchcompile::call(fc1, x).relu()); }
template <typename M, typename... Args>
auto call(const M& module, Args&&... args) {
  using Impl = typename decltype(detail::module_shared(module))::element_type;
  using detail::Site;
  if constexpr (!(detail::check_arg<Site::Call, false, detail::storage_t<Args>>() && ...)) {
    (detail::check_arg<Site::Call, true, detail::storage_t<Args>>(), ...);
    return detail::Rejected{};
  } else if constexpr (!detail::has_forward<Impl, void, detail::storage_t<Args>...>::value) {
    (void)detail::module_forward_not_callable_with<Impl, detail::storage_t<Args>...>::value;
    return detail::Rejected{};
  } else {
    auto m = detail::module_shared(module);
    using R = std::decay_t<decltype(m->forward(std::declval<detail::storage_t<Args>&>()...))>;
    if constexpr (!detail::check_result<Site::Call, false, R>()) {
      detail::check_result<Site::Call, true, R>();
      return detail::Rejected{};
    } else {
      if (runtime::call_is_plain(*m)) return R(m->forward(std::forward<Args>(args)...));
      std::tuple<detail::storage_t<Args>...> skeleton(args...);
      std::vector<at::Tensor> inputs = detail::flatten_args(skeleton);
      detail::strip_args(skeleton);  // an opaque call_module node keeps the body: no tensors in it
      auto forward = [m](auto&... a) -> R { return m->forward(a...); };
      runtime::OutputSpec spec;
      std::vector<at::Tensor> flat =
          runtime::call_module(m, std::move(inputs), detail::make_body<R>(forward, std::move(skeleton)), spec);
      return detail::unflatten_result<R>(flat, spec);
    }
  }
}

}  // namespace torchcompile

namespace torch {
using torchcompile::compile;
}  // namespace torch
