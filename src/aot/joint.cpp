// The joint graph: the captured graph re-run under functionalization with the below-autograd
// tracer, parameters lifted to primals, and autograd asked for the primals' gradients.
#include "aot/aot_internal.h"
#include "support/rng_state_guard.h"
#include "support/strided_copy.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/compat.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_properties.h>

#include "ir/effects.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/TensorUtils.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::aot {

namespace fz = at::functionalization::impl;

namespace {

using support::RngStateGuard;

at::Tensor unwrap(const at::Tensor& t) {
  if (!fz::isFunctionalTensor(t)) return t;  // made by a factory op from no functional input
  fz::sync(t);
  return fz::from_functional_tensor(t);
}

// `native_batch_norm` (LibTorch 1.13, and 2.6 on CPU) updates the running statistics without
// declaring it in its schema (`Tensor? running_mean`, not `Tensor(a!)?`); 2.x's
// `_native_batch_norm_legit` declares it, and functionalization handles that one itself.
bool hides_running_stat_update(const c10::OperatorHandle& op) {
  if (op.schema().name() != "aten::native_batch_norm") return false;
  const auto& args = op.schema().arguments();
  return args.size() > 4 && args[3].name() == "running_mean" &&
         (args[3].alias_info() == nullptr || !args[3].alias_info()->isWrite());
}

// Such a native_batch_norm updates the running statistics without saying so in its
// schema, so functionalization cannot turn that into new values: run it without running stats
// (recorded as a pure op) and record the update as ops, then point the buffers' functional
// wrappers at the new values, exactly as functionalization does for a declared mutation.
// The update is eager's: running = (1 - momentum) * running + momentum * batch statistic, with
// the unbiased variance (recovered from the saved inverse standard deviation).
bool batch_norm_with_functional_update(torch::jit::Stack* stack,
                                       std::unordered_map<const c10::TensorImpl*, at::Tensor>& wrapper_of) {
  const size_t n = stack->size();
  const c10::IValue& training = (*stack)[n - 3];
  const c10::IValue& running_mean = (*stack)[n - 5];
  if (!training.toBool() || running_mean.isNone() || !running_mean.toTensor().defined()) return false;
  at::Tensor input = (*stack)[n - 8].toTensor();
  c10::optional<at::Tensor> weight = (*stack)[n - 7].toOptional<at::Tensor>();
  c10::optional<at::Tensor> bias = (*stack)[n - 6].toOptional<at::Tensor>();
  at::Tensor rm = running_mean.toTensor();
  at::Tensor rv = (*stack)[n - 4].toTensor();
  const double momentum = (*stack)[n - 2].toDouble();
  const double eps = (*stack)[n - 1].toDouble();
  auto wm = wrapper_of.find(rm.unsafeGetTensorImpl());
  auto wv = wrapper_of.find(rv.unsafeGetTensorImpl());
  TORCH_CHECK(wm != wrapper_of.end() && wv != wrapper_of.end(),
              "aot_autograd: training-mode batch norm whose running statistics are not module buffers");
  torch::jit::drop(*stack, 8);
  auto [out, mean, invstd] = at::native_batch_norm(input, weight, bias, {}, {}, true, momentum, eps);
  const double count = static_cast<double>(input.numel() / input.size(1));
  at::Tensor biased_var = at::sub(at::pow(invstd, -2), eps);
  at::Tensor new_mean = at::add(at::mul(rm, 1.0 - momentum), at::mul(mean, momentum));
  at::Tensor new_var =
      at::add(at::mul(rv, 1.0 - momentum), at::mul(biased_var, momentum * count / std::max(count - 1.0, 1.0)));
  const at::Tensor mean_wrapper = wm->second, var_wrapper = wv->second;
  wrapper_of.erase(rm.unsafeGetTensorImpl());
  wrapper_of.erase(rv.unsafeGetTensorImpl());
  for (const auto& [wrapper, value] : {std::pair{mean_wrapper, new_mean}, std::pair{var_wrapper, new_var}}) {
    fz::replace_(wrapper, value);
    fz::commit_update(wrapper);
    wrapper_of.emplace(value.unsafeGetTensorImpl(), wrapper);
  }
  stack->emplace_back(std::move(out));
  stack->emplace_back(std::move(mean));
  stack->emplace_back(std::move(invstd));
  return true;
}

// LibTorch's functionalization gives a view updated in place (`x.narrow(1, 2, 6).mul_(0.5)`)
// the strides of the functional op's result, which is contiguous, so a later `reshape` of that
// view is traced as `_reshape_alias` with contiguous strides. When functionalization then
// regenerates the view from its updated base, it replays that alias on the view's real layout,
// where (ATen does not check `_reshape_alias`'s strides) it reads the wrong elements: the graph
// computes a wrong result on every call. An alias whose strides the input's layout does not give
// is run, and recorded, as the copy `reshape` makes when no view is possible: a contiguous clone,
// then `_unsafe_view`.
bool is_reshape_alias(const c10::OperatorHandle& op) { return op.schema().name() == "aten::_reshape_alias"; }

bool reshape_alias_as_copy(torch::jit::Stack* stack) {
  const size_t n = stack->size();
  const at::Tensor self = (*stack)[n - 3].toTensor();
  const std::vector<int64_t> size = (*stack)[n - 2].toIntVector();
  const std::vector<int64_t> stride = (*stack)[n - 1].toIntVector();
  const auto viewed = at::detail::computeStride(self.sizes(), self.strides(), at::DimVector(size.begin(), size.end()));
  bool same = viewed.has_value();
  for (size_t d = 0; same && d < size.size(); ++d) same = size[d] == 1 || (*viewed)[d] == stride[d];
  if (same) return false;
  torch::jit::drop(*stack, 3);
  stack->emplace_back(at::_unsafe_view(self.clone(at::MemoryFormat::Contiguous), size));
  return true;
}

}  // namespace

namespace {

bool is_contiguous(const ir::TensorMeta& m) {
  int64_t expected = 1;
  for (size_t d = m.sizes.size(); d-- > 0;) {
    if (m.sizes[d] != 1 && m.strides[d] != expected) return false;
    expected *= m.sizes[d];
  }
  return true;
}

}  // namespace

bool liftable(const ir::GraphModule& gm, bool training, std::string* why) {
  if constexpr (compat::kFunctionalDetachOfViewLosesTheView) {
    const ir::Node* detach_of_view = nullptr;
    bool updates = false;
    for (const auto& n : gm.graph().nodes()) {
      if (n->kind() != ir::NodeKind::CallFunction) continue;
      updates = updates || !ir::written_arguments(*n).empty();
      if (!detach_of_view && n->schema().name() == "aten::detach" && n->args().at(0).is_value() &&
          ir::is_view_node(n->args()[0].value().node))
        detach_of_view = n.get();
    }
    if (detach_of_view && updates) {
      if (why)
        *why = "the graph detaches a view ('" + detach_of_view->name() +
               "') and updates tensors in place, which LibTorch 1.13's functionalization gets wrong";
      return false;
    }
  }
  if (training) {
    // The compiled pair runs as one autograd Function, whose outputs autograd may not update in
    // place when they are views (it cannot rebase the custom backward). Eager allows it, so a
    // graph returning a view of one of its own results (`y.view(...)`, `y.narrow(...)`) runs
    // under ordinary autograd. (Views of inputs are rebuilt outside the Function.)
    for (const auto& out : gm.graph().output_node()->args().at(0).list()) {
      if (!out) continue;
      bool through_view = false;
      ir::Value v = *out;
      while (v.node->kind() == ir::NodeKind::CallFunction) {
        const auto& returns = v.node->schema().returns();
        const size_t r = returns.size() == 1 ? 0 : v.index;
        if (r >= returns.size() || returns[r].alias_info() == nullptr) break;
        through_view = through_view || !returns[r].alias_info()->isWrite();
        const auto& schema_args = v.node->schema().arguments();
        size_t i = 0;
        while (i < schema_args.size() && !(schema_args[i].alias_info() != nullptr && v.node->args()[i].is_value())) ++i;
        if (i == schema_args.size()) break;
        v = v.node->args()[i].value();  // one step back along the alias chain, as memory_base walks
      }
      if (through_view && v.node->kind() == ir::NodeKind::CallFunction) {
        if (why)
          *why = "output '" + out->node->name() + "' is a view of the intermediate '" + v.node->name() +
                 "', which callers may update in place";
        return false;
      }
    }
  }
  for (const auto& n : gm.graph().nodes()) {
    if (n->kind() == ir::NodeKind::CallModule) {
      if (why) *why = "the graph calls module '" + n->target() + "' opaquely (call_module)";
      return false;
    }
    if (!training || n->kind() != ir::NodeKind::CallFunction || !ir::op_is_mutating(n->op())) continue;
    // Autograd replays an in-place op on a view with the view's geometry (as_strided), which
    // functionalization has replaced by that of the op's result (contiguous, offset 0): unless
    // the view is the whole base reshaped, the gradient would be silently wrong.
    const auto& schema_args = n->schema().arguments();
    for (size_t i = 0; i < schema_args.size(); ++i) {
      const auto* alias = schema_args[i].alias_info();
      if (alias == nullptr || !alias->isWrite() || !n->args()[i].is_value()) continue;
      for (ir::Value v = n->args()[i].value(); ir::is_view_node(v.node);) {
        if (!ir::node_properties(*v.node).whole_view || !is_contiguous(v.node->output_meta().at(v.index))) {
          if (why)
            *why = "the forward updates a view in place (" + n->target() + " on '" + v.node->name() +
                   "'), which LibTorch's functionalization cannot differentiate";
          return false;
        }
        ir::Value base;
        for (const auto& a : v.node->args())
          if (a.is_value()) {
            base = a.value();
            break;
          }
        if (!base.valid()) break;
        v = base;
      }
    }
  }
  return true;
}

namespace {
// "input 2" or "'fc.weight'", for messages.
std::string primal_name(const PrimalSource& p) {
  return p.input < 0 ? "'" + p.attribute + "'" : "input " + std::to_string(p.input);
}
}  // namespace

bool wants_gradients(const ir::GraphModule& gm, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  for (const auto& [name, attr] : gm.attributes())
    if (attr.first.requires_grad()) return true;
  return false;
}

JointGraph build_joint(const ir::GraphModule& gm, const std::vector<at::Tensor>& example_inputs,
                       const DecompositionTable& decompositions) {
  const ir::Graph& g = gm.graph();
  const auto placeholders = g.placeholders();
  TORCH_CHECK(example_inputs.size() == placeholders.size(), "aot_autograd: the graph has ", placeholders.size(),
              " inputs but ", example_inputs.size(), " example inputs were given");

  JointGraph j;
  // Primals: module state in the order the graph reads it, then the inputs. A constant that
  // requires grad (a parameter the forward reached without it being module state: a module
  // captured by a lambda) is lifted too, so that its gradient flows, and so is one the graph
  // updates in place (a tensor captured by a lambda that the forward accumulates into), so that
  // the update is written back.
  const std::vector<std::string> written = ir::effects_of(gm).written_attributes;
  auto is_written = [&](const std::string& name) {
    return std::find(written.begin(), written.end(), name) != written.end();
  };
  std::unordered_set<std::string> lifted;
  for (const auto& n : g.nodes()) {
    if (n->kind() != ir::NodeKind::GetAttr) continue;
    const at::Tensor& t = gm.attribute(n->target());
    if (gm.attribute_kind(n->target()) == ir::AttributeKind::Constant && !t.requires_grad() && !is_written(n->target()))
      continue;
    if (!lifted.insert(n->target()).second) continue;
    j.primals.push_back({-1, n->target(), t, t.requires_grad()});
  }
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    const at::Tensor& t = example_inputs[i];
    j.primals.push_back({static_cast<int>(i), "", t, t.defined() && t.requires_grad()});
  }
  bool any_requires_grad = false;
  for (const auto& p : j.primals) any_requires_grad |= p.requires_grad;
  const bool want_grads = at::GradMode::is_enabled() && any_requires_grad;
  std::string why;
  TORCH_CHECK(liftable(gm, want_grads, &why), "aot_autograd: ", why);
  if (want_grads) {
    // An input that requires grad (an activation a previous graph returned) updated in place:
    // eager records the update in its autograd history; the pair's write-back (a plain copy)
    // would not, and its gradient would miss the update.
    for (size_t i : ir::effects_of(gm).written_inputs) {
      const at::Tensor& t = example_inputs.at(i);
      if (t.defined() && t.requires_grad()) {
        j.decline_reason = "the forward updates input " + std::to_string(i) +
                           " in place although it requires grad; the interpreter runs it under autograd";
        return j;
      }
    }
  }

  RngStateGuard rng;
  capture::Tracer tracer(/*fullgraph=*/true, capture::TraceLevel::BelowAutograd);
  fz::FunctionalizationReapplyViewsGuard reapply_views(true);

  // Functional wrappers over copies of the primals: the trace computes real values without
  // touching the real tensors.
  const size_t np = j.primals.size();
  std::vector<at::Tensor> inner(np), wrapped(np);
  std::unordered_map<const c10::TensorImpl*, at::Tensor> wrapper_of;
  for (size_t k = 0; k < np; ++k) {
    const at::Tensor& t = j.primals[k].tensor;
    const std::string name = "primals_" + std::to_string(k + 1);
    if (!t.defined()) {
      tracer.add_input(at::Tensor(), name);
      continue;
    }
    // A copy with the primal's strides: the trace's views and reshapes (which may alias or copy,
    // by the strides) must be those of the real tensor.
    inner[k] = support::strided_copy(t);
    if (inner[k].strides() != t.strides()) {
      // An input that overlaps itself (expanded): the trace on a copy would record the copy's
      // views, which are not the real tensor's.
      j.decline_reason = "the memory layout of " + primal_name(j.primals[k]) + " (strides " + c10::str(t.strides()) +
                         ") cannot be reproduced for tracing";
      return j;
    }
    tracer.add_input(inner[k], name);
    wrapped[k] = fz::to_functional_tensor(inner[k]);
    if (want_grads && t.requires_grad()) wrapped[k].requires_grad_(true);
    wrapper_of.emplace(inner[k].unsafeGetTensorImpl(), wrapped[k]);
  }

  tracer.set_interceptor([&](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    if (!decompositions.empty()) {
      if (const Decomposition* d = decompositions.find(ir::op_target_name(op))) {
        const size_t num_args = op.schema().arguments().size();
        std::vector<c10::IValue> args(stack->end() - num_args, stack->end());
        torch::jit::drop(*stack, num_args);
        std::vector<c10::IValue> results = (*d)(args);
        TORCH_CHECK(results.size() == op.schema().returns().size(), "decomposition of ", ir::op_target_name(op),
                    " returned ", results.size(), " values; the operator returns ", op.schema().returns().size());
        for (auto& r : results) stack->push_back(std::move(r));
        return true;
      }
    }
    if (hides_running_stat_update(op)) return batch_norm_with_functional_update(stack, wrapper_of);
    if (is_reshape_alias(op)) return reshape_alias_as_copy(stack);
    return false;
  });

  // The captured graph with its module state replaced by the wrappers, and its constants
  // wrapped too (over the constants themselves, which functionalization never writes): an op
  // on a plain tensor would run unfunctionalized, and an in-place update of its result (a copy
  // of a constant, then `mul_` on a view of it) would be a side effect the partitioner drops.
  ir::GraphModule lifted_gm(gm.shared_graph());
  for (const auto& [name, attr] : gm.attributes()) {
    const bool wrap = attr.second == ir::AttributeKind::Constant && attr.first.defined() && !lifted.count(name);
    lifted_gm.set_attribute(name, wrap ? fz::to_functional_tensor(attr.first) : attr.first, attr.second);
  }
  for (size_t k = 0; k < np; ++k)
    if (j.primals[k].input < 0) lifted_gm.set_attribute(j.primals[k].attribute, wrapped[k], gm.attribute_kind(j.primals[k].attribute));
  std::vector<at::Tensor> graph_inputs;
  for (size_t k = 0; k < np; ++k)
    if (j.primals[k].input >= 0) graph_inputs.push_back(wrapped[k]);

  std::vector<at::Tensor> joint_outputs;
  {
    capture::Tracer::Activation active(tracer);
    at::AutoGradMode grad_mode(want_grads);
    std::vector<at::Tensor> outs;
    {
      // Functionalization is on for every op, as Python's AOT enables it: a tensor made by a
      // factory op (`zeros`, then `add_`) is a functional tensor too.
      c10::impl::IncludeDispatchKeyGuard functionalize(c10::DispatchKey::Functionalize);
      outs = ir::Interpreter(lifted_gm).run(std::move(graph_inputs));
    }

    // Outputs that are views of a primal are rebuilt as views on each call, not computed.
    std::vector<at::Tensor> differentiable, tangents;
    for (const at::Tensor& out : outs) {
      OutputSource src;
      for (size_t k = 0; k < np && out.defined(); ++k) {
        if (!wrapped[k].defined() || !out.is_alias_of(wrapped[k])) continue;
        src.alias_primal = static_cast<int>(k);
        src.primal_strides = inner[k].strides().vec();
        // An in-place op's result on a primal laid out otherwise than its new value (`mul_` on a
        // narrowed input): functionalization gave the primal the new value's layout, so a view's
        // metadata is not that of a view of the caller's tensor.
        const bool relaid = wrapped[k].sizes() != inner[k].sizes() || wrapped[k].strides() != inner[k].strides();
        if (relaid && out.is_same(wrapped[k]) && wrapped[k].sizes() == inner[k].sizes()) {
          // The primal itself, as the caller passed it.
          src.sizes = inner[k].sizes().vec();
          src.strides = inner[k].strides().vec();
          src.storage_offset = 0;
          break;
        }
        if (relaid && j.decline_reason.empty())
          j.decline_reason = "an output is a view of " + primal_name(j.primals[k]) +
                             ", which the forward updates in place with results laid out otherwise";
        src.sizes = out.sizes().vec();
        src.strides = out.strides().vec();
        src.storage_offset = out.storage_offset() - inner[k].storage_offset();
        break;
      }
      if (src.alias_primal < 0) {
        src.graph_output = static_cast<int>(j.num_fw_outputs++);
        int tangent = -1;
        if (want_grads && out.requires_grad()) {
          tangent = static_cast<int>(j.num_tangents++);
          at::Tensor t;
          {
            capture::Tracer::Suspension untraced(capture::TraceLevel::BelowAutograd);
            at::NoGradGuard no_grad;
            t = at::ones(out.sizes(), out.options().requires_grad(false));
          }
          tracer.add_input(t, "tangents_" + std::to_string(j.num_tangents));
          differentiable.push_back(out);
          tangents.push_back(fz::to_functional_tensor(t));
        }
        j.tangent_of_fw_output.push_back(tangent);
        joint_outputs.push_back(out);
      }
      j.outputs.push_back(std::move(src));
    }

    std::vector<at::Tensor> grads;
    std::vector<size_t> grad_of;
    if (!differentiable.empty()) {
      std::vector<at::Tensor> wanted;
      for (size_t k = 0; k < np; ++k) {
        if (wrapped[k].defined() && wrapped[k].requires_grad()) {
          wanted.push_back(wrapped[k]);
          grad_of.push_back(k);
        }
      }
      grads = torch::autograd::grad(differentiable, wanted, tangents, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    for (at::Tensor& out : joint_outputs) out = unwrap(out);
    for (size_t k = 0; k < np; ++k) {
      if (!wrapped[k].defined()) continue;
      at::Tensor now = unwrap(wrapped[k]);
      if (now.unsafeGetTensorImpl() == inner[k].unsafeGetTensorImpl()) continue;
      if (want_grads && j.primals[k].requires_grad && j.decline_reason.empty()) {
        // An input that requires grad (an activation a previous graph returned) updated in place:
        // eager records the update in its autograd history; the pair's write-back (a plain copy)
        // would not, and its gradient would miss the update.
        j.decline_reason = "the forward updates " + primal_name(j.primals[k]) +
                           " in place although it requires grad; the interpreter runs it under autograd";
      }
      if (want_grads && !j.primals[k].requires_grad && wrapped[k].requires_grad() && j.decline_reason.empty()) {
        // The written value requires grad (`x.copy_(x + w)` into an input that does not): eager
        // gives the input an autograd history, the pair's write-back (a plain copy) would not.
        j.decline_reason = "the forward writes a value that requires grad into " + primal_name(j.primals[k]) +
                           ", which does not require grad; the interpreter runs it under autograd";
      }
      j.mutated_primals.push_back(k);
      joint_outputs.push_back(now);
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      j.grad_primals.push_back(grad_of[i]);
      joint_outputs.push_back(unwrap(grads[i]));
    }
    j.training = !j.grad_primals.empty();
  }
  TORCH_CHECK(!tracer.failed(), "aot_autograd: tracing the joint graph failed: ", tracer.failure()->reason);
  j.gm = tracer.finish(joint_outputs);
  TORCH_CHECK(j.gm, "aot_autograd: tracing the joint graph failed: ",
              tracer.failed() ? tracer.failure()->reason : std::string("no graph"));
  return j;
}

}  // namespace torchcompile::aot
