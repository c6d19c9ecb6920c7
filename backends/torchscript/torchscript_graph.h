// The torchscript backend's two steps, exposed for its tests: GraphModule -> torch::jit::Graph,
// and the pass pipeline run on the result.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <string>
#include <vector>

namespace torchcompile::backends::torchscript {

/// A TorchScript graph computing a GraphModule's graph. Its inputs are the placeholders (in
/// order) followed by one input per attribute in `attributes`; its single output is a tuple of
/// the output node's values.
struct Program {
  std::shared_ptr<torch::jit::Graph> graph;
  std::vector<std::string> attributes;  // qualified names, in graph input order
};

/// Convert `gm`. Every call_function node becomes a node resolving to exactly the same
/// operator overload. Throws a c10::Error naming the node and its target when the graph holds
/// something TorchScript cannot express (a call_module node, an argument TorchScript has no
/// constant for, an overload TorchScript cannot select).
Program convert(const ir::GraphModule& gm);

/// Which of the optional passes may run (see optimize()).
struct PassOptions {
  /// Constant folding and common subexpression elimination. Off when the graph draws random
  /// numbers: TorchScript's own list of nondeterministic ops is not exhaustive.
  bool fold_and_dedup = true;
  /// aten::add + aten::relu -> aten::_add_relu. Only for graphs that need no gradient (the fused
  /// op has no derivative) and whose tensors all have one floating dtype (the fused kernel
  /// clamps with the limits of its first operand's dtype).
  bool fuse_add_relu = false;
};

/// The options that are safe for `gm` when called with autograd `needs_grad` or not.
PassOptions pass_options(const ir::GraphModule& gm, bool needs_grad);

/// Run the pass pipeline on `graph` in place: removeDropout (train=False only), dead code
/// elimination, constant propagation + pooling (kept only if no folded tensor can reach an
/// output and none is 0-dim), CSE, FuseLinear, FuseAddRelu, dead code elimination. Throws if
/// the result cannot be compiled to TorchScript's interpreter code.
void optimize(std::shared_ptr<torch::jit::Graph>& graph, const PassOptions& options);

}  // namespace torchcompile::backends::torchscript
