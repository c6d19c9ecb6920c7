// The compile pipeline: from a graph the tracer closed to a compiled function, one step per
// line, each timed and logged (TORCHCOMPILE_LOGS=passes), with a record of which backend
// compiled the graph and what was declined on the way (CompileReport). Steps are timed with
// TimedStep (backends/backend.h), which backends and aot_autograd use too.
#pragma once

#include <torchcompile/compile/compile_report.h>

#include <string>
#include <vector>

// The namespace is not `compile`: torchcompile::compile is the function that compiles a module.
namespace torchcompile::compile_stage {

struct CompiledGraph {
  CompiledFn fn;
  CompileReport report;
};

/// Compile `gm`: lint the captured graph; dead-code elimination (and dropping attributes no
/// longer read); the backend. A declined graph runs with the interpreter. A backend's exception
/// propagates (the caller runs eagerly and warns). `owner` names the compiled object in logs.
CompiledGraph compile_graph(GraphModule& gm, const std::vector<at::Tensor>& example_inputs, const Backend& backend,
                            const std::string& backend_name, const std::string& owner);

/// Call `backend` (registered as `name`) on `gm` and record its answer in the current report:
/// compiled, declined (with the reason given to decline()) or failed (then rethrows). Answers
/// a nested chain already recorded are not recorded twice.
CompiledFn call_backend(const Backend& backend, const std::string& name, GraphModule& gm,
                        const std::vector<at::Tensor>& example_inputs);

}  // namespace torchcompile::compile_stage
