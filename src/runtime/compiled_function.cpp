// The guarded cache of a compiled object (runtime/compiled_function.h): a call finds the entry
// whose guards accept its arguments, most recently used first, and runs its trace tree
// (trace_tree.cpp); a miss traces the forward and compiles a new entry (trace_session.h), up to
// cache_size_limit entries, then runs eagerly. Verify mode is in verify.cpp, argument
// flattening in call_args.cpp.
#include <torchcompile/runtime/compiled_function.h>

#include <torchcompile/capture/tracer.h>
#include <torchcompile/ir/split.h>
#include <torchcompile/support/logging.h>

#include "capture/observed.h"
#include "compile/autotune.h"
#include "compile/pipeline.h"
#include "compile/precision.h"
#include "runtime/dynamic_entry.h"
#include "runtime/guards.h"
#include "runtime/trace_session.h"
#include "runtime/trace_tree.h"
#include "support/error_text.h"
#include "support/rng_state_guard.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>

namespace torchcompile::runtime {

namespace {
thread_local const std::vector<at::Tensor>* tls_substituted = nullptr;
}  // namespace

const std::vector<at::Tensor>* take_substituted_inputs() {
  const std::vector<at::Tensor>* s = tls_substituted;
  tls_substituted = nullptr;
  return s;
}

SubstitutedInputs::SubstitutedInputs(const std::vector<at::Tensor>* inputs) : previous_(tls_substituted) {
  tls_substituted = inputs;
}

SubstitutedInputs::~SubstitutedInputs() { tls_substituted = previous_; }

CompiledEntry::CompiledEntry(std::shared_ptr<GuardSet> guards, std::unique_ptr<Segment> root,
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

std::vector<std::string> CompiledEntry::size_symbols() const {
  if (replays_) {
    std::vector<std::string> lines = replays_->plan.describe();
    if (replays_->general)
      lines.push_back("one graph with size expressions (compiled once) serves every new size whose trace records it (" +
                      std::to_string(replays_->general_hits) + " new sizes so far)");
    else if (!replays_->general_reason.empty())
      lines.push_back("no graph for every size: " + replays_->general_reason);
    return lines;
  }
  if (!root_ || !root_->dynamic) return {};
  std::vector<std::string> lines = root_->dynamic->plan().describe();
  if (!root_->dynamic->symbolic())
    lines.push_back("the backend compiles a static graph per size: " + root_->dynamic->static_reason());
  return lines;
}

size_t CompiledEntry::num_specializations() const {
  if (replays_) return replays_->trees.size();
  return root_ && root_->dynamic ? root_->dynamic->num_specializations() : 0;
}

bool CompiledEntry::symbolic_graph() const {
  if (replays_) return replays_->general != nullptr;
  return root_ && root_->dynamic && root_->dynamic->symbolic();
}

const CompiledEntry& CompiledEntry::described() const {
  return replays_ && replays_->first ? *replays_->first : *this;
}

// ---- the compiled object ------------------------------------------------------------------------

CompiledFunction::CompiledFunction(CompileOptions options, std::shared_ptr<torch::nn::Module> root, std::string name)
    : options_(std::move(options)),
      root_(std::move(root)),
      name_(std::move(name)),
      size_history_(std::make_unique<SizeHistory>()) {
  capture::register_tracing_fallback();
  const char* verify_env = std::getenv("TORCHCOMPILE_VERIFY");
  verify_ = options_.verify || (verify_env != nullptr && std::string(verify_env) == "1");
  (void)NewSizeCosts::forced_from_env();  // a misspelt TORCHCOMPILE_NEW_SIZES fails here, not at a new size
  // Resolve now so a misspelt backend name (or a precision this build or CPU cannot give) fails
  // at torch::compile, not at the first call.
  compile_stage::check_precision(options_.precision_options());
  backend_ = compile_stage::with_precision(
      compile_stage::with_mode(resolve_backend(), options_.backend, options_.mode), options_.precision_options());
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
    TORCHCOMPILE_LOG(logging::LogKind::Recompiles, "torch::compile(", name_, "): recompiling: ", last_reason_, " (",
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

void CompiledFunction::check_inference(const CallArgs& args) const {
  if (options_.precision == Precision::Float32 || !at::GradMode::is_enabled()) return;
  std::string needs;
  for (const at::Tensor& t : args.tensors)
    if (t.defined() && t.requires_grad()) needs = "an input requires grad";
  if (needs.empty() && root_)
    for (const at::Tensor& p : root_->parameters())
      if (p.requires_grad()) needs = "the module has parameters that require grad";
  TORCH_CHECK(needs.empty(), "torch::compile(", name_, "): precision ", to_string(options_.precision),
              " is for inference, but grad mode is on and ", needs,
              ". Call the module under torch::NoGradGuard or c10::InferenceMode (training stays float32)");
}

std::vector<at::Tensor> CompiledFunction::call_compiled(const CallArgs& args, const ForwardFn& forward,
                                                        OutputSpec& spec) {
  check_inference(args);
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

namespace {

// Whether the backend declined a graph with size symbols (for a reason other than one that a
// static graph has too: autograd recording).
bool declined_symbols(const CompileReport& report) {
  if (report.backend != "interpreter") return false;
  bool declined = false;
  for (const BackendAttempt& a : report.attempts)
    if (a.outcome == BackendAttempt::Outcome::Declined) {
      if (a.reason == kNeedsAutogradReason || a.reason.rfind(detail::kDeclinedAtExampleSizes, 0) == 0) return false;
      declined = true;
    }
  return declined;
}

std::string decline_reasons(const CompileReport& report) {
  std::string out;
  for (const BackendAttempt& a : report.attempts)
    if (a.outcome == BackendAttempt::Outcome::Declined)
      out += (out.empty() ? "" : "; ") + a.backend + ": " + (a.reason.empty() ? std::string("no reason given") : a.reason);
  return out;
}


}  // namespace

// A dynamic entry's segment compiled from `generic` (its graph with size symbols if
// `static_reason` is empty, else the static graph; `examples` gives its example inputs): its
// function becomes a ShapeSpecializations serving every size. A backend that declined the
// symbols compiles the static graph instead. Returns "" or why the backend failed.
std::string serve_all_sizes(Segment& root, DynamicPlan plan, std::shared_ptr<GraphModule> generic,
                            std::string static_reason, const std::function<std::vector<at::Tensor>()>& examples,
                            const Backend& backend, const std::string& backend_name, const std::string& owner) {
  bool symbolic = static_reason.empty();
  if (symbolic && declined_symbols(root.report)) {
    // The backend declined the graph with symbols: it gets the static graph, one per size.
    static_reason = "backend '" + backend_name + "' declined the graph with size symbols (" +
                    decline_reasons(root.report) + ")";
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", owner, "): ", static_reason,
                     "; it compiles the static graph, once per size");
    root.gm->graph().clear_symbols();
    const std::vector<at::Tensor> example_inputs = examples();
    try {
      compile_stage::CompiledGraph compiled =
          compile_stage::compile_graph(*root.gm, example_inputs, backend, backend_name, owner);
      root.fn = std::move(compiled.fn);
      root.report = std::move(compiled.report);
    } catch (const std::exception& e) {
      return "backend '" + backend_name + "' failed to compile: " + support::error_message(e);
    }
    symbolic = false;
  }
  if (symbolic) generic = root.gm;  // the graph with symbols, as compiled (explain, result sizes)
  auto shapes = std::make_shared<ShapeSpecializations>(std::move(plan), std::move(generic), backend, backend_name,
                                                       owner, std::move(root.fn), symbolic, static_reason);
  root.dynamic = shapes;
  root.fn = ShapeSpecializations::entry_function(shapes);
  return "";
}

namespace {

// The segments with size expressions `general` (`plans`: the plan of each, empty for a segment
// without symbols) compiled as `traced`'s records, each serving every size (serve_all_sizes).
// Returns the compiled chain, and in `as_generalized` the graphs as generalized (copies: the
// compile takes the records' graphs); or null, with why in `failure`.
std::unique_ptr<Segment> compile_general(TracedRun& traced, std::vector<capture::SegmentRecord> general,
                                         std::vector<DynamicPlan> plans, const OutputSpec& spec,
                                         const Backend& backend, const std::string& backend_name,
                                         const std::string& owner,
                                         std::vector<capture::SegmentRecord>& as_generalized, std::string& failure) {
  as_generalized = copy_records(general);
  traced.records = std::move(general);
  std::unique_ptr<Segment> root = compile_chain(traced, 0, spec, backend, backend_name, owner, failure);
  Segment* seg = root.get();
  for (size_t i = 0; seg && failure.empty() && i < as_generalized.size(); ++i) {
    if (!plans[i].empty())
      failure = serve_all_sizes(*seg, std::move(plans[i]), ir::copy_module(*as_generalized[i].gm), "",
                                [&] { return capture::example_inputs(traced.records.at(i), traced.slots); },
                                backend, backend_name, owner);
    seg = seg->branch ? seg->branch->children.front().get() : nullptr;
  }
  if (!failure.empty()) root.reset();
  return root;
}

}  // namespace

std::vector<at::Tensor> CompiledFunction::trace_new_entry(const CallArgs& args, const ForwardFn& forward,
                                                          OutputSpec& spec) {
  auto guards = GuardSet::build(args, root_, options_.input_names);
  const auto names = tensor_input_names(args, options_.input_names);
  // Dynamic shapes (runtime/dynamic_entry.h): candidates, an observed trace, symbols.
  const std::vector<Candidate> candidates =
      dynamic_candidates(options_.dynamic, args, names, *size_history_, name_);
  // Why the trace cannot tell which candidates host code read (then a dynamic entry runs the
  // forward again at each new size).
  std::string replay_reason;
  std::optional<ObservedInputs> observed;
  if (!candidates.empty()) {
    // While autograd records, results it tracks are observed too (sharing their gradient edge);
    // what cannot be (views it tracks, inputs requiring grad) makes the trace incomplete.
    const bool autograd_records = !autograd_reason(args, names, root_.get()).empty();
    observed = observe_inputs(args, names, candidates, autograd_records);
    if (!observed->unobserved.empty()) replay_reason = "not every size read can be seen: " + observed->unobserved;
  }
  const auto trace_start = std::chrono::steady_clock::now();
  TracedRun traced = trace_forward(*this, *guards, args, forward, spec, names, observed ? &*observed : nullptr);
  const double traced_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - trace_start).count();
  DynamicPlan plan;
  if (!candidates.empty()) {
    const std::string static_reason = traced.failure.empty() ? "" : "the trace failed";
    if (replay_reason.empty() && traced.records.size() > 1) replay_reason = "the forward has graph breaks";
    if (replay_reason.empty() && !traced.unobserved.empty())
      replay_reason = "not every size read can be seen: " + traced.unobserved;
    const uint64_t read = observed ? observed->reads->read() : 0;
    const std::vector<std::string> first_reads = observed ? observed->reads->first_reads() : std::vector<std::string>{};
    plan = plan_symbols(candidates, read, first_reads, static_reason, replay_reason, args, names, name_,
                        /*specialize_blanket_reads=*/true);
    // A plan that kept sizes host code read static, and whose graph can take none of its other
    // symbols: the read sizes become symbols that run the forward again at each new size.
    bool blanket_read = false;
    for (size_t k = 0; k < candidates.size(); ++k) blanket_read = blanket_read || ((read >> k & 1) && candidates[k].blanket);
    auto replan = [&] {
      TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): no size host code did not read can ",
                       "vary; the sizes it read become symbols whose new values run the forward again");
      plan = plan_symbols(candidates, read, first_reads, static_reason, replay_reason, args, names, name_,
                          /*specialize_blanket_reads=*/false);
    };
    if (blanket_read && plan.empty()) replan();
    if (blanket_read && !plan.empty() && !plan.replays_forward() && traced.failure.empty()) {
      DynamicPlan probe = plan;
      auto copy = ir::copy_module(*traced.records.front().gm);
      make_symbolic(*copy, probe, args.tensors, name_);
      if (probe.empty()) replan();
    }
  }
  // The captured graph as traced: a dynamic entry that does not replay the forward records it
  // again at new sizes.
  std::shared_ptr<GraphModule> generic;
  std::string static_reason;  // why the backend does not receive the graph with size symbols
  if (!plan.empty() && !plan.replays_forward() && traced.failure.empty()) {
    generic = ir::copy_module(*traced.records.front().gm);
    static_reason = make_symbolic(*traced.records.front().gm, plan, args.tensors, name_);
    if (plan.empty()) generic.reset();  // no symbol can vary: a static entry
    else
      TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): ",
                       static_reason.empty() ? std::string("the backend receives the graph with size symbols")
                                             : "the graph stays static, compiled per size: " + static_reason);
  }
  if (!plan.empty()) guards->make_symbolic(plan);
  std::vector<capture::SegmentRecord> sample;  // see below
  // `general_trace`: the tree of `root` is the graph with size expressions (as generalized).
  auto insert = [&](std::unique_ptr<Segment> root, std::string eager_reason,
                    std::vector<capture::SegmentRecord> general_trace = {}) {
    std::shared_ptr<GuardSet> shared_guards = std::move(guards);
    std::shared_ptr<CompiledEntry> entry;
    if (root && plan.replays_forward()) {
      // The first size's tree; later sizes add theirs (run_replayed).
      auto replays = std::make_shared<ForwardReplays>();
      replays->new_sizes.forced = NewSizeCosts::forced_from_env();
      replays->plan = std::move(plan);
      auto first = std::make_shared<CompiledEntry>(shared_guards, std::move(root), names, "");
      if (!general_trace.empty()) {
        first->general_of_ = replays.get();
        replays->general = first;
        replays->general_trace = std::move(general_trace);
        replays->new_sizes.add_traced(traced_us);  // what a real trace at a new size costs (NewSizeCosts)
      }
      replays->first = first;
      replays->trees.insert(replays->plan.traced_key(), replays->first);
      if (!sample.empty()) replays->samples.push_back(TraceSample{std::move(sample), replays->plan.traced_key()});
      entry = std::make_shared<CompiledEntry>(shared_guards, nullptr, names, "");
      entry->replays_ = std::move(replays);
    } else {
      entry = std::make_shared<CompiledEntry>(shared_guards, std::move(root), names, std::move(eager_reason));
    }
    if (logging::log_enabled(logging::LogKind::Guards)) {
      std::string msg = "torch::compile(" + name_ + "): guards of the new entry:";
      for (const auto& line : entry->guards().describe()) msg += "\n  " + line;
      logging::log(logging::LogKind::Guards, msg);
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
  // Automatic dynamic: the first entry's trace, while it is static, for a dynamic entry that
  // runs the forward again (below); dropped once a dynamic entry exists.
  SizeHistory& history = *size_history_;
  if (!options_.dynamic.has_value() && plan.empty() && candidates.empty() && !history.first_trace_kept &&
      traced.records.size() == 1) {
    history.first_trace_kept = true;
    history.first_trace = copy_records(traced.records);
    for (const at::Tensor& t : args.tensors)
      history.first_inputs.push_back(t.defined() && t.layout() == c10::kStrided
                                         ? at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta))
                                         : at::Tensor());
  }
  // A dynamic entry that runs the forward again at new sizes: this trace and the first entry's
  // (at other values of the symbols) may already give one graph for every size, as two traces
  // at new sizes would (trace_new_sizes); its tree is then compiled from that graph.
  std::vector<capture::SegmentRecord> general;
  std::vector<DynamicPlan> general_plans;
  if (plan.replays_forward() && traced.records.size() == 1) {
    if (std::optional<SizeKey> first_key = first_trace_key(history, plan, args.tensors)) {
      std::vector<capture::SegmentRecord> records = copy_records(traced.records, /*with_values=*/true);
      with_forward_inputs(records, traced.slots, names.size());
      DynamicPlan generalized = plan;
      const std::string why = generalize(*records.front().gm, {{&history.first_trace.front().gm->graph(), *first_key}},
                                         plan.traced_key(), generalized, traced.slots, name_);
      if (why.empty()) {
        general = std::move(records);
        general_plans.push_back(std::move(generalized));
      } else {
        TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): with the first trace (",
                         plan.key_str(*first_key), ") no graph for every size yet: ", why);
      }
    }
  }
  if (!plan.empty()) {
    history.first_trace.clear();
    history.first_inputs.clear();
  }
  if (!general.empty()) {
    std::vector<capture::SegmentRecord> as_generalized;
    std::string failure;
    auto root = compile_general(traced, std::move(general), std::move(general_plans), spec, backend_, options_.backend,
                                name_, as_generalized, failure);
    if (!root) {
      warn_once("backend", failure + "; running eagerly");
      insert(nullptr, failure);
      return traced.outputs;
    }
    insert(std::move(root), "", std::move(as_generalized));
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_,
                     "): with the first trace, made one graph with size expressions for every size: compiled once ",
                     "(2 sizes traced)");
    return traced.outputs;
  }
  // A dynamic entry that runs the forward again at new sizes keeps the graph as traced: with the
  // next sizes' it may become one graph for every size (run_replayed).
  if (plan.replays_forward()) {
    sample = copy_records(traced.records);
    with_forward_inputs(sample, traced.slots, names.size());
  }
  std::string failure;
  auto root = compile_chain(traced, 0, spec, backend_, options_.backend, name_, failure);
  if (!root) {
    warn_once("backend", failure + "; running eagerly");
    insert(nullptr, failure);
    return traced.outputs;
  }
  if (generic) {
    std::string failure =
        serve_all_sizes(*root, std::move(plan), std::move(generic), static_reason,
                        [&] { return capture::example_inputs(traced.records.at(0), traced.slots); }, backend_,
                        options_.backend, name_);
    if (!failure.empty()) {
      warn_once("backend", failure + "; running eagerly");
      insert(nullptr, failure);
      return traced.outputs;
    }
  }
  insert(std::move(root), "");
  return traced.outputs;
}

std::vector<at::Tensor> CompiledFunction::run_replayed(const CompiledEntry& entry, const CallArgs& args,
                                                       const ForwardFn& forward, OutputSpec& spec) {
  ForwardReplays& replays = *entry.replays_;
  const SizeKey key = replays.plan.key_of(args.tensors);
  std::shared_ptr<const CompiledEntry> tree = replays.trees.find(key);
  if (!tree) {
    // One trace at a time per compiled object; a thread that waited may find these sizes traced.
    std::unique_lock<std::mutex> tracing(trace_mutex_);
    tree = replays.trees.find(key);
    if (!tree) return trace_new_sizes(entry, args, forward, spec);
  }
  if (tree->runs_eagerly()) return forward(spec);
  return run_entry(*tree, args, forward, spec);
}

std::vector<at::Tensor> CompiledFunction::trace_new_sizes(const CompiledEntry& entry, const CallArgs& args,
                                                          const ForwardFn& forward, OutputSpec& spec) {
  ForwardReplays& replays = *entry.replays_;
  const SizeKey key = replays.plan.key_of(args.tensors);
  using Clock = std::chrono::steady_clock;
  auto us_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  };
  // With a graph for every size (no graph break: a break's host read needs data), and autograd
  // not recording: a trace of shapes only (host code runs, ops on meta tensors) tells whether
  // these sizes record that graph; then it computes the call, and nothing is compiled. Unless a
  // real trace (below) has cost this forward less (NewSizeCosts).
  const bool shapes_possible = replays.general && replays.general_trace.size() == 1 &&
                               autograd_reason(args, entry.input_names_, root_.get()).empty();
  const bool by_shapes = shapes_possible && replays.new_sizes.next_by_shapes();
  if (shapes_possible && !by_shapes)
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): new sizes ", replays.plan.key_str(key),
                     ": checked by a real trace, which computes the call (", replays.new_sizes.str(), ")");
  double failed_shapes_us = -1;  // a trace of shapes that did not give the graph: its cost joins the real trace's
  if (by_shapes) {
    const Clock::time_point start = Clock::now();
    std::string why;
    try {
      support::RngStateGuard keep_rng;  // ops without meta kernels run on zeros
      TracedRun shapes =
          trace_forward(*this, entry.guards(), args, forward, spec, entry.input_names_, nullptr, /*shapes_only=*/true);
      if (!shapes.failure.empty()) why = shapes.failure;
      else why = same_trace_at(replays.general_trace, shapes.records, shapes.slots);
    } catch (const std::exception& e) {
      // A host read of data (ShapesOnlyStopped), or anything else meta tensors made fail: the
      // real trace below decides (and throws again if the forward itself does).
      why = support::error_message(e);
    }
    if (why.empty()) {
      ++replays.general_hits;
      const size_t count = replays.trees.insert(key, replays.general);
      TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): new sizes ", replays.plan.key_str(key),
                       ": the forward's shapes record the graph with size expressions: no compile (", count,
                       " sizes traced; ", replays.new_sizes.str(), ")");
      std::vector<at::Tensor> outputs = run_entry(*replays.general, args, forward, spec);
      replays.new_sizes.add_shapes(us_since(start));
      return outputs;
    }
    failed_shapes_us = us_since(start);
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): new sizes ", replays.plan.key_str(key),
                     ": the trace of shapes does not give the graph with size expressions (", why,
                     "); tracing the forward");
  }
  // The forward at these sizes, host code included: its integers and branches are those of these
  // sizes, as in a static entry's trace. Modules whose hooks it crosses join the entry's guards.
  const Clock::time_point start = Clock::now();
  TracedRun traced = trace_forward(*this, entry.guards(), args, forward, spec, entry.input_names_);
  std::string failure = traced.failure;
  const bool recorded = failure.empty() && !traced.records.empty();
  if (recorded) {
    const double traced_us = us_since(start);
    // Checking by shapes cost this size both traces; a real trace alone costs its own.
    if (failed_shapes_us >= 0) replays.new_sizes.add_shapes(failed_shapes_us + traced_us);
    replays.new_sizes.add_traced(traced_us);
  }
  // The trace as its samples and the graphs with size expressions have it: later segments take
  // the forward's inputs too (with_forward_inputs). Compiled trees keep the trace as recorded.
  auto comparable = [&] {
    std::vector<capture::SegmentRecord> records = copy_records(traced.records, /*with_values=*/true);
    with_forward_inputs(records, traced.slots, entry.input_names_.size());
    return records;
  };
  auto sample_of = [&] {
    std::vector<capture::SegmentRecord> records = comparable();
    for (capture::SegmentRecord& r : records) r.values_before_writes.clear();
    return records;
  };
  auto add_tree = [&](std::shared_ptr<const CompiledEntry> tree, const std::string& how) {
    const size_t count = replays.trees.insert(key, std::move(tree));
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): new sizes ", replays.plan.key_str(key),
                     ": traced the forward again", how, " (", count, " sizes traced)");
  };
  // The graphs with size expressions are this trace's graphs at these sizes: nothing to compile.
  if (replays.general && recorded) {
    std::string why = traced.records.size() == 1 ? same_trace_at(replays.general_trace, traced.records, traced.slots)
                                                 : same_trace_at(replays.general_trace, comparable(), traced.slots);
    if (why.empty()) {
      ++replays.general_hits;
      add_tree(replays.general, ", the same graph as the one with size expressions: no compile");
      return traced.outputs;
    }
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): at ", replays.plan.key_str(key),
                     " the forward records another graph than the one with size expressions (", why,
                     "); these sizes get their own");
  }
  // At the first sizes: keep the trace, and once the traces tell which integers are which
  // expressions of the sizes, make one graph with size expressions per segment for every size.
  // Until then a new size's trace is not compiled (it is this call's result; a later call at
  // those sizes compiles it).
  std::vector<capture::SegmentRecord> general;  // the segments with size expressions
  std::vector<DynamicPlan> general_plans;       // the plan of each
  if (!replays.general && replays.general_reason.empty() && recorded) {
    bool seen = false;
    for (const TraceSample& sample : replays.samples) seen = seen || sample.key == key;
    if (!seen && !replays.samples.empty()) {
      general = comparable();
      std::string why;
      if (general.size() == 1) {
        std::vector<std::pair<const ir::Graph*, SizeKey>> samples;
        for (const TraceSample& sample : replays.samples) {
          if (sample.records.size() != 1) {
            why = "the traces have " + std::to_string(sample.records.size()) + " and 1 graph segments";
            break;
          }
          samples.emplace_back(&sample.records.front().gm->graph(), sample.key);
        }
        DynamicPlan plan = replays.plan;
        if (why.empty()) why = generalize(*general.front().gm, samples, key, plan, traced.slots, name_);
        if (why.empty()) general_plans.push_back(std::move(plan));
      } else {
        std::vector<const TraceSample*> samples;
        for (const TraceSample& sample : replays.samples) samples.push_back(&sample);
        why = generalize_segments(general, traced.slots, samples, key, replays.plan, general_plans, name_);
      }
      if (!why.empty()) {
        general.clear();
        general_plans.clear();
        const size_t max_samples = std::max<size_t>(3, replays.plan.symbols.size() + 2);
        const bool more = why.rfind(kGeneralizeNeedsMoreSizes, 0) == 0 && replays.samples.size() + 1 < max_samples;
        TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): no graph for every size yet: ", why,
                         more ? "; the next new size's trace tells more" : "; every new size is compiled");
        if (more) {
          replays.samples.push_back(TraceSample{sample_of(), key});
          const size_t count = replays.trees.size();
          TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): new sizes ",
                           replays.plan.key_str(key), ": traced the forward again, kept to compare (", count,
                           " sizes compiled)");
          return traced.outputs;
        }
        replays.general_reason = why;
        replays.samples.clear();
      }
    } else if (!seen) {
      replays.samples.push_back(TraceSample{sample_of(), key});
    }
  }
  std::unique_ptr<Segment> root;
  if (!general.empty()) {
    // Each segment compiled from its graph with size expressions, served at every size.
    std::vector<capture::SegmentRecord> as_generalized;
    root = compile_general(traced, std::move(general), std::move(general_plans), spec, backend_, options_.backend,
                           name_, as_generalized, failure);
    if (root) {
      auto tree = std::make_shared<CompiledEntry>(entry.guards_, std::move(root), entry.input_names_, "");
      tree->general_of_ = &replays;
      replays.general = tree;
      replays.general_trace = std::move(as_generalized);
      replays.samples.clear();
      add_tree(std::move(tree), ", and made one graph with size expressions for every size: compiled once");
      return traced.outputs;
    }
    replays.general_reason = failure.empty() ? "compiling it failed" : failure;
    warn_once("replay:" + failure, failure + "; those sizes run eagerly");
    add_tree(std::make_shared<CompiledEntry>(entry.guards_, nullptr, entry.input_names_, failure),
             " (" + failure + "; these sizes run eagerly)");
    return traced.outputs;
  }
  if (failure.empty()) root = compile_chain(traced, 0, spec, backend_, options_.backend, name_, failure);
  const bool eager = root == nullptr;
  if (eager) warn_once("replay:" + failure, failure + "; those sizes run eagerly");
  add_tree(std::make_shared<CompiledEntry>(entry.guards_, std::move(root), entry.input_names_, failure),
           eager ? " (" + failure + "; these sizes run eagerly)" : "");
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

}  // namespace torchcompile::runtime
