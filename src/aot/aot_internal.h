// AOT autograd internals: the joint graph, the partitioner, and what the runtime needs to map a
// captured graph's call onto the forward/backward pair. See include/torchcompile/aot/aot_autograd.h.
#pragma once

#include <torchcompile/aot/aot_autograd.h>
#include <torchcompile/ir/graph_module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchcompile::aot {

/// Where a primal comes from on each call.
struct PrimalSource {
  int input = -1;          ///< the captured graph's input index, or -1 for module state
  std::string attribute;   ///< the attribute's qualified name (module state)
  at::Tensor tensor;       ///< the attribute's tensor (the module's own), or the example input
  bool requires_grad = false;
};

/// Where each output of the captured graph comes from.
struct OutputSource {
  int graph_output = -1;  ///< a forward graph output
  int alias_primal = -1;  ///< or a view of this primal, rebuilt with as_strided on each call
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;  ///< relative to the primal's own storage offset
  std::vector<int64_t> primal_strides;  ///< the primal's strides when traced (the view is right only for them)
};

/// The joint forward+backward graph of one captured graph.
///
/// Placeholders: primals_1..n (module state first, then inputs), then tangents_1..m.
/// Outputs: [forward outputs][new values of mutated primals][gradients of grad_primals].
struct JointGraph {
  std::unique_ptr<ir::GraphModule> gm;
  std::vector<PrimalSource> primals;
  size_t num_tangents = 0;
  std::vector<OutputSource> outputs;      ///< one per output of the captured graph
  size_t num_fw_outputs = 0;
  std::vector<int> tangent_of_fw_output;  ///< per forward output: its tangent, or -1 (no gradient)
  std::vector<size_t> mutated_primals;
  std::vector<size_t> grad_primals;
  bool training = false;                  ///< a backward exists
  /// Non-empty when the pair would not compute what eager computes (a value requiring grad
  /// written into an input that does not; an input whose layout a copy cannot keep): the caller
  /// declines the graph, and nothing else is set.
  std::string decline_reason;
};

/// Trace the joint graph of `gm` (docs/training.md). Throws a c10::Error saying why when
/// the graph cannot be lifted. Uses and restores the CPU generator's state; leaves every tensor
/// it was given untouched.
JointGraph build_joint(const ir::GraphModule& gm, const std::vector<at::Tensor>& example_inputs,
                       const DecompositionTable& decompositions);

/// The joint graph of `gm`, a graph with size symbols, for every size: recorded at the example
/// inputs and at three other combinations of the symbols' values (inputs made from the examples'
/// values), its integers and metadata fitted as expressions of the symbols, which it declares.
/// None, with `why`, when the recordings differ otherwise, an expression does not fit, or the
/// graph is declined at the examples.
std::optional<JointGraph> build_symbolic_joint(const ir::GraphModule& gm, const std::vector<at::Tensor>& example_inputs,
                                               const DecompositionTable& decompositions, std::string& why);

/// The forward and backward graphs.
///
/// forward: primals -> [forward outputs][mutated primals' new values][saved values]
/// backward: [saved values][tangents] -> gradients of JointGraph::grad_primals
struct Partition {
  std::unique_ptr<ir::GraphModule> forward;
  std::unique_ptr<ir::GraphModule> backward;  ///< null for a forward-only graph
  size_t num_saved = 0;
  PartitionReport report;
  /// The joint graph had size symbols that the forward or backward graph could not keep (its
  /// inputs do not bind them): that graph was made static at the example sizes.
  bool lost_symbols = false;
};

Partition partition_joint(const JointGraph& joint, Partitioner partitioner);


/// Whether `gm` can be lifted (no opaque module calls; when `training`, no in-place update of a
/// non-contiguous view); if not, `why` says why.
bool liftable(const ir::GraphModule& gm, bool training, std::string* why);
/// Whether a call with these inputs (and the graph's module state) trains: grad mode is on and
/// some input or attribute requires grad.
bool wants_gradients(const ir::GraphModule& gm, const std::vector<at::Tensor>& inputs);
/// Zeros with each placeholder's traced metadata (dtype, sizes, strides, device): example inputs
/// of a graph that has none at hand (a backward graph, a graph loaded from a package).
std::vector<at::Tensor> zeros_like_placeholders(const ir::GraphModule& gm);

}  // namespace torchcompile::aot
