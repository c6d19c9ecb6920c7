// What a compiled forward may take and return, checked at compile time with errors that name
// torch::compile and the offending type; the structure of composite arguments and results.
#pragma once

#include <torchcompile/frontend/fields.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchcompile {

namespace detail {

template <typename T>
struct dependent_false : std::false_type {};

// ---- structure: tuples, pairs and registered structs ------------------------------------------
//
// A composite is visited part by part, in order; `Parts` is a std::tuple of the part types.

template <typename T, typename = void>
struct has_fields : std::false_type {};
template <typename T>
struct has_fields<T, std::void_t<decltype(Fields<T>::get(std::declval<T&>()))>> : std::true_type {};

template <typename Tuple>
struct decay_parts;
template <typename... Es>
struct decay_parts<std::tuple<Es...>> {
  using type = std::tuple<std::decay_t<Es>...>;
};

template <typename T, typename = void>
struct Composite : std::false_type {};

template <typename... Ts>
struct Composite<std::tuple<Ts...>> : std::true_type {
  using Parts = std::tuple<Ts...>;
  template <typename V, typename F>
  static void each(V& v, F&& f) {
    std::apply([&](auto&... e) { (f(e), ...); }, v);
  }
};

template <typename A, typename B>
struct Composite<std::pair<A, B>> : std::true_type {
  using Parts = std::tuple<A, B>;
  template <typename V, typename F>
  static void each(V& v, F&& f) {
    f(v.first);
    f(v.second);
  }
};

template <typename T>
struct Composite<T, std::enable_if_t<has_fields<T>::value>> : std::true_type {
  using Parts = typename decay_parts<std::decay_t<decltype(Fields<T>::get(std::declval<T&>()))>>::type;
  // `get` takes a T&; for a const value the fields are only read.
  template <typename V, typename F>
  static void each(V& v, F&& f) {
    std::apply([&](auto&... e) { (f(e), ...); }, Fields<T>::get(const_cast<T&>(v)));
  }
};

template <typename T>
struct is_vector : std::false_type {};
template <typename E>
struct is_vector<std::vector<E>> : std::true_type {};

template <typename T>
struct is_optional : std::false_type {};
template <typename E>
struct is_optional<c10::optional<E>> : std::true_type {};

/// How an argument is kept by value: decayed, and tuples and pairs of references (std::tie,
/// std::forward_as_tuple) become tuples and pairs of values.
template <typename T>
struct storage {
  using type = std::decay_t<T>;
};
template <typename... Ts>
struct storage<std::tuple<Ts...>> {
  using type = std::tuple<typename storage<std::decay_t<Ts>>::type...>;
};
template <typename A, typename B>
struct storage<std::pair<A, B>> {
  using type = std::pair<typename storage<std::decay_t<A>>::type, typename storage<std::decay_t<B>>::type>;
};
template <typename T>
using storage_t = typename storage<std::decay_t<T>>::type;

// ---- what may be passed and returned, with errors naming the type -----------------------------
//
// Each entry point checks its signature before instantiating anything else; an unsupported
// type instantiates one of the templates below, so the compiler's "In instantiation of ..."
// line names the innermost offending type next to the message.

template <typename T>
struct cannot_pass_to_torch_compile {
  static_assert(dependent_false<T>::value,
                "torch::compile: unsupported forward argument type T (T is named in the instantiation of "
                "cannot_pass_to_torch_compile<T>). A compiled forward takes at::Tensor, std::vector<at::Tensor>, "
                "c10::optional<at::Tensor>, c10::nullopt, bool, integer, floating-point and enum values, and "
                "std::tuple / std::pair / registered structs (TORCHCOMPILE_FIELDS, torchcompile::Fields) of these, "
                "nested");
  static constexpr bool value = false;
};

template <typename T>
struct cannot_return_from_torch_compile {
  static_assert(dependent_false<T>::value,
                "torch::compile: unsupported forward result type T (T is named in the instantiation of "
                "cannot_return_from_torch_compile<T>). A compiled forward returns at::Tensor, or c10::optional / "
                "std::vector / std::tuple / std::pair of returnable types, nested. To return a struct of these, make "
                "it default-constructible and register its fields: TORCHCOMPILE_FIELDS(Type, field1, field2, ...); in "
                "its namespace, or a torchcompile::Fields<Type> specialization (see torchcompile.h)");
  static constexpr bool value = false;
};

template <typename T>
struct cannot_pass_to_torchcompile_call {
  static_assert(dependent_false<T>::value,
                "torchcompile::call: unsupported module argument type T (T is named in the instantiation of "
                "cannot_pass_to_torchcompile_call<T>). Module arguments are at::Tensor, std::vector<at::Tensor>, "
                "c10::optional<at::Tensor>, c10::nullopt, arithmetic, enum and std::string values, and std::tuple / "
                "std::pair / registered structs (TORCHCOMPILE_FIELDS, torchcompile::Fields) of these, nested");
  static constexpr bool value = false;
};

template <typename T>
struct cannot_return_from_torchcompile_call {
  static_assert(dependent_false<T>::value,
                "torchcompile::call: unsupported module result type T (T is named in the instantiation of "
                "cannot_return_from_torchcompile_call<T>). A forward called through the module call boundary "
                "returns at::Tensor, or c10::optional / std::vector / std::tuple / std::pair of returnable types, "
                "nested, or a default-constructible struct registered with TORCHCOMPILE_FIELDS(Type, field...) or "
                "torchcompile::Fields<Type>");
  static constexpr bool value = false;
};

template <typename Forward, typename... Args>
struct forward_not_callable_with {
  static_assert(dependent_false<Forward>::value,
                "torch::compile: the compiled forward cannot be called with these arguments (their types are "
                "named in the instantiation of forward_not_callable_with<Forward, Args...>)");
  static constexpr bool value = false;
};

template <typename M, typename... Args>
struct module_forward_not_callable_with {
  static_assert(dependent_false<M>::value,
                "torchcompile::call: the module's forward cannot be called with these arguments (their types are "
                "named in the instantiation of module_forward_not_callable_with<Module, Args...>)");
  static constexpr bool value = false;
};

/// Which entry point checks a signature: torch::compile or torchcompile::call.
enum class Site { Compile, Call };

template <Site S, typename T>
inline constexpr bool is_leaf_arg_v =
    std::is_same_v<T, at::Tensor> || std::is_same_v<T, std::vector<at::Tensor>> ||
    std::is_same_v<T, c10::optional<at::Tensor>> || std::is_same_v<T, c10::nullopt_t> || std::is_arithmetic_v<T> ||
    std::is_enum_v<T> || (S == Site::Call && std::is_same_v<T, std::string>);

template <Site S, bool Diagnose, typename T>
constexpr bool check_arg();
template <Site S, bool Diagnose, typename... Ts>
constexpr bool check_arg_parts(std::tuple<Ts...>*) {
  return (check_arg<S, Diagnose, Ts>() & ... & true);
}
/// Whether T (a storage type) may be passed; with Diagnose, an unsupported part is a compile error.
template <Site S, bool Diagnose, typename T>
constexpr bool check_arg() {
  if constexpr (Composite<T>::value) {
    return check_arg_parts<S, Diagnose>(static_cast<typename Composite<T>::Parts*>(nullptr));
  } else if constexpr (is_leaf_arg_v<S, T>) {
    return true;
  } else if constexpr (!Diagnose) {
    return false;
  } else if constexpr (S == Site::Compile) {
    return cannot_pass_to_torch_compile<T>::value;
  } else {
    return cannot_pass_to_torchcompile_call<T>::value;
  }
}

template <Site S, bool Diagnose, typename T>
constexpr bool check_result();
template <Site S, bool Diagnose, typename... Ts>
constexpr bool check_result_parts(std::tuple<Ts...>*) {
  return (check_result<S, Diagnose, Ts>() & ... & true);
}
/// Whether T may be returned; with Diagnose, an unsupported part is a compile error.
template <Site S, bool Diagnose, typename T>
constexpr bool check_result() {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return true;
  } else if constexpr (is_vector<T>::value || is_optional<T>::value) {
    return check_result<S, Diagnose, typename T::value_type>();
  } else if constexpr (Composite<T>::value && (!has_fields<T>::value || std::is_default_constructible_v<T>)) {
    return check_result_parts<S, Diagnose>(static_cast<typename Composite<T>::Parts*>(nullptr));
  } else if constexpr (!Diagnose) {
    return false;
  } else if constexpr (S == Site::Compile) {
    return cannot_return_from_torch_compile<T>::value;
  } else {
    return cannot_return_from_torchcompile_call<T>::value;
  }
}

/// What a rejected call returns, so that the static_assert above is the only error: converts
/// to anything (never defined: the program does not compile).
struct Rejected {
  template <typename T>
  operator T() const;
};

}  // namespace detail
}  // namespace torchcompile
