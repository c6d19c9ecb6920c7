// Backends composed over a partitioned graph (Glow's isOpSupported / FX's capability-based
// partitioner): each backend claims the nodes it would compile, the graph is split into runs of
// consecutive nodes claimed by the same backend (ir::partition_by_support, ir::split_module), each
// run is compiled by its backend, and the rest of the graph runs with the interpreter around them.
#pragma once

#include <torchcompile/backends/registry.h>

#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

namespace torchcompile {

/// Which call_function nodes of a graph a backend would compile. It sees the whole graph, so a
/// claim may depend on context (a GEMM together with the activation after it). A claim that
/// takes nothing for a reason worth telling (grad mode, say) records it with `decline(reason)`.
using Claim = std::function<std::unordered_set<const ir::Node*>(const GraphModule& gm,
                                                                const std::vector<at::Tensor>& example_inputs)>;

/// One backend of a composition.
struct PartitionBackend {
  /// The name shown in explain() and the logs.
  std::string name;
  /// The call_function nodes of a graph this backend would compile.
  Claim claim;
  /// Compiles one part (a graph of nodes it claimed); may decline it (the part then runs with
  /// the interpreter).
  Backend compile;
};

/// A backend that splits each graph among `backends`: a node claimed by several goes to the
/// first. Runs of consecutive nodes of one backend (at least `min_size` nodes) become parts; a
/// graph that is one whole run is handed to its backend unsplit (the report then names that
/// backend; a split graph's report names the composition and lists its parts). Each part's example inputs are
/// the real inputs where the part reads a graph input, and tensors with the traced metadata and
/// unspecified contents elsewhere (as FX's fake tensors). Declines when no backend claims a
/// node or every part is declined; a part whose backend throws runs with the interpreter (with
/// a warning). explain() and TORCHCOMPILE_LOGS=passes list each part and who runs it.
Backend partitioned_backend(std::vector<PartitionBackend> backends, size_t min_size = 1);

/// A claim from a per-node predicate.
Claim claim_if(std::function<bool(const ir::Node&)> supported);

/// Declare the claim of the registered backend `name`, so that compositions can name it
/// (partition_backend). Throws if `name` already has one.
void register_claim(const std::string& name, Claim claim);

/// Whether the registered backend `name` has a claim.
bool has_claim(const std::string& name);

/// The registered backend `name` with its registered claim; throws if either is missing.
PartitionBackend partition_backend(const std::string& name);

/// Whether running `gm` with these inputs must record autograd: grad mode is enabled and an input
/// or attribute requires grad. Backends whose kernels record no autograd graph decline then.
bool needs_autograd(const GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

/// The decline reason for such a graph (one wording for every backend that declines it).
extern const char* const kNeedsAutogradReason;

}  // namespace torchcompile
