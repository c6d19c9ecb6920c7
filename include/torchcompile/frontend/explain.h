// torchcompile::explain: compile a target, call it once and report its graphs, breaks, guards
// and what each backend did (see runtime/explain_output.h for the result type).
#pragma once

#include <torchcompile/frontend/compiled.h>
#include <torchcompile/runtime/explain_output.h>

#include <type_traits>
#include <utility>

namespace torchcompile {

/// What torch._dynamo.explain reports: compile `target` with `options` (a backend name such as
/// "default", a backend function, or CompileOptions), call it once with `inputs`, and return the
/// number of graphs, the graph breaks with their reasons, the ops of each graph, the guards, and
/// per graph which backend compiled it, its partition and every decline. Print it with `<<`.
namespace detail {
// What explain() accepts before its target: a backend name, a Backend or CompileOptions. (Not
// "convertible to CompileOptions": asking that of a module holder instantiates its forward.)
template <typename O>
constexpr bool is_explain_options_v = std::is_same_v<std::decay_t<O>, CompileOptions> ||
                                      std::is_same_v<std::decay_t<O>, Backend> || std::is_convertible_v<O, std::string>;
}  // namespace detail

template <typename O, typename T, typename... Args, typename = std::enable_if_t<detail::is_explain_options_v<O>>>
ExplainOutput explain(O&& options, T&& target, Args&&... inputs) {
  auto compiled = compile(std::forward<T>(target), CompileOptions(std::forward<O>(options)));
  compiled(std::forward<Args>(inputs)...);
  auto entries = compiled.state().entries();
  TORCH_CHECK(!entries.empty(), "explain: the call produced no cache entry");
  return runtime::explain_entry(*entries.front());
}

/// explain() with the `eager` backend (the interpreter), which captures exactly what any
/// backend would receive. (A backend given as a lambda goes first as `Backend(lambda)`.)
template <typename T, typename... Args, typename = std::enable_if_t<!detail::is_explain_options_v<T>>>
ExplainOutput explain(T&& target, Args&&... inputs) {
  return explain(CompileOptions("eager"), std::forward<T>(target), std::forward<Args>(inputs)...);
}

}  // namespace torchcompile
