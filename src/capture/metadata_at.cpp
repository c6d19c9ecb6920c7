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

std::unordered_map<std::string, std::vector<ir::TensorMeta>> metadata_at(const ir::GraphModule& gm,
                                                                       const std::vector<ir::TensorMeta>& inputs) {
  auto copy = ir::copy_module(gm);
  for (const auto& [name, attr] : gm.attributes()) copy->set_attribute(name, on_meta(attr.first), attr.second);
  std::unordered_map<std::string, std::vector<ir::TensorMeta>> out;
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
                         if (auto r = pointwise_on_meta(n.op(), args)) {
                           results = {std::move(*r)};
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
                       std::vector<ir::TensorMeta>& metas = out[n.name()];
                       for (const at::Tensor& t : results) metas.push_back(ir::TensorMeta::of(t));
                       return results;
                     });
  std::vector<at::Tensor> args;
  for (const ir::TensorMeta& m : inputs)
    args.push_back(m.defined ? at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(c10::kMeta))
                             : at::Tensor());
  interp.run(std::move(args));
  return out;
}

}  // namespace torchcompile::capture
