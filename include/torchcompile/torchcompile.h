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
//
// Signatures: a forward takes tensors, std::vector<at::Tensor>, c10::optional<at::Tensor>,
// bool / integer / floating-point / enum values (specialized: a new value is a new cache entry),
// and std::tuple / std::pair of these, nested (an LSTM's (h, c) state); it returns at::Tensor or
// c10::optional / std::vector / std::tuple / std::pair of returnable types, nested. A user
// struct is passed and returned once its fields are registered (torchcompile::Fields,
// TORCHCOMPILE_FIELDS below). Any other type is a compile error naming torch::compile and the
// type. Lambdas may be `mutable` or move-only: the compiled object owns the one callable and
// calls it in place, so its state persists across calls (it runs on tracing calls only).
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

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

/// `TORCHCOMPILE_FIELDS(Type, field1, field2, ...);` at namespace scope, in the namespace of
/// `Type` (up to 16 fields): makes `Type` returnable by (and passable to) a compiled forward,
/// its fields flattened in the order listed. See torchcompile::Fields.
#define TORCHCOMPILE_FIELDS(Type, ...)                                                              \
  inline auto torchcompile_fields(Type& torchcompile_fields_object) {                               \
    return std::tie(TORCHCOMPILE_DETAIL_CAT(TORCHCOMPILE_DETAIL_FIELD_,                             \
                                            TORCHCOMPILE_DETAIL_NARGS(__VA_ARGS__))(                \
        torchcompile_fields_object, __VA_ARGS__));                                                  \
  }                                                                                                 \
  static_assert(true, "")

#define TORCHCOMPILE_DETAIL_CAT(a, b) TORCHCOMPILE_DETAIL_CAT_(a, b)
#define TORCHCOMPILE_DETAIL_CAT_(a, b) a##b
#define TORCHCOMPILE_DETAIL_NARGS(...) \
  TORCHCOMPILE_DETAIL_NARGS_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define TORCHCOMPILE_DETAIL_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, n, ...) n
#define TORCHCOMPILE_DETAIL_FIELD_1(o, a) o.a
#define TORCHCOMPILE_DETAIL_FIELD_2(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_1(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_3(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_2(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_4(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_3(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_5(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_4(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_6(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_5(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_7(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_6(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_8(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_7(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_9(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_8(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_10(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_9(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_11(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_10(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_12(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_11(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_13(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_12(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_14(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_13(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_15(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_14(o, __VA_ARGS__)
#define TORCHCOMPILE_DETAIL_FIELD_16(o, a, ...) o.a, TORCHCOMPILE_DETAIL_FIELD_15(o, __VA_ARGS__)

namespace torchcompile {

/// Customization point: makes a user struct returnable by a compiled forward (and passable as
/// an argument). Specialize it with a static `get` returning a `std::tuple` of references to
/// the fields, as `std::tie` does:
///
///     struct VAEOutput { torch::Tensor recon, mu, log_var; };
///     template <> struct torchcompile::Fields<VAEOutput> {     // at global namespace scope
///       static auto get(VAEOutput& o) { return std::tie(o.recon, o.mu, o.log_var); }
///     };
///
/// or, in the namespace of the struct, `TORCHCOMPILE_FIELDS(VAEOutput, recon, mu, log_var);`.
/// The fields are flattened in that order and may be of any returnable type (at::Tensor,
/// c10::optional, std::vector, std::tuple, std::pair, other registered structs). A returned
/// struct is rebuilt by value-initializing it (`T{}`) and assigning the fields, so it must be
/// default-constructible. Register the struct before the compiled object is first called.
template <typename T, typename = void>
struct Fields {};

/// What TORCHCOMPILE_FIELDS defines: `torchcompile_fields(T&)`, found by argument-dependent
/// lookup in the namespace of T.
template <typename T>
struct Fields<T, std::void_t<decltype(torchcompile_fields(std::declval<T&>()))>> {
  static auto get(T& o) { return torchcompile_fields(o); }
};

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
    runtime::ForwardFn forward = [&](runtime::OutputSpec& s) {
      const std::shared_ptr<torch::nn::Module>& root = state_->root_ptr();
      if (!root || runtime::hooks_run_outside(*root)) {
        std::vector<at::Tensor> out;
        detail::OutputCodec<R>::flatten(std::apply(callable_, a), out, s);
        return out;
      }
      // A module root goes through the call boundary: its traceable hooks are traced with it,
      // and its ops get their module paths. An opaque call_module node (a leaf root) keeps the
      // body, so a copyable callable is copied into it; a mutable or move-only one (never a
      // module root in practice) is referenced, keeping its one state.
      using Skeleton = detail::storage_t<Tuple>;
      Skeleton skeleton(a);
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

namespace torch {
using torchcompile::compile;
}  // namespace torch
