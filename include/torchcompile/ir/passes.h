// Checks and simple passes over a Graph.
#pragma once

#include <torchcompile/ir/graph.h>

namespace torchcompile::ir {

/// Verify the graph's invariants; throws a c10::Error describing the first violation and
/// printing the offending node. Checks: every node is owned by this graph; names are unique;
/// placeholders come first and exactly one output node comes last; every argument Value refers
/// to an earlier node of this graph and a valid output index; use lists match the arguments
/// exactly; call_function nodes have one argument per schema argument and output metadata
/// matching their return counts. Tests call it after every transform.
void lint(const Graph& g);

/// Dead-code elimination: removes nodes none of whose outputs are used, unless they have side
/// effects (mutation, randomness; see Node::has_side_effects), repeating until nothing
/// changes. Placeholders are kept (they are the calling convention). Returns whether anything
/// was removed. Shown by test/ir/test_passes.cpp.
bool eliminate_dead_code(Graph& g);

}  // namespace torchcompile::ir
