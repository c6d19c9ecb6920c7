// capture::metadata_at (capture/metadata_at.h).
#include "capture/metadata_at.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/split.h>

#include <ATen/Functions.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <optional>

namespace torchcompile::capture {

namespace {

at::Tensor on_meta(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta).requires_grad(false));
}

at::Tensor zeros_like_strided(const at::Tensor& t) {
  if (!t.defined()) return t;
  at::Tensor z = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU).requires_grad(false));
  z.zero_();
  return z;
}

}  // namespace

std::optional<at::Tensor> pointwise_on_meta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  const ir::OpProperties props = ir::op_properties(op);
  if (!props.pointwise() || props.mutating || props.random || op.schema().returns().size() != 1) return std::nullopt;
  std::vector<at::Tensor> tensors;
  std::vector<c10::IValue> tiny;
  for (const c10::IValue& a : args) {
    if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();
      if (!t.defined() || !t.is_meta()) return std::nullopt;
      tensors.push_back(t);
      tiny.push_back(at::zeros(std::vector<int64_t>(t.dim(), 1), t.options().device(c10::kCPU)));
    } else if (a.isList() || a.isTensorList()) {
      return std::nullopt;  // tensors in lists: not a pointwise call this handles
    } else {
      tiny.push_back(a);
    }
  }
  if (tensors.empty()) return std::nullopt;
  try {
    torch::jit::Stack stack(tiny.begin(), tiny.end());
    op.callBoxed(&stack);
    if (stack.size() != 1 || !stack[0].isTensor()) return std::nullopt;
    const at::Tensor small = stack[0].toTensor();
    at::TensorIteratorConfig config;
    config.add_owned_output(at::Tensor());
    for (const at::Tensor& t : tensors) config.add_input(t);
    config.check_all_same_dtype(false).declare_static_dtype_and_device(small.scalar_type(), c10::Device(c10::kMeta));
    at::TensorIterator iter = config.build();
    at::Tensor out = iter.output();
    if (out.dim() != small.dim()) return std::nullopt;  // not an elementwise result of these arguments
    return out;
  } catch (const c10::Error&) {
    return std::nullopt;  // the zeros of the real sizes decide
  }
}

std::optional<at::Tensor> convolution_on_meta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  const c10::FunctionSchema& schema = op.schema();
  const std::string& name = schema.name();
  const bool wrapper = name == "aten::conv1d" || name == "aten::conv2d" || name == "aten::conv3d";
  const bool wrapper_t = name == "aten::conv_transpose1d" || name == "aten::conv_transpose2d" ||
                         name == "aten::conv_transpose3d";
  if (!wrapper && !wrapper_t && name != "aten::convolution" && name != "aten::_convolution") return std::nullopt;
  if (args.size() != schema.arguments().size()) return std::nullopt;
  auto arg = [&](const char* n) -> const c10::IValue* {
    for (size_t i = 0; i < schema.arguments().size(); ++i)
      if (schema.arguments()[i].name() == n) return &args[i];
    return nullptr;
  };
  const c10::IValue* in = arg("input");
  const c10::IValue* w = arg("weight");
  if (!in || !w || !in->isTensor() || !w->isTensor()) return std::nullopt;
  const at::Tensor& x = in->toTensor();
  const at::Tensor& weight = w->toTensor();
  if (!x.defined() || !weight.defined() || !x.is_meta() || !weight.is_meta()) return std::nullopt;
  if (!at::isFloatingType(x.scalar_type()) || x.scalar_type() != weight.scalar_type()) return std::nullopt;
  if (!x.is_contiguous() || !weight.is_contiguous()) return std::nullopt;
  const int64_t spatial = weight.dim() - 2;
  if (spatial < 1 || spatial > 3) return std::nullopt;
  const bool batched = x.dim() == weight.dim();
  if (!batched && !(x.dim() == weight.dim() - 1 && (wrapper || wrapper_t))) return std::nullopt;
  bool transposed = wrapper_t;
  if (const c10::IValue* t = arg("transposed")) {
    if (!t->isBool()) return std::nullopt;
    transposed = t->toBool();
  }
  auto ints = [&](const char* n, int64_t fill) -> std::optional<std::vector<int64_t>> {
    const c10::IValue* v = arg(n);
    if (!v) return std::vector<int64_t>(spatial, fill);
    if (!v->isIntList()) return std::nullopt;
    std::vector<int64_t> l = v->toIntVector();
    if (l.size() == 1) l.assign(spatial, l[0]);
    if (static_cast<int64_t>(l.size()) != spatial) return std::nullopt;
    return l;
  };
  auto stride = ints("stride", 1), dilation = ints("dilation", 1), output_padding = ints("output_padding", 0);
  if (!stride || !dilation || !output_padding) return std::nullopt;
  std::optional<std::vector<int64_t>> padding;
  bool same = false;
  if (const c10::IValue* p = arg("padding"); p && p->isString()) {
    const std::string mode = p->toStringRef();
    if (mode == "valid") padding = std::vector<int64_t>(spatial, 0);
    else if (mode == "same") same = true;
    else return std::nullopt;
  } else {
    padding = ints("padding", 0);
    if (!padding) return std::nullopt;
  }
  int64_t groups = 1;
  if (const c10::IValue* g = arg("groups")) {
    if (!g->isInt()) return std::nullopt;
    groups = g->toInt();
  }
  if (groups < 1) return std::nullopt;
  const int64_t lead = batched ? 2 : 1;  // (N, C, ...) or (C, ...)
  const int64_t channels = x.size(lead - 1);
  std::vector<int64_t> sizes;
  if (batched) sizes.push_back(x.size(0));
  if (!transposed) {
    if (channels != weight.size(1) * groups || weight.size(0) % groups != 0) return std::nullopt;
    sizes.push_back(weight.size(0));
  } else {
    if (channels != weight.size(0) || channels % groups != 0) return std::nullopt;
    sizes.push_back(weight.size(1) * groups);
  }
  for (int64_t d = 0; d < spatial; ++d) {
    const int64_t size = x.size(lead + d), k = weight.size(2 + d);
    const int64_t s = (*stride)[d], dil = (*dilation)[d];
    if (s < 1 || dil < 1) return std::nullopt;
    if (size <= 0) return std::nullopt;
    int64_t out;
    if (same) {
      if (transposed || s != 1) return std::nullopt;
      out = size;
    } else if (!transposed) {
      const int64_t span = size + 2 * (*padding)[d] - dil * (k - 1) - 1;
      if (span < 0) return std::nullopt;  // the op throws
      out = span / s + 1;
    } else {
      out = (size - 1) * s - 2 * (*padding)[d] + dil * (k - 1) + (*output_padding)[d] + 1;
    }
    sizes.push_back(out);
  }
  for (int64_t v : sizes)
    if (v <= 0) return std::nullopt;  // empty or negative sizes: the op decides
  return at::empty(sizes, x.options().device(c10::kMeta));
}

std::optional<std::vector<at::Tensor>> layer_norm_on_meta(const c10::OperatorHandle& op,
                                                          const std::vector<c10::IValue>& args) {
  const bool native = op.schema().name() == "aten::native_layer_norm";  // else `layer_norm`: the first result
  if (!(native ? args.size() == 5 : op.schema().name() == "aten::layer_norm" && args.size() == 6) || !args[0].isTensor())
    return std::nullopt;
  const at::Tensor& x = args[0].toTensor();
  if (!x.defined() || !x.is_meta() || (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) ||
      x.numel() == 0 || !args[1].isIntList())
    return std::nullopt;
  const std::vector<int64_t> normalized = args[1].toIntVector();
  const int64_t axis = x.dim() - static_cast<int64_t>(normalized.size());
  if (normalized.empty() || axis < 0) return std::nullopt;
  for (size_t i = 0; i < normalized.size(); ++i)
    if (x.size(axis + static_cast<int64_t>(i)) != normalized[i]) return std::nullopt;  // the op throws
  for (size_t i : {size_t(2), size_t(3)}) {  // weight, bias: absent, or of the normalized sizes and x's dtype
    if (args[i].isNone()) continue;
    if (!args[i].isTensor()) return std::nullopt;
    const at::Tensor& w = args[i].toTensor();
    if (!w.defined()) continue;
    if (!w.is_meta() || w.scalar_type() != x.scalar_type() || w.sizes() != at::IntArrayRef(normalized))
      return std::nullopt;
  }
  std::vector<int64_t> stat(x.sizes().begin(), x.sizes().begin() + axis);
  stat.resize(static_cast<size_t>(x.dim()), 1);
  const at::TensorOptions options = x.options().device(c10::kMeta).requires_grad(false);
  if (!native) return std::vector<at::Tensor>{at::empty(x.sizes(), options)};
  return std::vector<at::Tensor>{at::empty(x.sizes(), options), at::empty(stat, options), at::empty(stat, options)};
}

std::optional<at::Tensor> embedding_on_meta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  if (op.schema().name() != "aten::embedding" || args.size() != 5 || !args[0].isTensor() || !args[1].isTensor())
    return std::nullopt;
  const at::Tensor &weight = args[0].toTensor(), &indices = args[1].toTensor();
  if (!weight.defined() || !indices.defined() || !weight.is_meta() || !indices.is_meta() || weight.dim() != 2 ||
      (indices.scalar_type() != at::kLong && indices.scalar_type() != at::kInt))
    return std::nullopt;
  std::vector<int64_t> sizes(indices.sizes().begin(), indices.sizes().end());
  sizes.push_back(weight.size(1));
  return at::empty(sizes, weight.options().device(c10::kMeta).requires_grad(false));
}

std::optional<std::vector<at::Tensor>> result_on_meta(const c10::OperatorHandle& op,
                                                      const std::vector<c10::IValue>& args) {
  if (auto r = pointwise_on_meta(op, args)) return std::vector<at::Tensor>{std::move(*r)};
  if (auto r = convolution_on_meta(op, args)) return std::vector<at::Tensor>{std::move(*r)};
  if (auto r = embedding_on_meta(op, args)) return std::vector<at::Tensor>{std::move(*r)};
  return layer_norm_on_meta(op, args);
}

std::vector<std::unordered_map<std::string, std::vector<ir::TensorMeta>>> metadata_at_points(
    const ir::GraphModule& gm, const std::vector<std::vector<ir::TensorMeta>>& points) {
  std::vector<std::unordered_map<std::string, std::vector<ir::TensorMeta>>> all(points.size());
  if (points.empty()) return all;
  auto copy = ir::copy_module(gm);
  for (const auto& [name, attr] : gm.attributes()) copy->set_attribute(name, on_meta(attr.first), attr.second);
  std::unordered_map<std::string, std::vector<ir::TensorMeta>>* out = nullptr;  // this point's
  ir::Interpreter interp(*copy);
  interp.override_if([](const ir::Node&) { return true; },
                     [&out](const ir::Node& n, const std::vector<c10::IValue>& args) {
                       std::vector<at::Tensor> results;
                       const bool op = n.has_op() && !n.callable();
                       const bool known = op && known_without_meta_kernel(n.op());
                       bool zeros = known;
                       if (!zeros) {
                         try {
                           results = ir::run_target(n, args);
                         } catch (const c10::Error&) {
                           zeros = true;  // no meta kernel, or these sizes are wrong for the op (below)
                         }
                       }
                       if (zeros && op) {
                         if (auto r = result_on_meta(n.op(), args)) {
                           results = std::move(*r);
                           zeros = false;
                           if (!known) note_without_meta_kernel(n.op());
                         }
                       }
                       if (zeros) {
                         // No meta kernel: run it on zeros of these sizes.
                         std::vector<c10::IValue> real;
                         for (const c10::IValue& a : args) real.push_back(map_tensors(a, zeros_like_strided));
                         results = ir::run_target(n, real);  // throws if the sizes are wrong
                         if (op && !known) note_without_meta_kernel(n.op());
                         for (at::Tensor& t : results) t = on_meta(t);
                       }
                       std::vector<ir::TensorMeta>& metas = (*out)[n.name()];
                       for (const at::Tensor& t : results) metas.push_back(ir::TensorMeta::of(t));
                       return results;
                     });
  for (size_t p = 0; p < points.size(); ++p) {
    std::vector<at::Tensor> args;
    for (const ir::TensorMeta& m : points[p])
      args.push_back(m.defined ? at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(c10::kMeta))
                               : at::Tensor());
    out = &all[p];
    interp.run(std::move(args));
  }
  return all;
}

std::unordered_map<std::string, std::vector<ir::TensorMeta>> metadata_at(const ir::GraphModule& gm,
                                                                       const std::vector<ir::TensorMeta>& inputs) {
  return std::move(metadata_at_points(gm, {inputs}).front());
}

}  // namespace torchcompile::capture
