// torch::compile for the LibTorch C++ frontend.
//
//     #include <torchcompile/torchcompile.h>
//     auto fast = torch::compile(net, "debug");   // net: std::shared_ptr<Net> or a ModuleHolder
//     torch::Tensor y = fast(x);                   // same signature and result as net->forward(x)
//     auto f = torch::compile([](torch::Tensor a, torch::Tensor b) { return a.cos() + b.sin(); });
//
// The first call with a new input signature runs the forward once under the tracer (computing
// the real result while recording every ATen op), hands the graph to the backend and caches the
// result under guards; later calls that pass the guards run the compiled graph without executing
// the C++ forward at all. Host-side effects of the forward (printing, counters) therefore happen
// on tracing calls only, as with torch.jit.trace.
#pragma once

#include <torchcompile/aot.h>
#include <torchcompile/backends/registry.h>
#include <torchcompile/hooks.h>
#include <torchcompile/ir/graph_module.h>
#include <torchcompile/runtime/compile_options.h>
#include <torchcompile/runtime/compiled_function.h>
#include <torchcompile/runtime/explain.h>
#include <torchcompile/runtime/module_call.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchcompile {

namespace detail {

// ---- arguments -------------------------------------------------------------------------------

template <typename T>
struct dependent_false : std::false_type {};

template <typename T>
void add_arg(runtime::CallArgs& ca, const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    ca.add(v);
  } else if constexpr (std::is_same_v<D, std::vector<at::Tensor>>) {
    ca.add(v);
  } else if constexpr (std::is_same_v<D, c10::optional<at::Tensor>>) {
    ca.add(v);
  } else if constexpr (std::is_same_v<D, c10::nullopt_t>) {
    ca.add(c10::optional<at::Tensor>());
  } else if constexpr (std::is_same_v<D, bool>) {
    ca.add(static_cast<bool>(v));
  } else if constexpr (std::is_integral_v<D>) {
    ca.add(static_cast<int64_t>(v));
  } else if constexpr (std::is_floating_point_v<D>) {
    ca.add(static_cast<double>(v));
  } else {
    static_assert(dependent_false<D>::value,
                  "torch::compile: forward arguments must be at::Tensor, std::vector<at::Tensor>, "
                  "c10::optional<at::Tensor>, or an integer, floating-point or bool value");
  }
}

// ---- results ---------------------------------------------------------------------------------

template <typename T>
struct OutputCodec {
  static_assert(dependent_false<T>::value,
                "torch::compile: forward must return at::Tensor, std::vector<at::Tensor>, or a "
                "std::tuple / std::pair of those");
};

template <>
struct OutputCodec<at::Tensor> {
  static void flatten(const at::Tensor& t, std::vector<at::Tensor>& out, runtime::OutputSpec&) { out.push_back(t); }
  static at::Tensor unflatten(std::vector<at::Tensor>& flat, size_t& pos, const runtime::OutputSpec&, size_t&) {
    return std::move(flat.at(pos++));
  }
};

template <>
struct OutputCodec<std::vector<at::Tensor>> {
  static void flatten(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out, runtime::OutputSpec& spec) {
    spec.list_sizes.push_back(ts.size());
    out.insert(out.end(), ts.begin(), ts.end());
  }
  static std::vector<at::Tensor> unflatten(std::vector<at::Tensor>& flat, size_t& pos, const runtime::OutputSpec& spec,
                                           size_t& list_pos) {
    const size_t n = spec.list_sizes.at(list_pos++);
    std::vector<at::Tensor> r;
    r.reserve(n);
    for (size_t i = 0; i < n; ++i) r.push_back(std::move(flat.at(pos++)));
    return r;
  }
};

template <typename... Ts>
struct OutputCodec<std::tuple<Ts...>> {
  static void flatten(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out, runtime::OutputSpec& spec) {
    std::apply([&](const auto&... e) { (OutputCodec<std::decay_t<decltype(e)>>::flatten(e, out, spec), ...); }, t);
  }
  static std::tuple<Ts...> unflatten(std::vector<at::Tensor>& flat, size_t& pos, const runtime::OutputSpec& spec,
                                     size_t& list_pos) {
    // Braced initialization evaluates left to right, matching flatten's order.
    return std::tuple<Ts...>{OutputCodec<Ts>::unflatten(flat, pos, spec, list_pos)...};
  }
};

template <typename A, typename B>
struct OutputCodec<std::pair<A, B>> {
  static void flatten(const std::pair<A, B>& p, std::vector<at::Tensor>& out, runtime::OutputSpec& spec) {
    OutputCodec<A>::flatten(p.first, out, spec);
    OutputCodec<B>::flatten(p.second, out, spec);
  }
  static std::pair<A, B> unflatten(std::vector<at::Tensor>& flat, size_t& pos, const runtime::OutputSpec& spec,
                                   size_t& list_pos) {
    A a = OutputCodec<A>::unflatten(flat, pos, spec, list_pos);
    B b = OutputCodec<B>::unflatten(flat, pos, spec, list_pos);
    return {std::move(a), std::move(b)};
  }
};

// ---- arguments of a module call, as tensors and a skeleton --------------------------------------
//
// The call boundary shows hooks the tensors of a call and rebuilds the arguments from the
// (possibly replaced) tensors: `flatten` appends an argument's tensors, `strip` drops them
// from a copy kept by an opaque call_module node (the skeleton), `rebuild` refills a copy.

template <typename T>
struct ArgCodec {
  static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string> ||
                    std::is_same_v<T, c10::nullopt_t>,
                "torchcompile::call: module arguments must be at::Tensor, std::vector<at::Tensor>, "
                "c10::optional<at::Tensor>, or an arithmetic, enum or std::string value");
  static void flatten(const T&, std::vector<at::Tensor>&) {}
  static void strip(T&) {}
  static void rebuild(T&, const std::vector<at::Tensor>&, size_t&) {}
};

template <>
struct ArgCodec<at::Tensor> {
  static void flatten(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
  static void strip(at::Tensor& t) { t = at::Tensor(); }
  static void rebuild(at::Tensor& t, const std::vector<at::Tensor>& flat, size_t& pos) { t = flat.at(pos++); }
};

template <>
struct ArgCodec<std::vector<at::Tensor>> {
  static void flatten(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
    out.insert(out.end(), ts.begin(), ts.end());
  }
  static void strip(std::vector<at::Tensor>& ts) {
    for (auto& t : ts) t = at::Tensor();
  }
  static void rebuild(std::vector<at::Tensor>& ts, const std::vector<at::Tensor>& flat, size_t& pos) {
    for (auto& t : ts) t = flat.at(pos++);
  }
};

template <>
struct ArgCodec<c10::optional<at::Tensor>> {
  // Present means "has a defined tensor"; a stripped present value holds an undefined one.
  static void flatten(const c10::optional<at::Tensor>& t, std::vector<at::Tensor>& out) {
    if (t.has_value() && t->defined()) out.push_back(*t);
  }
  static void strip(c10::optional<at::Tensor>& t) {
    if (t.has_value() && t->defined()) {
      t = at::Tensor();
    } else {
      t = c10::nullopt;
    }
  }
  static void rebuild(c10::optional<at::Tensor>& t, const std::vector<at::Tensor>& flat, size_t& pos) {
    if (t.has_value()) t = flat.at(pos++);
  }
};

template <typename Tuple>
std::vector<at::Tensor> flatten_args(const Tuple& args) {
  std::vector<at::Tensor> out;
  std::apply([&](const auto&... a) { (ArgCodec<std::decay_t<decltype(a)>>::flatten(a, out), ...); }, args);
  return out;
}

template <typename Tuple>
void strip_args(Tuple& args) {
  std::apply([](auto&... a) { (ArgCodec<std::decay_t<decltype(a)>>::strip(a), ...); }, args);
}

template <typename Tuple>
void rebuild_args(Tuple& args, const std::vector<at::Tensor>& flat) {
  size_t pos = 0;
  std::apply([&](auto&... a) { (ArgCodec<std::decay_t<decltype(a)>>::rebuild(a, flat, pos), ...); }, args);
}

/// A CallBody calling `fn(args...)` with `skeleton`'s arguments refilled from the tensors.
template <typename R, typename Fn, typename Tuple>
runtime::CallBody make_body(Fn fn, Tuple skeleton) {
  return [fn = std::move(fn), skeleton = std::move(skeleton)](const std::vector<at::Tensor>& inputs,
                                                               runtime::OutputSpec& spec) {
    Tuple a = skeleton;
    rebuild_args(a, inputs);
    std::vector<at::Tensor> out;
    OutputCodec<R>::flatten(std::apply(fn, a), out, spec);
    return out;
  };
}

template <typename... Ts>
std::tuple<std::decay_t<Ts>...> decay_tuple(const std::tuple<Ts...>& t) {
  return std::apply([](const auto&... x) { return std::tuple<std::decay_t<Ts>...>(x...); }, t);
}

template <typename R>
R unflatten_result(std::vector<at::Tensor>& flat, const runtime::OutputSpec& spec) {
  size_t pos = 0, list_pos = 0;
  return OutputCodec<R>::unflatten(flat, pos, spec, list_pos);
}

// ---- what gets called ------------------------------------------------------------------------

template <typename T>
struct is_module_holder : std::false_type {};
template <typename Impl>
struct is_module_holder<torch::nn::ModuleHolder<Impl>> : std::true_type {};

template <typename T>
struct is_module_ptr : std::false_type {};
template <typename M>
struct is_module_ptr<std::shared_ptr<M>> : std::is_base_of<torch::nn::Module, M> {};

template <typename T>
inline constexpr bool is_module_like_v =
    is_module_holder<T>::value || is_module_ptr<T>::value || std::is_base_of_v<torch::nn::Module, T> ||
    std::is_base_of_v<torch::detail::ModuleHolderIndicator, T>;

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
    using R = decltype(callable_(args...));
    using Skeleton = std::tuple<std::decay_t<Args>...>;
    runtime::OutputSpec spec;
    std::vector<at::Tensor> flat;
    const std::shared_ptr<torch::nn::Module>& root = state_->root_ptr();
    if (root && runtime::hooks_run_outside(*root)) {
      // The root's hooks are not all traceable: they run on every call with the real tensors,
      // around the compiled graph of its forward.
      runtime::CallBody compiled = [&](const std::vector<at::Tensor>& inputs, runtime::OutputSpec& s) {
        Skeleton a(args...);
        detail::rebuild_args(a, inputs);
        return call_state(a, s);
      };
      flat = runtime::run_with_hooks(*root, detail::flatten_args(Skeleton(args...)), compiled, spec);
    } else {
      flat = call_state(std::forward_as_tuple(args...), spec);
    }
    return detail::unflatten_result<R>(flat, spec);
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
  // One call of the cached, compiled forward with the arguments in `a` (a tuple).
  template <typename Tuple>
  std::vector<at::Tensor> call_state(const Tuple& a, runtime::OutputSpec& spec) {
    using R = decltype(std::apply(callable_, a));
    runtime::CallArgs ca;
    std::apply([&](const auto&... x) { (detail::add_arg(ca, x), ...); }, a);
    // Runs the forward when the runtime needs it: to trace, to retrace a new branch, eagerly,
    // or twice in verify mode, so the arguments are passed as lvalues (never moved from).
    runtime::ForwardFn forward = [&](runtime::OutputSpec& s) {
      const std::shared_ptr<torch::nn::Module>& root = state_->root_ptr();
      if (!root || runtime::hooks_run_outside(*root)) {
        std::vector<at::Tensor> out;
        detail::OutputCodec<R>::flatten(std::apply(callable_, a), out, s);
        return out;
      }
      // A module root goes through the call boundary: its traceable hooks are traced with it,
      // and its ops get their module paths.
      auto skeleton = detail::decay_tuple(a);
      return runtime::call_module(root, detail::flatten_args(skeleton), detail::make_body<R>(callable_, skeleton), s);
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
/// (torchcompile/hooks.h), eagerly or in a compiled forward, and gives the ops it records
/// their module path. `module` is a `std::shared_ptr` to a module or a ModuleHolder. Without
/// hooks and outside a trace it costs a lookup that is lock-free while no module has hooks.
///
///     torch::Tensor forward(torch::Tensor x) { return torchcompile::call(fc2, torchcompile::call(fc1, x).relu()); }
template <typename M, typename... Args>
auto call(const M& module, Args&&... args) {
  auto m = detail::module_shared(module);
  using R = decltype(m->forward(std::declval<std::decay_t<Args>&>()...));
  if (runtime::call_is_plain(*m)) return R(m->forward(std::forward<Args>(args)...));
  std::tuple<std::decay_t<Args>...> skeleton(args...);
  std::vector<at::Tensor> inputs = detail::flatten_args(skeleton);
  detail::strip_args(skeleton);  // an opaque call_module node keeps the body: no tensors in it
  auto forward = [m](auto&... a) -> R { return m->forward(a...); };
  runtime::OutputSpec spec;
  std::vector<at::Tensor> flat = runtime::call_module(m, std::move(inputs), detail::make_body<R>(forward, skeleton), spec);
  return detail::unflatten_result<R>(flat, spec);
}

/// What torch._dynamo.explain reports: compile `target` with a recording backend, call it once
/// with `inputs`, and return (and print to stdout) the number of graphs, the graph breaks with
/// their reasons, the ops of each graph, and the guards.
template <typename T, typename... Args>
ExplainOutput explain(T&& target, Args&&... inputs) {
  auto compiled = compile(std::forward<T>(target), CompileOptions("eager"));
  compiled(std::forward<Args>(inputs)...);
  auto entries = compiled.state().entries();
  TORCH_CHECK(!entries.empty(), "explain: the call produced no cache entry");
  ExplainOutput out = runtime::explain_entry(*entries.front());
  std::cout << out.str();
  return out;
}

}  // namespace torchcompile

namespace torch {
using torchcompile::compile;
}  // namespace torch
