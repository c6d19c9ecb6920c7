// Runs a GraphModule's graph through the dispatcher with a call plan prepared once.
#pragma once

#include <torchcompile/ir/callable.h>
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
/// A call_function node whose target is a user function (Graph::set_target) calls it, with
/// the node's arguments, in place of the operator.
///
/// Extensible as FX's Interpreter (whose `call_function` / `run_node` one overrides in a
/// subclass): override(target, fn) runs `fn` for every node of that target, override_if(select,
/// fn) for every node `select` accepts. Those nodes become steps that gather their arguments and
/// call the function (with the autograd keys, as module calls); every other node keeps its
/// prepared step, with the same run-time shortcuts (dispatch below autograd, in-place reuse,
/// prepared scalar operands) and no extra cost per step: an interpreter without overrides runs
/// exactly as before. A node reading a user function's result is not computed in that result's
/// memory (the function may return any tensor).
///
/// Thread-safe: run() keeps its state on the caller's stack, so one Interpreter may serve
/// concurrent calls. override() and override_if() re-prepare the plan: call them before run(),
/// not while another thread runs the interpreter.
class Interpreter {
 public:
  explicit Interpreter(const GraphModule& gm);
  ~Interpreter();

  /// Run `fn` in place of every call_function node whose target() is `target` (an operator as
  /// `aten::add.Tensor`, or a user function's name), with the node's arguments (CallableFn).
  /// Returns the number of nodes it applies to. A later override of a node wins.
  size_t override(const std::string& target, CallableFn fn);
  /// Run `fn(node, args)` in place of every call_function node `select` accepts (FX's
  /// `run_node` hook). Returns the number of nodes it applies to. A later override of a node wins.
  size_t override_if(std::function<bool(const Node&)> select, NodeFn fn);

  /// Bind placeholders to `inputs` (in order), run every node, return the output values.
  /// Attributes are read from the GraphModule at each call.
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs) const;

  size_t num_inputs() const;

  /// The prepared plan, one line per step: `exp = aten::exp  (in place)`, `mul = aten::mul.Scalar
  /// (scalar operand prepared)`, `add = aten::add.Tensor  (override)`, `add_1 = test_add  (user
  /// function)`, `w = get_attr w`, `submod_0 = call_module submod_0`.
  std::string describe() const;

 private:
  struct Plan;
  struct Override {
    std::function<bool(const Node&)> select;
    std::shared_ptr<const NodeFn> fn;
  };
  void prepare();
  std::unique_ptr<Plan> plan_;
  const GraphModule& gm_;
  std::vector<Override> overrides_;
};

/// What a call_function node runs when no override replaces it: its user function if it has one
/// (Graph::set_target), else its operator, called with `args` (as a CallableFn receives them).
/// Returns the outputs in order. For an override that adds to the node's own work:
///
///     interp.override_if(is_matmul, [](const ir::Node& n, const std::vector<c10::IValue>& args) {
///       log(n.name());
///       return ir::run_target(n, args);
///     });
std::vector<at::Tensor> run_target(const Node& node, const std::vector<c10::IValue>& args);

/// The graph as a function of its inputs, run by an Interpreter that the function owns: what a
/// backend returns to run a graph as captured (`return ir::interpreter_fn(gm);`). The type is
/// the backends' CompiledFn. `gm` must outlive the function (the runtime keeps it alive).
std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)> interpreter_fn(const GraphModule& gm);

}  // namespace torchcompile::ir
