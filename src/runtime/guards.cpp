#include "runtime/guards.h"

#include "hooks/hooks_internal.h"
#include "runtime/module_registries.h"
#include "runtime/dynamic_entry.h"

#include <torchcompile/compat.h>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/AutogradState.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/ScalarTypeToTypeMeta.h>
#include <c10/util/StringUtil.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <algorithm>
#include <optional>
#include <functional>
#include <limits>
#include <sstream>
#include <unordered_set>

namespace torchcompile::runtime {

namespace {

// ---- formatting --------------------------------------------------------------------------

const char* kind_name(ArgItem::Kind k) {
  switch (k) {
    case ArgItem::Tensor: return "Tensor";
    case ArgItem::TensorList: return "std::vector<Tensor>";
    case ArgItem::Int: return "int";
    case ArgItem::Double: return "double";
    case ArgItem::Bool: return "bool";
  }
  return "?";
}

std::string item_value(const ArgItem& it) {
  std::ostringstream os;
  switch (it.kind) {
    case ArgItem::Double: os << it.d; break;
    case ArgItem::Bool: os << (it.i ? "true" : "false"); break;
    default: os << it.i; break;
  }
  return os.str();
}

const char* b(bool v) { return v ? "true" : "false"; }
const char* on(bool v) { return v ? "enabled" : "disabled"; }

template <typename T>
std::string join(const T& xs) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
  os << "]";
  return os.str();
}

std::string join(const int64_t* xs, size_t n) { return join(c10::IntArrayRef(xs, n)); }

std::string qualify(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

const std::string& display_path(const std::string& path) {
  static const std::string root = "<root>";
  return path.empty() ? root : path;
}

c10::Layout layout_of(c10::DispatchKeySet ks) {
  if (ks.has(c10::DispatchKey::Sparse)) return c10::kSparse;
  if (ks.has(c10::DispatchKey::SparseCsrCPU) || ks.has(c10::DispatchKey::SparseCsrCUDA)) return c10::kSparseCsr;
  if (ks.has(c10::DispatchKey::MkldnnCPU)) return c10::kMkldnn;
  return c10::kStrided;
}

}  // namespace

std::vector<std::string> tensor_input_names(const CallArgs& args, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t k = 0; k < args.items.size(); ++k) {
    const ArgItem& it = args.items[k];
    std::string base = k < names.size() ? names[k] : "arg" + std::to_string(k);
    switch (it.kind) {
      case ArgItem::Tensor:
        if (it.i) out.push_back(base);
        break;
      case ArgItem::TensorList:
        for (int64_t i = 0; i < it.i; ++i) out.push_back(base + "_" + std::to_string(i));
        break;
      default: break;
    }
  }
  return out;
}

// ---- identity ------------------------------------------------------------------------------

c10::SmallVector<GuardSet::Identity, 8> GuardSet::identities_of(const at::Tensor* tensors, size_t n) {
  c10::SmallVector<Identity, 8> out(n);
  if (n < 2) return out;
  // Sorted by (TensorImpl, index), each run of one TensorImpl starts at its first input.
  c10::SmallVector<std::pair<const c10::TensorImpl*, uint32_t>, 8> by_impl;
  for (size_t i = 0; i < n; ++i)
    if (tensors[i].defined()) by_impl.emplace_back(tensors[i].unsafeGetTensorImpl(), static_cast<uint32_t>(i));
  std::sort(by_impl.begin(), by_impl.end());
  for (size_t k = 1; k < by_impl.size(); ++k)
    if (by_impl[k].first == by_impl[k - 1].first)
      out[by_impl[k].second].input = out[by_impl[k - 1].second].input >= 0 ? out[by_impl[k - 1].second].input
                                                                               : static_cast<int32_t>(by_impl[k - 1].second);
  return out;
}

int32_t GuardSet::attr_of(const at::Tensor& t) const {
  if (!t.defined() || attr_impls_.empty()) return -1;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  auto it = std::lower_bound(attr_impls_.begin(), attr_impls_.end(), std::pair{impl, uint32_t{0}});
  return it != attr_impls_.end() && it->first == impl ? static_cast<int32_t>(it->second) : -1;
}

// ---- build ---------------------------------------------------------------------------------

std::unique_ptr<GuardSet> GuardSet::build(const CallArgs& args, const std::shared_ptr<torch::nn::Module>& root,
                                          std::vector<std::string> input_names) {
  auto g = std::make_unique<GuardSet>();
  g->items_ = args.items;
  g->tensor_names_ = tensor_input_names(args, input_names);
  g->tensors_.reserve(args.tensors.size());
  for (size_t i = 0; i < args.tensors.size(); ++i) {
    const at::Tensor& t = args.tensors[i];
    TensorGuard tg;
    tg.defined = t.defined();
    if (tg.defined) {
      tg.keys = t.key_set();
      tg.dtype = t.dtype();
      tg.device = t.device();
      tg.requires_grad = t.requires_grad();
      tg.strided = t.layout() == c10::kStrided;
      tg.ndim = static_cast<uint8_t>(t.dim());
      tg.dims = static_cast<uint32_t>(g->dims_.size());
      g->dims_.insert(g->dims_.end(), t.sizes().begin(), t.sizes().end());
      if (tg.strided) g->dims_.insert(g->dims_.end(), t.strides().begin(), t.strides().end());
    }
    g->tensors_.push_back(tg);
  }
  g->identity_ = identities_of(args.tensors.data(), args.tensors.size());

  g->grad_mode_ = at::GradMode::is_enabled();
  g->inference_mode_ = c10::InferenceMode::is_enabled();
  g->default_dtype_ = c10::get_default_dtype();
  g->deterministic_ = at::globalContext().deterministicAlgorithms();
  g->autocast_cpu_ = compat::autocast_cpu_enabled();
  g->autocast_cpu_dtype_ = compat::autocast_cpu_dtype();

  if (root) {
    // Pre-order, each module once (a submodule registered twice is guarded at its first path).
    std::unordered_set<const torch::nn::Module*> seen;
    auto add_attrs = [&](const TensorDict& dict, const std::string& path, bool buffer) {
      for (const auto& item : dict.items()) {
        const at::Tensor& t = item.value();
        AttrGuard a;
        a.tensor = t;
        a.buffer = buffer;
        a.defined = t.defined();
        if (a.defined) {
          a.dtype = t.dtype();
          a.device = t.device();
          a.requires_grad = t.requires_grad();
          a.ndim = static_cast<uint8_t>(t.dim());
          a.dims = static_cast<uint32_t>(g->dims_.size());
          g->dims_.insert(g->dims_.end(), t.sizes().begin(), t.sizes().end());
        }
        g->attrs_.push_back(std::move(a));
        g->attr_names_.push_back(qualify(path, item.key()));
      }
    };
    std::function<void(const std::shared_ptr<torch::nn::Module>&, const std::string&)> visit =
        [&](const std::shared_ptr<torch::nn::Module>& m, const std::string& path) {
          if (!seen.insert(m.get()).second) return;
          ModuleGuard mg;
          mg.module = m;
          mg.training = m->is_training();
          mg.params_begin = static_cast<uint32_t>(g->attrs_.size());
          add_attrs(registered_parameters(*m), path, /*buffer=*/false);
          mg.buffers_begin = static_cast<uint32_t>(g->attrs_.size());
          add_attrs(registered_buffers(*m), path, /*buffer=*/true);
          mg.attrs_end = static_cast<uint32_t>(g->attrs_.size());
          const ModuleDict& kids = registered_children(*m);
          mg.children_begin = static_cast<uint32_t>(g->children_.size());
          for (const auto& kid : kids.items()) {
            g->children_.push_back(kid.value().get());
            g->child_names_.push_back(kid.key());
          }
          mg.children_end = static_cast<uint32_t>(g->children_.size());
          g->modules_.push_back(std::move(mg));
          g->module_paths_.push_back(path);
          for (const auto& kid : kids.items()) visit(kid.value(), qualify(path, kid.key()));
        };
    visit(root, "");
  }
  for (size_t a = 0; a < g->attrs_.size(); ++a)
    if (g->attrs_[a].defined) g->attr_impls_.emplace_back(g->attrs_[a].tensor.unsafeGetTensorImpl(), a);
  std::sort(g->attr_impls_.begin(), g->attr_impls_.end());
  for (size_t i = 0; i < args.tensors.size(); ++i)
    if (g->identity_[i].input < 0) g->identity_[i].attr = g->attr_of(args.tensors[i]);
  // The epoch is read before the versions: a hook change in between shows on the next check.
  g->hook_epoch_seen_.store(detail::hook_epoch());
  for (size_t mi = 0; mi < g->modules_.size(); ++mi) {
    const auto& m = g->modules_[mi].module;
    g->add_hook_module(m, detail::hook_version(*m), g->module_paths_[mi]);
  }
  return g;
}

// ---- packages ------------------------------------------------------------------------------

namespace {

// Whether two key sets differ at most in autograd's keys (an inference tensor and a normal one).
bool same_but_autograd(c10::DispatchKeySet a, c10::DispatchKeySet b) {
  const c10::DispatchKeySet autograd = c10::autograd_dispatch_keyset | c10::DispatchKeySet(c10::DispatchKey::ADInplaceOrView);
  return (a - autograd) == (b - autograd);
}


// The dispatch keys of a plain CPU tensor of `dtype`, or of an inference tensor.
c10::DispatchKeySet plain_keys(c10::ScalarType dtype, bool inference) {
  c10::InferenceMode mode(inference);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).key_set();
}

}  // namespace

std::string GuardSet::to_portable(PortableGuards& out) const {
  out = PortableGuards{};
  out.items = items_;
  out.tensor_names = tensor_names_;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorGuard& g = tensors_[i];
    PortableGuards::Tensor t;
    t.defined = g.defined;
    if (g.defined) {
      const std::string name = "input '" + tensor_names_.at(i) + "'";
      if (g.device.type() != c10::DeviceType::CPU) return name + " is on " + g.device.str() + " (a package serves CPU inputs)";
      if (!g.strided) return name + " is not a strided tensor";
      t.dtype = c10::typeMetaToScalarType(g.dtype);
      if (g.keys == plain_keys(t.dtype, false)) {
        t.inference = false;
      } else if (g.keys == plain_keys(t.dtype, true)) {
        t.inference = true;
      } else {
        return name + " has dispatch keys " + c10::toString(g.keys) + " (conjugate, negative or a wrapper tensor)";
      }
      if (g.requires_grad) return name + " required grad (a package serves inference)";
      t.sizes.assign(dims_.begin() + g.dims, dims_.begin() + g.dims + g.ndim);
      t.strides.assign(dims_.begin() + g.dims + g.ndim, dims_.begin() + g.dims + 2 * g.ndim);
      t.symbolic = g.symbolic;
    }
    out.tensors.push_back(std::move(t));
  }
  for (const SymDimGuard& sg : sym_dims_)
    out.sym_dims.push_back({sg.input, sg.dim, sg.first_input, sg.first_dim, sg.min, sg.max, sg.symbol});
  for (size_t i = 0; i < identity_.size(); ++i) {
    if (identity_[i].attr >= 0)
      return "input '" + tensor_names_.at(i) + "' is the module's own '" + attr_names_.at(identity_[i].attr) + "'";
    out.same_as.push_back(identity_[i].input);
  }
  out.default_dtype = c10::typeMetaToScalarType(default_dtype_);
  out.deterministic = deterministic_;
  out.autocast_cpu = autocast_cpu_;
  out.autocast_cpu_dtype = autocast_cpu_dtype_;
  return "";
}

std::unique_ptr<GuardSet> GuardSet::from_portable(const PortableGuards& p) {
  auto g = std::make_unique<GuardSet>();
  g->items_ = p.items;
  g->tensor_names_ = p.tensor_names;
  for (const PortableGuards::Tensor& t : p.tensors) {
    TensorGuard tg;
    tg.defined = t.defined;
    if (t.defined) {
      tg.keys = plain_keys(t.dtype, t.inference);
      tg.dtype = c10::scalarTypeToTypeMeta(t.dtype);
      tg.strided = true;
      tg.ndim = static_cast<uint8_t>(t.sizes.size());
      tg.dims = static_cast<uint32_t>(g->dims_.size());
      tg.symbolic = t.symbolic;
      g->dims_.insert(g->dims_.end(), t.sizes.begin(), t.sizes.end());
      g->dims_.insert(g->dims_.end(), t.strides.begin(), t.strides.end());
    }
    g->tensors_.push_back(tg);
  }
  for (const PortableGuards::SymDim& d : p.sym_dims)
    g->sym_dims_.push_back(SymDimGuard{d.input, d.dim, d.first_input, d.first_dim, d.min, d.max, d.symbol});
  for (int32_t same : p.same_as) {
    Identity id;
    id.input = same;
    g->identity_.push_back(id);
  }
  g->autograd_guarded_ = false;
  g->default_dtype_ = c10::scalarTypeToTypeMeta(p.default_dtype);
  g->deterministic_ = p.deterministic;
  g->autocast_cpu_ = p.autocast_cpu;
  g->autocast_cpu_dtype_ = p.autocast_cpu_dtype;
  return g;
}

// ---- evaluation ----------------------------------------------------------------------------

bool GuardSet::check(const CallArgs& args) const { return evaluate<false>(args, nullptr); }

std::string GuardSet::failure_reason(const CallArgs& args) const {
  std::string reason;
  evaluate<true>(args, &reason);
  return reason;
}

void GuardSet::make_symbolic(const DynamicPlan& plan) {
  for (const SymbolicDim& d : plan.dims) {
    TORCH_INTERNAL_ASSERT(d.input < tensors_.size() && d.dim < tensors_[d.input].ndim && d.dim < 64);
    tensors_[d.input].symbolic |= uint64_t{1} << d.dim;
    const SizeSymbol& s = plan.symbols.at(d.symbol);
    sym_dims_.push_back(SymDimGuard{d.input, d.dim, s.input, s.dim, s.min, s.max, s.name});
  }
}

// Without a reason (check()), a failing guard only returns false: the message arguments are
// never evaluated and nothing allocates.
#define TC_GUARD_FAIL(...)                                       \
  do {                                                           \
    if constexpr (kWithReason) *reason = c10::str(__VA_ARGS__); \
    return false;                                                \
  } while (0)

template <bool kWithReason>
bool GuardSet::check_attr(const AttrGuard& g, size_t index, const at::Tensor& t, std::string* reason) const {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const char* kind = g.buffer ? "buffer '" : "parameter '";
  if (impl != g.tensor.unsafeGetTensorImpl()) TC_GUARD_FAIL(kind, attr_names_[index], "' was replaced (identity changed)");
  if (!g.defined) return true;  // the undefined tensor is a singleton: identity covers it
  if (impl->dtype() != g.dtype)
    TC_GUARD_FAIL(kind, attr_names_[index], "' dtype mismatch: expected ", c10::typeMetaToScalarType(g.dtype), ", got ",
                  c10::typeMetaToScalarType(impl->dtype()));
  if (impl->device() != g.device)
    TC_GUARD_FAIL(kind, attr_names_[index], "' device mismatch: expected ", g.device, ", got ", impl->device());
  if (impl->requires_grad() != g.requires_grad)
    TC_GUARD_FAIL(kind, attr_names_[index], "' requires_grad mismatch: expected ", b(g.requires_grad), ", got ",
                  b(!g.requires_grad));
  const c10::IntArrayRef sizes = impl->sizes();
  if (sizes.size() != g.ndim)
    TC_GUARD_FAIL(kind, attr_names_[index], "' dimensionality mismatch: expected ", int(g.ndim), ", got ", sizes.size());
  const int64_t* expected = dims_.data() + g.dims;
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] != expected[d])
      TC_GUARD_FAIL(kind, attr_names_[index], "' size mismatch at index ", d, ": expected ", expected[d], ", got ",
                    sizes[d]);
  return true;
}

template <bool kWithReason>
bool GuardSet::evaluate(const CallArgs& args, std::string* reason) const {
  // 1. Argument structure and scalar values.
  const size_t n_items = items_.size();
  if (args.items.size() != n_items)
    TC_GUARD_FAIL("argument count mismatch: expected ", n_items, ", got ", args.items.size());
  for (size_t k = 0; k < n_items; ++k) {
    const ArgItem& e = items_[k];
    const ArgItem& a = args.items[k];
    if (C10_UNLIKELY(!(e == a))) {
      if (e.kind != a.kind)
        TC_GUARD_FAIL("argument ", k, " type mismatch: expected ", kind_name(e.kind), ", got ", kind_name(a.kind));
      const char* what = e.kind == ArgItem::TensorList ? " length" : e.kind == ArgItem::Tensor ? " presence" : "";
      TC_GUARD_FAIL("argument ", k, what, " mismatch: expected ", item_value(e), ", got ", item_value(a));
    }
  }

  // 2. Input tensors.
  const size_t n_tensors = tensors_.size();
  if (args.tensors.size() != n_tensors)
    TC_GUARD_FAIL("tensor input count mismatch: expected ", n_tensors, ", got ", args.tensors.size());
  const at::Tensor* inputs = args.tensors.data();
  for (size_t i = 0; i < n_tensors; ++i) {
    const TensorGuard& g = tensors_[i];
    const at::Tensor& t = inputs[i];
    if (t.defined() != g.defined) TC_GUARD_FAIL("tensor '", tensor_names_[i], "' definedness mismatch");
    if (!g.defined) continue;
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl->dtype() != g.dtype)
      TC_GUARD_FAIL("tensor '", tensor_names_[i], "' dtype mismatch: expected ", c10::typeMetaToScalarType(g.dtype), ", got ",
                    c10::typeMetaToScalarType(impl->dtype()));
    if (impl->device() != g.device)
      TC_GUARD_FAIL("tensor '", tensor_names_[i], "' device mismatch: expected ", g.device, ", got ", impl->device());
    if (impl->key_set() != g.keys && !(!autograd_guarded_ && same_but_autograd(impl->key_set(), g.keys))) {
      if constexpr (kWithReason) {
        const c10::Layout expected = layout_of(g.keys), actual = layout_of(impl->key_set());
        if (expected != actual)
          TC_GUARD_FAIL("tensor '", tensor_names_[i], "' layout mismatch: expected ", expected, ", got ", actual);
      }
      TC_GUARD_FAIL("tensor '", tensor_names_[i], "' dispatch key set mismatch: expected ", g.keys, ", got ",
                    impl->key_set());
    }
    if (impl->requires_grad() != g.requires_grad)
      TC_GUARD_FAIL("tensor '", tensor_names_[i], "' requires_grad mismatch: expected ", b(g.requires_grad), ", got ",
                    b(!g.requires_grad));
    const c10::IntArrayRef sizes = impl->sizes();
    const size_t ndim = g.ndim;
    if (sizes.size() != ndim)
      TC_GUARD_FAIL("tensor '", tensor_names_[i], "' dimensionality mismatch: expected ", ndim, ", got ", sizes.size());
    const int64_t* expected = dims_.data() + g.dims;
    for (size_t d = 0; d < ndim; ++d)
      if (sizes[d] != expected[d] && !(g.symbolic >> d & 1))
        TC_GUARD_FAIL("tensor '", tensor_names_[i], "' size mismatch at index ", d, ": expected ", expected[d],
                      ", got ", sizes[d]);
    if (g.symbolic != 0) {
      if (!impl->is_contiguous())
        TC_GUARD_FAIL("tensor '", tensor_names_[i], "' is not contiguous: a tensor with symbolic sizes must be");
    } else if (g.strided) {
      const c10::IntArrayRef strides = impl->strides();
      expected += ndim;
      for (size_t d = 0; d < ndim; ++d)
        if (strides[d] != expected[d])
          TC_GUARD_FAIL("tensor '", tensor_names_[i], "' stride mismatch at index ", d, ": expected ", expected[d],
                        ", got ", strides[d]);
    }
  }

  // 2b. Symbolic sizes: in range, and equal where they share a symbol.
  for (const SymDimGuard& sg : sym_dims_) {
    const int64_t size = inputs[sg.input].unsafeGetTensorImpl()->sizes()[sg.dim];
    if (size < sg.min || size > sg.max)
      TC_GUARD_FAIL("tensor '", tensor_names_[sg.input], "' size at index ", sg.dim, " (symbol ", sg.symbol,
                    "): expected a size in ", size_range(sg.min, sg.max), ", got ", size);
    if (sg.first_input == sg.input && sg.first_dim == sg.dim) continue;
    const int64_t first = inputs[sg.first_input].unsafeGetTensorImpl()->sizes()[sg.first_dim];
    if (size != first)
      TC_GUARD_FAIL("tensor '", tensor_names_[sg.input], "' size at index ", sg.dim, " is symbol ", sg.symbol,
                    ", equal to size ", sg.first_dim, " of '", tensor_names_[sg.first_input],
                    "' when traced: expected ", first, ", got ", size);
  }

  // 3. Identity between inputs: the same tensors passed as the same arguments as when traced.
  // A few inputs are compared pairwise (no allocation, no sort); many are sorted.
  if (n_tensors > 1) {
    c10::SmallVector<Identity, 8> sorted;
    if (n_tensors > 16) sorted = identities_of(inputs, n_tensors);
    for (size_t i = 1; i < n_tensors; ++i) {
      if (!tensors_[i].defined) continue;
      int32_t is = -1;
      if (n_tensors > 16) {
        is = sorted[i].input;
      } else {
        const c10::TensorImpl* impl = inputs[i].unsafeGetTensorImpl();
        for (size_t j = 0; j < i && is < 0; ++j)
          if (tensors_[j].defined && inputs[j].unsafeGetTensorImpl() == impl) is = static_cast<int32_t>(j);
      }
      const int32_t was = identity_[i].input;
      if (was == is) continue;
      if (was >= 0)
        TC_GUARD_FAIL("tensor '", tensor_names_[i], "' was the same tensor as '", tensor_names_[was],
                      "' when traced, and is not now");
      TC_GUARD_FAIL("tensor '", tensor_names_[i], "' is the same tensor as '", tensor_names_[is],
                    "', which it was not when traced");
    }
  }

  // 4. Global state that changes results.
  // Inference mode first: it implies grad mode off, and is the more useful reason. Both live in
  // one thread-local (what InferenceMode::is_enabled() and GradMode::is_enabled() read).
  const c10::AutogradState& autograd = c10::AutogradState::get_tls_state();
  if (autograd_guarded_ && autograd.get_inference_mode() != inference_mode_)
    TC_GUARD_FAIL("inference mode mismatch: expected ", b(inference_mode_), ", got ", b(!inference_mode_));
  if (autograd_guarded_ && autograd.get_grad_mode() != grad_mode_)
    TC_GUARD_FAIL("grad mode mismatch: expected ", b(grad_mode_), ", got ", b(!grad_mode_));
  if (c10::get_default_dtype() != default_dtype_)
    TC_GUARD_FAIL("default dtype mismatch: expected ", c10::typeMetaToScalarType(default_dtype_), ", got ",
                  c10::typeMetaToScalarType(c10::get_default_dtype()));
  if (at::globalContext().deterministicAlgorithms() != deterministic_)
    TC_GUARD_FAIL("deterministic algorithms mismatch: expected ", b(deterministic_), ", got ", b(!deterministic_));
  if (compat::autocast_cpu_enabled() != autocast_cpu_)
    TC_GUARD_FAIL("autocast (CPU) mismatch: expected ", on(autocast_cpu_), ", got ", on(!autocast_cpu_));
  if (autocast_cpu_ && compat::autocast_cpu_dtype() != autocast_cpu_dtype_)
    TC_GUARD_FAIL("autocast (CPU) dtype mismatch: expected ", autocast_cpu_dtype_, ", got ", compat::autocast_cpu_dtype());

  // 5. Modules: training flag, submodules, parameters, buffers.
  const size_t n_modules = modules_.size();
  for (size_t mi = 0; mi < n_modules; ++mi) {
    const ModuleGuard& mg = modules_[mi];
    const torch::nn::Module& m = *mg.module;
    if (m.is_training() != mg.training)
      TC_GUARD_FAIL("module '", display_path(module_paths_[mi]), "' training flag mismatch: expected ", b(mg.training),
                    ", got ", b(!mg.training));

    const auto& kids = registered_children(m).items();
    const size_t n_kids = mg.children_end - mg.children_begin;
    if (kids.size() != n_kids)
      TC_GUARD_FAIL("module '", display_path(module_paths_[mi]), "' submodule count mismatch: expected ", n_kids,
                    ", got ", kids.size());
    for (size_t k = 0; k < n_kids; ++k) {
      if (kids[k].value().get() != children_[mg.children_begin + k]) {
        const std::string& expected_name = child_names_[mg.children_begin + k];
        if (kids[k].key() != expected_name)
          TC_GUARD_FAIL("module '", display_path(module_paths_[mi]), "' submodule ", k, " changed: expected '",
                        expected_name, "', got '", kids[k].key(), "'");
        TC_GUARD_FAIL("submodule '", qualify(module_paths_[mi], expected_name), "' was replaced (identity changed)");
      }
    }

    const auto& params = registered_parameters(m).items();
    const size_t n_params = mg.buffers_begin - mg.params_begin;
    if (params.size() != n_params)
      TC_GUARD_FAIL("module '", display_path(module_paths_[mi]), "' parameter count mismatch: expected ", n_params,
                    ", got ", params.size());
    for (size_t k = 0; k < n_params; ++k) {
      const size_t idx = mg.params_begin + k;
      if (!check_attr<kWithReason>(attrs_[idx], idx, params[k].value(), reason)) return false;
    }

    const auto& buffers = registered_buffers(m).items();
    const size_t n_buffers = mg.attrs_end - mg.buffers_begin;
    if (buffers.size() != n_buffers)
      TC_GUARD_FAIL("module '", display_path(module_paths_[mi]), "' buffer count mismatch: expected ", n_buffers,
                    ", got ", buffers.size());
    for (size_t k = 0; k < n_buffers; ++k) {
      const size_t idx = mg.buffers_begin + k;
      if (!check_attr<kWithReason>(attrs_[idx], idx, buffers[k].value(), reason)) return false;
    }
  }

  // 6. Identity between inputs and module state (now that the state is the traced tensors).
  for (size_t i = 0; i < n_tensors; ++i) {
    const Identity& id = identity_[i];
    if (!tensors_[i].defined || id.input >= 0) continue;
    const int32_t is = attr_of(inputs[i]);
    if (is == id.attr) continue;
    if (id.attr >= 0)
      TC_GUARD_FAIL("tensor '", tensor_names_[i], "' was ", attrs_[id.attr].buffer ? "buffer '" : "parameter '",
                    attr_names_[id.attr], "' when traced, and is not now");
    TC_GUARD_FAIL("tensor '", tensor_names_[i], "' is ", attrs_[is].buffer ? "buffer '" : "parameter '",
                  attr_names_[is], "', which it was not when traced");
  }

  // Hooks: one load while no hook changed anywhere since the last check that passed.
  if (detail::hook_epoch() != hook_epoch_seen_.load(std::memory_order_acquire)) {
    if (hooks_changed(reason)) return false;
  }
  return true;
}

#undef TC_GUARD_FAIL

bool GuardSet::hooks_changed(std::string* reason) const {
  const uint64_t epoch = detail::hook_epoch();
  std::lock_guard<std::mutex> lock(hook_mutex_);
  for (const HookGuard& g : hook_guards_) {
    if (detail::hook_version(*g.module) == g.version) continue;
    if (reason != nullptr) {
      auto now = detail::hooks_of(*g.module);
      *reason = c10::str("hooks of module '", g.path, "' changed since compilation: ",
                         (now ? *now : detail::HookSet()).change_from(g.counts));
    }
    return true;
  }
  hook_epoch_seen_.store(epoch, std::memory_order_release);
  return false;
}

bool GuardSet::hooks_stale() const {
  if (detail::hook_epoch() == hook_epoch_seen_.load(std::memory_order_acquire)) return false;
  return hooks_changed(nullptr);
}

void GuardSet::add_hook_module(const std::shared_ptr<torch::nn::Module>& m, uint64_t version,
                               std::string path) const {
  std::lock_guard<std::mutex> lock(hook_mutex_);
  for (const HookGuard& g : hook_guards_)
    if (g.module.get() == m.get()) return;
  auto hooks = detail::hooks_of(*m);
  hook_guards_.push_back(HookGuard{m, version, path.empty() ? std::string("<root>") : std::move(path),
                                   (hooks ? *hooks : detail::HookSet()).counts()});
}

// ---- describe ------------------------------------------------------------------------------

std::vector<std::string> GuardSet::describe() const {
  std::vector<std::string> out;
  for (size_t k = 0; k < items_.size(); ++k) {
    const ArgItem& it = items_[k];
    if (it.kind == ArgItem::Tensor && it.i) continue;
    out.push_back("argument " + std::to_string(k) + " is " + kind_name(it.kind) + " " + item_value(it));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorGuard& g = tensors_[i];
    std::ostringstream os;
    os << "tensor '" << tensor_names_[i] << "': ";
    if (!g.defined) {
      os << "undefined";
    } else {
      const int64_t* d = dims_.data() + g.dims;
      os << c10::typeMetaToScalarType(g.dtype) << ", " << g.device << ", " << layout_of(g.keys) << ", sizes ";
      if (g.symbolic == 0) {
        os << join(d, g.ndim);
      } else {
        os << "[";
        for (size_t k = 0; k < g.ndim; ++k) {
          os << (k ? ", " : "");
          if (g.symbolic >> k & 1) {
            for (const SymDimGuard& sg : sym_dims_)
              if (sg.input == i && sg.dim == k) os << sg.symbol;
          } else {
            os << d[k];
          }
        }
        os << "]";
      }
      if (g.symbolic != 0) {
        os << ", contiguous";
      } else if (g.strided) {
        os << ", strides " << join(d + g.ndim, g.ndim);
      }
      os << ", requires_grad " << b(g.requires_grad);
    }
    out.push_back(os.str());
  }
  for (const SymDimGuard& sg : sym_dims_) {
    std::string line = "symbol " + sg.symbol + ": size " + std::to_string(sg.dim) + " of '" + tensor_names_[sg.input] + "'";
    if (sg.first_input == sg.input && sg.first_dim == sg.dim) {
      line += " in " + size_range(sg.min, sg.max);
    } else {
      line += " equal to size " + std::to_string(sg.first_dim) + " of '" + tensor_names_[sg.first_input] + "'";
    }
    out.push_back(std::move(line));
  }
  for (size_t i = 0; i < identity_.size(); ++i) {
    if (identity_[i].input >= 0)
      out.push_back("tensor '" + tensor_names_[i] + "' is tensor '" + tensor_names_[identity_[i].input] + "'");
    else if (identity_[i].attr >= 0)
      out.push_back("tensor '" + tensor_names_[i] + "' is " + (attrs_[identity_[i].attr].buffer ? "buffer '" : "parameter '") +
                    attr_names_[identity_[i].attr] + "'");
  }
  if (!identity_.empty()) out.push_back("other input tensors: distinct from each other and from module state");
  out.push_back(std::string("inference mode ") + on(inference_mode_));
  out.push_back(std::string("grad mode ") + on(grad_mode_));
  out.push_back(c10::str("default dtype ", c10::typeMetaToScalarType(default_dtype_)));
  out.push_back(std::string("deterministic algorithms ") + on(deterministic_));
  out.push_back(autocast_cpu_ ? c10::str("autocast (CPU) enabled, dtype ", autocast_cpu_dtype_)
                              : std::string("autocast (CPU) disabled"));
  {
    std::lock_guard<std::mutex> lock(hook_mutex_);
    for (const HookGuard& g : hook_guards_)
      if (g.version != 0) {
        std::string line = "module '" + g.path + "' hooks:";
        for (const auto& [what, n] : g.counts) line += " " + what + " " + n + ";";
        out.push_back(line);
      }
    out.push_back("hooks of " + std::to_string(hook_guards_.size()) + " modules unchanged (global hook epoch)");
  }
  for (size_t mi = 0; mi < modules_.size(); ++mi) {
    const ModuleGuard& mg = modules_[mi];
    const std::string& path = display_path(module_paths_[mi]);
    out.push_back("module '" + path + "' training=" + b(mg.training));
    if (mg.children_end > mg.children_begin) {
      std::vector<std::string> names(child_names_.begin() + mg.children_begin, child_names_.begin() + mg.children_end);
      out.push_back("module '" + path + "' submodules " + join(names) + " (identity)");
    }
    for (size_t idx = mg.params_begin; idx < mg.attrs_end; ++idx) {
      const AttrGuard& a = attrs_[idx];
      std::ostringstream os;
      os << (a.buffer ? "buffer '" : "parameter '") << attr_names_[idx] << "': ";
      if (!a.defined) {
        os << "undefined";
      } else {
        os << c10::typeMetaToScalarType(a.dtype) << ", " << a.device << ", sizes " << join(dims_.data() + a.dims, a.ndim)
           << ", requires_grad " << b(a.requires_grad);
      }
      os << ", identity " << static_cast<const void*>(a.tensor.unsafeGetTensorImpl());
      out.push_back(os.str());
    }
  }
  return out;
}

}  // namespace torchcompile::runtime
