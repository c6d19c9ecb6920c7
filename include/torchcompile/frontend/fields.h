// Registering a user struct's fields so that a compiled forward can take and return it:
// torchcompile::Fields and TORCHCOMPILE_FIELDS.
#pragma once

#include <tuple>

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

}  // namespace torchcompile
