// Flattening a call's arguments to tensors and a skeleton, and rebuilding results from the
// flattened outputs of a compiled graph: the codecs between the user's C++ types and the runtime.
#pragma once

#include <torchcompile/frontend/signature.h>
#include <torchcompile/runtime/compiled_function.h>
#include <torchcompile/runtime/module_call.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchcompile {
namespace detail {

// ---- arguments -------------------------------------------------------------------------------

/// Appends an argument (already checked) to the call's flattened arguments.
template <typename T>
void add_arg(runtime::CallArgs& ca, const T& v) {
  using D = std::decay_t<T>;
  if constexpr (Composite<D>::value) {
    Composite<D>::each(v, [&](const auto& e) { add_arg(ca, e); });
  } else if constexpr (std::is_same_v<D, at::Tensor>) {
    ca.add(v);
  } else if constexpr (std::is_same_v<D, std::vector<at::Tensor>>) {
    ca.add(v);
  } else if constexpr (std::is_same_v<D, c10::optional<at::Tensor>>) {
    ca.add(v);
  } else if constexpr (std::is_same_v<D, c10::nullopt_t>) {
    ca.add(c10::optional<at::Tensor>());
  } else if constexpr (std::is_same_v<D, bool>) {
    ca.add(static_cast<bool>(v));
  } else if constexpr (std::is_integral_v<D> || std::is_enum_v<D>) {
    ca.add(static_cast<int64_t>(v));
  } else if constexpr (std::is_floating_point_v<D>) {
    ca.add(static_cast<double>(v));
  } else {
    static_assert(dependent_false<D>::value, "torch::compile: unsupported forward argument type (unchecked)");
  }
}

// ---- results ---------------------------------------------------------------------------------
//
// Results are flattened to tensors in order; the structure that depends on the values (vector
// lengths, optional presence as a length of 0 or 1) goes to OutputSpec::list_sizes. Undefined
// tensors pass through unchanged.

template <typename T, typename = void>
struct OutputCodec {
  static_assert(dependent_false<T>::value, "torch::compile: unsupported forward result type (unchecked)");
};

template <>
struct OutputCodec<at::Tensor> {
  static void flatten(const at::Tensor& t, std::vector<at::Tensor>& out, runtime::OutputSpec&) { out.push_back(t); }
  static at::Tensor unflatten(std::vector<at::Tensor>& flat, size_t& pos, const runtime::OutputSpec&, size_t&) {
    return std::move(flat.at(pos++));
  }
};

template <typename E>
struct OutputCodec<std::vector<E>> {
  static void flatten(const std::vector<E>& v, std::vector<at::Tensor>& out, runtime::OutputSpec& spec) {
    spec.list_sizes.push_back(v.size());
    for (const E& e : v) OutputCodec<E>::flatten(e, out, spec);
  }
  static std::vector<E> unflatten(std::vector<at::Tensor>& flat, size_t& pos, const runtime::OutputSpec& spec,
                                  size_t& list_pos) {
    const size_t n = spec.list_sizes.at(list_pos++);
    std::vector<E> r;
    r.reserve(n);
    for (size_t i = 0; i < n; ++i) r.push_back(OutputCodec<E>::unflatten(flat, pos, spec, list_pos));
    return r;
  }
};

template <typename E>
struct OutputCodec<c10::optional<E>> {
  static void flatten(const c10::optional<E>& v, std::vector<at::Tensor>& out, runtime::OutputSpec& spec) {
    spec.list_sizes.push_back(v.has_value() ? 1 : 0);
    if (v.has_value()) OutputCodec<E>::flatten(*v, out, spec);
  }
  static c10::optional<E> unflatten(std::vector<at::Tensor>& flat, size_t& pos, const runtime::OutputSpec& spec,
                                    size_t& list_pos) {
    if (spec.list_sizes.at(list_pos++) == 0) return c10::nullopt;
    return OutputCodec<E>::unflatten(flat, pos, spec, list_pos);
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

/// A registered struct: its fields in order; rebuilt from a value-initialized T.
template <typename T>
struct OutputCodec<T, std::enable_if_t<has_fields<T>::value>> {
  static void flatten(const T& v, std::vector<at::Tensor>& out, runtime::OutputSpec& spec) {
    Composite<T>::each(v, [&](const auto& e) { OutputCodec<std::decay_t<decltype(e)>>::flatten(e, out, spec); });
  }
  static T unflatten(std::vector<at::Tensor>& flat, size_t& pos, const runtime::OutputSpec& spec, size_t& list_pos) {
    T r{};
    Composite<T>::each(r, [&](auto& e) {
      e = OutputCodec<std::decay_t<decltype(e)>>::unflatten(flat, pos, spec, list_pos);
    });
    return r;
  }
};

// ---- arguments of a module call, as tensors and a skeleton --------------------------------------
//
// The call boundary shows hooks the tensors of a call and rebuilds the arguments from the
// (possibly replaced) tensors: `flatten` appends an argument's tensors, `strip` drops them
// from a copy kept by an opaque call_module node (the skeleton), `rebuild` refills a copy.

/// Values without tensors (scalars, strings, nullopt): nothing to flatten.
template <typename T, typename = void>
struct ArgCodec {
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

/// Tuples, pairs and registered structs: their parts in order.
template <typename T>
struct ArgCodec<T, std::enable_if_t<Composite<T>::value>> {
  static void flatten(const T& v, std::vector<at::Tensor>& out) {
    Composite<T>::each(v, [&](const auto& e) { ArgCodec<std::decay_t<decltype(e)>>::flatten(e, out); });
  }
  static void strip(T& v) {
    Composite<T>::each(v, [](auto& e) { ArgCodec<std::decay_t<decltype(e)>>::strip(e); });
  }
  static void rebuild(T& v, const std::vector<at::Tensor>& flat, size_t& pos) {
    Composite<T>::each(v, [&](auto& e) { ArgCodec<std::decay_t<decltype(e)>>::rebuild(e, flat, pos); });
  }
};

template <typename Tuple>
std::vector<at::Tensor> flatten_args(const Tuple& args) {
  std::vector<at::Tensor> out;
  ArgCodec<Tuple>::flatten(args, out);
  return out;
}

template <typename Tuple>
void strip_args(Tuple& args) {
  ArgCodec<Tuple>::strip(args);
}

template <typename Tuple>
void rebuild_args(Tuple& args, const std::vector<at::Tensor>& flat) {
  size_t pos = 0;
  ArgCodec<Tuple>::rebuild(args, flat, pos);
}

/// A CallBody calling `fn(args...)` with `skeleton`'s arguments refilled from the tensors.
/// `fn` is copied into the body (pass a std::reference_wrapper to call an object in place).
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

/// The result type `R` of a C++ forward as a string a saved package rebuilds IValues from
/// (OutputSpec::result_type): `T` a tensor, `L<e>` a std::vector, `O<e>` an optional, `(a,b)`
/// a tuple, pair or registered struct (whose fields it lists).
template <typename T, typename = void>
struct ResultType {
  static void append(std::string&) {}
};
template <>
struct ResultType<at::Tensor> {
  static void append(std::string& s) { s += 'T'; }
};
template <typename E>
struct ResultType<std::vector<E>> {
  static void append(std::string& s) {
    s += "L<";
    ResultType<E>::append(s);
    s += '>';
  }
};
template <typename E>
struct ResultType<c10::optional<E>> {
  static void append(std::string& s) {
    s += "O<";
    ResultType<E>::append(s);
    s += '>';
  }
};
template <typename... Ts>
struct ResultType<std::tuple<Ts...>> {
  static void append(std::string& s) {
    s += '(';
    size_t i = 0;
    ((s += (i++ ? "," : ""), ResultType<Ts>::append(s)), ...);
    s += ')';
  }
};
template <typename A, typename B>
struct ResultType<std::pair<A, B>> : ResultType<std::tuple<A, B>> {};
template <typename T>
struct ResultType<T, std::enable_if_t<has_fields<T>::value>> {
  static void append(std::string& s) {
    s += '(';
    size_t i = 0;
    T object{};
    Composite<T>::each(object, [&](const auto& e) {
      if (i++) s += ',';
      ResultType<std::decay_t<decltype(e)>>::append(s);
    });
    s += ')';
  }
};
/// ResultType<R> as a string that lives as long as the program.
template <typename R>
const char* result_type_name() {
  static const std::string name = [] {
    std::string s;
    ResultType<R>::append(s);
    return s;
  }();
  return name.c_str();
}

template <typename R>
R unflatten_result(std::vector<at::Tensor>& flat, const runtime::OutputSpec& spec) {
  size_t pos = 0, list_pos = 0;
  return OutputCodec<R>::unflatten(flat, pos, spec, list_pos);
}

/// Whether `F` can be called with lvalues of a tuple's elements.
template <typename F, typename Tuple>
struct invocable_with_tuple : std::false_type {};
template <typename F, typename... Ts>
struct invocable_with_tuple<F, std::tuple<Ts...>> : std::is_invocable<F, Ts&...> {};

/// The result type of calling `F` with lvalues of the arguments' storage types, decayed.
template <typename F, typename... Args>
using call_result_t = std::decay_t<std::invoke_result_t<F&, storage_t<Args>&...>>;

template <typename M, typename = void, typename... Args>
struct has_forward : std::false_type {};
template <typename M, typename... Args>
struct has_forward<M, std::void_t<decltype(std::declval<M&>().forward(std::declval<Args&>()...))>, Args...>
    : std::true_type {};

}  // namespace detail
}  // namespace torchcompile
