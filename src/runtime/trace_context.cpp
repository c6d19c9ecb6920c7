// The trace context: which trace runs on this thread, and the module paths and hook versions
// a module call boundary records in it (see trace_context.h).
#include "runtime/trace_context.h"

#include <torch/nn/module.h>

namespace torchcompile::runtime {

namespace {
thread_local TraceContext* tls_context = nullptr;
}  // namespace

std::string module_type_name(const torch::nn::Module& m) {
  std::string n = m.name();
  if (auto p = n.rfind("::"); p != std::string::npos) n = n.substr(p + 2);
  if (n.size() > 4 && n.compare(n.size() - 4, 4, "Impl") == 0) n.resize(n.size() - 4);
  return n;
}

TraceContext* TraceContext::current() { return tls_context; }

TraceContext::Scope::Scope(TraceContext& ctx) : previous_(tls_context) { tls_context = &ctx; }
TraceContext::Scope::~Scope() { tls_context = previous_; }

std::string TraceContext::path_of(const torch::nn::Module& m) const {
  const torch::nn::Module* parent = stack_.empty() ? root_ : stack_.back().first;
  const std::string parent_path = stack_.empty() ? "" : stack_.back().second;
  if (parent != nullptr) {
    for (const auto& c : parent->named_children())
      if (c.value().get() == &m) return parent_path.empty() ? c.key() : parent_path + "." + c.key();
  }
  if (root_ != nullptr) {
    if (&m == root_) return "";
    for (const auto& c : root_->named_modules("", /*include_self=*/false))
      if (c.value().get() == &m) return c.key();
  }
  return module_type_name(m);
}

void TraceContext::note(const std::shared_ptr<torch::nn::Module>& m, uint64_t version, const std::string& path) {
  for (const Noted& n : modules_)
    if (n.module.get() == m.get()) return;
  modules_.push_back(Noted{m, version, path});
}

}  // namespace torchcompile::runtime
