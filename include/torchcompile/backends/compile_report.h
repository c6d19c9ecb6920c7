// What the compile pipeline did with one captured graph, and how a backend declines a graph or
// describes what it compiled.
//
// A backend is a function `CompiledFn(GraphModule&, const std::vector<at::Tensor>&)`. To decline
// a graph it returns an empty CompiledFn; `return torchcompile::decline("why");` also records
// the reason, which explain() and TORCHCOMPILE_LOGS=passes show. The pipeline then runs the next
// backend of a fallback_chain, or the interpreter.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torchcompile {

using CompiledFn = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)>;

/// One backend's answer for a graph.
struct BackendAttempt {
  enum class Outcome { Compiled, Declined, Failed };
  std::string backend;  ///< the registered name ("<function>" for an unnamed backend function)
  Outcome outcome = Outcome::Compiled;
  std::string reason;   ///< a decline's reason (may be empty) or a failure's error message
};

/// One step of the pipeline: its name and wall time.
struct PipelineStep {
  std::string name;
  double ms = 0;
};

/// The record of compiling one graph.
struct CompileReport {
  /// Which backend runs the graph: the backend that compiled it, or "interpreter" when every
  /// backend declined.
  std::string backend;
  /// What the backends of a chain answered, in order (the compiling one last).
  std::vector<BackendAttempt> attempts;
  /// How the compiling backend split the graph, one line per part (e.g. "onednn: linear+relu",
  /// "aten: 4 ops"); empty if it did not say.
  std::vector<std::string> partition;
  /// The pipeline's steps with their times.
  std::vector<PipelineStep> steps;

  /// Lines for explain(): "compiled by onednn", the partition, each decline and failure.
  std::vector<std::string> describe() const;
};

/// Decline the graph being compiled: returns an empty CompiledFn and records `reason`.
CompiledFn decline(std::string reason);

/// For a backend that compiled the graph: describe one part of it (a fused group, "aten: 3
/// ops"); shown by explain() and the logs. Does nothing outside a pipeline.
void report_partition(std::string part);

namespace detail {
/// The reason recorded by the last decline() on this thread, cleared by the call.
std::string take_decline_reason();
/// The report of the graph being compiled on this thread, or nullptr.
CompileReport* current_report();
/// Makes `report` current on this thread for its lifetime (nests).
class ReportScope {
 public:
  explicit ReportScope(CompileReport* report);
  ~ReportScope();
  ReportScope(const ReportScope&) = delete;
  ReportScope& operator=(const ReportScope&) = delete;

 private:
  CompileReport* previous_;
};
}  // namespace detail

}  // namespace torchcompile
