// Runs a GraphModule's graph through the dispatcher with a call plan prepared once.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <functional>
#include <memory>
#include <vector>

namespace torchcompile::ir {

/// Executes a graph. The constructor turns every node into a step: the operator handle, a
/// stack template with the constant arguments in place, where each tensor argument comes
/// from, and which value slots die after the step (so intermediates are freed as early as
/// eager frees them). run() does no string lookups and no schema parsing.
///
/// Thread-safe: run() keeps its state on the caller's stack, so one Interpreter may serve
/// concurrent calls.
class Interpreter {
 public:
  explicit Interpreter(const GraphModule& gm);
  ~Interpreter();

  /// Bind placeholders to `inputs` (in order), run every node, return the output values.
  /// Attributes are read from the GraphModule at each call.
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs) const;

  size_t num_inputs() const;

 private:
  struct Plan;
  std::unique_ptr<Plan> plan_;
  const GraphModule& gm_;
};

/// The graph as a function of its inputs, run by an Interpreter that the function owns: what a
/// backend returns to run a graph as captured (`return ir::interpreter_fn(gm);`). The type is
/// the backends' CompiledFn. `gm` must outlive the function (the runtime keeps it alive).
std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)> interpreter_fn(const GraphModule& gm);

}  // namespace torchcompile::ir
