// What an operator does, in the terms passes, AOT autograd, partitioners and backends ask about:
// one table for all of them, so that no pass or backend keeps its own list of "pointwise ops" or
// "random ops".
//
// Properties that follow from the schema (mutation, views) are read from it; the kind of
// computation (pointwise, reduction, GEMM, ...) comes from a table of ATen's operators, keyed by
// the operator's name without overload and without the trailing `_` of in-place variants. An
// operator the table does not know is `OpKind::Other`: a pass must treat it conservatively.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace torchcompile::ir {

class Graph;
class Node;

/// The kind of computation an operator performs.
enum class OpKind : uint8_t {
  Other,          ///< anything not below (scans, indexing, concatenation, custom operators...)
  Pointwise,      ///< each output element from the same-index elements of broadcast inputs:
                  ///< activations, arithmetic, comparisons, `where`, dtype copies, their backwards
  Reduction,      ///< reduces dimensions: `sum`, `mean`, `amax`, `var`, `argmax`, ...
  Normalization,  ///< reduce then rescale along dimensions: softmax, layer/batch/group norm (+ backwards)
  View,           ///< returns an alias of an argument without writing it (by schema: `view`, `t`, `select`)
  Gemm,           ///< matrix products: `mm`, `addmm`, `bmm`, `baddbmm`, `matmul`, `linear`
  Convolution,    ///< convolutions and transposed convolutions (+ backward)
  Pooling,        ///< max/average pooling, adaptive pooling (+ backwards)
  Factory,        ///< makes a tensor from sizes and scalars: `empty`, `zeros`, `full`, `*_like`, `arange`
  MetadataQuery,  ///< reads tensor metadata only and returns host values: `size`, `stride`, `is_contiguous`
};

const char* to_string(OpKind kind);

/// What passes and backends may assume about an operator.
struct OpProperties {
  OpKind kind = OpKind::Other;
  /// Draws from a random generator (dropout, bernoulli, rand*, any `Generator?` argument).
  bool random = false;
  /// Writes one of its arguments, as its schema declares (`add_`, `out=` variants).
  bool mutating = false;
  /// Its result's memory is uninitialized (`empty`, `empty_strided`, ...).
  bool uninitialized = false;
  /// A view whose result has all of its base's elements in the same order (`view`, `reshape`,
  /// `squeeze`, `flatten`, `alias`, `detach`): writing through it writes the whole base.
  bool whole_view = false;
  /// Updates running statistics (batch and instance norm) when called in training mode, which
  /// the schema does not declare.
  bool updates_running_stats = false;
  /// Returns its input unchanged when not training (`dropout` with `train=False`).
  bool identity_when_not_training = false;
  /// The sizes of its results depend on the values of its arguments, not only on their sizes
  /// (PyTorch's "dynamic output shape" operators: `nonzero`, `masked_select`, `unique`,
  /// `repeat_interleave` by a tensor, `bincount`). `index` is one only when an index is a
  /// boolean mask: see results_depend_on_data.
  bool data_dependent_sizes = false;
  /// How many tensors it returns follows from an argument's size (`unbind`, `split`, `chunk`,
  /// `tensor_split`, `split_with_sizes`): calling it reads that size.
  bool result_count_from_sizes = false;

  bool pointwise() const { return kind == OpKind::Pointwise; }
  bool view() const { return kind == OpKind::View; }
};

/// The properties of `op` (computed once per operator, then cached; thread-safe).
OpProperties op_properties(const c10::OperatorHandle& op);

/// True if calling this operator draws from a random generator (dropout, bernoulli, rand*...).
inline bool op_is_random(const c10::OperatorHandle& op) { return op_properties(op).random; }
/// True if the operator's schema writes to one of its arguments (`add_`, `out=` variants).
inline bool op_is_mutating(const c10::OperatorHandle& op) { return op_properties(op).mutating; }
/// Whether the sizes of this call's results depend on the values of its arguments `args` (the
/// operator's, in schema order): op_properties(op).data_dependent_sizes, or `index` with a
/// boolean (or uint8) mask among its indices.
bool results_depend_on_data(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args);

// ---- properties of a call_function node (its operator's, refined by its constant arguments) ----

/// The properties of a node's operator; `OpKind::Other` and nothing else for other node kinds.
OpProperties node_properties(const Node& n);
/// results_depend_on_data for a call_function node (an `index` node's boolean masks are read from
/// the recorded metadata of its index values); false for other node kinds.
bool node_results_depend_on_data(const Node& n);
/// The first node of `g` whose results' sizes depend on the data (node_results_depend_on_data),
/// or null.
const Node* first_node_with_data_dependent_sizes(const Graph& g);
/// True for a call_function node whose single result views an argument (`view`, `t`, `select`).
bool is_view_node(const Node* n);
/// The argument positions a call_function node writes: those its schema declares (`Tensor(a!)`)
/// and the running statistics of batch and instance norm in training mode, which LibTorch's
/// schemas do not declare.
std::vector<size_t> written_arguments(const Node& n);
/// Whether running this call_function node draws random numbers (op_is_random, except dropout
/// in eval mode).
bool node_is_random(const Node& n);
/// Whether this call_function node returns its first argument unchanged: a dropout with
/// `train=False` or `p=0`.
bool node_is_identity(const Node& n);

}  // namespace torchcompile::ir
