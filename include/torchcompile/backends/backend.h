// The backend contract: what a backend is, what it may claim of a graph, and how it tells the
// compile stage what it did — declining a graph, describing the parts it compiled, timing its
// own steps. Everything here is what a backend (built-in, registered in code, or a plugin) and
// the wrappers around backends (aot_autograd) see; the record the compile stage keeps of these
// answers is compile/compile_report.h.
//
// A backend is a function `CompiledFn(GraphModule&, const std::vector<at::Tensor>&)`. To decline
// a graph it returns an empty CompiledFn; `return torchcompile::decline("why");` also records
// the reason, which explain() and TORCHCOMPILE_LOGS=passes show. The compile stage then runs the
// next backend of a fallback_chain, or the interpreter.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

namespace torchcompile {

using ir::GraphModule;

/// A compiled graph: takes the graph's inputs (placeholders, in order) and returns its outputs.
/// It may consume (and free) its input vector.
using CompiledFn = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)>;

/// A backend turns a captured graph into a CompiledFn. `example_inputs` are the real inputs
/// of the call that was traced. A backend may decline with an empty CompiledFn, best through
/// `return decline("reason");`: the compile stage then tries the next backend of a fallback
/// chain, or runs the graph with the interpreter.
using Backend = std::function<CompiledFn(GraphModule& gm, const std::vector<at::Tensor>& example_inputs)>;

/// Which call_function nodes of a graph a backend would compile (Glow's isOpSupported, seeing
/// the whole graph, so a claim may depend on context: a GEMM together with the activation after
/// it). A claim that takes nothing for a reason worth telling (grad mode, say) records it with
/// `decline(reason)`. A registered backend may carry one (registry.h); compositions
/// (compile/partitioner.h) split graphs by claims.
using Claim = std::function<std::unordered_set<const ir::Node*>(const GraphModule& gm,
                                                                const std::vector<at::Tensor>& example_inputs)>;

/// A claim from a per-node predicate.
Claim claim_if(std::function<bool(const ir::Node&)> supported);

/// Decline the graph being compiled: returns an empty CompiledFn and records `reason`.
CompiledFn decline(std::string reason);

/// Graphs with size symbols. With dynamic shapes a backend receives the graph once per
/// dynamic entry, with size symbols (`gm.graph().symbols()`, metadata `f32[s0, 784]`), and its
/// CompiledFn is then called with inputs of any sizes the symbols take. A backend whose
/// compiled form depends on the example sizes (primitives, buffers or programs built for them)
/// returns `compile_per_shape(gm, static_backend)`: at each new combination of symbol values
/// it makes a static copy of the graph with every value's metadata at those sizes and hands it
/// to `static_backend`, whose compiled form computes that call and serves those sizes from then
/// on (the most recent 64 combinations are kept). The metadata comes from running the graph's
/// ops on meta tensors (no data); for a graph that writes its inputs or attributes, draws random
/// numbers or has an op whose result sizes depend on the data, from running the graph on the
/// call's inputs (whose results that call returns). A backend may
/// instead `decline(...)` a graph with symbols: the runtime then hands it static graphs, one
/// per size. For a graph without symbols, compile_per_shape is `static_backend(gm, inputs)`.
CompiledFn compile_per_shape(GraphModule& gm, const std::vector<at::Tensor>& example_inputs, Backend static_backend);

/// For a backend that compiled the graph: describe one part of it (a fused group, "aten: 3
/// ops"); shown by explain() and the logs. Does nothing outside the compile stage.
void report_partition(std::string part);

/// Whether running `gm` with these inputs must record autograd: grad mode is enabled and an input
/// or attribute requires grad. Backends whose kernels record no autograd graph decline then.
bool needs_autograd(const GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

/// The decline reason for such a graph (one wording for every backend that declines it).
extern const char* const kNeedsAutogradReason;

/// One timed step of compiling a graph (a pass, a backend, a step of aot_autograd): its time goes
/// into the graph's compile report and, with TORCHCOMPILE_LOGS=passes, into the log, with the
/// graph when `gm` is given and the step changed it.
class TimedStep {
 public:
  explicit TimedStep(std::string name, const GraphModule* gm = nullptr);
  ~TimedStep();
  TimedStep(const TimedStep&) = delete;
  TimedStep& operator=(const TimedStep&) = delete;

 private:
  std::string name_;
  const GraphModule* gm_;
  std::string before_;  // the graph's text before the step (only while logging)
  std::chrono::steady_clock::time_point start_;
};

namespace detail {

/// The reason recorded by the last decline() on this thread, cleared by the call.
std::string take_decline_reason();

/// How compile_per_shape's decline reasons begin when the static backend declined the graph at
/// the example sizes (the runtime then does not offer it static graphs instead).
extern const char* const kDeclinedAtExampleSizes;

/// What the compile stage listens to while it compiles a graph on this thread: the parts a
/// backend reports and the timed steps. (compile/compile_report.h's ReportScope installs one that
/// writes into a CompileReport.)
class CompileListener {
 public:
  virtual ~CompileListener() = default;
  virtual void on_partition(std::string part) = 0;
  virtual void on_step(const std::string& name, double ms) = 0;
};

/// The listener of this thread, or nullptr outside the compile stage.
CompileListener* current_listener();

/// Makes `listener` current on this thread for its lifetime (nests).
class ListenerScope {
 public:
  explicit ListenerScope(CompileListener* listener);
  ~ListenerScope();
  ListenerScope(const ListenerScope&) = delete;
  ListenerScope& operator=(const ListenerScope&) = delete;

 private:
  CompileListener* previous_;
};

}  // namespace detail

}  // namespace torchcompile
