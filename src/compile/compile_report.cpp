// CompileReport and the decline/partition calls backends make while the pipeline runs them.
#include <torchcompile/backends/compile_report.h>

namespace torchcompile {

namespace {
thread_local std::string t_decline_reason;
thread_local CompileReport* t_report = nullptr;
}  // namespace

std::vector<std::string> CompileReport::describe() const {
  std::vector<std::string> lines;
  lines.push_back(backend == "interpreter" ? "run by the interpreter" : "compiled by " + backend);
  for (const auto& part : partition) lines.push_back("  part: " + part);
  for (const auto& a : attempts) {
    if (a.outcome == BackendAttempt::Outcome::Declined)
      lines.push_back("  declined by " + a.backend + (a.reason.empty() ? " (no reason given)" : ": " + a.reason));
    else if (a.outcome == BackendAttempt::Outcome::Failed)
      lines.push_back("  failed in " + a.backend + ": " + a.reason);
  }
  return lines;
}

CompiledFn decline(std::string reason) {
  t_decline_reason = std::move(reason);
  return CompiledFn();
}

void report_partition(std::string part) {
  if (t_report) t_report->partition.push_back(std::move(part));
}

namespace detail {

std::string take_decline_reason() {
  std::string r = std::move(t_decline_reason);
  t_decline_reason.clear();
  return r;
}

CompileReport* current_report() { return t_report; }

ReportScope::ReportScope(CompileReport* report) : previous_(t_report) { t_report = report; }
ReportScope::~ReportScope() { t_report = previous_; }

}  // namespace detail
}  // namespace torchcompile
