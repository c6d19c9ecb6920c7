#include <torchcompile/runtime/compiled_function.h>

#include <torchcompile/capture/tracer.h>

#include "capture/segment_records.h"
#include "compile/pipeline.h"
#include "runtime/call_state.h"
#include "runtime/guards.h"
#include <torchcompile/logging.h>
#include "runtime/trace_context.h"

#include <torchcompile/ir/op_step.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/structure.h>

#include <ATen/core/stack.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

namespace torchcompile {
namespace runtime {

// ---- the trace tree ---------------------------------------------------------------------------

struct BranchPoint;

/// A compiled graph segment of a trace tree.
struct Segment {
  std::shared_ptr<GraphModule> gm;
  CompiledFn fn;
  std::vector<uint32_t> input_slots;
  std::vector<uint32_t> output_slots;
  CompileReport report;                 // which backend compiled it, declines, pipeline steps
  GraphEffects effects;                 // what running it changes: saved before, on calls that may re-run
  ir::GraphKey key;                     // the captured graph's identity: identical continuations are shared
  std::unique_ptr<BranchPoint> branch;  // null: the outputs are the call's results
  OutputSpec spec;                      // of the results (a segment without branch)

  size_t count_graphs() const;
  size_t count_breaks() const;
};

/// A graph break: the host read that ended a segment and the continuations seen so far.
struct BranchPoint {
  explicit BranchPoint(capture::BranchRecord r) : record(std::move(r)), op_name(ir::op_target_name(record.op)) {}

  capture::BranchRecord record;
  std::string op_name;
  std::vector<std::unique_ptr<Segment>> children;                    // distinct continuations
  std::vector<std::pair<std::vector<c10::IValue>, Segment*>> known;  // recent values, newest first
  bool closed = false;  // too many distinct continuations: new values run the rest eagerly

  static constexpr size_t kKnownValues = 64;

  Segment* find(const std::vector<c10::IValue>& key) {
    for (size_t i = 0; i < known.size(); ++i) {
      if (!capture::same_key(known[i].first, key)) continue;
      if (i != 0) std::rotate(known.begin(), known.begin() + i, known.begin() + i + 1);
      return known.front().second;
    }
    return nullptr;
  }
  void remember(const std::vector<c10::IValue>& key, Segment* s) {
    known.insert(known.begin(), {key, s});
    if (known.size() > kKnownValues) known.pop_back();
  }
};

size_t Segment::count_graphs() const {
  size_t n = 1;
  if (branch)
    for (const auto& c : branch->children) n += c->count_graphs();
  return n;
}

size_t Segment::count_breaks() const {
  if (!branch) return 0;
  size_t n = 1;
  for (const auto& c : branch->children) n += c->count_breaks();
  return n;
}

namespace {

// The outputs of one segment, given the call's environment.
std::vector<at::Tensor> run_segment(const Segment& seg, const std::vector<at::Tensor>& env) {
  std::vector<at::Tensor> inputs;
  inputs.reserve(seg.input_slots.size());
  for (uint32_t s : seg.input_slots) inputs.push_back(env[s]);
  return seg.fn(std::move(inputs));
}

// Execute the host read of a branch point on this call's tensors.
std::vector<c10::IValue> read_key(const BranchPoint& bp, const std::vector<at::Tensor>& env) {
  torch::jit::Stack stack = bp.record.stack_template;
  // The read dispatches as the interpreter's steps do (ir::may_dispatch_below_autograd).
  bool below_autograd = true;
  for (const auto& [index, slot] : bp.record.tensor_args) {
    stack[index] = env[slot];
    below_autograd = below_autograd && ir::may_dispatch_below_autograd(&env[slot], 1);
  }
  {
    std::optional<c10::impl::ExcludeDispatchKeyGuard> skip;
    if (below_autograd) skip.emplace(c10::autograd_dispatch_keyset);
    bp.record.op.callBoxed(&stack);
  }
  return stack;
}

bool same_segment(const Segment& a, const capture::SegmentRecord& b, const ir::GraphKey& b_key) {
  return a.key == b_key && a.input_slots == b.input_slots && a.output_slots == b.output_slots &&
         (a.branch != nullptr) == b.branch.has_value() &&
         (!a.branch || &a.branch->record.op.schema() == &b.branch->op.schema());
}

Segment* leaf_of(Segment* s) {
  while (s->branch) s = s->branch->children.front().get();
  return s;
}

// The call's flattened results: the graph outputs with the undefined tensors put back.
std::vector<at::Tensor> with_undefined(std::vector<at::Tensor> outs, const OutputSpec& spec) {
  if (spec.undefined.empty()) return outs;
  std::vector<at::Tensor> all(outs.size() + spec.undefined.size());
  size_t next = 0, u = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (u < spec.undefined.size() && spec.undefined[u] == i) {
      ++u;
      continue;
    }
    all[i] = std::move(outs.at(next++));
  }
  return all;
}

bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.has_storage() && b.has_storage() &&
         a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

// Before `seg` runs on a call that may have to run the forward again: save what it changes
// outside this call's own intermediate values (inputs, module state and constants, also through
// intermediate views of them; the generator; a module called opaquely may change any buffer).
void save_effects(const Segment& seg, const std::vector<const Segment*>& path, const std::vector<at::Tensor>& env,
                  const CallArgs& args, torch::nn::Module* root, StateSnapshot& snap) {
  const GraphEffects& e = seg.effects;
  for (size_t pos : e.written_inputs) {
    const uint32_t slot = seg.input_slots.at(pos);
    const at::Tensor& t = env.at(slot);
    bool external = slot < args.tensors.size();
    for (size_t i = 0; !external && i < args.tensors.size(); ++i) external = same_storage(t, args.tensors[i]);
    for (size_t k = 0; !external && k <= path.size(); ++k)
      for (const auto& [name, attr] : (k < path.size() ? path[k] : &seg)->gm->attributes())
        external = external || same_storage(t, attr.first);
    if (external) {
      snap.save(t);
      // The call's other arguments over the same memory (a view passed with its base) get a new
      // autograd history from an in-place update of `t` too.
      for (const at::Tensor& input : args.tensors)
        if (same_storage(t, input)) snap.save_history(input);
    }
  }
  for (const std::string& name : e.written_attributes) snap.save(seg.gm->attribute(name));
  if (e.random) snap.save_rng();
  if (e.opaque && root != nullptr)
    for (const at::Tensor& b : root->buffers(/*recurse=*/true)) snap.save(b);
}

}  // namespace

CompiledEntry::CompiledEntry(std::unique_ptr<GuardSet> guards, std::unique_ptr<Segment> root,
                             std::vector<std::string> input_names, std::string eager_reason)
    : guards_(std::move(guards)),
      root_(std::move(root)),
      input_names_(std::move(input_names)),
      eager_reason_(std::move(eager_reason)) {}

CompiledEntry::~CompiledEntry() = default;

const std::string& CompiledEntry::eager_reason() const {
  static const std::string kBranchLimit = "a graph break read more distinct values than cache_size_limit";
  return eager_reason_.empty() && runs_eagerly() ? kBranchLimit : eager_reason_;
}

std::shared_ptr<GraphModule> CompiledEntry::graph_module() const { return root_ ? root_->gm : nullptr; }

size_t CompiledEntry::num_graphs() const {
  std::lock_guard<std::mutex> lock(tree_mutex_);
  return root_ ? root_->count_graphs() : 0;
}

size_t CompiledEntry::num_breaks() const {
  std::lock_guard<std::mutex> lock(tree_mutex_);
  return root_ ? root_->count_breaks() : 0;
}

namespace {
void visit_segment(const Segment& s, const std::function<void(const GraphModule&, const CompileReport&)>& on_graph,
                   const std::function<void(const std::string&, const std::string&)>& on_break) {
  on_graph(*s.gm, s.report);
  if (!s.branch) return;
  on_break(s.branch->op_name, capture::key_repr(s.branch->record.key));
  for (const auto& c : s.branch->children) visit_segment(*c, on_graph, on_break);
}
}  // namespace

void CompiledEntry::visit(const std::function<void(const GraphModule& graph, const CompileReport& report)>& on_graph,
                          const std::function<void(const std::string& op, const std::string& value)>& on_break) const {
  std::lock_guard<std::mutex> lock(tree_mutex_);
  if (root_) visit_segment(*root_, on_graph, on_break);
}

// ---- the compiled object ------------------------------------------------------------------------

CompiledFunction::CompiledFunction(CompileOptions options, std::shared_ptr<torch::nn::Module> root, std::string name)
    : options_(std::move(options)), root_(std::move(root)), name_(std::move(name)) {
  capture::register_tracing_fallback();
  const char* verify_env = std::getenv("TORCHCOMPILE_VERIFY");
  verify_ = options_.verify || (verify_env != nullptr && std::string(verify_env) == "1");
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
  std::string hooks_reason;
  for (size_t k = 0; k < entries_.size();) {
    const GuardSet& guards = entries_[k]->guards();
    if (guards.check(args)) {
      // Most recently hit first: the next call with the same signature checks it first.
      if (k != 0) std::rotate(entries_.begin(), entries_.begin() + k, entries_.begin() + k + 1);
      return entries_.front();
    }
    if (guards.hooks_stale()) {
      // Hook versions only grow: this entry can never match again. Dropping it keeps hook
      // changes from filling the cache.
      if (hooks_reason.empty()) hooks_reason = guards.failure_reason(args);
      entries_.erase(entries_.begin() + k);
      continue;
    }
    ++k;
  }
  if (!hooks_reason.empty()) {
    last_reason_ = evicted_reason_ = hooks_reason;
  } else if (entries_.empty()) {
    last_reason_ = evicted_reason_.empty() ? "no cached entry" : evicted_reason_;
  } else {
    last_reason_ = entries_.front()->guards().failure_reason(args);
  }
  if (!entries_.empty() || !hooks_reason.empty())
    TORCHCOMPILE_LOG(LogKind::Recompiles, "torch::compile(", name_, "): recompiling: ", last_reason_, " (",
                     entries_.size(), " cached entries)");
  if (entries_.size() < options_.cache_size_limit) return nullptr;
  if (!overflow_entry_)
    overflow_entry_ =
        std::make_shared<CompiledEntry>(nullptr, nullptr, std::vector<std::string>{}, "cache size limit reached");
  auto entry = overflow_entry_;
  const std::string reason = last_reason_;
  lock.unlock();
  warn_once("cache_size_limit", "cache_size_limit (" + std::to_string(options_.cache_size_limit) +
                                    ") reached; running eagerly from now on. Last recompile reason: " + reason);
  return entry;
}

std::vector<at::Tensor> CompiledFunction::call(const CallArgs& args, const ForwardFn& forward, OutputSpec& spec) {
  // Called from a forward being traced (or replayed): run inline, so the enclosing trace
  // records (or matches) this forward's ops as its own.
  if (capture::Tracer::current() != nullptr) return forward(spec);
  if (verify_) return call_verified(args, forward, spec);
  return call_compiled(args, forward, spec);
}

std::vector<at::Tensor> CompiledFunction::call_compiled(const CallArgs& args, const ForwardFn& forward,
                                                        OutputSpec& spec) {
  auto entry = lookup(args);
  if (entry && entry->runs_eagerly()) return forward(spec);
  if (entry) return run_entry(*entry, args, forward, spec);
  // A miss: one thread traces, the others wait for it and then use its entry.
  std::unique_lock<std::mutex> tracing(trace_mutex_);
  entry = lookup(args);
  if (!entry) return trace_new_entry(args, forward, spec);
  tracing.unlock();
  if (entry->runs_eagerly()) return forward(spec);
  return run_entry(*entry, args, forward, spec);
}

void CompiledFunction::add_module_state(capture::Tracer& tracer) const {
  if (!root_) return;
  for (const auto& p : root_->named_parameters(/*recurse=*/true))
    tracer.add_attribute(p.key(), p.value(), ir::AttributeKind::Parameter);
  for (const auto& b : root_->named_buffers(/*recurse=*/true))
    tracer.add_attribute(b.key(), b.value(), ir::AttributeKind::Buffer);
}

std::unique_ptr<Segment> CompiledFunction::compile_chain(std::vector<capture::SegmentRecord>& records, size_t from,
                                                         const std::vector<at::Tensor>& slots, std::string& failure) {
  // Compile in program order (a debugging backend prints the prefix first), then link.
  std::vector<std::unique_ptr<Segment>> chain;
  for (size_t i = from; i < records.size(); ++i) {
    capture::SegmentRecord& r = records[i];
    auto seg = std::make_unique<Segment>();
    seg->gm = std::shared_ptr<GraphModule>(std::move(r.gm));
    seg->key = ir::GraphKey(seg->gm->graph());
    TORCHCOMPILE_LOG(LogKind::Graph, "torch::compile(", name_, "): captured graph:\n", ir::to_text(seg->gm->graph()));
    seg->input_slots = r.input_slots;
    seg->output_slots = r.output_slots;
    seg->effects = effects_of(*seg->gm);
    std::vector<at::Tensor> example_inputs;
    for (uint32_t s : seg->input_slots) example_inputs.push_back(slots.at(s));
    try {
      pipeline::CompiledGraph compiled =
          pipeline::compile_graph(*seg->gm, example_inputs, backend_, options_.backend, name_);
      seg->fn = std::move(compiled.fn);
      seg->report = std::move(compiled.report);
    } catch (const std::exception& e) {
      failure = "backend '" + options_.backend + "' failed to compile: " + e.what();
    }
    if (!failure.empty()) return nullptr;
    if (r.branch) {
      TORCHCOMPILE_LOG(LogKind::GraphBreaks, "torch::compile(", name_, "): graph break: data-dependent host read ",
                       ir::op_target_name(r.branch->op), " returned ", capture::key_repr(r.branch->key));
      seg->branch = std::make_unique<BranchPoint>(*r.branch);
    }
    chain.push_back(std::move(seg));
  }
  for (size_t i = chain.size() - 1; i-- > 0;) {
    BranchPoint& bp = *chain[i]->branch;
    bp.remember(bp.record.key, chain[i + 1].get());
    bp.children.push_back(std::move(chain[i + 1]));
  }
  return std::move(chain.front());
}

struct CompiledFunction::Traced {
  std::vector<at::Tensor> outputs;              // the call's flattened results
  std::vector<capture::SegmentRecord> records;  // empty if the trace failed
  std::vector<at::Tensor> slots;                // the slot tensors (example inputs)
  std::string failure;
  std::vector<TraceContext::Noted> modules;     // module calls crossed (hook guards)
};

CompiledFunction::Traced CompiledFunction::trace(const CallArgs& args, const ForwardFn& forward, OutputSpec& spec,
                                                 const std::vector<std::string>& names) {
  Traced t;
  capture::Tracer tracer(options_.fullgraph);
  for (size_t i = 0; i < args.tensors.size(); ++i) tracer.add_input(args.tensors[i], names.at(i));
  add_module_state(tracer);
  TraceContext context(options_, name_, root_.get());
  {
    TraceContext::Scope in_context(context);
    capture::Tracer::Activation active(tracer);
    t.outputs = forward(spec);
  }
  t.modules = context.modules();
  // Undefined results (an empty state passed through) are not graph values: the spec puts
  // them back around the graphs' outputs.
  spec.undefined.clear();
  std::vector<at::Tensor> defined;
  for (size_t i = 0; i < t.outputs.size(); ++i) {
    if (t.outputs[i].defined()) {
      defined.push_back(t.outputs[i]);
    } else {
      spec.undefined.push_back(i);
    }
  }
  if (!tracer.failed()) t.records = capture::finish_segments(tracer, defined);  // may fail on an output
  if (tracer.failed()) {
    t.failure = tracer.failure()->reason;
    t.records.clear();
    TORCHCOMPILE_LOG(LogKind::GraphBreaks, "torch::compile(", name_, "): trace abandoned: ", t.failure);
  }
  t.slots = capture::slot_tensors(tracer);
  return t;
}

std::vector<at::Tensor> CompiledFunction::trace_new_entry(const CallArgs& args, const ForwardFn& forward,
                                                          OutputSpec& spec) {
  auto guards = GuardSet::build(args, root_, options_.input_names);
  const auto names = tensor_input_names(args, options_.input_names);
  Traced traced = trace(args, forward, spec, names);
  for (const auto& n : traced.modules) guards->add_hook_module(n.module, n.version, n.path);
  auto insert = [&](std::unique_ptr<Segment> root, std::string eager_reason) {
    auto entry = std::make_shared<CompiledEntry>(std::move(guards), std::move(root), names, std::move(eager_reason));
    if (log_enabled(LogKind::Guards)) {
      std::string msg = "torch::compile(" + name_ + "): guards of the new entry:";
      for (const auto& line : entry->guards().describe()) msg += "\n  " + line;
      runtime::log(LogKind::Guards, msg);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.insert(entries_.begin(), std::move(entry));
    evicted_reason_.clear();
  };
  if (!traced.failure.empty()) {
    warn_once("trace:" + traced.failure, traced.failure + "; this input signature runs eagerly");
    insert(nullptr, traced.failure);
    return traced.outputs;
  }
  std::string failure;
  auto root = compile_chain(traced.records, 0, traced.slots, failure);
  if (!root) {
    warn_once("backend", failure + "; running eagerly");
    insert(nullptr, failure);
    return traced.outputs;
  }
  leaf_of(root.get())->spec = spec;
  insert(std::move(root), "");
  return traced.outputs;
}

std::vector<at::Tensor> CompiledFunction::run_entry(const CompiledEntry& entry, const CallArgs& args,
                                                    const ForwardFn& forward, OutputSpec& spec) {
  const Segment* seg = entry.root_.get();
  if (!seg->branch) {  // no graph break: the common case
    spec = seg->spec;
    return with_undefined(seg->fn(args.tensors), spec);
  }
  // A call may reach a branch value with no compiled continuation; then the forward runs again
  // from the start, so what the segments change outside their own values is saved first.
  StateSnapshot snapshot;
  std::vector<at::Tensor> env = args.tensors;
  std::vector<const Segment*> path;
  for (;;) {
    if (seg->effects.any()) save_effects(*seg, path, env, args, root_.get(), snapshot);
    std::vector<at::Tensor> outs = run_segment(*seg, env);
    if (!seg->branch) {
      spec = seg->spec;
      return with_undefined(std::move(outs), spec);
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      const uint32_t s = seg->output_slots[i];
      if (env.size() <= s) env.resize(s + 1);
      env[s] = std::move(outs[i]);
    }
    std::vector<c10::IValue> key = read_key(*seg->branch, env);
    path.push_back(seg);
    Segment* next;
    bool closed;
    {
      std::lock_guard<std::mutex> lock(entry.tree_mutex_);
      next = seg->branch->find(key);
      closed = seg->branch->closed;
    }
    if (!next && closed) return rerun_forward(entry, args, snapshot, /*record=*/false, forward, spec);
    if (!next) {
      // One retrace at a time per compiled object; a thread that waited may find the branch
      // traced by the one before it and go on.
      std::unique_lock<std::mutex> tracing(trace_mutex_);
      {
        std::lock_guard<std::mutex> lock(entry.tree_mutex_);
        next = seg->branch->find(key);
        closed = seg->branch->closed;
      }
      if (!next) return rerun_forward(entry, args, snapshot, !closed, forward, spec);
    }
    seg = next;
  }
}

std::vector<at::Tensor> CompiledFunction::rerun_forward(const CompiledEntry& entry, const CallArgs& args,
                                                        const StateSnapshot& snapshot, bool record,
                                                        const ForwardFn& forward, OutputSpec& spec) {
  // The state as it was when the call began: the forward's run is then eager's own.
  snapshot.restore();
  if (!record) {
    // A branch point past its limit got yet another value: running the compiled prefix and
    // then the whole forward again costs more than eager, so from now on this entry is eager.
    entry.eager_.store(true, std::memory_order_relaxed);
    warn_once("branch-limit", "a graph break read more distinct values than cache_size_limit (" +
                                  std::to_string(options_.cache_size_limit) +
                                  "); this input signature runs eagerly from now on");
    return forward(spec);
  }
  Traced traced = trace(args, forward, spec, entry.input_names_);
  for (const auto& n : traced.modules) entry.guards().add_hook_module(n.module, n.version, n.path);
  if (!traced.failure.empty()) {
    warn_once("trace:" + traced.failure, traced.failure + "; that branch runs eagerly");
    return traced.outputs;
  }
  std::vector<capture::SegmentRecord>& records = traced.records;

  // Walk the tree along the new trace, by the values it read, while its segments are the
  // compiled ones; attach the rest at the first value with no continuation. Two values share a
  // continuation only when it is the last segment and the same graph (a float compared on the
  // host: `if (b.sum().item<float>() < 0)`): a value read at a break may be kept on the host and
  // baked into any later segment (`b = n.item()`, two more breaks, then `x * b`), so a shared
  // segment with breaks of its own would give one value's later segments to the other.
  BranchPoint* attach = nullptr;
  std::vector<c10::IValue> key;
  size_t first_new = 0;
  {
    std::lock_guard<std::mutex> lock(entry.tree_mutex_);
    Segment* seg = entry.root_.get();
    if (!same_segment(*seg, records[0], ir::GraphKey(records[0].gm->graph()))) first_new = records.size() + 1;
    for (size_t i = 0; first_new == 0 && seg->branch && i + 1 < records.size(); ++i) {
      BranchPoint& bp = *seg->branch;
      const ir::GraphKey key_of_next(records[i + 1].gm->graph());
      Segment* known = bp.find(records[i].branch->key);
      if (known == nullptr && !records[i + 1].branch) {
        for (const auto& c : bp.children)
          if (!c->branch && same_segment(*c, records[i + 1], key_of_next) && c->spec.undefined == spec.undefined &&
              c->spec.list_sizes == spec.list_sizes)
            known = c.get();
        if (known != nullptr) bp.remember(records[i].branch->key, known);
      }
      if (known == nullptr) {
        attach = &bp;
        key = records[i].branch->key;
        first_new = i + 1;
        if (bp.children.size() >= options_.cache_size_limit) bp.closed = true;
        break;
      }
      if (!same_segment(*known, records[i + 1], key_of_next)) {
        first_new = records.size() + 1;  // the same values led elsewhere: host state
        break;
      }
      seg = known;
    }
  }
  if (first_new > records.size()) {
    warn_once("diverged", "re-running the forward for a new graph-break value made different tensor calls than "
                          "when it was traced (does it depend on host state?); new branch values run eagerly");
    return traced.outputs;
  }
  if (!attach) return traced.outputs;  // every segment was known already
  if (attach->closed) {
    warn_once("branch:" + attach->op_name,
              "graph break on " + attach->op_name + " has " + std::to_string(options_.cache_size_limit) +
                  " continuations (cache_size_limit); the next new value makes this input signature run "
                  "eagerly. Is the value read used as a number?");
    return traced.outputs;
  }
  std::string failure;
  auto chain = compile_chain(records, first_new, traced.slots, failure);
  if (!chain) {
    warn_once("backend", failure + "; that branch runs eagerly");
    return traced.outputs;
  }
  leaf_of(chain.get())->spec = spec;
  std::lock_guard<std::mutex> lock(entry.tree_mutex_);
  Segment* head = chain.get();
  attach->children.push_back(std::move(chain));
  attach->remember(key, head);
  return traced.outputs;
}

size_t CompiledFunction::num_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::vector<std::shared_ptr<const CompiledEntry>> CompiledFunction::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

std::string CompiledFunction::verify_failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return verify_failure_;
}

std::string CompiledFunction::last_recompile_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_reason_;
}

}  // namespace runtime
}  // namespace torchcompile
