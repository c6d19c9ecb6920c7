// The tracer (capture/tracer.h): its recording state, the dispatcher fallback that feeds it, and
// the finished segments (capture/segment_records.h).
#include <torchcompile/capture/tracer.h>

#include <torchcompile/compat.h>
#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/passes.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "capture/fast_path_ops.h"
#include "capture/metadata_at.h"
#include "capture/observed.h"
#include "capture/segment_records.h"
#include "support/strided_copy.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
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
bool is_metadata_query(const c10::OperatorHandle& op) {
  return ir::op_properties(op).kind == ir::OpKind::MetadataQuery;
}

bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns())
    if (!ir::is_tensor_like_type(r.type())) return false;
  return true;
}

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

bool is_key_value(const c10::IValue& v) {
  return v.isDouble() || v.isInt() || v.isBool() || v.isComplexDouble() || v.isIntList() ||
         (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu());
}

// `torchcompile::host_data(Tensor self) -> Tensor`: the host read that ends a segment where host
// code read a tensor's data through a pointer (`data_ptr`, an accessor): a contiguous copy of
// its contents, the key of the continuation.
at::Tensor host_data(const at::Tensor& t) { return t.detach().clone(at::MemoryFormat::Contiguous); }

// Same dtype, sizes and bytes (NaNs with the same bits are equal, as for double keys).
bool same_contents(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  const size_t n = static_cast<size_t>(ca.numel()) * ca.element_size();
  return n == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), n) == 0;
}

// `torchcompile::result_sizes(Tensor self) -> int[]`: the host read that ends a segment after an
// operator whose results' sizes depend on the data; its value keys the continuation. Reading
// through it is not a host read of sizes by the forward (an observed tensor stays quiet).
std::vector<int64_t> result_sizes(const at::Tensor& t) {
  ObservedTensorImpl* o = ObservedTensorImpl::of(t);
  if (o) o->set_observing(false);
  std::vector<int64_t> sizes = t.sizes().vec();
  if (o) o->set_observing(true);
  return sizes;
}

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
    } else if (x.isIntList() && y.isIntList()) {
      if (x.toIntVector() != y.toIntVector()) return false;
    } else if (x.isTensor() && y.isTensor()) {
      if (!same_contents(x.toTensor(), y.toTensor())) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::string key_repr(const std::vector<c10::IValue>& key) {
  std::ostringstream os;
  for (size_t i = 0; i < key.size(); ++i) {
    os << (i ? ", " : "");
    if (!key[i].isTensor()) {
      os << key[i];
      continue;
    }
    // The data host code read: `Int[5] {0, 1, 0, 0, 1}` (the first 8 elements).
    const at::Tensor& t = key[i].toTensor();
    os << c10::toString(t.scalar_type()) << t.sizes() << " {";
    const at::Tensor flat = t.reshape({-1}).to(at::kDouble);
    const int64_t n = std::min<int64_t>(flat.numel(), 8);
    for (int64_t k = 0; k < n; ++k) os << (k ? ", " : "") << flat.data_ptr<double>()[k];
    os << (flat.numel() > n ? ", ...}" : "}");
  }
  return os.str();
}

// ---- the recording state ---------------------------------------------------------------------

struct Tracer::Impl {
  Tracer* owner = nullptr;
  c10::DispatchKey key = compat::kTracingKey;
  bool fullgraph = false;
  OpInterceptor interceptor;
  OpSubstitute substitute;
  std::shared_ptr<SizeReads> size_reads;  // set: observe size and data reads (capture/observed.h)
  std::string unobserved;                 // why some size reads may not have been seen
  bool autograd_records = false;          // observe_reads: results autograd tracks stay as they are
  bool shapes_only = false;               // set_shapes_only: ops run on meta tensors

  // Shapes only: run `op` on meta versions of its tensor arguments (an op without a meta kernel
  // on zero-filled tensors of their sizes, its results then made meta). A result that is an
  // argument's stand-in (an in-place or out= op) is the argument itself.
  void run_on_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t num_args) {
    const size_t base = stack->size() - num_args;
    const std::vector<c10::IValue> given(stack->begin() + base, stack->end());
    std::unordered_map<const c10::TensorImpl*, at::Tensor> stands_for;
    std::vector<at::Tensor> alive;  // the stand-ins, until their results are mapped (no address reuse)
    auto convert = [&](bool zeros) {
      stack->resize(base);
      for (const c10::IValue& v : given)
        stack->push_back(map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
          if (!t.defined() || (t.is_meta() && !zeros)) return t;
          at::Tensor m = at::empty_strided(t.sizes(), t.strides(),
                                           t.options().device(zeros ? c10::kCPU : c10::kMeta).requires_grad(false));
          if (zeros) m.zero_();
          if (t.requires_grad()) m.requires_grad_(true);  // results of views of parameters require grad too
          stands_for[m.unsafeGetTensorImpl()] = t;
          alive.push_back(m);
          return m;
        }));
    };
    c10::impl::ExcludeDispatchKeyGuard no_tracing(key);
    const bool known = known_without_meta_kernel(op);
    bool zeros = known;
    if (!zeros) {
      try {
        convert(false);
        op.callBoxed(stack);
      } catch (const c10::Error&) {
        zeros = true;  // no meta kernel, or the arguments are wrong for the op (below)
      }
    }
    if (zeros) {
      convert(false);
      if (auto r = result_on_meta(op, std::vector<c10::IValue>(stack->begin() + base, stack->end()))) {
        stack->resize(base);
        for (at::Tensor& t : *r) stack->push_back(std::move(t));
      } else {
        convert(true);
        op.callBoxed(stack);  // throws if the arguments are wrong: not a missing meta kernel
      }
      if (!known) note_without_meta_kernel(op);
    }
    const size_t num_returns = op.schema().returns().size();
    for (size_t i = stack->size() - num_returns; i < stack->size(); ++i)
      (*stack)[i] = map_tensors((*stack)[i], [&](const at::Tensor& t) -> at::Tensor {
        if (!t.defined()) return t;
        auto it = stands_for.find(t.unsafeGetTensorImpl());
        if (it != stands_for.end()) return it->second;
        if (!zeros || t.is_meta()) return t;
        return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
      });
  }


  // Tensors whose data host code read (each a graph break keyed by a copy of the contents), at
  // the version read: reading them again before an op writes to them is no new break. Kept
  // until the trace ends, when they are checked for host writes (check_host_writes).
  struct DataRead {
    at::Tensor tensor;
    int64_t version = 0;
    at::Tensor contents;
    std::string label;
  };
  std::vector<DataRead> data_reads;

  // The call's environment: slot tensors, their names, and which slot a tensor is.
  std::vector<at::Tensor> slots;
  std::vector<std::string> slot_names;
  std::unordered_map<const c10::TensorImpl*, uint32_t> slot_of;
  size_t num_inputs = 0;

  // The segment being recorded.
  std::unique_ptr<ir::GraphModule> gm = std::make_unique<ir::GraphModule>();
  std::vector<uint32_t> segment_inputs;
  std::vector<std::pair<uint32_t, uint32_t>> segment_input_epochs;  // (slot, write epoch) per placeholder
  // In-place writes to slot tensors a segment read: each write begins a new epoch of the slot,
  // and the value the readers of the epoch before saw is kept (their example inputs).
  std::vector<uint32_t> slot_epoch;
  std::vector<char> slot_read_in_epoch;
  std::map<std::pair<uint32_t, uint32_t>, at::Tensor> values_before_writes;
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> done_input_epochs;  // segment_input_epochs of `done`

  // After the last segment: give each segment the values its inputs had where a later write
  // changed them.
  void note_values_before_writes() {
    if (values_before_writes.empty()) return;
    for (size_t k = 0; k < done.size(); ++k) {
      const auto& epochs = done_input_epochs.at(k);
      done[k].values_before_writes.assign(epochs.size(), at::Tensor());
      for (size_t i = 0; i < epochs.size(); ++i)
        if (auto it = values_before_writes.find(epochs[i]); it != values_before_writes.end())
          done[k].values_before_writes[i] = it->second;
    }
  }
  std::unordered_map<uint32_t, ir::Value> placeholder_of_slot;
  std::unordered_map<const c10::TensorImpl*, ir::Value> values;  // values produced or read in it
  std::unordered_map<const ir::Node*, size_t> op_order;  // call order of the segment's ops
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

  // Storages of the tensors recorded ops produced. A tensor no recorded op produced that shares
  // one of them was made outside the dispatcher (`.data()`, a factory function's shallow copy,
  // from_blob): baking it in as a constant would freeze the tracing call's values. Weak
  // references keep the StorageImpl addresses unique for the trace.
  std::unordered_set<const c10::StorageImpl*> result_storages;
  // Where each result of this segment lives (its storage and offset), for shallow copies.
  std::unordered_map<const c10::TensorImpl*, std::pair<const c10::StorageImpl*, int64_t>> result_geometry;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> result_storage_refs;

  bool derived_from_result(const at::Tensor& t) const {
    if (!t.has_storage()) return false;
    if (result_storages.count(t.storage().unsafeGetStorageImpl()) != 0) return true;
    // from_blob over a result's bytes makes a new StorageImpl: compare addresses of live results.
    if (t.storage().data() == nullptr) return false;
    const auto begin = reinterpret_cast<uintptr_t>(t.storage().data()), end = begin + t.storage().nbytes();
    for (const auto& [weak, impl] : weak_values) {
      auto strong = weak.lock();
      if (!strong || !strong->has_storage() || strong->storage().data() == nullptr) continue;
      const auto b = reinterpret_cast<uintptr_t>(strong->storage().data()), e = b + strong->storage().nbytes();
      if (begin < e && b < end) return true;
    }
    return false;
  }

  // Results of factory ops (no tensor arguments) not yet used by a recorded op, with their bytes
  // as made (an `empty` result is first filled with a marker). Host code may fill such a tensor
  // outside the dispatcher (`at::tensor(std::vector)`, an accessor loop after `torch::empty`);
  // replaying the factory op would then lose the values. At the first use the bytes are
  // compared: if they changed, the value becomes a per-call copy of a graph constant.
  struct FreshFactory {
    c10::weak_intrusive_ptr<c10::TensorImpl> tensor;  // weak: a strong reference would make
                                                       // torch:: factories copy the TensorImpl
    c10::Storage storage;
    std::vector<uint8_t> bytes;
    bool random = false;  // its contents come from the random generator
  };
  std::unordered_map<const c10::StorageImpl*, FreshFactory> fresh_factories;

  static bool is_uninitialized_factory(const c10::OperatorHandle& op) {
    return ir::op_properties(op).uninitialized;
  }

  void note_factory(const c10::OperatorHandle& op, const std::vector<at::Tensor>& produced) {
    for (const at::Tensor& t : produced) {
      if (!t.defined() || !t.has_storage() || t.storage().data() == nullptr || !t.device().is_cpu()) continue;
      auto* data = static_cast<uint8_t*>(compat::mutable_storage_data(t.storage()));
      const size_t n = t.storage().nbytes();
      if (is_uninitialized_factory(op)) std::memset(data, 0x7f, n);
      fresh_factories.insert_or_assign(
          t.storage().unsafeGetStorageImpl(),
          FreshFactory{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), t.storage(),
                       std::vector<uint8_t>(data, data + n), ir::op_is_random(op)});
    }
  }

  // The first use of a factory result (`t` is over its storage): if host code wrote to it since
  // the op made it, read its contents from a constant, copied on every call since the graph may
  // update it in place.
  void check_factory(const at::Tensor& t) {
    if (!t.has_storage()) return;
    auto it = fresh_factories.find(t.storage().unsafeGetStorageImpl());
    if (it == fresh_factories.end()) return;
    FreshFactory f = std::move(it->second);
    fresh_factories.erase(it);
    if (f.storage.nbytes() == f.bytes.size() && std::memcmp(f.storage.data(), f.bytes.data(), f.bytes.size()) == 0)
      return;
    auto strong = f.tensor.lock();
    if (!strong) return;  // only reachable through tensors no op made: value_for refuses those
    at::Tensor made(std::move(strong));
    auto v = values.find(made.unsafeGetTensorImpl());
    if (v == values.end()) return;
    const ir::Value old = v->second;
    at::Tensor contents;
    {
      c10::impl::ExcludeDispatchKeyGuard no_tracing(key);
      at::NoGradGuard no_grad;
      contents = made.detach().clone(at::MemoryFormat::Preserve);
    }
    ir::Graph& g = gm->graph();
    std::string name = "_tensor_constant" + std::to_string(num_constants++);
    ir::Value c = g.get_attr(name, ir::TensorMeta::of(contents));
    gm->set_attribute(name, contents, ir::AttributeKind::Constant);
    static const c10::OperatorHandle clone = ir::find_op("aten::clone");
    ir::Node* copy =
        g.call_function(clone, {ir::Argument(c), ir::Argument(c10::IValue())}, {ir::TensorMeta::of(made)}, {1});
    if (!module_stack.empty()) copy->set_module_path(module_stack.back());
    op_order.emplace(copy, op_order.size());
    for (auto& [impl, value] : values)
      if (value == old) value = copy->output(0);
  }

  // A tensor no recorded op produced over the memory of a recorded result, with the same
  // geometry: a shallow copy made outside the dispatcher (`torch::` factories and
  // make_variable copy the TensorImpl when its result is still referenced). It is that value.
  std::optional<ir::Value> shallow_copy_of(const at::Tensor& t) {
    std::optional<ir::Value> best;
    for (const auto& [impl, v] : values) {
      auto g = result_geometry.find(impl);
      if (g == result_geometry.end() || g->second.first != t.storage().unsafeGetStorageImpl() ||
          g->second.second != t.storage_offset())
        continue;
      const ir::TensorMeta& m = v.node->output_meta().at(v.index);
      if (m.dtype != t.scalar_type() || m.sizes != t.sizes().vec() || m.strides != t.strides().vec()) continue;
      if (!best || op_order.at(v.node) > op_order.at(best->node)) best = v;  // the newest alias
    }
    return best;
  }

  void check_factories_in(const torch::jit::Stack& stack, size_t num_args) {
    for (size_t i = stack.size() - num_args; i < stack.size(); ++i) {
      if (stack[i].isTensor()) {
        check_factory(stack[i].toTensor());
      } else if (stack[i].isList()) {
        for (const c10::IValue& e : stack[i].toListRef())
          if (e.isTensor()) check_factory(e.toTensor());
      }
    }
  }

  void check_all_factories() {
    while (!fresh_factories.empty()) {
      auto strong = fresh_factories.begin()->second.tensor.lock();
      if (!strong) {
        fresh_factories.erase(fresh_factories.begin());
        continue;
      }
      check_factory(at::Tensor(std::move(strong)));
    }
  }

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
    slot_epoch.push_back(0);
    slot_read_in_epoch.push_back(0);
    // The latest slot wins: a tensor passed through several segments is read from its newest slot.
    slot_of[t.unsafeGetTensorImpl()] = s;
    return s;
  }

  ir::Value placeholder_for_slot(uint32_t s) {
    if (auto it = placeholder_of_slot.find(s); it != placeholder_of_slot.end()) return it->second;
    ir::Value v = gm->graph().placeholder(slot_names[s], ir::TensorMeta::of(slots[s]));
    placeholder_of_slot.emplace(s, v);
    segment_inputs.push_back(s);
    segment_input_epochs.emplace_back(s, slot_epoch[s]);
    slot_read_in_epoch[s] = 1;
    return v;
  }

  // Before an op writes its arguments in place: keep the value of every slot tensor sharing
  // memory with a written argument that a segment read since the slot's last write, for those
  // segments' example inputs (a backend compiles a graph with the values it was traced on).
  void keep_slots_before_write(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t num_args) {
    const size_t base = stack.size() - num_args;
    for (size_t i = 0; i < num_args && i < schema.arguments().size(); ++i) {
      const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
      if (alias == nullptr || !alias->isWrite()) continue;
      const c10::IValue& v = stack[base + i];
      if (v.isTensor()) {
        keep_slots_aliasing(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) keep_slots_aliasing(t);
      }
    }
  }

  void keep_slots_aliasing(const at::Tensor& written) {
    if (!written.defined() || !written.has_storage()) return;
    // The op reads what it writes: a slot it writes is an input of this segment, read before.
    const c10::TensorImpl* impl = written.unsafeGetTensorImpl();
    if (!values.count(impl) && slot_of.count(impl)) value_for(written);
    for (uint32_t s = 0; s < slots.size(); ++s) {
      const at::Tensor& t = slots[s];
      if (!slot_read_in_epoch[s] || !t.defined() || !t.has_storage() || !t.storage().is_alias_of(written.storage()))
        continue;
      at::Tensor copy;
      {
        c10::impl::ExcludeDispatchKeyGuard no_tracing(key);
        ObservedTensorImpl* observed = ObservedTensorImpl::of(t);
        const bool was_observing = observed && observed->observing();
        if (was_observing) observed->set_observing(false);  // not host code reading its sizes
        copy = support::strided_copy(t);  // the layout the segment read
        // A backend must see whether the input requires grad (AOT lifts it with its gradient).
        if (t.requires_grad()) copy.requires_grad_(true);
        if (was_observing) observed->set_observing(true);
      }
      values_before_writes.emplace(std::make_pair(s, slot_epoch[s]), std::move(copy));
      ++slot_epoch[s];
      slot_read_in_epoch[s] = 0;
    }
  }

  // The graph value for a tensor the forward passed to an op.
  std::optional<ir::Value> value_for(const at::Tensor& t) {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (!fresh_factories.empty()) check_factory(t);
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
    if (derived_from_result(t)) {
      if (auto v = shallow_copy_of(t)) {
        track(t, *v);
        return v;
      }
    }
    if (shares_tracked_memory(t) || derived_from_result(t)) {
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

    std::vector<uint32_t> return_counts;
    std::vector<at::Tensor> produced = flatten_returns(returns, schema.returns().size(), return_counts);
    std::vector<ir::TensorMeta> metas;
    for (const at::Tensor& t : produced) metas.push_back(ir::TensorMeta::of(t));
    ir::Node* node = gm->graph().call_function(op, std::move(ir_args), std::move(metas), return_counts);
    if (!module_stack.empty()) node->set_module_path(module_stack.back());
    add_results(node, produced);
    // An op that returns an argument without its schema saying so (eval-mode dropout returns
    // its input): the result is that argument's value, so writes through it are writes to it.
    for (size_t i = 0, r = 0, k = 0; i < produced.size(); ++i) {
      while (r < return_counts.size() && k == return_counts[r]) ++r, k = 0;
      ++k;
      if (!produced[i].defined() || (r < schema.returns().size() && schema.returns()[r].alias_info() != nullptr))
        continue;
      for (size_t a = 0; a < args.size(); ++a) {
        if (!args[a].isTensor() || !args[a].toTensor().defined() || !node->args()[a].is_value()) continue;
        const at::Tensor& arg = args[a].toTensor();
        if (arg.unsafeGetTensorImpl() == produced[i].unsafeGetTensorImpl()) {
          values[arg.unsafeGetTensorImpl()] = node->args()[a].value();
        } else if (key == compat::kTracingKey && arg.has_storage() && produced[i].has_storage() &&
                   arg.storage().is_alias_of(produced[i].storage()) && arg.storage().nbytes() > 0) {
          // (The level-1 graph only: its writes are what a call must be able to undo. Below
          // autograd, `unsafe_split` and friends do this by design.)
          owner->fail(ir::op_target_name(op) + " returned memory of its argument without declaring it in its schema",
                      ir::op_target_name(op));
          return;
        }
      }
    }
    bool factory = true;
    for (size_t i = 0; i < args.size(); ++i)
      factory = factory && !(ir::is_tensor_like_type(schema.arguments()[i].type()) && !args[i].isNone());
    if (factory) note_factory(op, produced);
  }

  // Track the tensors a recorded op or module call produced as its node's outputs.
  void add_results(ir::Node* node, const std::vector<at::Tensor>& produced) {
    op_order.emplace(node, op_order.size());
    for (size_t i = 0; i < produced.size(); ++i) {
      if (!produced[i].defined()) continue;
      track(produced[i], node->output(i));
      if (produced[i].has_storage()) {
        const c10::StorageImpl* st = produced[i].storage().unsafeGetStorageImpl();
        result_geometry[produced[i].unsafeGetTensorImpl()] = {st, produced[i].storage_offset()};
        if (result_storages.insert(st).second)
          result_storage_refs.emplace_back(produced[i].storage().getWeakStorageImpl());
      }
    }
  }

  // End the segment with `outputs` (record mode). Extra outputs are the values the forward
  // still holds that this segment produced, so later segments can read them from slots;
  // `forced` values get slots too. Returns the slot of each forced value.
  std::vector<uint32_t> close_segment(std::vector<ir::Value> outputs, const std::vector<ir::Value>& forced,
                                      bool is_last) {
    SegmentRecord rec;
    std::vector<uint32_t> forced_slots;
    check_all_factories();
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
        live.push_back({op_order.at(v.node) * 1024 + v.index, v, at::Tensor(std::move(strong))});
      }
      std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.order < b.order; });
      std::unordered_map<ir::Value, uint32_t, ir::ValueHash> slot_of_value;
      auto give_slot = [&](const ir::Value& v, const at::Tensor& t) {
        uint32_t s = new_slot(t, v.node->name());
        slot_of_value.emplace(v, s);
        outputs.push_back(v);
        rec.output_slots.push_back(s);
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
        forced_slots.push_back(s);
      }
    }
    ir::Graph& g = gm->graph();
    g.output(std::move(outputs));  // dead code is left to the compile pipeline

    rec.gm = std::move(gm);
    rec.input_slots = std::move(segment_inputs);
    done.push_back(std::move(rec));
    done_input_epochs.push_back(std::move(segment_input_epochs));

    gm = std::make_unique<ir::GraphModule>();
    segment_inputs.clear();
    segment_input_epochs.clear();
    placeholder_of_slot.clear();
    values.clear();
    op_order.clear();
    result_geometry.clear();
    num_constants = 0;
    return forced_slots;
  }

  // Host code read the data of `t` (an observed tensor) through a pointer: what it computes from
  // here may depend on the contents, so the segment ends here with a host read of them; the
  // continuation is keyed by a copy (as `item()` is keyed by its value). A factory result no op
  // has used yet holds constants, or what host code writes into it (check_factory makes that
  // a graph constant): reading or filling it is no break, unless it is random.
  void data_read(const at::Tensor& t, const std::string& label) {
    if (owner->failed() || Tracer::current(TraceLevel::AboveAutograd) != owner) return;
    const int64_t version = t._version();
    for (const DataRead& r : data_reads)
      if (r.tensor.unsafeGetTensorImpl() == t.unsafeGetTensorImpl() && r.version == version) return;
    auto fresh = fresh_factories.find(t.storage().unsafeGetStorageImpl());
    if (fresh != fresh_factories.end() && !fresh->second.random) return;
    TORCH_CHECK(!fullgraph, "torch::compile(fullgraph=true): host code read the data of ", label,
                " through a pointer (data_ptr, an accessor), which ends the graph (a graph break)");
    static const c10::OperatorHandle data_op =
        c10::Dispatcher::singleton().findSchemaOrThrow("torchcompile::host_data", "");
    torch::jit::Stack stack{c10::IValue(t)};
    const size_t breaks = done.size();
    host_read(data_op, std::nullopt, &stack);
    if (done.size() == breaks || !done.back().branch) return;  // not a graph value: nothing to key
    data_reads.push_back(DataRead{t, version, done.back().branch->key.at(0).toTensor(), label});
  }

  // When the forward has returned: a tensor whose data host code read and then changed through
  // the pointer (no op wrote to it since) holds values the graph does not compute; replaying
  // it would lose them.
  void check_host_writes() {
    for (const DataRead& r : data_reads) {
      if (owner->failed()) return;
      if (r.tensor._version() != r.version || same_contents(r.tensor, r.contents)) continue;
      owner->fail("host code wrote into the data of " + r.label + " through a pointer", "");
    }
  }

  // After an operator whose results' sizes depend on the data (`nonzero`, `masked_select`,
  // boolean indexing, ...): later ops, and host code reading those sizes, were recorded for one
  // size, so the segment ends here with a host read of the first result's sizes; the
  // continuation is keyed by them. (PyTorch's tracer breaks the graph on these "dynamic output
  // shape" operators by default too.) The other results' sizes follow from the arguments' sizes
  // and the first's: `unique`'s counts have the values' length, its inverse the input's shape.
  void break_on_data_dependent_sizes(const c10::OperatorHandle& op, c10::DispatchKeySet ks, const at::Tensor& result) {
    const std::string name = ir::op_target_name(op);
    TORCH_CHECK(!fullgraph, "torch::compile(fullgraph=true): the sizes of ", name,
                "'s result depend on the data, which ends the graph (a graph break)");
    static const c10::OperatorHandle sizes_op =
        c10::Dispatcher::singleton().findSchemaOrThrow("torchcompile::result_sizes", "");
    torch::jit::Stack stack{c10::IValue(result)};
    host_read(sizes_op, ks, &stack);
  }

  // A data-dependent host read while recording: end the segment, run the read, branch on it.
  // `ks` is the key set the dispatcher gave the tracing fallback; none for a read that did not
  // come through the dispatcher (a data read): the op is then called with the tracer excluded.
  void host_read(const c10::OperatorHandle& op, std::optional<c10::DispatchKeySet> ks, torch::jit::Stack* stack) {
    if (shapes_only) throw ShapesOnlyStopped("a host read of data (" + ir::op_target_name(op) + ")");
    auto run = [&] {
      if (ks) {
        redispatch_below_tracer(key, op, *ks, stack);
      } else {
        c10::impl::ExcludeDispatchKeyGuard no_tracing(key);
        op.callBoxed(stack);
      }
    };
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
          run();
          return;
        }
        continue;
      }
      auto v = value_for(args[i].toTensor());
      if (!v) {
        run();
        return;
      }
      forced.push_back(*v);
      forced_positions.push_back(static_cast<uint32_t>(i));
      branch.stack_template[i] = c10::IValue();
    }
    std::vector<uint32_t> forced_slots = close_segment({}, forced, /*is_last=*/false);
    for (size_t k = 0; k < forced_slots.size(); ++k) branch.tensor_args.emplace_back(forced_positions[k], forced_slots[k]);
    run();
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

};

// What the code outside the class reaches of a Tracer: its recording state.
struct TracerAccess {
  using Impl = Tracer::Impl;
  static Impl& impl(Tracer& t) { return *t.impl_; }
  static const Impl& impl(const Tracer& t) { return *t.impl_; }
};

// ---- dispatcher hook --------------------------------------------------------------------------

namespace {

// The observed tensors among an op's arguments: muted (default policy) until destruction, so
// that reads by kernels and by the tracer are not counted; observe_results observes the op's
// results (capture/observed.h).
class MutedArgs {
 public:
  MutedArgs(const torch::jit::Stack& stack, size_t num_args) {
    for (size_t i = stack.size() - num_args; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      if (v.isTensor()) {
        add(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) add(t);
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef())
          if (e.isTensor()) add(e.toTensor());
      }
    }
  }
  ~MutedArgs() {
    for (ObservedTensorImpl* t : muted_) t->set_observing(true);
  }
  MutedArgs(const MutedArgs&) = delete;
  MutedArgs& operator=(const MutedArgs&) = delete;

  // A metadata query op (its result is a size or stride): a read of all its arguments' sizes.
  void note_read(const std::string& op) {
    for (ObservedTensorImpl* t : muted_) t->note_read_all(op.c_str());
  }

  // Observe the op's tensor results (their dimensions carry the union of the arguments'
  // candidates); a result written in place (`out=`, `resize_`) gains them too.
  void observe_results(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, torch::jit::Stack* stack,
                       size_t num_returns, TracerAccess::Impl& impl);

 private:
  void add(const at::Tensor& t) {
    ObservedTensorImpl* o = ObservedTensorImpl::of(t);
    if (o == nullptr) return;
    bits_ |= o->all_bits();
    o->set_observing(false);
    muted_.push_back(o);
  }
  at::Tensor observe(const at::Tensor& t, const std::string& label, TracerAccess::Impl& impl);

  std::vector<ObservedTensorImpl*> muted_;
  uint64_t bits_ = 0;
};

}  // namespace

at::Tensor MutedArgs::observe(const at::Tensor& t, const std::string& label, TracerAccess::Impl& impl) {
  if (!t.defined()) return t;
  if (ObservedTensorImpl* o = ObservedTensorImpl::of(t)) {
    o->add_bits(bits_);
    return t;
  }
  if (t.layout() != c10::kStrided || !t.has_storage()) {
    if (bits_ != 0 && impl.unobserved.empty()) impl.unobserved = label + " is not a strided tensor";
    return t;
  }
  // A result autograd recorded (not a leaf, not a view) that carries candidate dimensions of a
  // dynamic trace: its observed copy gets the same gradient edge (grad_fn and output number), so
  // gradients flow through it as through the result, and its size reads are counted.
  const bool recorded = bits_ != 0 && t.requires_grad() && t.grad_fn() != nullptr && !t.is_view();
  // Other tensors that require grad, and while autograd records one it tracks at all (a view),
  // would lose that in a copy of their TensorImpl: left as they are (their reads are not seen).
  if (!recorded &&
      (t.requires_grad() || (impl.autograd_records && t.unsafeGetTensorImpl()->autograd_meta() != nullptr))) {
    if (bits_ != 0 && impl.unobserved.empty()) impl.unobserved = label + " is recorded by autograd";
    return t;
  }
  at::Tensor o = ObservedTensorImpl::make(t, impl.size_reads, std::vector<uint64_t>(t.dim(), bits_), label);
  if (recorded) torch::autograd::impl::set_gradient_edge(o, torch::autograd::impl::gradient_edge(t));
  ObservedTensorImpl* impl_of = ObservedTensorImpl::of(o);
  impl_of->set_observing(false);
  muted_.push_back(impl_of);
  return o;
}

void MutedArgs::observe_results(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                torch::jit::Stack* stack, size_t num_returns, TracerAccess::Impl& impl) {
  const std::string label = "the result of " + ir::op_target_name(op);
  // Arguments written in place: an observed one gains the candidates; another cannot be.
  const auto& schema = op.schema();
  std::unordered_set<const c10::TensorImpl*> arg_impls;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].isTensor() && args[i].toTensor().defined()) arg_impls.insert(args[i].toTensor().unsafeGetTensorImpl());
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias == nullptr || !alias->isWrite() || !args[i].isTensor()) continue;
    const at::Tensor& t = args[i].toTensor();
    if (!t.defined()) continue;
    if (ObservedTensorImpl* o = ObservedTensorImpl::of(t)) {
      o->add_bits(bits_);
    } else if (bits_ != 0 && impl.unobserved.empty()) {
      impl.unobserved = ir::op_target_name(op) + " wrote into a tensor that is not observed";
    }
  }
  // A result that is an argument itself (`add_` returns `self`) stays that tensor.
  auto result = [&](const at::Tensor& t) {
    return t.defined() && arg_impls.count(t.unsafeGetTensorImpl()) != 0 ? t : observe(t, label, impl);
  };
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      v = result(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) list.set(k, result(list.get(k)));
    } else if (v.isList()) {
      if (bits_ != 0 && impl.unobserved.empty()) impl.unobserved = label + " is a list the tracer does not observe";
    }
  }
}

namespace {

// The operator a call of the forward is recorded as. `_unsafe_view(self, size)` returns a view of
// `self` without its schema saying so (autograd then takes the result for a new tensor): the
// level-1 graph records it as the `view` it is, with the same arguments, so that the graph knows
// the memory is shared. (Below autograd it stays: functionalization makes it on purpose.)
const c10::OperatorHandle& recorded_as(const c10::OperatorHandle& op, TraceLevel level) {
  static const c10::OperatorHandle unsafe_view = ir::find_op("aten::_unsafe_view");
  static const c10::OperatorHandle view = ir::find_op("aten::view");
  return level == TraceLevel::AboveAutograd && &op.schema() == &unsafe_view.schema() ? view : op;
}

template <TraceLevel Level>
void tracing_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  Tracer* tracer = Tracer::current(Level);
  const c10::DispatchKey key = key_of(Level);
  // A trace of shapes only cannot go on untraced: the forward holds meta tensors.
  if (Level == TraceLevel::AboveAutograd && tracer != nullptr && tracer->failed() &&
      TracerAccess::impl(*tracer).shapes_only)
    throw ShapesOnlyStopped(tracer->failure()->reason);
  if (tracer == nullptr || tracer->failed() ||
      (Level == TraceLevel::BelowAutograd && has_meta_tensor(*stack, op.schema().arguments().size()))) {
    redispatch_below_tracer(key, op, ks, stack);
    return;
  }
  // A fast-path operator is traced as the operators it is made of, as if the forward had
  // called them (their size reads and results observed as the forward's own).
  if (Level == TraceLevel::AboveAutograd && decompose_fast_path_op(op, stack)) return;
  TracerAccess::Impl& impl = TracerAccess::impl(*tracer);
  const auto& schema = op.schema();
  // What the tracer and the kernels read here is not host code reading data.
  IgnoreDataReads ours;
  // Observed tensors: ordinary while the op runs, observed again afterwards.
  std::optional<MutedArgs> muted;
  if (impl.size_reads) muted.emplace(*stack, schema.arguments().size());
  const bool host_value = !returns_only_tensors(schema);
  if (host_value && is_metadata_query(op)) {
    if (muted) muted->note_read(ir::op_target_name(op));  // a size query by other means
    redispatch_below_tracer(key, op, ks, stack);
    return;
  }
  // Before the op can write to it: was a factory result filled by host code?
  if (!impl.fresh_factories.empty()) impl.check_factories_in(*stack, schema.arguments().size());
  if (host_value) {
    impl.host_read(op, ks, stack);
    return;
  }
  if (impl.interceptor && impl.interceptor(op, stack)) return;
  const size_t num_args = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - num_args, stack->end());
  if (impl.shapes_only) {
    impl.run_on_meta(op, stack, num_args);
  } else {
    if (ir::op_is_mutating(op)) impl.keep_slots_before_write(schema, *stack, num_args);
    bool substituted = false;
    if (impl.substitute) {
      c10::impl::ExcludeDispatchKeyGuard no_tracing(key);
      substituted = impl.substitute(op, stack);
    }
    if (!substituted) redispatch_below_tracer(key, op, ks, stack);
  }
  const size_t num_returns = schema.returns().size();
  // The number of tensors `unbind` / `split` / `chunk` return is a size of their argument: the
  // graph and the host code that loops over them hold that count.
  if (muted && ir::op_properties(op).result_count_from_sizes) muted->note_read(ir::op_target_name(op));
  if (muted) muted->observe_results(op, args, stack, num_returns, impl);
  impl.record(recorded_as(op, Level), args, stack->data() + (stack->size() - num_returns));
  if (Level == TraceLevel::AboveAutograd && !tracer->failed() && ir::results_depend_on_data(op, args)) {
    const c10::IValue& first = (*stack)[stack->size() - num_returns];
    if (first.isTensor() && first.toTensor().defined()) impl.break_on_data_dependent_sizes(op, ks, first.toTensor());
  }
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

void Tracer::set_substitute(OpSubstitute f) { impl_->substitute = std::move(f); }

std::optional<std::string> Tracer::attribute_behind(const at::Tensor& t) const {
  const c10::TensorImpl* ti = t.unsafeGetTensorImpl();
  if (auto it = impl_->values.find(ti); it != impl_->values.end()) {
    const ir::Value base = ir::memory_base(it->second);
    if (base.node->kind() == ir::NodeKind::GetAttr) return base.node->target();
    return std::nullopt;
  }
  if (auto it = impl_->attributes.find(ti); it != impl_->attributes.end()) return it->second.name;
  return std::nullopt;
}

namespace {
std::mutex no_meta_mutex;
std::unordered_set<const c10::FunctionSchema*>& no_meta() {
  static std::unordered_set<const c10::FunctionSchema*> ops;
  return ops;
}
}  // namespace

c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList()) {
    c10::impl::GenericList out(v.toList().elementType());
    for (const c10::IValue& e : v.toList()) out.push_back(map_tensors(e, f));
    return out;
  }
  return v;
}

bool known_without_meta_kernel(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(no_meta_mutex);
  return no_meta().count(&op.schema()) != 0;
}

void note_without_meta_kernel(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(no_meta_mutex);
  no_meta().insert(&op.schema());
}

void Tracer::set_shapes_only() {
  TORCH_INTERNAL_ASSERT(level_ == TraceLevel::AboveAutograd, "shape-only traces are above autograd");
  impl_->shapes_only = true;
}

ShapesOnlyStopped::ShapesOnlyStopped(const std::string& why)
    : std::runtime_error("a trace of shapes only stopped: " + why) {}

void Tracer::observe_reads(std::shared_ptr<SizeReads> reads, bool autograd_records) {
  TORCH_INTERNAL_ASSERT(level_ == TraceLevel::AboveAutograd, "reads are observed above autograd only");
  Impl* im = impl_.get();
  reads->set_data_read_handler([im](const at::Tensor& t) {
    const ObservedTensorImpl* o = ObservedTensorImpl::of(t);
    im->data_read(t, o ? o->label() : std::string("a tensor"));
  });
  im->size_reads = std::move(reads);
  im->autograd_records = autograd_records;
}

void Tracer::check_host_writes() { impl_->check_host_writes(); }

const std::string& Tracer::unobserved_reason() const { return impl_->unobserved; }

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

void Tracer::fail(std::string reason, std::string op) {
  if (failure_) return;
  failure_ = std::make_unique<TraceFailure>(TraceFailure{std::move(reason), std::move(op)});
  // Stop paying for the fallback for the rest of this forward; Activation restores the TLS.
  c10::impl::tls_set_dispatch_key_included(impl_->key, false);
}

size_t Tracer::num_breaks() const { return impl_->done.size(); }

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

bool Tracer::following() const { return !failed(); }

void Tracer::push_module_path(std::string path) { impl_->module_stack.push_back(std::move(path)); }

void Tracer::pop_module_path() {
  TORCH_INTERNAL_ASSERT(!impl_->module_stack.empty(), "Tracer::pop_module_path without a push");
  impl_->module_stack.pop_back();
}

void Tracer::before_module_call(const std::vector<at::Tensor>& inputs) {
  if (failed()) return;
  IgnoreDataReads ours;
  for (const at::Tensor& t : inputs)
    if (t.defined()) impl_->check_factory(t);
}

void Tracer::record_module_call(const std::string& path, const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& outputs, ir::ModuleFn fn) {
  Impl& im = *impl_;
  if (failed()) return;
  IgnoreDataReads ours;
  if (im.size_reads && im.unobserved.empty()) im.unobserved = "module '" + path + "' ran as an opaque call";
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
  std::vector<ir::TensorMeta> metas;
  for (const at::Tensor& t : outputs) metas.push_back(ir::TensorMeta::of(t));
  // The same module called twice may differ in its scalar arguments: one target per call.
  std::string target = path;
  for (int k = 1; im.gm->has_submodule(target); ++k) target = path + "_" + std::to_string(k);
  ir::Node* node = im.gm->graph().call_module(target, std::move(args), std::move(metas));
  node->set_module_path(path);
  im.gm->set_submodule(target, std::move(fn));
  im.add_results(node, outputs);
}

// ---- finished segments -----------------------------------------------------------------------

std::vector<SegmentRecord> finish_segments(Tracer& tracer, const std::vector<at::Tensor>& outputs) {
  TORCH_INTERNAL_ASSERT(!tracer.failed(), "Tracer::finish called on a failed trace");
  TORCH_INTERNAL_ASSERT(Tracer::current(tracer.level()) != &tracer, "Tracer::finish called while the tracer is active");
  TracerAccess::Impl& im = TracerAccess::impl(tracer);
  std::vector<ir::Value> outs;
  outs.reserve(outputs.size());
  for (const at::Tensor& t : outputs) {
    TORCH_CHECK(t.defined(), "torch::compile: the forward returned an undefined tensor");
    auto v = im.value_for(t);
    if (!v) return {};
    outs.push_back(*v);
  }
  im.close_segment(std::move(outs), {}, /*is_last=*/true);
  im.note_values_before_writes();
  return std::move(im.done);
}

const std::vector<at::Tensor>& slot_tensors(const Tracer& tracer) { return TracerAccess::impl(tracer).slots; }

std::vector<at::Tensor> example_inputs(const SegmentRecord& record, const std::vector<at::Tensor>& slots) {
  std::vector<at::Tensor> inputs;
  inputs.reserve(record.input_slots.size());
  for (size_t i = 0; i < record.input_slots.size(); ++i) {
    const bool kept = i < record.values_before_writes.size() && record.values_before_writes[i].defined();
    inputs.push_back(kept ? record.values_before_writes[i] : slots.at(record.input_slots[i]));
  }
  return inputs;
}

std::unique_ptr<ir::GraphModule> Tracer::finish(const std::vector<at::Tensor>& outputs) {
  TORCH_INTERNAL_ASSERT(impl_->done.empty(), "Tracer::finish: the trace has graph breaks; use finish_segments");
  auto segments = finish_segments(*this, outputs);
  if (segments.empty()) return nullptr;
  return std::move(segments.front().gm);
}

}  // namespace torchcompile::capture

TORCH_LIBRARY_FRAGMENT(torchcompile, m) {
  m.def("result_sizes(Tensor self) -> int[]", &torchcompile::capture::result_sizes);
  m.def("host_data(Tensor self) -> Tensor", &torchcompile::capture::host_data);
}
