#include <torchcompile/capture/tracer.h>
#include <torchcompile/compat.h>
#include <torchcompile/ir/passes.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::capture {

namespace {

thread_local Tracer* tls_current_tracer = nullptr;

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

bool is_tensor_type(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }

// Tensor, Tensor?, Tensor[], Tensor?[]: the return kinds a graph value can carry.
bool is_tensor_like(const c10::TypePtr& t) {
  if (is_tensor_type(t)) return true;
  if (auto opt = t->cast<c10::OptionalType>()) return is_tensor_type(opt->getElementType());
  if (auto list = t->cast<c10::ListType>()) return is_tensor_like(list->getElementType());
  return false;
}

bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns())
    if (!is_tensor_like(r.type())) return false;
  return true;
}

void redispatch_below_tracer(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_tracing(compat::kTracingKey);
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, compat::kTracingKey), stack);
}

void tracing_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

}  // namespace

// ---- the recording state ---------------------------------------------------------------------

struct Tracer::Impl {
  Tracer* owner = nullptr;
  std::unique_ptr<ir::GraphModule> gm = std::make_unique<ir::GraphModule>();
  // The graph value each live tensor currently stands for.
  std::unordered_map<const c10::TensorImpl*, ir::Value> values;
  // Weak references keep a recorded TensorImpl's memory (not its storage) allocated during the
  // trace, so a freed tensor's address cannot be reused by a new tensor and alias its value.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> keep_addresses;
  // Declared module state, turned into get_attr nodes on first use.
  struct Attribute {
    std::string name;
    at::Tensor tensor;
    ir::AttributeKind kind;
  };
  std::unordered_map<const c10::TensorImpl*, Attribute> attributes;
  // Storages of inputs and attributes: a tensor sharing one of them that no op produced was
  // derived outside the dispatcher (`.data()`, from_blob over data_ptr); baking it in as a
  // constant would be silently wrong, so the trace is abandoned instead.
  // Compared by address range: from_blob over an input's data_ptr makes a new StorageImpl.
  std::vector<std::pair<uintptr_t, uintptr_t>> tracked_memory;

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
  size_t num_constants = 0;

  void track(const at::Tensor& t, ir::Value v) {
    values[t.unsafeGetTensorImpl()] = v;
    keep_addresses.emplace_back(t.getIntrusivePtr());
  }

  // The graph value for a tensor the forward passed to an op.
  std::optional<ir::Value> value_for(const at::Tensor& t) {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (auto it = values.find(impl); it != values.end()) return it->second;
    ir::Graph& g = gm->graph();
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
    if (is_tensor_like(schema_arg.type()) && v.isList()) {
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

  void record(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, const c10::IValue* returns) {
    const auto& schema = op.schema();
    std::vector<ir::Argument> ir_args(args.size());
    for (size_t i = 0; i < args.size(); ++i)
      if (!to_argument(args[i], schema.arguments()[i], ir_args[i])) return;

    std::vector<ir::TensorMeta> metas;
    std::vector<uint32_t> counts;
    std::vector<at::Tensor> produced;
    for (size_t r = 0; r < schema.returns().size(); ++r) {
      const c10::IValue& rv = returns[r];
      if (rv.isTensorList() || (rv.isList() && !rv.isTensor())) {
        uint32_t n = 0;
        for (const c10::IValue& e : rv.toListRef()) {
          at::Tensor t = e.isTensor() ? e.toTensor() : at::Tensor();
          metas.push_back(ir::TensorMeta::of(t));
          produced.push_back(std::move(t));
          ++n;
        }
        counts.push_back(n);
        continue;
      }
      at::Tensor t = rv.isTensor() ? rv.toTensor() : at::Tensor();
      metas.push_back(ir::TensorMeta::of(t));
      produced.push_back(std::move(t));
      counts.push_back(1);
    }
    ir::Node* node = gm->graph().call_function(op, std::move(ir_args), std::move(metas), std::move(counts));
    for (size_t i = 0; i < produced.size(); ++i)
      if (produced[i].defined()) track(produced[i], node->output(i));
  }
};

// ---- dispatcher hook --------------------------------------------------------------------------

namespace {

void tracing_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  Tracer* tracer = Tracer::current();
  if (tracer == nullptr || tracer->failed()) {
    redispatch_below_tracer(op, ks, stack);
    return;
  }
  const auto& schema = op.schema();
  if (!returns_only_tensors(schema)) {
    if (!is_metadata_query(schema.operator_name())) {
      tracer->fail("data-dependent host read (" + ir::op_target_name(op) + ") in the forward",
                   ir::op_target_name(op));
    }
    redispatch_below_tracer(op, ks, stack);
    return;
  }
  const size_t num_args = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - num_args, stack->end());
  redispatch_below_tracer(op, ks, stack);
  const size_t num_returns = schema.returns().size();
  tracer->impl().record(op, args, stack->data() + (stack->size() - num_returns));
}

}  // namespace

void register_tracing_fallback() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the process lifetime: the fallback must outlive every traced call.
    static auto* library = new torch::Library(torch::Library::IMPL, "_", compat::kTracingKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&tracing_fallback>());
  });
}

// ---- Tracer ---------------------------------------------------------------------------------

Tracer::Tracer() : impl_(std::make_unique<Impl>()) {
  impl_->owner = this;
  register_tracing_fallback();
}

Tracer::~Tracer() = default;

Tracer* Tracer::current() { return tls_current_tracer; }

void Tracer::add_input(const at::Tensor& t, const std::string& name) {
  ir::Value v = impl_->gm->graph().placeholder(name, ir::TensorMeta::of(t));
  if (!t.defined()) return;
  impl_->track(t, v);
  impl_->track_memory(t);
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
  c10::impl::tls_set_dispatch_key_included(compat::kTracingKey, false);
}

Tracer::Activation::Activation(Tracer& t)
    : previous_(tls_current_tracer), previous_included_(c10::impl::tls_is_dispatch_key_included(compat::kTracingKey)) {
  tls_current_tracer = &t;
  c10::impl::tls_set_dispatch_key_included(compat::kTracingKey, true);
}

Tracer::Activation::~Activation() {
  tls_current_tracer = previous_;
  c10::impl::tls_set_dispatch_key_included(compat::kTracingKey, previous_included_);
}

std::unique_ptr<ir::GraphModule> Tracer::finish(const std::vector<at::Tensor>& outputs) {
  TORCH_INTERNAL_ASSERT(!failed(), "Tracer::finish called on a failed trace");
  TORCH_INTERNAL_ASSERT(tls_current_tracer != this, "Tracer::finish called while the tracer is active");
  std::vector<ir::Value> outs;
  outs.reserve(outputs.size());
  for (const at::Tensor& t : outputs) {
    TORCH_CHECK(t.defined(), "torch::compile: the forward returned an undefined tensor");
    auto v = impl_->value_for(t);
    if (!v) return nullptr;
    outs.push_back(*v);
  }
  ir::Graph& g = impl_->gm->graph();
  g.output(std::move(outs));
  ir::eliminate_dead_code(g);
  ir::lint(g);
  // Attributes whose get_attr nodes died are dropped too.
  std::unordered_set<std::string> used;
  for (const auto& n : g.nodes())
    if (n->kind() == ir::NodeKind::GetAttr) used.insert(n->target());
  std::vector<std::string> unused;
  for (const auto& [name, attr] : impl_->gm->attributes())
    if (!used.count(name)) unused.push_back(name);
  for (const auto& name : unused) impl_->gm->remove_attribute(name);
  return std::move(impl_->gm);
}

}  // namespace torchcompile::capture
