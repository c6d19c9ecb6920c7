// The backend contract's calls (backends/backend.h): declines, reported parts and timed steps,
// passed to the compile stage through a thread-local listener; claims; needs_autograd.
#include <torchcompile/backends/backend.h>

#include <torchcompile/ir/printer.h>
#include <torchcompile/support/logging.h>

#include <ATen/core/grad_mode.h>

#include <cstdio>

namespace torchcompile {

namespace {
thread_local std::string t_decline_reason;
thread_local detail::CompileListener* t_listener = nullptr;

std::string format_ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", ms);
  return buf;
}
}  // namespace

Claim claim_if(std::function<bool(const ir::Node&)> supported) {
  return [supported = std::move(supported)](const GraphModule& gm, const std::vector<at::Tensor>&) {
    std::unordered_set<const ir::Node*> claimed;
    for (const auto& n : gm.graph().nodes())
      if (n->kind() == ir::NodeKind::CallFunction && supported(*n)) claimed.insert(n.get());
    return claimed;
  };
}

CompiledFn decline(std::string reason) {
  t_decline_reason = std::move(reason);
  return CompiledFn();
}

void report_partition(std::string part) {
  if (t_listener) t_listener->on_partition(std::move(part));
}

const char* const kNeedsAutogradReason = "grad mode is enabled and an input or parameter requires grad";

bool needs_autograd(const GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const auto& t : example_inputs)
    if (t.defined() && t.requires_grad()) return true;
  for (const auto& kv : gm.attributes())
    if (kv.second.first.defined() && kv.second.first.requires_grad()) return true;
  return false;
}

TimedStep::TimedStep(std::string name, const GraphModule* gm)
    : name_(std::move(name)), gm_(gm), start_(std::chrono::steady_clock::now()) {
  if (gm_ && logging::log_enabled(logging::LogKind::Passes)) before_ = ir::to_text(gm_->graph());
}

TimedStep::~TimedStep() {
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  if (t_listener) t_listener->on_step(name_, ms);
  if (!logging::log_enabled(logging::LogKind::Passes)) return;
  std::string msg = "step " + name_ + " (" + format_ms(ms) + ")";
  if (gm_) {
    std::string after = ir::to_text(gm_->graph());
    msg += after == before_ ? ": graph unchanged" : ", graph after it:\n" + after;
  }
  logging::log(logging::LogKind::Passes, msg);
}

namespace detail {

std::string take_decline_reason() {
  std::string r = std::move(t_decline_reason);
  t_decline_reason.clear();
  return r;
}

CompileListener* current_listener() { return t_listener; }

ListenerScope::ListenerScope(CompileListener* listener) : previous_(t_listener) { t_listener = listener; }
ListenerScope::~ListenerScope() { t_listener = previous_; }

}  // namespace detail
}  // namespace torchcompile
