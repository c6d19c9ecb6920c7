// The compile pipeline: from a graph the tracer closed to a compiled function, one step per
// line, each timed and logged (TORCHCOMPILE_LOGS=passes), with a record of which backend
// compiled the graph and what was declined on the way (CompileReport).
#pragma once

#include <torchcompile/backends/compile_report.h>
#include <torchcompile/backends/registry.h>

#include <chrono>
#include <string>
#include <vector>

namespace torchcompile::pipeline {

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

/// One timed step: its time goes into the current report and, with TORCHCOMPILE_LOGS=passes,
/// into the log, with the graph when `gm` is given and the step changed it.
class TimedStep {
 public:
  TimedStep(std::string name, const GraphModule* gm = nullptr);
  ~TimedStep();
  TimedStep(const TimedStep&) = delete;
  TimedStep& operator=(const TimedStep&) = delete;

 private:
  std::string name_;
  const GraphModule* gm_;
  std::string before_;  // the graph's text before the step (only while logging)
  std::chrono::steady_clock::time_point start_;
};

}  // namespace torchcompile::pipeline
