// The trace tree (see trace_tree.h): running an entry's segments and reading each break's
// value, the state saved for a restart, a retrace that grows the tree at a new value, and the
// queries an entry answers about its tree.
#include "runtime/trace_tree.h"

#include "runtime/dynamic_entry.h"
#include "runtime/guards.h"
#include "runtime/trace_session.h"

#include <torchcompile/ir/op_step.h>
#include <torchcompile/support/logging.h>

#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <mutex>
#include <optional>

namespace torchcompile::runtime {

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

// A segment ending in a branch passes its outputs on in the call's slots.
void store_outputs(const Segment& seg, std::vector<at::Tensor> outs, std::vector<at::Tensor>& env) {
  for (size_t i = 0; i < outs.size(); ++i) {
    const uint32_t s = seg.output_slots[i];
    if (env.size() <= s) env.resize(s + 1);
    env[s] = std::move(outs[i]);
  }
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

void visit_segment(const Segment& s, const std::function<void(const GraphModule&, const CompileReport&)>& on_graph,
                   const std::function<void(const std::string&, const std::string&)>& on_break) {
  on_graph(*s.gm, s.report);
  if (!s.branch) return;
  on_break(s.branch->op_name, capture::key_repr(s.branch->record.key));
  for (const auto& c : s.branch->children) visit_segment(*c, on_graph, on_break);
}

}  // namespace

// ---- the entry's tree -----------------------------------------------------------------------

std::shared_ptr<GraphModule> CompiledEntry::graph_module() const {
  const CompiledEntry& e = described();
  return e.root_ ? e.root_->gm : nullptr;
}

size_t CompiledEntry::num_graphs() const {
  if (replays_) {
    size_t n = 0;
    for (const auto& tree : replays_->trees.values()) n += tree->num_graphs();
    return n;
  }
  std::lock_guard<std::mutex> lock(tree_mutex_);
  return root_ ? root_->count_graphs() : 0;
}

size_t CompiledEntry::num_breaks() const {
  if (replays_) {
    size_t n = 0;
    for (const auto& tree : replays_->trees.values()) n += tree->num_breaks();
    return n;
  }
  std::lock_guard<std::mutex> lock(tree_mutex_);
  return root_ ? root_->count_breaks() : 0;
}

void CompiledEntry::visit(const std::function<void(const GraphModule& graph, const CompileReport& report)>& on_graph,
                          const std::function<void(const std::string& op, const std::string& value)>& on_break) const {
  const CompiledEntry& e = described();
  std::lock_guard<std::mutex> lock(e.tree_mutex_);
  if (e.root_) visit_segment(*e.root_, on_graph, on_break);
}

// ---- running an entry -----------------------------------------------------------------------

std::vector<at::Tensor> CompiledFunction::run_entry(const CompiledEntry& entry, const CallArgs& args,
                                                    const ForwardFn& forward, OutputSpec& spec) {
  if (entry.replays_) return run_replayed(entry, args, forward, spec);
  const Segment* seg = entry.root_.get();
  if (!seg->branch) {  // no graph break: the common case
    spec = seg->spec;
    return with_undefined(seg->fn(args.tensors), spec);
  }
  // A call may reach a branch value with no compiled continuation; then the forward runs again
  // from the start, so what the segments change outside their own values is saved first.
  StateSnapshot snapshot;
  auto rerun = [&](bool record, BranchPoint* missed_at = nullptr, const std::vector<c10::IValue>* missed_key = nullptr) {
    // The state as it was when the call began: the forward's run is then eager's own.
    snapshot.restore();
    return retrace_branch(entry, args, record, forward, spec, missed_at, missed_key);
  };
  std::vector<at::Tensor> env = args.tensors;
  std::vector<const Segment*> path;
  for (;;) {
    if (seg->effects.any()) save_effects(*seg, path, env, args, root_.get(), snapshot);
    std::vector<at::Tensor> outs = run_segment(*seg, env);
    if (!seg->branch) {
      spec = seg->spec;
      return with_undefined(std::move(outs), spec);
    }
    store_outputs(*seg, std::move(outs), env);
    std::vector<c10::IValue> key = read_key(*seg->branch, env);
    path.push_back(seg);
    Segment* next;
    bool closed;
    {
      std::lock_guard<std::mutex> lock(entry.tree_mutex_);
      next = seg->branch->find(key);
      closed = seg->branch->closed;
    }
    if (!next && closed) return rerun(/*record=*/false);
    if (!next) {
      // One retrace at a time per compiled object; a thread that waited may find the branch
      // traced by the one before it and go on.
      std::unique_lock<std::mutex> tracing(trace_mutex_);
      {
        std::lock_guard<std::mutex> lock(entry.tree_mutex_);
        next = seg->branch->find(key);
        closed = seg->branch->closed;
      }
      if (!next) return rerun(/*record=*/!closed, seg->branch.get(), &key);
    }
    seg = next;
  }
}

std::vector<at::Tensor> run_fixed_tree(
    const Segment& root, const std::vector<at::Tensor>& inputs, OutputSpec& spec, std::mutex& tree_mutex,
    const std::function<void(const BranchPoint&, const std::vector<c10::IValue>&)>& on_miss) {
  std::vector<at::Tensor> env = inputs;
  const Segment* seg = &root;
  for (;;) {
    std::vector<at::Tensor> outs = run_segment(*seg, env);
    if (!seg->branch) {
      spec = seg->spec;
      return with_undefined(std::move(outs), spec);
    }
    store_outputs(*seg, std::move(outs), env);
    const std::vector<c10::IValue> key = read_key(*seg->branch, env);
    const Segment* next;
    {
      std::lock_guard<std::mutex> lock(tree_mutex);
      next = seg->branch->find(key);
    }
    if (!next && !seg->effects.any()) {
      // The values were read from the forward run by ATen while it was traced; a backend's
      // kernels may differ in the last bits (a float read by item()). The segment run by the
      // interpreter, on the same inputs, reads what ATen gives: if that value is known, its
      // continuation is this call's, and the compiled value is remembered for it.
      std::vector<at::Tensor> inputs_again;
      for (uint32_t s : seg->input_slots) inputs_again.push_back(env[s]);
      std::vector<at::Tensor> env_aten = env;
      store_outputs(*seg, seg->gm->forward(std::move(inputs_again)), env_aten);
      const std::vector<c10::IValue> aten_key = read_key(*seg->branch, env_aten);
      std::lock_guard<std::mutex> lock(tree_mutex);
      next = seg->branch->find(aten_key);
      if (next) seg->branch->remember(key, const_cast<Segment*>(next));
    }
    if (!next) {
      on_miss(*seg->branch, key);
      TORCH_INTERNAL_ASSERT(false, "run_fixed_tree: on_miss returned");
    }
    seg = next;
  }
}

// ---- retracing a branch ---------------------------------------------------------------------

std::vector<at::Tensor> CompiledFunction::retrace_branch(const CompiledEntry& entry, const CallArgs& args, bool record,
                                                         const ForwardFn& forward, OutputSpec& spec,
                                                         BranchPoint* missed_at,
                                                         const std::vector<c10::IValue>* missed_key) {
  if (!record) {
    // A branch point past its limit got yet another value: running the compiled prefix and
    // then the whole forward again costs more than eager, so from now on this entry is eager.
    entry.eager_.store(true, std::memory_order_relaxed);
    warn_once("branch-limit", "a graph break read more distinct values than cache_size_limit (" +
                                  std::to_string(options_.cache_size_limit) +
                                  "); this input signature runs eagerly from now on");
    return forward(spec);
  }
  TracedRun traced = trace_forward(*this, entry.guards(), args, forward, spec, entry.input_names_);
  if (!traced.failure.empty()) {
    warn_once("trace:" + traced.failure, traced.failure + "; that branch runs eagerly");
    return traced.outputs;
  }
  std::vector<capture::SegmentRecord>& records = traced.records;
  if (entry.general_of_ != nullptr) {
    // The tree with size expressions serves every size whose trace recorded its segments; a new
    // value at one of its breaks may come with other sizes' graphs. These sizes get a tree of
    // their own, from this trace; the tree for every size stays as it is.
    ForwardReplays& replays = *entry.general_of_;
    const SizeKey key = replays.plan.key_of(args.tensors);
    std::string failure;
    std::unique_ptr<Segment> root = compile_chain(traced, 0, spec, backend_, options_.backend, name_, failure);
    if (!root) warn_once("backend", failure + "; those sizes run eagerly");
    const size_t count =
        replays.trees.insert(key, std::make_shared<CompiledEntry>(entry.guards_, std::move(root), entry.input_names_, failure));
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", name_, "): new sizes ", replays.plan.key_str(key),
                     ": a graph break of the graph with size expressions read a new value; these sizes get a tree of ",
                     "their own (", count, " sizes traced)");
    return traced.outputs;
  }

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
          if (!c->branch && same_segment(*c, records[i + 1], key_of_next) && c->spec.same_shape(spec))
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
      // The compiled segments read another value here than the eager forward (their results
      // differ from ATen's in the last bits): that value goes where the eager one did.
      if (&bp == missed_at && missed_key && !capture::same_key(*missed_key, records[i].branch->key))
        bp.remember(*missed_key, known);
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
  auto chain = compile_chain(traced, first_new, spec, backend_, options_.backend, name_, failure);
  if (!chain) {
    warn_once("backend", failure + "; that branch runs eagerly");
    return traced.outputs;
  }
  std::lock_guard<std::mutex> lock(entry.tree_mutex_);
  Segment* head = chain.get();
  attach->children.push_back(std::move(chain));
  attach->remember(key, head);
  if (attach == missed_at && missed_key && !capture::same_key(*missed_key, key)) attach->remember(*missed_key, head);
  return traced.outputs;
}

}  // namespace torchcompile::runtime
