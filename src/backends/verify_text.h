// TORCHCOMPILE_VERIFY_TEXT=1 (the test suite runs with it): every graph with size symbols handed
// to a backend is checked against the text format first. The compile pipeline checks the graphs
// it hands to backends (whole, or each part of a split); aot_autograd its forward and backward
// graphs.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <vector>

namespace torchcompile::detail {

/// With TORCHCOMPILE_VERIFY_TEXT=1, a graph with size symbols must round-trip through the text
/// format (print, parse, print gives the same text) and the parsed graph must compute what the
/// graph computes at the example inputs (both run by the interpreter on copies of the inputs and
/// attributes, from the same random state); throws otherwise. Does nothing without the variable,
/// for a graph without symbols, or for one that calls modules (their graphs are checked on
/// their own).
void verify_text_round_trip(const ir::GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

}  // namespace torchcompile::detail
