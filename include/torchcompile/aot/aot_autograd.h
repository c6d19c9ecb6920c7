// AOT autograd: compiled forward *and* backward graphs, as PyTorch's AOTAutograd.
//
// `aot_autograd(fw_compiler, bw_compiler)` wraps two backends into one backend, as
// torch._dynamo.backends.common.aot_autograd does in Python. For each captured graph it
//
//  1. lifts the parameters and buffers the graph reads to inputs (`primals_1..`, parameters and
//     buffers first in the order the graph reads them, then the graph's own inputs), and re-runs
//     the graph under functionalization with a tracer *below* autograd
//     (compat::kBelowAutogradTracingKey). With grad mode on and something requiring grad it also
//     asks autograd for the gradients of the primals that require them, seeding each output that
//     requires grad with a tangent placeholder (`tangents_1..`): one *joint* graph of ATen ops;
//  2. partitions the joint graph into a forward graph (primals -> outputs, updated buffers, saved
//     values) and a backward graph (saved values, tangents -> gradients), saving everything the
//     backward reads (Partitioner::SaveAll) or solving a min cut that recomputes cheap ops in the
//     backward instead of saving their results (Partitioner::MinCut);
//  3. hands the forward graph to `fw_compiler` and the backward graph to `bw_compiler`, both at
//     compile time (the backward is compiled eagerly, not on the first backward: an entry is only
//     built for grad-enabled calls, compile errors then surface at the first call instead of
//     inside a backward pass, and the backward needs no lock or lazy state shared by threads);
//  4. runs the pair as one torch::autograd::Function per graph (per segment when the forward has
//     graph breaks).
//
// What the graphs contain (the operator set a compiler can expect): ATen operators as they reach
// the kernels below autograd — no CompositeImplicitAutograd op (linear, matmul, batch_norm,
// dropout ... arrive decomposed: t + addmm, native_batch_norm, bernoulli + mul ...), no
// in-place or out= op (functionalization rewrote them; buffers the forward updates come back as
// extra outputs and are copied into the real tensors after the call), views kept as view ops
// (`t`, `view`, `expand`, ...), plus derivative ops in the backward (`threshold_backward`,
// `native_batch_norm_backward`, ...). A decomposition table turns more ops into simpler ones.
//
// Calls with grad mode off, or where nothing requires grad, build a forward-only graph and no
// autograd::Function. Double backward through a compiled graph is refused with an error;
// `retain_graph=true` works. Outputs that are views of inputs are rebuilt as views of the real
// inputs on every call (so aliasing and in-place updates through them match eager). A graph with
// an opaque module call (call_module: a non-traceable hook, a leaf module) is not lifted: it runs
// with the interpreter under ordinary autograd, and TORCHCOMPILE_LOGS=graph says so.
#pragma once

#include <torchcompile/backends/registry.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace torchcompile {

/// How the joint graph is split into forward and backward graphs.
enum class Partitioner {
  SaveAll,  ///< the forward computes everything it can and saves what the backward reads
  MinCut,   ///< min cut over saved bytes: cheap ops (pointwise, views) are recomputed in the backward
};

/// A decomposition: computes an operator from others. It receives the operator's arguments (in
/// schema order, defaults included) and returns its results; the ops it calls through ATen are
/// recorded (and decomposed again if they are in the table).
using Decomposition = std::function<std::vector<c10::IValue>(const std::vector<c10::IValue>& args)>;

/// Operator overloads (`aten::addmm`, `aten::gelu`, `aten::add.Tensor`) to decompositions.
class DecompositionTable {
 public:
  /// Add or replace the decomposition of `op` (an overload name as the graph prints it).
  void add(const std::string& op, Decomposition fn);
  bool contains(const std::string& op) const { return table_.count(op) != 0; }
  const Decomposition* find(const std::string& op) const;
  bool empty() const { return table_.empty(); }
  /// The overloads in the table, sorted.
  std::vector<std::string> ops() const;
  /// Merge `other` in (its entries win).
  void update(const DecompositionTable& other);

 private:
  std::map<std::string, Decomposition> table_;
};

/// The built-in decompositions of the given operators (torch._decomp.get_decompositions): an
/// operator name without overload (`aten::addmm`) selects all its built-in overloads. Unknown
/// names throw, listing what is available.
DecompositionTable get_decompositions(const std::vector<std::string>& ops);
/// Every operator with a built-in decomposition.
std::vector<std::string> available_decompositions();

/// A compiled function with a by-reference signature, adapted to the boxed calling convention
/// (CompiledFn takes its inputs by value, so a compiled function may release them as soon as it
/// has used them; the AOT runtime passes vectors it no longer holds): functorch's make_boxed_func.
CompiledFn make_boxed_func(std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn);

/// The backend that compiles forward and backward graphs with the given compilers (`bw_compiler`
/// defaults to `fw_compiler`; graphs with grad off go to `fw_compiler` alone).
/// `decompositions` are applied while the joint graph is traced.
Backend aot_autograd(Backend fw_compiler, Backend bw_compiler = nullptr, DecompositionTable decompositions = {},
                     Partitioner partition = Partitioner::SaveAll);

namespace aot {

/// What the partitioner decided for one graph: for the partitioner report.
struct PartitionReport {
  Partitioner partitioner = Partitioner::SaveAll;
  size_t forward_nodes = 0;   ///< call_function nodes of the forward graph
  size_t backward_nodes = 0;  ///< call_function nodes of the backward graph
  size_t saved_values = 0;    ///< tensors saved for the backward (primals included)
  size_t saved_primals = 0;   ///< of which inputs, parameters and buffers (held anyway)
  int64_t saved_activation_bytes = 0;  ///< bytes of the saved tensors that are not primals
  std::vector<std::string> saved_names;  ///< the saved values, in order
};

/// The graphs aot_autograd made for one captured graph, for tests and reports.
struct AotGraphs {
  std::string joint;     ///< the joint graph as text (ir::to_text)
  std::string forward;   ///< the forward graph as text
  std::string backward;  ///< the backward graph as text (empty for a forward-only graph)
  PartitionReport report;
};

/// Build the joint graph of `gm` for `example_inputs` and partition it, without compiling
/// (uses and restores the global random generator state; leaves all tensors untouched).
AotGraphs trace_and_partition(GraphModule& gm, const std::vector<at::Tensor>& example_inputs,
                              const DecompositionTable& decompositions = {},
                              Partitioner partition = Partitioner::SaveAll);

}  // namespace aot

}  // namespace torchcompile
