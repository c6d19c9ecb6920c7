#include <torchcompile/capture/tracer.h>
#include <torchcompile/compat.h>
#include <torchcompile/ir/passes.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::capture {

namespace {

// The active tracer of each level on this thread.
thread_local Tracer* tls_current_tracer[2] = {nullptr, nullptr};

c10::DispatchKey key_of(TraceLevel level) {
  return level == TraceLevel::AboveAutograd ? compat::kTracingKey : compat::kBelowAutogradTracingKey;
}

// Operators returning host values that depend only on tensor metadata: they are executed but
// neither recorded nor treated as a data-dependent read (the metadata they read is guarded).
bool is_metadata_query(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> names = {
      "aten::size",          "aten::stride",         "aten::numel",
      "aten::dim",           "aten::sym_size",       "aten::sym_stride",
      "aten::sym_numel",     "aten::sym_storage_offset", "aten::storage_offset",
      "aten::is_same_size",  "aten::is_complex",     "aten::is_floating_point",
      "aten::is_signed",     "aten::is_conj",        "aten::is_neg",
      "aten::is_inference",  "aten::is_leaf",        "aten::output_nr",
      "aten::_version",      "aten::retains_grad",   "aten::result_type",
      "aten::can_cast",      "aten::promote_types",  "aten::is_set_to",
      "aten::_nnz",          "aten::sparse_dim",     "aten::dense_dim",
      "aten::is_coalesced",  "aten::is_pinned",      "aten::is_distributed",
      "aten::_has_compatible_shallow_copy_type", "aten::_debug_has_internal_overlap",
      "aten::_has_same_storage_numel", "aten::is_contiguous", "aten::is_non_overlapping_and_dense",
  };
  return names.count(name.name) != 0;
}

bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns())
    if (!ir::is_tensor_like_type(r.type())) return false;
  return true;
}

bool same_op(const c10::OperatorHandle& a, const c10::OperatorHandle& b) { return &a.schema() == &b.schema(); }

void redispatch_below_tracer(c10::DispatchKey key, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                             torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_tracing(key);
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, key), stack);
}

// Whether an op works on meta tensors: functionalization computes view and in-place results on
// meta tensors first (shape checks) — not part of the program.
bool has_meta_tensor(const torch::jit::Stack& stack, size_t num_args) {
  for (size_t i = stack.size() - num_args; i < stack.size(); ++i)
    if (stack[i].isTensor() && stack[i].toTensor().defined() && stack[i].toTensor().is_meta()) return true;
  return false;
}

bool is_key_value(const c10::IValue& v) { return v.isDouble() || v.isInt() || v.isBool() || v.isComplexDouble(); }

}  // namespace

bool same_key(const std::vector<c10::IValue>& a, const std::vector<c10::IValue>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const c10::IValue &x = a[i], &y = b[i];
    if (x.tagKind() != y.tagKind()) return false;
    if (x.isDouble()) {
      double dx = x.toDouble(), dy = y.toDouble();
      if (std::memcmp(&dx, &dy, sizeof dx) != 0 && !(dx != dx && dy != dy)) return false;
    } else if (x.isInt()) {
      if (x.toInt() != y.toInt()) return false;
    } else if (x.isBool()) {
      if (x.toBool() != y.toBool()) return false;
    } else if (x.isComplexDouble()) {
      if (x.toComplexDouble() != y.toComplexDouble()) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::string key_repr(const std::vector<c10::IValue>& key) {
  std::ostringstream os;
  for (size_t i = 0; i < key.size(); ++i) os << (i ? ", " : "") << key[i];
  return os.str();
}

// ---- the recording state ---------------------------------------------------------------------

struct Tracer::Impl {
  enum class Mode { Record, Replay, Off };

  Tracer* owner = nullptr;
  c10::DispatchKey key = compat::kTracingKey;
  bool fullgraph = false;
  OpInterceptor interceptor;
  Mode mode = Mode::Record;

  // The call's environment: slot tensors, their names, and which slot a tensor is.
  std::vector<at::Tensor> slots;
  std::vector<std::string> slot_names;
  std::unordered_map<const c10::TensorImpl*, uint32_t> slot_of;
  size_t num_inputs = 0;

  // The segment being recorded.
  std::unique_ptr<ir::GraphModule> gm = std::make_unique<ir::GraphModule>();
  std::vector<uint32_t> segment_inputs;
  std::unordered_map<uint32_t, ir::Value> placeholder_of_slot;
  std::unordered_map<const c10::TensorImpl*, ir::Value> values;  // values produced or read in it
  std::vector<LoggedOp> log;
  std::unordered_map<const ir::Node*, size_t> log_index;
  std::vector<SegmentRecord> done;
  size_t num_constants = 0;

  // Weak references keep a recorded TensorImpl's memory (not its storage) allocated during the
  // trace, so a freed tensor's address cannot be reused by a new tensor and alias its value;
  // they also tell, at a graph break, whether the forward still holds a tensor.
  std::vector<std::pair<c10::weak_intrusive_ptr<c10::TensorImpl>, const c10::TensorImpl*>> weak_values;

  // Declared module state, turned into get_attr nodes on first use.
  struct Attribute {
    std::string name;
    at::Tensor tensor;
    ir::AttributeKind kind;
  };
  std::unordered_map<const c10::TensorImpl*, Attribute> attributes;
  // Memory of inputs and attributes: a tensor over it that no op produced was derived outside
  // the dispatcher (`.data()`, from_blob over data_ptr); baking it in as a constant would be
  // silently wrong, so the trace is abandoned instead. Compared by address range: from_blob
  // makes a new StorageImpl over the same bytes.
  std::vector<std::pair<uintptr_t, uintptr_t>> tracked_memory;

  // Replay state. Stand-ins for values that died inside a replayed segment must never reach a
  // recorded op (they hold no data); weak references keep their addresses unique.
  ReplayPath path;
  std::unordered_set<const c10::TensorImpl*> stand_ins;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> stand_in_refs;
  size_t replay_segment = 0;
  size_t replay_index = 0;

  // Module paths of the enclosing torchcompile::call boundaries, innermost last.
  std::vector<std::string> module_stack;

  void track_memory(const at::Tensor& t) {
    if (!t.has_storage() || t.storage().data() == nullptr) return;
    auto begin = reinterpret_cast<uintptr_t>(t.storage().data());
    tracked_memory.emplace_back(begin, begin + t.storage().nbytes());
  }

  bool shares_tracked_memory(const at::Tensor& t) const {
    if (!t.has_storage() || t.storage().data() == nullptr) return false;
    auto begin = reinterpret_cast<uintptr_t>(t.storage().data());
    auto end = begin + t.storage().nbytes();
    for (const auto& [b, e] : tracked_memory)
      if (begin < e && b < end) return true;
    return false;
  }

  void track(const at::Tensor& t, ir::Value v) {
    values[t.unsafeGetTensorImpl()] = v;
    weak_values.emplace_back(c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), t.unsafeGetTensorImpl());
  }

  uint32_t new_slot(const at::Tensor& t, std::string name) {
    auto s = static_cast<uint32_t>(slots.size());
    slots.push_back(t);
    slot_names.push_back(std::move(name));
    // The latest slot wins, in recording and in replay alike, so both bind the same slots.
    slot_of[t.unsafeGetTensorImpl()] = s;
    return s;
  }

  ir::Value placeholder_for_slot(uint32_t s) {
    if (auto it = placeholder_of_slot.find(s); it != placeholder_of_slot.end()) return it->second;
    ir::Value v = gm->graph().placeholder(slot_names[s], ir::TensorMeta::of(slots[s]));
    placeholder_of_slot.emplace(s, v);
    segment_inputs.push_back(s);
    return v;
  }

  // The graph value for a tensor the forward passed to an op.
  std::optional<ir::Value> value_for(const at::Tensor& t) {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (auto it = values.find(impl); it != values.end()) return it->second;
    ir::Graph& g = gm->graph();
    if (auto it = slot_of.find(impl); it != slot_of.end()) {
      ir::Value v = placeholder_for_slot(it->second);
      values[impl] = v;
      return v;
    }
    if (auto it = attributes.find(impl); it != attributes.end()) {
      const std::string& name = it->second.name;
      ir::Value v = g.get_attr(name, ir::TensorMeta::of(t));
      // The owning module is known for module state; op nodes get theirs from the module call
      // boundary (torchcompile::call), once it exists.
      if (auto dot = name.rfind('.'); dot != std::string::npos) v.node->set_module_path(name.substr(0, dot));
      gm->set_attribute(name, it->second.tensor, it->second.kind);
      track(t, v);
      return v;
    }
    if (stand_ins.count(impl)) {
      owner->fail("the forward used a tensor computed before a graph break that it did not hold at the break", "");
      return std::nullopt;
    }
    if (shares_tracked_memory(t)) {
      owner->fail("a tensor sharing memory with an input or parameter reached an operator without "
                  "being produced by one (.data(), from_blob or set_ outside the dispatcher)",
                  "");
      return std::nullopt;
    }
    std::string name = "_tensor_constant" + std::to_string(num_constants++);
    ir::Value v = g.get_attr(name, ir::TensorMeta::of(t));
    gm->set_attribute(name, t, ir::AttributeKind::Constant);
    track(t, v);
    return v;
  }

  // Returns false if the trace failed while converting.
  bool to_argument(const c10::IValue& v, const c10::Argument& schema_arg, ir::Argument& out) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        out = ir::Argument(c10::IValue());
        return true;
      }
      auto val = value_for(t);
      if (!val) return false;
      out = ir::Argument(*val);
      return true;
    }
    if (ir::is_tensor_like_type(schema_arg.type()) && v.isList()) {
      std::vector<std::optional<ir::Value>> list;
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isNone() || (e.isTensor() && !e.toTensor().defined())) {
          list.emplace_back(std::nullopt);
          continue;
        }
        auto val = value_for(e.toTensor());
        if (!val) return false;
        list.emplace_back(*val);
      }
      out = ir::Argument(std::move(list));
      return true;
    }
    out = ir::Argument(v);
    return true;
  }

  // Flatten an op's returns (Tensor, Tensor?, Tensor[]) into tensors, with the count per return.
  static std::vector<at::Tensor> flatten_returns(const c10::IValue* returns, size_t n, std::vector<uint32_t>& counts) {
    std::vector<at::Tensor> out;
    for (size_t r = 0; r < n; ++r) {
      const c10::IValue& rv = returns[r];
      if (rv.isTensor() || rv.isNone()) {
        out.push_back(rv.isTensor() ? rv.toTensor() : at::Tensor());
        counts.push_back(1);
        continue;
      }
      uint32_t k = 0;
      for (const c10::IValue& e : rv.toListRef()) {
        out.push_back(e.isTensor() ? e.toTensor() : at::Tensor());
        ++k;
      }
      counts.push_back(k);
    }
    return out;
  }

  void record(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, const c10::IValue* returns) {
    const auto& schema = op.schema();
    std::vector<ir::Argument> ir_args(args.size());
    for (size_t i = 0; i < args.size(); ++i)
      if (!to_argument(args[i], schema.arguments()[i], ir_args[i])) return;

    LoggedOp entry;
    entry.op = op;
    std::vector<at::Tensor> produced = flatten_returns(returns, schema.returns().size(), entry.return_counts);
    std::vector<ir::TensorMeta> metas;
    for (const at::Tensor& t : produced) {
      LoggedOutput lo;
      lo.meta = ir::TensorMeta::of(t);
      for (size_t a = 0; t.defined() && a < args.size(); ++a)
        if (args[a].isTensor() && args[a].toTensor().unsafeGetTensorImpl() == t.unsafeGetTensorImpl())
          lo.alias_arg = static_cast<int32_t>(a);
      metas.push_back(lo.meta);
      entry.outputs.push_back(std::move(lo));
    }
    ir::Node* node = gm->graph().call_function(op, std::move(ir_args), std::move(metas), entry.return_counts);
    if (!module_stack.empty()) node->set_module_path(module_stack.back());
    log_index[node] = log.size();
    log.push_back(std::move(entry));
    for (size_t i = 0; i < produced.size(); ++i)
      if (produced[i].defined()) track(produced[i], node->output(i));
  }

  // End the segment with `outputs` (record mode). Extra outputs are the values the forward
  // still holds that this segment produced, so later segments can read them from slots;
  // `forced` values get slots too. Returns the slot of each forced value.
  std::vector<uint32_t> close_segment(std::vector<ir::Value> outputs, const std::vector<ir::Value>& forced,
                                      bool is_last) {
    SegmentRecord rec;
    std::vector<uint32_t> forced_slots;
    if (!is_last) {
      // Live values produced here, in program order.
      struct Live {
        size_t order;
        ir::Value value;
        at::Tensor tensor;
      };
      std::vector<Live> live;
      std::unordered_set<const c10::TensorImpl*> seen;
      for (const auto& [weak, impl] : weak_values) {
        if (!seen.insert(impl).second) continue;
        auto it = values.find(impl);
        if (it == values.end() || (it->second.node->kind() != ir::NodeKind::CallFunction &&
                                   it->second.node->kind() != ir::NodeKind::CallModule))
          continue;
        auto strong = weak.lock();
        if (!strong) continue;
        const ir::Value& v = it->second;
        live.push_back({log_index.at(v.node) * 1024 + v.index, v, at::Tensor(std::move(strong))});
      }
      std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.order < b.order; });
      std::unordered_map<ir::Value, uint32_t, ir::ValueHash> slot_of_value;
      auto give_slot = [&](const ir::Value& v, const at::Tensor& t) {
        uint32_t s = new_slot(t, v.node->name());
        slot_of_value.emplace(v, s);
        outputs.push_back(v);
        rec.output_slots.push_back(s);
        rec.output_names.push_back(v.node->name());
        log[log_index.at(v.node)].outputs[v.index].slot = static_cast<int32_t>(s);
      };
      for (const Live& l : live)
        if (!slot_of_value.count(l.value)) give_slot(l.value, l.tensor);
      for (const ir::Value& v : forced) {
        if (v.node->kind() == ir::NodeKind::Placeholder) {
          // Already a slot.
          for (const auto& [s, pv] : placeholder_of_slot)
            if (pv == v) forced_slots.push_back(s);
          continue;
        }
        TORCH_INTERNAL_ASSERT(slot_of_value.count(v) || v.node->kind() == ir::NodeKind::GetAttr,
                              "graph break: the read tensor is not live");
        if (auto it = slot_of_value.find(v); it != slot_of_value.end()) {
          forced_slots.push_back(it->second);
          continue;
        }
        // An attribute read directly: pass it through the graph into a slot.
        uint32_t s = new_slot(gm->attribute(v.node->target()), v.node->name());
        outputs.push_back(v);
        rec.output_slots.push_back(s);
        rec.output_names.push_back(v.node->name());
        forced_slots.push_back(s);
      }
    }
    ir::Graph& g = gm->graph();
    g.output(std::move(outputs));
    ir::eliminate_dead_code(g);
    ir::lint(g);
    std::unordered_set<std::string> used;
    for (const auto& n : g.nodes())
      if (n->kind() == ir::NodeKind::GetAttr) used.insert(n->target());
    std::vector<std::string> unused;
    for (const auto& [name, attr] : gm->attributes())
      if (!used.count(name)) unused.push_back(name);
    for (const auto& name : unused) gm->remove_attribute(name);

    rec.gm = std::move(gm);
    rec.input_slots = std::move(segment_inputs);
    rec.log = std::move(log);
    done.push_back(std::move(rec));

    gm = std::make_unique<ir::GraphModule>();
    segment_inputs.clear();
    placeholder_of_slot.clear();
    values.clear();
    log.clear();
    log_index.clear();
    num_constants = 0;
    return forced_slots;
  }

  // A data-dependent host read while recording: end the segment, run the read, branch on it.
  void host_read(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const std::string name = ir::op_target_name(op);
    TORCH_CHECK(!fullgraph, "torch::compile(fullgraph=true): graph break on a data-dependent host read (", name,
                ") in the forward");
    const size_t num_args = schema.arguments().size();
    std::vector<c10::IValue> args(stack->end() - num_args, stack->end());
    BranchRecord branch{op, args, {}, {}};
    std::vector<ir::Value> forced;
    std::vector<uint32_t> forced_positions;
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].isTensor() || !args[i].toTensor().defined()) {
        if (!args[i].isTensor() && ir::is_tensor_like_type(schema.arguments()[i].type()) && !args[i].isNone()) {
          owner->fail("graph break on " + name + " with a tensor-list argument is not supported", name);
          redispatch_below_tracer(key, op, ks, stack);
          return;
        }
        continue;
      }
      auto v = value_for(args[i].toTensor());
      if (!v) {
        redispatch_below_tracer(key, op, ks, stack);
        return;
      }
      forced.push_back(*v);
      forced_positions.push_back(static_cast<uint32_t>(i));
      branch.stack_template[i] = c10::IValue();
    }
    std::vector<uint32_t> forced_slots = close_segment({}, forced, /*is_last=*/false);
    for (size_t k = 0; k < forced_slots.size(); ++k) branch.tensor_args.emplace_back(forced_positions[k], forced_slots[k]);
    redispatch_below_tracer(key, op, ks, stack);
    const size_t num_returns = schema.returns().size();
    branch.key.assign(stack->end() - num_returns, stack->end());
    for (const auto& k : branch.key) {
      if (!is_key_value(k)) {
        owner->fail("graph break on " + name + ": its result is not a number or bool", name);
        return;
      }
    }
    done.back().branch = std::move(branch);
  }

  // The outputs of a logged op or module call, without running it: from the slots, the
  // aliased argument, or stand-ins for values that died inside their segment.
  std::vector<at::Tensor> answer(const LoggedOp& logged, const std::function<at::Tensor(size_t)>& arg) {
    c10::impl::ExcludeDispatchKeyGuard no_tracing(key);
    std::vector<at::Tensor> outs;
    for (const LoggedOutput& lo : logged.outputs) {
      if (lo.slot >= 0) {
        outs.push_back(slots.at(lo.slot));
      } else if (lo.alias_arg >= 0) {
        outs.push_back(arg(static_cast<size_t>(lo.alias_arg)));
      } else if (!lo.meta.defined) {
        outs.emplace_back();
      } else {
        // Only metadata can still be asked of a dead value.
        outs.push_back(at::empty_strided(lo.meta.sizes, lo.meta.strides,
                                         at::TensorOptions().dtype(lo.meta.dtype).device(lo.meta.device)));
        stand_ins.insert(outs.back().unsafeGetTensorImpl());
        stand_in_refs.emplace_back(outs.back().getIntrusivePtr());
      }
    }
    return outs;
  }

  // The next logged entry of the replayed segment, which must be `what`.
  const LoggedOp& next_logged(const std::function<bool(const LoggedOp&)>& matches, const std::string& what) {
    const std::vector<LoggedOp>& seg = *path.logs.at(replay_segment);
    TORCH_CHECK(replay_index < seg.size() && matches(seg[replay_index]),
                "torch::compile: while re-running the forward to trace a new branch, it called ", what,
                " where the trace recorded ",
                replay_index < seg.size() ? seg[replay_index].describe() : std::string("the end of a segment"),
                ". A compiled forward must make the same tensor calls for the same guards and branch values "
                "(does it depend on host state?)");
    return seg[replay_index++];
  }

  // Answer an op of an already executed segment without running it again.
  void replay_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const LoggedOp& logged = next_logged([&](const LoggedOp& l) { return l.op && same_op(*l.op, op); },
                                         ir::op_target_name(op));
    const size_t num_args = schema.arguments().size();
    std::vector<c10::IValue> args(stack->end() - num_args, stack->end());
    torch::jit::drop(*stack, num_args);
    std::vector<at::Tensor> outs = answer(logged, [&](size_t a) { return args.at(a).toTensor(); });
    size_t o = 0;
    for (size_t r = 0; r < logged.return_counts.size(); ++r) {
      if (schema.returns()[r].type()->kind() == c10::TypeKind::ListType) {
        c10::List<at::Tensor> list;
        for (uint32_t k = 0; k < logged.return_counts[r]; ++k) list.push_back(outs[o++]);
        stack->emplace_back(std::move(list));
      } else {
        at::Tensor t = outs[o++];
        if (t.defined()) {
          stack->emplace_back(std::move(t));
        } else {
          stack->emplace_back();
        }
      }
    }
  }

  // The host read ending a replayed segment: answer with the known (or this call's) value.
  void replay_branch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::string name = ir::op_target_name(op);
    const BranchRecord* b = replay_segment < path.branches.size() ? path.branches[replay_segment] : nullptr;
    TORCH_CHECK(replay_index == path.logs.at(replay_segment)->size() && b && same_op(b->op, op),
                "torch::compile: while re-running the forward to trace a new branch, it read ", name,
                " at a point where the trace did not; a compiled forward must make the same calls for the same "
                "guards and branch values");
    torch::jit::drop(*stack, op.schema().arguments().size());
    for (const auto& k : path.keys.at(replay_segment)) stack->push_back(k);
    ++replay_segment;
    replay_index = 0;
    if (replay_segment < path.keys.size()) return;
    if (path.record_after) {
      mode = Mode::Record;
      return;
    }
    mode = Mode::Off;
    c10::impl::tls_set_dispatch_key_included(key, false);
  }
};

// ---- dispatcher hook --------------------------------------------------------------------------

namespace {

template <TraceLevel Level>
void tracing_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  Tracer* tracer = Tracer::current(Level);
  const c10::DispatchKey key = key_of(Level);
  if (tracer == nullptr || tracer->failed() || tracer->impl().mode == Tracer::Impl::Mode::Off ||
      (Level == TraceLevel::BelowAutograd && has_meta_tensor(*stack, op.schema().arguments().size()))) {
    redispatch_below_tracer(key, op, ks, stack);
    return;
  }
  Tracer::Impl& impl = tracer->impl();
  const auto& schema = op.schema();
  const bool host_value = !returns_only_tensors(schema);
  if (host_value && is_metadata_query(schema.operator_name())) {
    redispatch_below_tracer(key, op, ks, stack);
    return;
  }
  if (impl.mode == Tracer::Impl::Mode::Replay) {
    if (host_value) {
      impl.replay_branch(op, stack);
    } else {
      impl.replay_op(op, stack);
    }
    return;
  }
  if (host_value) {
    impl.host_read(op, ks, stack);
    return;
  }
  if (impl.interceptor && impl.interceptor(op, stack)) return;
  const size_t num_args = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - num_args, stack->end());
  redispatch_below_tracer(key, op, ks, stack);
  const size_t num_returns = schema.returns().size();
  impl.record(op, args, stack->data() + (stack->size() - num_returns));
}

}  // namespace

void register_tracing_fallback() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the process lifetime: the fallback must outlive every traced call.
    static auto* above = new torch::Library(torch::Library::IMPL, "_", compat::kTracingKey, __FILE__, __LINE__);
    above->fallback(torch::CppFunction::makeFromBoxedFunction<&tracing_fallback<TraceLevel::AboveAutograd>>());
    static auto* below =
        new torch::Library(torch::Library::IMPL, "_", compat::kBelowAutogradTracingKey, __FILE__, __LINE__);
    below->fallback(torch::CppFunction::makeFromBoxedFunction<&tracing_fallback<TraceLevel::BelowAutograd>>());
  });
}

// ---- Tracer ---------------------------------------------------------------------------------

Tracer::Tracer(bool fullgraph, TraceLevel level) : level_(level), impl_(std::make_unique<Impl>()) {
  impl_->owner = this;
  impl_->key = key_of(level);
  impl_->fullgraph = fullgraph;
  register_tracing_fallback();
}

Tracer::~Tracer() = default;

Tracer* Tracer::current(TraceLevel level) { return tls_current_tracer[static_cast<int>(level)]; }

void Tracer::set_interceptor(OpInterceptor f) { impl_->interceptor = std::move(f); }

void Tracer::add_input(const at::Tensor& t, const std::string& name) {
  Impl& im = *impl_;
  const uint32_t s = im.new_slot(t, name);
  ++im.num_inputs;
  // The first segment takes every input as a placeholder, in order, used or not; placeholders
  // stay in front of the recorded ops.
  ir::Graph& g = im.gm->graph();
  ir::Node* first_op = nullptr;
  for (const auto& n : g.nodes()) {
    if (n->kind() != ir::NodeKind::Placeholder) {
      first_op = n.get();
      break;
    }
  }
  g.set_insert_point(first_op);
  ir::Value v = im.placeholder_for_slot(s);
  g.set_insert_point(nullptr);
  if (!t.defined()) return;
  im.track(t, v);
  im.track_memory(t);
}

void Tracer::add_attribute(const std::string& qualified_name, const at::Tensor& t, ir::AttributeKind kind) {
  if (!t.defined()) return;
  // The first declaration wins (a parameter shared by two submodules keeps one name).
  impl_->attributes.emplace(t.unsafeGetTensorImpl(), Impl::Attribute{qualified_name, t, kind});
  impl_->track_memory(t);
}

void Tracer::set_replay(ReplayPath path, std::vector<at::Tensor> env, const std::vector<std::string>& env_names) {
  Impl& im = *impl_;
  TORCH_INTERNAL_ASSERT(env.size() >= im.num_inputs, "set_replay: the environment lacks the inputs");
  TORCH_INTERNAL_ASSERT(!path.keys.empty() && path.logs.size() == path.keys.size(), "set_replay: bad path");
  // The first segment's placeholders were made by add_input; replay makes no graph of its own.
  im.gm = std::make_unique<ir::GraphModule>();
  im.segment_inputs.clear();
  im.placeholder_of_slot.clear();
  im.values.clear();
  for (size_t s = im.num_inputs; s < env.size(); ++s) {
    im.slots.push_back(env[s]);
    im.slot_names.push_back(s < env_names.size() ? env_names[s] : "slot" + std::to_string(s));
    if (env[s].defined()) im.slot_of[env[s].unsafeGetTensorImpl()] = static_cast<uint32_t>(s);
  }
  im.path = std::move(path);
  im.mode = Impl::Mode::Replay;
}

void Tracer::fail(std::string reason, std::string op) {
  if (failure_) return;
  failure_ = std::make_unique<TraceFailure>(TraceFailure{std::move(reason), std::move(op)});
  // Stop paying for the fallback for the rest of this forward; Activation restores the TLS.
  c10::impl::tls_set_dispatch_key_included(impl_->key, false);
}

size_t Tracer::num_breaks() const { return impl_->done.size(); }

const std::vector<at::Tensor>& Tracer::slot_tensors() const { return impl_->slots; }

Tracer::Activation::Activation(Tracer* t, TraceLevel level)
    : level_(level),
      previous_(tls_current_tracer[static_cast<int>(level)]),
      previous_included_(c10::impl::tls_is_dispatch_key_included(key_of(level))) {
  tls_current_tracer[static_cast<int>(level)] = t;
  c10::impl::tls_set_dispatch_key_included(key_of(level), t != nullptr);
}

Tracer::Activation::~Activation() {
  tls_current_tracer[static_cast<int>(level_)] = previous_;
  c10::impl::tls_set_dispatch_key_included(key_of(level_), previous_included_);
}

std::string LoggedOp::describe() const {
  return op ? ir::op_target_name(*op) : "module call '" + module_call + "'";
}

bool Tracer::following() const { return !failed() && impl_->mode != Impl::Mode::Off; }

bool Tracer::replaying() const { return !failed() && impl_->mode == Impl::Mode::Replay; }

void Tracer::push_module_path(std::string path) { impl_->module_stack.push_back(std::move(path)); }

void Tracer::pop_module_path() {
  TORCH_INTERNAL_ASSERT(!impl_->module_stack.empty(), "Tracer::pop_module_path without a push");
  impl_->module_stack.pop_back();
}

void Tracer::record_module_call(const std::string& path, const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& outputs, ir::ModuleFn fn,
                                std::vector<size_t> list_sizes) {
  Impl& im = *impl_;
  TORCH_INTERNAL_ASSERT(im.mode == Impl::Mode::Record, "Tracer::record_module_call outside recording");
  if (failed()) return;
  std::vector<ir::Argument> args;
  for (const at::Tensor& t : inputs) {
    if (!t.defined()) {
      fail("module call '" + path + "' with an undefined tensor argument cannot be an opaque call_module node", "");
      return;
    }
    auto v = im.value_for(t);
    if (!v) return;
    args.emplace_back(*v);
  }
  LoggedOp entry;
  entry.module_call = path;
  entry.list_sizes = std::move(list_sizes);
  std::vector<ir::TensorMeta> metas;
  for (const at::Tensor& t : outputs) {
    LoggedOutput lo;
    lo.meta = ir::TensorMeta::of(t);
    for (size_t a = 0; t.defined() && a < inputs.size(); ++a)
      if (inputs[a].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) lo.alias_arg = static_cast<int32_t>(a);
    metas.push_back(lo.meta);
    entry.outputs.push_back(std::move(lo));
    entry.return_counts.push_back(1);
  }
  // The same module called twice may differ in its scalar arguments: one target per call.
  std::string target = path;
  for (int k = 1; im.gm->has_submodule(target); ++k) target = path + "_" + std::to_string(k);
  ir::Node* node = im.gm->graph().call_module(target, std::move(args), std::move(metas));
  node->set_module_path(path);
  im.gm->set_submodule(target, std::move(fn));
  im.log_index[node] = im.log.size();
  im.log.push_back(std::move(entry));
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].defined()) im.track(outputs[i], node->output(i));
}

std::vector<at::Tensor> Tracer::replay_module_call(const std::string& path, const std::vector<at::Tensor>& inputs,
                                                   std::vector<size_t>& list_sizes) {
  Impl& im = *impl_;
  TORCH_INTERNAL_ASSERT(im.mode == Impl::Mode::Replay, "Tracer::replay_module_call outside replay");
  const LoggedOp& logged = im.next_logged([&](const LoggedOp& l) { return !l.op && l.module_call == path; },
                                          "module '" + path + "'");
  list_sizes = logged.list_sizes;
  return im.answer(logged, [&](size_t a) { return inputs.at(a); });
}

std::vector<SegmentRecord> Tracer::finish_segments(const std::vector<at::Tensor>& outputs) {
  TORCH_INTERNAL_ASSERT(!failed(), "Tracer::finish called on a failed trace");
  TORCH_INTERNAL_ASSERT(tls_current_tracer[static_cast<int>(level_)] != this,
                        "Tracer::finish called while the tracer is active");
  Impl& im = *impl_;
  TORCH_INTERNAL_ASSERT(im.mode == Impl::Mode::Record, "Tracer::finish: the forward ended before the replayed path did");
  std::vector<ir::Value> outs;
  outs.reserve(outputs.size());
  for (const at::Tensor& t : outputs) {
    TORCH_CHECK(t.defined(), "torch::compile: the forward returned an undefined tensor");
    auto v = im.value_for(t);
    if (!v) return {};
    outs.push_back(*v);
  }
  im.close_segment(std::move(outs), {}, /*is_last=*/true);
  return std::move(im.done);
}

std::unique_ptr<ir::GraphModule> Tracer::finish(const std::vector<at::Tensor>& outputs) {
  TORCH_INTERNAL_ASSERT(impl_->done.empty(), "Tracer::finish: the trace has graph breaks; use finish_segments");
  auto segments = finish_segments(outputs);
  if (segments.empty()) return nullptr;
  return std::move(segments.front().gm);
}

}  // namespace torchcompile::capture
