#include <torchcompile/runtime/compiled_function.h>

#include <torchcompile/capture/tracer.h>

#include "runtime/guards.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <optional>

namespace torchcompile {
namespace runtime {

// ---- arguments ------------------------------------------------------------------------------

bool ArgItem::operator==(const ArgItem& o) const {
  if (kind != o.kind) return false;
  if (kind == Double) return d == o.d || (d != d && o.d != o.d);  // NaN specializes like any value
  return i == o.i;
}

void CallArgs::add(const at::Tensor& t) {
  items.push_back({ArgItem::Tensor, 1});
  tensors.push_back(t);
}

void CallArgs::add(const std::vector<at::Tensor>& ts) {
  items.push_back({ArgItem::TensorList, static_cast<int64_t>(ts.size())});
  tensors.insert(tensors.end(), ts.begin(), ts.end());
}

void CallArgs::add(const c10::optional<at::Tensor>& t) {
  const bool present = t.has_value() && t->defined();
  items.push_back({ArgItem::Tensor, present ? 1 : 0});
  if (present) tensors.push_back(*t);
}

void CallArgs::add(int64_t v) { items.push_back({ArgItem::Int, v}); }
void CallArgs::add(double v) { items.push_back({ArgItem::Double, 0, v}); }
void CallArgs::add(bool v) { items.push_back({ArgItem::Bool, v ? 1 : 0}); }

// ---- entries ----------------------------------------------------------------------------------

CompiledEntry::CompiledEntry(std::unique_ptr<GuardSet> guards, CompiledFn fn, OutputSpec spec,
                             std::shared_ptr<GraphModule> gm, std::string eager_reason)
    : guards_(std::move(guards)),
      fn_(std::move(fn)),
      spec_(std::move(spec)),
      gm_(std::move(gm)),
      eager_reason_(std::move(eager_reason)) {}

CompiledEntry::~CompiledEntry() = default;

// ---- tracing ----------------------------------------------------------------------------------

class TraceSession {
 public:
  TraceSession(const CallArgs& args, const std::shared_ptr<torch::nn::Module>& root,
               const std::vector<std::string>& input_names)
      : guards(GuardSet::build(args, root, input_names)), example_inputs(args.tensors) {
    const auto names = tensor_input_names(args, input_names);
    for (size_t i = 0; i < args.tensors.size(); ++i) tracer.add_input(args.tensors[i], names[i]);
    if (root) {
      for (const auto& p : root->named_parameters(/*recurse=*/true))
        tracer.add_attribute(p.key(), p.value(), ir::AttributeKind::Parameter);
      for (const auto& b : root->named_buffers(/*recurse=*/true))
        tracer.add_attribute(b.key(), b.value(), ir::AttributeKind::Buffer);
    }
    activation.emplace(tracer);
  }

  capture::Tracer tracer;
  std::optional<capture::Tracer::Activation> activation;
  std::unique_ptr<GuardSet> guards;
  std::vector<at::Tensor> example_inputs;
};

// ---- the compiled object ------------------------------------------------------------------------

CompiledFunction::CompiledFunction(CompileOptions options, std::shared_ptr<torch::nn::Module> root, std::string name)
    : options_(std::move(options)), root_(std::move(root)), name_(std::move(name)) {
  capture::register_tracing_fallback();
  // Resolve now so a misspelt backend name fails at torch::compile, not at the first call.
  backend_ = resolve_backend();
}

CompiledFunction::~CompiledFunction() = default;

Backend CompiledFunction::resolve_backend() {
  if (options_.backend_fn) return options_.backend_fn;
  return lookup_backend(options_.backend);
}

void CompiledFunction::warn_once(const std::string& key, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(warned_.begin(), warned_.end(), key) != warned_.end()) return;
    warned_.push_back(key);
  }
  TORCH_WARN("torch::compile(", name_, "): ", message);
}

std::shared_ptr<const CompiledEntry> CompiledFunction::lookup(const CallArgs& args) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (size_t k = 0; k < entries_.size(); ++k) {
    if (!entries_[k]->guards().check(args)) continue;
    // Most recently hit first: the next call with the same signature checks it first.
    if (k != 0) std::rotate(entries_.begin(), entries_.begin() + k, entries_.begin() + k + 1);
    return entries_.front();
  }
  last_reason_ = entries_.empty() ? "no cached entry" : entries_.front()->guards().failure_reason(args);
  if (entries_.size() < options_.cache_size_limit) return nullptr;
  if (!overflow_entry_) {
    overflow_entry_ = std::make_shared<CompiledEntry>(nullptr, CompiledFn(), OutputSpec{}, nullptr,
                                                      "cache size limit reached");
  }
  auto entry = overflow_entry_;
  const std::string reason = last_reason_;
  lock.unlock();
  warn_once("cache_size_limit", "cache_size_limit (" + std::to_string(options_.cache_size_limit) +
                                    ") reached; running eagerly from now on. Last recompile reason: " + reason);
  return entry;
}

std::shared_ptr<TraceSession> CompiledFunction::begin_trace(const CallArgs& args) {
  return std::make_shared<TraceSession>(args, root_, options_.input_names);
}

void CompiledFunction::finish_trace(TraceSession& session, const std::vector<at::Tensor>& outputs, OutputSpec spec) {
  session.activation.reset();  // the backend's own ATen calls must not be traced
  auto insert = [&](CompiledFn fn, std::shared_ptr<GraphModule> gm, std::string eager_reason) {
    auto entry = std::make_shared<CompiledEntry>(std::move(session.guards), std::move(fn), std::move(spec),
                                                 std::move(gm), std::move(eager_reason));
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.insert(entries_.begin(), std::move(entry));
  };

  capture::Tracer& tracer = session.tracer;
  std::shared_ptr<GraphModule> gm;
  if (!tracer.failed()) gm = tracer.finish(outputs);  // may fail on an output it cannot name
  if (tracer.failed()) {
    const capture::TraceFailure& f = *tracer.failure();
    TORCH_CHECK(!options_.fullgraph, "torch::compile(", name_, ", fullgraph=true): graph break: ", f.reason);
    warn_once("break:" + f.reason, f.reason + "; this input signature runs eagerly");
    insert(CompiledFn(), nullptr, f.reason);
    return;
  }

  CompiledFn fn;
  std::string failure;
  try {
    fn = backend_(*gm, session.example_inputs);
    if (!fn) failure = "backend '" + options_.backend + "' declined the graph";
  } catch (const std::exception& e) {
    failure = "backend '" + options_.backend + "' failed to compile: " + e.what();
  }
  if (!failure.empty()) {
    warn_once("backend", failure + "; running eagerly");
    insert(CompiledFn(), nullptr, failure);
    return;
  }
  insert(std::move(fn), std::move(gm), "");
}

size_t CompiledFunction::num_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::vector<std::shared_ptr<const CompiledEntry>> CompiledFunction::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

std::string CompiledFunction::last_recompile_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_reason_;
}

}  // namespace runtime
}  // namespace torchcompile
