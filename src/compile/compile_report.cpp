// CompileReport, and the scope that records a backend's answers (backends/backend.h) into it.
#include <torchcompile/compile/compile_report.h>

namespace torchcompile {

namespace {
thread_local CompileReport* t_report = nullptr;

// Writes what backends report into one CompileReport.
class ReportListener final : public detail::CompileListener {
 public:
  explicit ReportListener(CompileReport* report) : report_(report) {}
  void on_partition(std::string part) override { report_->partition.push_back(std::move(part)); }
  void on_step(const std::string& name, double ms) override { report_->steps.push_back({name, ms}); }

 private:
  CompileReport* report_;
};
}  // namespace

std::vector<std::string> CompileReport::describe() const {
  std::vector<std::string> lines;
  lines.push_back(backend == "interpreter" ? "run by the interpreter" : "compiled by " + backend);
  for (const auto& part : partition) lines.push_back("  part: " + part);
  for (const auto& p : precision) lines.push_back("  precision " + p);
  for (const auto& r : rewrites) lines.push_back("  rewrite " + r);
  for (const auto& a : attempts) {
    if (a.outcome == BackendAttempt::Outcome::Declined)
      lines.push_back("  declined by " + a.backend + (a.reason.empty() ? " (no reason given)" : ": " + a.reason));
    else if (a.outcome == BackendAttempt::Outcome::Failed)
      lines.push_back("  failed in " + a.backend + ": " + a.reason);
  }
  return lines;
}

namespace detail {

CompileReport* current_report() { return t_report; }

ReportScope::ReportScope(CompileReport* report)
    : previous_(t_report),
      listener_(report ? std::make_unique<ReportListener>(report) : nullptr),
      scope_(std::make_unique<ListenerScope>(listener_.get())) {
  t_report = report;
}

ReportScope::~ReportScope() {
  scope_.reset();
  t_report = previous_;
}

}  // namespace detail
}  // namespace torchcompile
