// Compiling TorchScript modules (frontend/script_module.h).
//
// The module's state is shown to the runtime as a torch::nn::Module tree that mirrors it (a
// ScriptProxy per module object, registering the object's very tensors as its parameters and
// buffers and its submodules' proxies as children): the runtime's attributes, guards and AOT
// treat it as they treat a C++ module. TorchScript modules are references to objects whose
// slots the user may change at any time (`setattr`, `train()`), so before each call the slots
// are compared with the proxies and the proxies follow: a replaced tensor, a training flag. A
// changed non-tensor attribute drops the compiled entries (a new CompiledFunction).
#include <torchcompile/frontend/script_module.h>

#include <torchcompile/capture/tracer.h>
#include <torchcompile/support/logging.h>

#include "frontend/script_values.h"
#include "runtime/ivalues.h"
#include "runtime/module_registries.h"

#include <ATen/core/function_schema.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/nn/module.h>

#include <functional>
#include <shared_mutex>
#include <sstream>

namespace torchcompile {
namespace detail {

namespace {

using ObjectPtr = c10::intrusive_ptr<c10::ivalue::Object>;

// A torch::nn::Module standing for one TorchScript module object.
class ScriptProxy : public torch::nn::Module {
 public:
  explicit ScriptProxy(const std::string& name) : torch::nn::Module(name) {}
  void add_parameter(const std::string& name, const at::Tensor& t) {
    register_parameter(name, t, t.defined() && t.requires_grad());
  }
  void add_buffer(const std::string& name, const at::Tensor& t) { register_buffer(name, t); }
  void add_child(const std::string& name, std::shared_ptr<ScriptProxy> child) { register_module(name, std::move(child)); }
};

std::string type_name(const ObjectPtr& obj) {
  const auto& qn = obj->type()->name();
  return qn ? qn->name() : std::string("ScriptModule");
}

std::string qualify(const std::string& path, const std::string& name) { return path.empty() ? name : path + "." + name; }

// Whether two attribute values are the same (scalars, strings and containers by value, tensors
// and objects by identity).
bool same_value(const c10::IValue& a, const c10::IValue& b) { return runtime::same_ivalue(a, b, /*any_tensor=*/false); }

// A copy of a value whose lists and dicts are new objects (the snapshot of an attribute must not
// change when the module's list does).
c10::IValue deep_copy(const c10::IValue& v) {
  return map_tensors(v, [](const at::Tensor& t) { return t; });
}

// How many values `v` holds (containers recursively), counting no further than `limit`.
size_t count_values(const c10::IValue& v, size_t limit) {
  size_t n = 1;
  auto add = [&](const c10::IValue& x) {
    if (n <= limit) n += count_values(x, limit - n + 1);
  };
  if (v.isTuple()) {
    for (const auto& x : v.toTupleRef().elements()) add(x);
  } else if (v.isList()) {
    const c10::List<c10::IValue> l = v.toList();
    for (size_t i = 0; i < l.size() && n <= limit; ++i) add(l.get(i));
  } else if (v.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> d = v.toGenericDict();
    for (auto i = d.begin(); i != d.end() && n <= limit; ++i) add(i->key()), add(i->value());
  }
  return n;
}

// What a compiled object remembers of a non-tensor attribute, to notice a change before each
// call: a value of up to kCompared values (scalars, strings, small lists) by value, as a deep
// copy; a larger list or dict (a tokenizer's vocabulary) by identity and length, since comparing
// it element by element at every call would cost more than the call.
struct Snapshot {
  static constexpr size_t kCompared = 64;
  c10::IValue value;  // the deep copy, or the container itself
  bool by_identity = false;
  size_t length = 0;

  static Snapshot of(const c10::IValue& v) {
    Snapshot s;
    if ((v.isList() || v.isGenericDict()) && count_values(v, kCompared) > kCompared) {
      s.value = v;
      s.by_identity = true;
      s.length = v.isList() ? v.toList().size() : v.toGenericDict().size();
    } else {
      s.value = deep_copy(v);
    }
    return s;
  }
  bool matches(const c10::IValue& v) const {
    if (!by_identity) return same_value(v, value);
    return v.is(value) && (v.isList() ? v.toList().size() : v.toGenericDict().size()) == length;
  }
};

// ---- arguments --------------------------------------------------------------------------------


// ---- results ----------------------------------------------------------------------------------

// Appends the tensors of `v` to `out` and returns its structure (OutputSpec::structure: every
// tensor undefined); sets `unsupported` for a value that is not data (an object, a future).
c10::IValue flatten_result(const c10::IValue& v, std::vector<at::Tensor>& out, std::string& unsupported) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
    return c10::IValue(at::Tensor());
  }
  if (v.isNone() || v.isInt() || v.isDouble() || v.isBool() || v.isString() || v.isDevice()) return v;
  if (v.isTuple()) {
    std::vector<c10::IValue> e;
    for (const auto& x : v.toTupleRef().elements()) e.push_back(flatten_result(x, out, unsupported));
    return c10::ivalue::Tuple::create(std::move(e));
  }
  if (v.isList()) {
    const c10::List<c10::IValue> l = v.toList();
    c10::impl::GenericList s(l.elementType());
    for (size_t i = 0; i < l.size(); ++i) s.push_back(flatten_result(l.get(i), out, unsupported));
    return s;
  }
  if (v.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> d = v.toGenericDict();
    // Tensor keys are tensors' identities: the structure cannot hold them (and a dict keyed by
    // graph outputs would have to be rebuilt by identity).
    if (d.keyType()->kind() == c10::TypeKind::TensorType) {
      if (unsupported.empty()) unsupported = "the method returns a dict keyed by tensors";
      return c10::IValue();
    }
    c10::impl::GenericDict s(d.keyType(), d.valueType());
    for (auto i = d.begin(); i != d.end(); ++i) s.insert(i->key(), flatten_result(i->value(), out, unsupported));
    return s;
  }
  if (unsupported.empty()) unsupported = std::string("the method returns a ") + v.tagKind();
  return c10::IValue();
}

}  // namespace

// ---- the state of a compiled method -------------------------------------------------------------

class ScriptModuleState {
 public:
  ScriptModuleState(torch::jit::Module module, std::string method, CompileOptions options)
      : module_(std::move(module)), method_(std::move(method)), options_(std::move(options)) {
    TORCH_CHECK(module_.find_method(method_).has_value(), "torchcompile::compile_method: the TorchScript module (",
                type_name(module_._ivalue()), ") has no method '", method_, "'");
    const c10::FunctionSchema& schema = module_.get_method(method_).function().getSchema();
    for (size_t i = 1; i < schema.arguments().size(); ++i) arg_names_.push_back(schema.arguments()[i].name());
    if (options_.input_names.empty()) options_.input_names = arg_names_;
    name_ = type_name(module_._ivalue()) + (method_ == "forward" ? "" : "." + method_);
    root_ = mirror(module_._ivalue(), "");
    state_ = std::make_shared<runtime::CompiledFunction>(options_, root_, name_);
  }

  c10::IValue call(std::vector<c10::IValue> inputs, const std::unordered_map<std::string, c10::IValue>& kwargs) {
    // The method's schema checks the arguments and fills in keyword arguments and defaults.
    torch::jit::Method method = module_.get_method(method_);
    inputs.insert(inputs.begin(), module_._ivalue());
    method.function().getSchema().checkAndNormalizeInputs(inputs, kwargs);
    inputs.erase(inputs.begin());
    const runtime::CallArgs args = encode_args(inputs, arg_names_);

    std::shared_lock<std::shared_mutex> reading(mutex_);
    while (!in_sync()) {
      reading.unlock();
      {
        std::unique_lock<std::shared_mutex> writing(mutex_);
        follow_module();
      }
      reading.lock();
    }
    std::shared_ptr<runtime::CompiledFunction> state = state_;

    c10::optional<c10::IValue> direct;  // the result when it is not data (then the call is eager)
    bool changed_module = false;         // the method changed the module's attributes
    runtime::ForwardFn forward = [&](runtime::OutputSpec& spec) {
      std::vector<c10::IValue> stack = inputs;
      // A dynamic trace passes stand-ins for the inputs' tensors (defined ones, in order).
      std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> stand_ins;  // (stand-in, the input)
      if (const std::vector<at::Tensor>* substituted = runtime::take_substituted_inputs()) {
        size_t k = 0;
        for (c10::IValue& v : stack)
          v = map_tensors(v, [&](const at::Tensor& t) {
            if (!t.defined()) return t;
            const at::Tensor& s = substituted->at(k++);
            stand_ins.emplace_back(s.unsafeGetTensorImpl(), t);
            return s;
          });
      }
      capture::Tracer* tracer = capture::Tracer::current();
      c10::IValue result;
      if (tracer != nullptr) {
        // The interpreter runs the method as written: TorchScript's own optimizations (fusion
        // groups that run kernels outside the dispatcher) would hide ops from the trace.
        torch::jit::GraphOptimizerEnabledGuard plain(false);
        result = method(std::move(stack));
        const std::string changed = changed_by_method();
        if (!changed.empty()) tracer->fail("the method " + changed + " (the compiled graph could not repeat it)", "prim::SetAttr");
        changed_module |= !changed.empty();
      } else {
        result = method(std::move(stack));
        changed_module |= !changed_by_method().empty();
      }
      std::vector<at::Tensor> flat;
      std::string unsupported;
      spec.structure = flatten_result(result, flat, unsupported);
      if (!unsupported.empty()) {
        if (tracer != nullptr) tracer->fail(unsupported, "prim::Return");
        // Returned as it is, with the call's own tensors where the method returns its inputs.
        direct = stand_ins.empty() ? result : map_tensors(result, [&](const at::Tensor& t) {
          for (const auto& [stand_in, input] : stand_ins)
            if (t.defined() && t.unsafeGetTensorImpl() == stand_in) return input;
          return t;
        });
        flat.clear();
        spec.structure = c10::IValue();
      }
      return flat;
    };
    runtime::OutputSpec spec;
    std::vector<at::Tensor> flat = state->call(args, forward, spec);
    if (changed_module) {
      reading.unlock();
      std::unique_lock<std::shared_mutex> writing(mutex_);
      after_method_changed_module();
    }
    if (direct) return *direct;
    return rebuild_result(spec.structure, flat);
  }

  const torch::jit::Module& module() const { return module_; }
  const std::string& method() const { return method_; }
  runtime::CompiledFunction& state() const {
    std::shared_lock<std::shared_mutex> reading(mutex_);
    return *state_;
  }

 private:
  struct TensorSlot {
    ObjectPtr object;
    size_t slot;
    at::Tensor* registered;  // the proxy's parameter or buffer
  };
  struct ModuleSlot {
    ObjectPtr object;
    std::shared_ptr<ScriptProxy> proxy;
    size_t num_slots;
    c10::optional<size_t> training;  // slot of `training`
    std::string path;
  };
  struct ChildSlot {
    ObjectPtr parent, child;
    size_t slot;
    std::string path;
  };
  struct ValueSlot {
    ObjectPtr object;
    size_t slot;
    Snapshot value;  // as when compiled
    std::string path;
  };

  // The proxy of `obj` and, recursively, of its submodules; records every slot to follow.
  std::shared_ptr<ScriptProxy> mirror(const ObjectPtr& obj, const std::string& path) {
    auto proxy = std::make_shared<ScriptProxy>(type_name(obj));
    const c10::ClassTypePtr& type = obj->type();
    ModuleSlot m{obj, proxy, obj->slots().size(), c10::nullopt, path};
    std::vector<std::pair<size_t, bool>> registered;  // (slot, parameter) of each tensor, found after registering
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      const std::string& name = type->getAttributeName(i);
      const c10::TypePtr& attr_type = type->getAttribute(i);
      const c10::IValue& v = obj->getSlot(i);
      if (attr_type->is_module() && v.isObject()) {
        proxy->add_child(name, mirror(v.toObject(), qualify(path, name)));
        children_.push_back({obj, v.toObject(), i, qualify(path, name)});
      } else if (name == "training" && v.isBool()) {
        m.training = i;
        proxy->train(v.toBool());
      } else if (v.isTensor() || type->is_parameter(i) || type->is_buffer(i) ||
                 attr_type->isSubtypeOf(*c10::OptionalType::create(c10::TensorType::get()))) {
        const at::Tensor t = v.isTensor() ? v.toTensor() : at::Tensor();
        if (type->is_parameter(i)) {
          proxy->add_parameter(name, t);
        } else {
          proxy->add_buffer(name, t);
        }
        registered.emplace_back(i, type->is_parameter(i));
      } else {
        values_.push_back({obj, i, Snapshot::of(v), qualify(path, name)});
      }
    }
    // A registry's entries move while it grows: their addresses are taken once it is complete.
    for (const auto& [slot, parameter] : registered)
      tensors_.push_back({obj, slot, &runtime::registered_tensor(*proxy, type->getAttributeName(slot), parameter)});
    modules_.push_back(std::move(m));
    return proxy;
  }

  static const at::Tensor& tensor_in(const c10::IValue& v) {
    static const at::Tensor undefined;
    return v.isTensor() ? v.toTensor() : undefined;
  }

  // Whether the proxies show the module as it is (checked before every call).
  bool in_sync() const {
    for (const TensorSlot& t : tensors_)
      if (tensor_in(t.object->getSlot(t.slot)).unsafeGetTensorImpl() != t.registered->unsafeGetTensorImpl()) return false;
    for (const ModuleSlot& m : modules_) {
      if (m.object->slots().size() != m.num_slots) return false;
      if (m.training && m.object->getSlot(*m.training).toBool() != m.proxy->is_training()) return false;
    }
    for (const ChildSlot& c : children_)
      if (!c.parent->getSlot(c.slot).isObject() || c.parent->getSlot(c.slot).toObject().get() != c.child.get())
        return false;
    for (const ValueSlot& v : values_)
      if (!v.value.matches(v.object->getSlot(v.slot))) return false;
    return true;
  }

  // Makes the proxies follow the module (under the exclusive lock).
  void follow_module() {
    for (const ModuleSlot& m : modules_)
      TORCH_CHECK(m.object->slots().size() == m.num_slots, "torch::compile(", name_, "): the TorchScript module '",
                  m.path.empty() ? std::string("<root>") : m.path,
                  "' got new attributes after it was compiled; compile it again to use them");
    for (const ChildSlot& c : children_)
      TORCH_CHECK(c.parent->getSlot(c.slot).isObject() && c.parent->getSlot(c.slot).toObject().get() == c.child.get(),
                  "torch::compile(", name_, "): submodule '", c.path,
                  "' of the TorchScript module was replaced after it was compiled; compile it again");
    for (const TensorSlot& t : tensors_) *t.registered = tensor_in(t.object->getSlot(t.slot));
    // Pre-order: a module's train() sets its descendants, which come after it and set their own.
    for (auto m = modules_.rbegin(); m != modules_.rend(); ++m)
      if (m->training) m->proxy->train(m->object->getSlot(*m->training).toBool());
    std::string changed;
    for (ValueSlot& v : values_) {
      if (v.value.matches(v.object->getSlot(v.slot))) continue;
      if (changed.empty()) changed = v.path;
      v.value = Snapshot::of(v.object->getSlot(v.slot));
    }
    if (!changed.empty()) {
      TORCHCOMPILE_LOG(logging::LogKind::Recompiles, "torch::compile(", name_, "): attribute '", changed,
                       "' of the TorchScript module changed: the compiled entries are dropped");
      retired_.push_back(std::move(state_));  // state() may have handed it out
      state_ = std::make_shared<runtime::CompiledFunction>(options_, root_, name_);
    }
  }

  // After a call whose method changed the module's attributes (its entries run eagerly): the
  // snapshots take the new values, which are the method's own doing, not the user's. Compiled
  // entries may have read the old values (another input signature that did not change them):
  // they are dropped.
  void after_method_changed_module() {
    for (ValueSlot& v : values_)
      if (!v.value.matches(v.object->getSlot(v.slot))) v.value = Snapshot::of(v.object->getSlot(v.slot));
    for (const auto& e : state_->entries()) {
      if (e->runs_eagerly()) continue;
      TORCHCOMPILE_LOG(logging::LogKind::Recompiles, "torch::compile(", name_,
                       "): the method changed the TorchScript module's attributes: the compiled entries are dropped");
      retired_.push_back(std::move(state_));
      state_ = std::make_shared<runtime::CompiledFunction>(options_, root_, name_);
      break;
    }
  }

  // After a run of the method: what it changed of the module's attributes ("" if nothing).
  std::string changed_by_method() const {
    for (const TensorSlot& t : tensors_)
      if (tensor_in(t.object->getSlot(t.slot)).unsafeGetTensorImpl() != t.registered->unsafeGetTensorImpl())
        return "assigns a tensor attribute of the TorchScript module";
    for (const ValueSlot& v : values_)
      if (!v.value.matches(v.object->getSlot(v.slot))) return "changes attribute '" + v.path + "' of the TorchScript module";
    for (const ModuleSlot& m : modules_)
      if (m.object->slots().size() != m.num_slots) return "adds attributes to the TorchScript module";
    return "";
  }

  torch::jit::Module module_;
  std::string method_;
  CompileOptions options_;
  std::string name_;
  std::vector<std::string> arg_names_;
  std::shared_ptr<ScriptProxy> root_;
  std::vector<TensorSlot> tensors_;
  std::vector<ModuleSlot> modules_;  // children before their parents (post-order)
  std::vector<ChildSlot> children_;
  std::vector<ValueSlot> values_;
  mutable std::shared_mutex mutex_;  // exclusive while the proxies follow the module
  std::shared_ptr<runtime::CompiledFunction> state_;
  std::vector<std::shared_ptr<runtime::CompiledFunction>> retired_;
};

}  // namespace detail

c10::IValue CompiledScriptModule::forward(std::vector<c10::IValue> inputs,
                                          const std::unordered_map<std::string, c10::IValue>& kwargs) const {
  return impl_->call(std::move(inputs), kwargs);
}

const torch::jit::Module& CompiledScriptModule::module() const { return impl_->module(); }
const std::string& CompiledScriptModule::method_name() const { return impl_->method(); }
runtime::CompiledFunction& CompiledScriptModule::state() const { return impl_->state(); }

CompiledScriptModule compile_method(torch::jit::Module module, const std::string& method, CompileOptions options) {
  return CompiledScriptModule(std::make_shared<detail::ScriptModuleState>(std::move(module), method, std::move(options)));
}

}  // namespace torchcompile
