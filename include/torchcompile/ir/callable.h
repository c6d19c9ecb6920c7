// User functions as call_function targets (FX's `node.target = my_fn`), and the registry of named
// ones that the text format's parser resolves.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchcompile::ir {

class Node;

/// A user's function called in place of a call_function node's operator. It receives the node's
/// arguments as the operator would: one IValue per schema argument, in schema order, defaults
/// included (tensors, constants as traced, `Tensor[]` as a list); `aten::add.Tensor` passes
/// (self, other, alpha). It returns the node's outputs in order (one tensor per output).
using CallableFn = std::function<std::vector<at::Tensor>(const std::vector<c10::IValue>& args)>;

/// What an Interpreter override runs for a node (FX's `run_node` / `call_function` hooks): the
/// node, and its arguments as for CallableFn. Returns the node's outputs in order.
using NodeFn = std::function<std::vector<at::Tensor>(const Node& node, const std::vector<c10::IValue>& args)>;

/// A named user function. The name is what printers show as the node's target and what the
/// text format's parser looks up in the registry (register_callable).
struct Callable {
  std::string name;
  CallableFn fn;
};

/// A Callable, checked: `name` must look like `test_add` or `mylib::fast_add.v2` (letters,
/// digits, `_`, `.`, `:`, not starting with a digit) so that the text format can read it back,
/// and `fn` must not be empty.
std::shared_ptr<const Callable> make_callable(std::string name, CallableFn fn);

namespace detail {

template <typename R>
std::vector<at::Tensor> callable_results(R&& r) {
  using T = std::decay_t<R>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return {std::forward<R>(r)};
  } else {
    static_assert(std::is_same_v<T, std::vector<at::Tensor>>,
                  "a typed callable returns at::Tensor or std::vector<at::Tensor>");
    return std::forward<R>(r);
  }
}

template <typename R, typename... A, size_t... I>
std::vector<at::Tensor> call_typed(const std::function<R(A...)>& f, const std::vector<c10::IValue>& args,
                                   std::index_sequence<I...>) {
  return callable_results(f(args[I].to<std::decay_t<A>>()...));
}

template <typename R, typename... A>
CallableFn typed_callable_of(std::function<R(A...)> f) {
  return [f = std::move(f)](const std::vector<c10::IValue>& args) {
    TORCH_CHECK(args.size() == sizeof...(A), "typed callable: takes ", sizeof...(A), " arguments, the node passes ",
                args.size(), " (the operator's arguments in schema order, defaults included)");
    return call_typed(f, args, std::index_sequence_for<A...>{});
  };
}

}  // namespace detail

/// A CallableFn from a function with typed parameters, one per schema argument, e.g. for
/// `aten::add.Tensor`:
///
///     typed_callable([](const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
///       return at::add(self, other, alpha);
///     })
///
/// Each argument is converted with `IValue::to<T>()` (at::Tensor, int64_t, double, bool,
/// c10::Scalar, std::vector<int64_t>, c10::optional<at::Tensor>, ...); the function returns
/// at::Tensor or std::vector<at::Tensor>. A call with another number of arguments throws.
template <typename F>
CallableFn typed_callable(F f) {
  return detail::typed_callable_of(std::function(std::move(f)));
}

}  // namespace torchcompile::ir

namespace torchcompile {

/// Register `fn` under `name` (make_callable's rules), so that parse_graph can resolve a
/// call_function target of that name and Graph::set_target(node, name) can use it. Throws if
/// the name is already registered. Thread-safe.
void register_callable(const std::string& name, ir::CallableFn fn);
/// Remove a registered callable; returns whether it was registered. Graphs that use it keep it.
bool unregister_callable(const std::string& name);
/// The callable registered under `name`, or nullptr.
std::shared_ptr<const ir::Callable> lookup_callable(const std::string& name);
/// The registered names, sorted.
std::vector<std::string> list_callables();

}  // namespace torchcompile
