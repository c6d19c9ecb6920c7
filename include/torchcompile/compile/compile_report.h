// What the compile stage did with one captured graph: which backend compiled it, what each
// backend of a chain answered, how the graph was split, and the time of each step. explain()
// and TORCHCOMPILE_LOGS=passes show it. Backends do not write it themselves: they answer through
// the backend contract (backends/backend.h: decline(), report_partition(), TimedStep), which the
// compile stage records here.
#pragma once

#include <torchcompile/backends/backend.h>

#include <memory>
#include <string>
#include <vector>

namespace torchcompile {

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
  /// Under a reduced precision (CompileOptions::precision): each Linear's precision, and why a
  /// Linear kept float32 ("int8-dynamic: linear fc1 [784 -> 512]"). Every other op is float32.
  std::vector<std::string> precision;
  /// Algebraic rewrites the compiling backend made before running the graph, one line each
  /// (`default`: "mm_2 [512 x 4096 @ 4096 x 2048]: column sums of its second operand times one
  /// value ..."). Each computes the same values up to float rounding.
  std::vector<std::string> rewrites;
  /// The pipeline's steps with their times.
  std::vector<PipelineStep> steps;

  /// Lines for explain(): "compiled by onednn", the partition, each decline and failure.
  std::vector<std::string> describe() const;
};

namespace detail {
/// The report of the graph being compiled on this thread, or nullptr.
CompileReport* current_report();
/// Makes `report` current on this thread for its lifetime (nests): the parts backends report and
/// the timed steps go into it.
class ReportScope {
 public:
  explicit ReportScope(CompileReport* report);
  ~ReportScope();
  ReportScope(const ReportScope&) = delete;
  ReportScope& operator=(const ReportScope&) = delete;

 private:
  CompileReport* previous_;
  std::unique_ptr<CompileListener> listener_;
  std::unique_ptr<ListenerScope> scope_;
};
}  // namespace detail

}  // namespace torchcompile
