// What running a graph changes besides its outputs: the inputs and attributes it writes, whether
// it draws random numbers or calls a module opaquely. Read from the graph alone (a pure IR
// analysis), by the runtime's snapshots of a call and by AOT's functionalization.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <string>
#include <vector>

namespace torchcompile::ir {

/// The state a compiled graph may change besides its outputs.
struct GraphEffects {
  std::vector<size_t> written_inputs;           ///< placeholder positions written (directly or through views)
  std::vector<std::string> written_attributes;  ///< get_attr targets written
  bool random = false;                          ///< draws random numbers
  bool opaque = false;                          ///< calls a module opaquely (anything it owns may change)

  bool any() const { return random || opaque || !written_inputs.empty() || !written_attributes.empty(); }
};

/// Reads a graph's effects from its nodes: in-place and out= arguments (followed back through
/// views to what owns their memory), random operators, call_module nodes (whose tensor
/// arguments count as written).
GraphEffects effects_of(const GraphModule& gm);

}  // namespace torchcompile::ir
