// Backends composed over a partitioned graph (Glow's isOpSupported / FX's capability-based
// partitioner): each backend claims the nodes it would compile, the graph is split into runs of
// consecutive nodes claimed by the same backend (ir::group_by_support, ir::split_module), each
// run is compiled by its backend, and the rest of the graph runs with the interpreter around them.
#pragma once

#include <torchcompile/backends/registry.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchcompile {

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

/// The bytes of the floating-point attributes (the weights) a graph reads: those of the whole
/// graph while partitioned_backend compiles one of its parts on this thread, else those `gm`
/// holds. A part's backend may choose by whether the weights of the graph it is part of can stay
/// in the caches from one call to the next.
int64_t graph_weight_bytes(const GraphModule& gm);

/// The registered backend `name` with its claim (registry.h: register_claim); throws if either is
/// missing.
PartitionBackend partition_backend(const std::string& name);

}  // namespace torchcompile
