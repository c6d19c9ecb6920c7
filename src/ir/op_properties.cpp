// The operator-property table (see op_properties.h).
#include <torchcompile/ir/op_properties.h>

#include <torchcompile/ir/graph.h>

#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::ir {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::Other: return "other";
    case OpKind::Pointwise: return "pointwise";
    case OpKind::Reduction: return "reduction";
    case OpKind::Normalization: return "normalization";
    case OpKind::View: return "view";
    case OpKind::Gemm: return "gemm";
    case OpKind::Convolution: return "convolution";
    case OpKind::Pooling: return "pooling";
    case OpKind::Factory: return "factory";
    case OpKind::MetadataQuery: return "metadata query";
  }
  return "?";
}

namespace {

// ATen operators by base name (no namespace, no overload, no trailing `_`).
const std::unordered_map<std::string, OpKind>& kind_table() {
  static const std::unordered_map<std::string, OpKind> table = [] {
    std::unordered_map<std::string, OpKind> t;
    auto add = [&t](OpKind k, std::initializer_list<const char*> names) {
      for (const char* n : names) t.emplace(n, k);
    };
    add(OpKind::Pointwise,
        {// unary math
         "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "erf", "erfc", "erfinv",
         "exp", "exp2", "expm1", "floor", "frac", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round",
         "rsqrt", "sign", "sgn", "sin", "sinh", "sqrt", "square", "tan", "tanh", "trunc", "logit", "nan_to_num",
         "isnan", "isinf", "isfinite", "logical_not", "bitwise_not", "positive",
         // activations
         "relu", "relu6", "gelu", "silu", "mish", "elu", "selu", "celu", "leaky_relu", "hardswish", "hardsigmoid",
         "hardtanh", "hardshrink", "softshrink", "softplus", "threshold", "sigmoid", "clamp", "clamp_min",
         "clamp_max", "clip",
         // binary and ternary
         "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "maximum",
         "minimum", "fmax", "fmin", "atan2", "hypot", "copysign", "eq", "ne", "gt", "ge", "lt", "le",
         "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "where", "lerp",
         "addcmul", "addcdiv", "masked_fill",
         // copies and dtype conversions
         "_to_copy", "clone", "copy", "fill", "type_as",
         // backwards of pointwise ops
         "threshold_backward", "gelu_backward", "sigmoid_backward", "tanh_backward", "silu_backward",
         "mish_backward", "elu_backward", "hardswish_backward", "hardsigmoid_backward", "hardtanh_backward",
         "leaky_relu_backward", "softplus_backward", "logit_backward"});
    add(OpKind::Reduction, {"sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean",
                            "std_mean", "norm", "linalg_vector_norm", "argmax", "argmin", "logsumexp", "any", "all",
                            "count_nonzero", "nansum", "nanmean"});
    add(OpKind::Normalization,
        {"softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
         "_log_softmax_backward_data", "layer_norm", "native_layer_norm", "native_layer_norm_backward",
         "batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
         "_batch_norm_impl_index", "native_batch_norm_backward", "group_norm", "native_group_norm",
         "native_group_norm_backward", "instance_norm"});
    add(OpKind::Gemm, {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv", "dot", "_addmm_activation"});
    add(OpKind::Convolution,
        {"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d",
         "conv_transpose3d", "mkldnn_convolution", "convolution_backward"});
    add(OpKind::Pooling,
        {"max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
         "avg_pool1d", "avg_pool2d", "avg_pool3d", "avg_pool2d_backward", "adaptive_avg_pool1d",
         "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
         "adaptive_max_pool2d"});
    add(OpKind::Factory,
        {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted", "zeros",
         "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "arange",
         "linspace", "logspace", "eye", "scalar_tensor", "rand", "rand_like", "randn", "randn_like", "randint",
         "randint_like", "randperm"});
    add(OpKind::MetadataQuery,
        {"size", "stride", "numel", "dim", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
         "storage_offset", "is_same_size", "is_complex", "is_floating_point", "is_signed", "is_conj", "is_neg",
         "is_inference", "is_leaf", "output_nr", "_version", "retains_grad", "result_type", "can_cast",
         "promote_types", "is_set_to", "_nnz", "sparse_dim", "dense_dim", "is_coalesced", "is_pinned",
         "is_distributed", "_has_compatible_shallow_copy_type", "_debug_has_internal_overlap",
         "_has_same_storage_numel", "is_contiguous", "is_non_overlapping_and_dense"});
    return t;
  }();
  return table;
}

bool is_random_op(const c10::OperatorHandle& op, std::string base) {
  static const std::unordered_set<std::string> kRandom = {
      "dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "native_dropout", "fused_dropout",
      "bernoulli", "multinomial", "normal", "uniform", "randperm", "poisson", "exponential", "geometric",
      "cauchy", "log_normal", "random", "binomial", "standard_gamma", "sample_dirichlet"};
  // In-place and private variants draw the same way: `bernoulli_`, `_fused_dropout`.
  while (!base.empty() && base.back() == '_') base.pop_back();
  while (!base.empty() && base.front() == '_') base.erase(base.begin());
  if (kRandom.count(base)) return true;
  if (base.rfind("rand", 0) == 0 || base.rfind("rrelu", 0) == 0) return true;
  for (const auto& arg : op.schema().arguments()) {
    c10::TypePtr t = arg.type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    if (t->kind() == c10::TypeKind::GeneratorType) return true;
  }
  return false;
}

OpProperties compute(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  const std::string& full = schema.name();
  const auto ns = full.find("::");
  std::string base = ns == std::string::npos ? full : full.substr(ns + 2);
  const bool aten = ns != std::string::npos && full.compare(0, ns, "aten") == 0;

  OpProperties p;
  for (const auto& arg : schema.arguments())
    if (arg.alias_info() && arg.alias_info()->isWrite()) p.mutating = true;
  p.random = is_random_op(op, base);

  const auto& returns = schema.returns();
  if (returns.size() == 1 && returns[0].alias_info() != nullptr && !returns[0].alias_info()->isWrite()) {
    p.kind = OpKind::View;
  } else if (aten) {
    std::string key = base;
    if (key.size() > 1 && key.back() == '_' && key[key.size() - 2] != '_') key.pop_back();  // `relu_` -> `relu`
    auto it = kind_table().find(key);
    if (it != kind_table().end()) p.kind = it->second;
    // `max.other` / `min.other` are elementwise; the other overloads reduce.
    if ((key == "max" || key == "min") && schema.overload_name() == "other") p.kind = OpKind::Pointwise;
  }
  if (aten) {
    static const std::unordered_set<std::string> kWholeViews = {"view",   "_unsafe_view", "reshape", "alias",
                                                                 "detach", "unsqueeze",    "squeeze", "flatten"};
    static const std::unordered_set<std::string> kUninitialized = {"empty", "empty_strided", "new_empty",
                                                                    "new_empty_strided", "empty_permuted"};
    static const std::unordered_set<std::string> kRunningStats = {"batch_norm", "native_batch_norm",
                                                                   "_batch_norm_impl_index", "instance_norm"};
    static const std::unordered_set<std::string> kEvalIdentity = {"dropout", "feature_dropout", "alpha_dropout",
                                                                   "feature_alpha_dropout"};
    p.whole_view = kWholeViews.count(base) != 0;
    p.uninitialized = kUninitialized.count(base) != 0;
    p.updates_running_stats = kRunningStats.count(base) != 0;
    p.identity_when_not_training = kEvalIdentity.count(base) != 0;
    static const std::unordered_set<std::string> kDataDependent = {
        "nonzero", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
        "unique_dim_consecutive", "bincount", "nonzero_numpy"};
    static const std::unordered_set<std::string> kCountFromSizes = {
        "unbind", "split", "unsafe_split", "chunk", "unsafe_chunk", "tensor_split", "split_with_sizes",
        "unsafe_split_with_sizes", "hsplit", "vsplit", "dsplit", "unbind_copy", "split_copy", "split_with_sizes_copy"};
    p.result_count_from_sizes = kCountFromSizes.count(base) != 0;
    const std::string& overload = schema.overload_name();
    p.data_dependent_sizes = kDataDependent.count(base) != 0 ||
                             (base == "repeat_interleave" && (overload == "Tensor" || overload == "self_Tensor"));
  }
  return p;
}

// A constant boolean argument of `n` by schema name, if given.
std::optional<bool> bool_arg(const Node& n, const char* name) {
  const auto& schema_args = n.schema().arguments();
  for (size_t i = 0; i < schema_args.size() && i < n.args().size(); ++i)
    if (schema_args[i].name() == name && n.args()[i].is_constant() && n.args()[i].constant().isBool())
      return n.args()[i].constant().toBool();
  return std::nullopt;
}

}  // namespace

OpProperties op_properties(const c10::OperatorHandle& op) {
  static std::shared_mutex mutex;
  static std::unordered_map<c10::OperatorName, OpProperties> cache;
  const c10::OperatorName& name = op.operator_name();
  {
    std::shared_lock<std::shared_mutex> lock(mutex);
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
  }
  OpProperties p = compute(op);
  std::unique_lock<std::shared_mutex> lock(mutex);
  cache.emplace(name, p);
  return p;
}

bool results_depend_on_data(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  if (op_properties(op).data_dependent_sizes) return true;
  const c10::FunctionSchema& schema = op.schema();
  if (schema.name() != "aten::index") return false;
  for (const c10::IValue& a : args) {
    if (!a.isList() && !a.isTensorList()) continue;
    for (const c10::IValue& e : a.toListRef()) {
      if (!e.isTensor() || !e.toTensor().defined()) continue;
      const at::ScalarType t = e.toTensor().scalar_type();
      if (t == at::kBool || t == at::kByte) return true;
    }
  }
  return false;
}

const Node* first_node_with_data_dependent_sizes(const Graph& g) {
  for (const auto& n : g.nodes())
    if (node_results_depend_on_data(*n)) return n.get();
  return nullptr;
}

bool node_results_depend_on_data(const Node& n) {
  if (n.kind() != NodeKind::CallFunction) return false;
  if (op_properties(n.op()).data_dependent_sizes) return true;
  if (n.schema().name() != "aten::index") return false;
  for (const Argument& a : n.args()) {
    if (a.kind() != Argument::Kind::ValueList) continue;
    for (const auto& e : a.list()) {
      if (!e) continue;
      const TensorMeta& m = e->node->output_meta()[e->index];
      if (m.defined && (m.dtype == at::kBool || m.dtype == at::kByte)) return true;
    }
  }
  return false;
}

OpProperties node_properties(const Node& n) {
  return n.kind() == NodeKind::CallFunction ? op_properties(n.op()) : OpProperties{};
}

bool is_view_node(const Node* n) { return node_properties(*n).view(); }

std::vector<size_t> written_arguments(const Node& n) {
  std::vector<size_t> written;
  if (n.kind() != NodeKind::CallFunction) return written;
  const auto& schema_args = n.schema().arguments();
  // The schema does not say batch norm writes its running statistics: it does when training
  // (an argument `training` / `use_input_stats` that is true or not constant).
  bool stats = false;
  if (op_properties(n.op()).updates_running_stats) {
    auto training = bool_arg(n, "training");
    if (!training) training = bool_arg(n, "use_input_stats");
    stats = training.value_or(true);
  }
  for (size_t i = 0; i < schema_args.size() && i < n.args().size(); ++i) {
    const bool declared = schema_args[i].alias_info() != nullptr && schema_args[i].alias_info()->isWrite();
    if (declared || (stats && (schema_args[i].name() == "running_mean" || schema_args[i].name() == "running_var")))
      written.push_back(i);
  }
  return written;
}

bool node_is_random(const Node& n) {
  if (!node_properties(n).random) return false;
  // Dropout in eval mode (`train=False`) returns its input and draws nothing.
  return bool_arg(n, "train").value_or(true);
}

bool node_is_identity(const Node& n) {
  if (!node_properties(n).identity_when_not_training) return false;
  if (bool_arg(n, "train") == std::optional<bool>(false)) return true;
  const auto& schema_args = n.schema().arguments();
  for (size_t i = 0; i < schema_args.size() && i < n.args().size(); ++i)
    if (schema_args[i].name() == "p" && n.args()[i].is_constant()) {
      const c10::IValue& p = n.args()[i].constant();
      return (p.isDouble() && p.toDouble() == 0.0) || (p.isInt() && p.toInt() == 0);
    }
  return false;
}

}  // namespace torchcompile::ir
