// The module call boundary (runtime/module_call.h): hook firing (forward and backward) around a
// module's forward, and what a trace does with a module call (inline it, or keep it as an opaque
// call_module node). The hooks it fires come from the registry below the runtime (src/hooks/).
#include <torchcompile/runtime/module_call.h>

#include <torchcompile/capture/tracer.h>

#include "hooks/hooks_internal.h"
#include "runtime/trace_context.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>

#include <algorithm>

namespace torchcompile::runtime {

// ---- backward hooks ---------------------------------------------------------------------------

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Shared by the two identity functions of one call: the hooks as they were at the call, and
// the grad_output seen by the output side for the input side.
struct BackwardState : torch::CustomClassHolder {
  std::weak_ptr<torch::nn::Module> module;
  std::shared_ptr<const detail::HookSet> hooks;
  size_t num_inputs = 0;
  bool inputs_wrapped = false;
  std::vector<at::Tensor> grad_outputs;

  torch::nn::Module& get() const {
    auto m = module.lock();
    TORCH_CHECK(m != nullptr, "torchcompile: a backward hook's module was destroyed before the backward pass");
    return *m;  // owners keep modules alive during backward in any sensible program
  }
};

c10::intrusive_ptr<BackwardState> state_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<BackwardState>(ctx->saved_data["state"].toCapsule());
}

void check_count(const char* what, const torch::nn::Module& m, size_t got, size_t expected) {
  TORCH_CHECK(got == expected, "torchcompile: a ", what, " of ", module_type_name(m), " returned ", got,
              " tensors; it must return as many as it was given (", expected, ")");
}

void run_backward_hooks(BackwardState& st, std::vector<at::Tensor>& grad_inputs) {
  torch::nn::Module& m = st.get();
  for (const auto& h : st.hooks->backward) {
    auto r = h.fn(m, grad_inputs, st.grad_outputs);
    if (!r) continue;
    check_count("full backward hook", m, r->size(), grad_inputs.size());
    grad_inputs = std::move(*r);
  }
}

// Identity on the tensors a call produced or received; its backward is where the hooks run.
// The state travels as an extra non-tensor argument (its gradient slot is left undefined).
void mark_non_differentiable(AutogradContext* ctx, at::TensorList ts) {
  std::vector<at::Tensor> nd;
  for (const at::Tensor& t : ts)
    if (!t.requires_grad()) nd.push_back(t);
  if (!nd.empty()) ctx->mark_non_differentiable(nd);
}

// The forward shared by both identity functions.
template <typename Derived>
struct IdentityWithHooks : torch::autograd::Function<Derived> {
  static variable_list forward(AutogradContext* ctx, at::TensorList tensors, c10::IValue state) {
    ctx->saved_data["state"] = std::move(state);
    ctx->set_materialize_grads(false);
    mark_non_differentiable(ctx, tensors);
    return tensors.vec();
  }
};

// On the outputs: runs the backward pre-hooks, keeps grad_output for the input side.
struct OutputHookFn : IdentityWithHooks<OutputHookFn> {
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of(ctx);
    torch::nn::Module& m = st->get();
    for (const auto& h : st->hooks->backward_pre) {
      auto r = h.fn(m, grads);
      if (!r) continue;
      check_count("full backward pre-hook", m, r->size(), grads.size());
      grads = std::move(*r);
    }
    st->grad_outputs = grads;
    if (!st->inputs_wrapped && !st->hooks->backward.empty()) {
      // No input requires grad: the hooks see undefined grad_input now (as PyTorch does).
      std::vector<at::Tensor> none(st->num_inputs);
      run_backward_hooks(*st, none);
    }
    grads.emplace_back();  // the state argument
    return grads;
  }
};

// On the inputs: runs the full backward hooks with grad_input and the saved grad_output.
struct InputHookFn : IdentityWithHooks<InputHookFn> {
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of(ctx);
    run_backward_hooks(*st, grads);
    grads.emplace_back();
    return grads;
  }
};

// Apply an identity function to the defined tensors of `ts`, in place.
template <typename Fn>
void wrap(std::vector<at::Tensor>& ts, const c10::intrusive_ptr<BackwardState>& st) {
  std::vector<size_t> where;
  std::vector<at::Tensor> defined;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined()) continue;
    where.push_back(i);
    defined.push_back(ts[i]);
  }
  if (defined.empty()) return;
  variable_list out = Fn::apply(at::TensorList(defined), c10::IValue::make_capsule(st));
  for (size_t k = 0; k < where.size(); ++k) ts[where[k]] = std::move(out[k]);
}

bool any_requires_grad(const std::vector<at::Tensor>& ts) {
  return std::any_of(ts.begin(), ts.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
}

}  // namespace

// ---- hooks around a call -----------------------------------------------------------------------

namespace {

std::vector<at::Tensor> fire(torch::nn::Module& module, const std::shared_ptr<const detail::HookSet>& hooks,
                             std::vector<at::Tensor> inputs, const CallBody& body, OutputSpec& spec) {
  if (!hooks || !hooks->has_call_hooks()) return body(inputs, spec);
  for (const auto& h : hooks->forward_pre) {
    auto r = h.fn(module, inputs);
    if (!r) continue;
    check_count("forward pre-hook", module, r->size(), inputs.size());
    inputs = std::move(*r);
  }
  c10::intrusive_ptr<BackwardState> st;
  if (hooks->has_backward_hooks() && at::GradMode::is_enabled()) {
    st = c10::make_intrusive<BackwardState>();
    st->module = module.weak_from_this();
    st->hooks = hooks;
    st->num_inputs = inputs.size();
    if (!hooks->backward.empty() && any_requires_grad(inputs)) {
      st->inputs_wrapped = true;
      wrap<InputHookFn>(inputs, st);
    }
  }
  std::vector<at::Tensor> outputs;
  try {
    outputs = body(inputs, spec);
  } catch (...) {
    for (const auto& h : hooks->forward)
      if (h.always_call) h.fn(module, inputs, {});
    throw;
  }
  for (const auto& h : hooks->forward) {
    auto r = h.fn(module, inputs, outputs);
    if (!r) continue;
    check_count("forward hook", module, r->size(), outputs.size());
    outputs = std::move(*r);
  }
  if (st && any_requires_grad(outputs)) wrap<OutputHookFn>(outputs, st);
  return outputs;
}

// An opaque module call as a call_module node runs it: the hooks with the real tensors, around
// the module's forward, compiled as a graph of its own unless the module is a leaf.
struct OpaqueCall {
  std::shared_ptr<torch::nn::Module> module;
  CallBody body;
  std::shared_ptr<CompiledFunction> compiled;  // null for a leaf

  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, OutputSpec& spec) const {
    if (!compiled) return run_with_hooks(*module, inputs, body, spec);
    CallBody inner = [this](const std::vector<at::Tensor>& ins, OutputSpec& s) {
      CallArgs ca;
      for (const at::Tensor& t : ins) ca.add(t);
      ForwardFn forward = [&](OutputSpec& s2) {
        const std::vector<at::Tensor>* substituted = take_substituted_inputs();
        return body(substituted ? *substituted : ins, s2);
      };
      return compiled->call(ca, forward, s);
    };
    return run_with_hooks(*module, inputs, inner, spec);
  }
};

}  // namespace

bool call_is_plain(const torch::nn::Module& m) {
  if (capture::Tracer::current() != nullptr) return false;
  auto hooks = detail::hooks_of(m);
  return !hooks || !hooks->has_call_hooks();
}

bool hooks_run_outside(const torch::nn::Module& root) {
  auto hooks = detail::hooks_of(root);
  return hooks && hooks->has_call_hooks() && !hooks->inlinable();
}

std::vector<at::Tensor> run_with_hooks(torch::nn::Module& module, std::vector<at::Tensor> inputs,
                                       const CallBody& body, OutputSpec& spec) {
  return fire(module, detail::hooks_of(module), std::move(inputs), body, spec);
}

std::vector<at::Tensor> call_module(const std::shared_ptr<torch::nn::Module>& module, std::vector<at::Tensor> inputs,
                                    const CallBody& body, OutputSpec& spec) {
  torch::nn::Module& m = *module;
  capture::Tracer* tracer = capture::Tracer::current();
  auto hooks = detail::hooks_of(m);
  if (tracer == nullptr || !tracer->following()) return fire(m, hooks, std::move(inputs), body, spec);

  TraceContext* ctx = TraceContext::current();
  const std::string path = ctx ? ctx->path_of(m) : module_type_name(m);
  if (ctx) ctx->note(module, hooks ? detail::hook_version(m) : 0, path);

  if (!hooks || hooks->inlinable()) {
    // Inline: the forward's ops (and the traceable hooks') are recorded under its path.
    tracer->push_module_path(path);
    if (ctx) ctx->push(m, path);
    struct Pop {
      capture::Tracer* t;
      TraceContext* c;
      ~Pop() {
        t->pop_module_path();
        if (c) c->pop();
      }
    } pop{tracer, ctx};
    return fire(m, hooks, std::move(inputs), body, spec);
  }

  const std::string node_path = path.empty() ? module_type_name(m) : path;
  TORCH_CHECK(hooks->leaf || !ctx || !ctx->options().fullgraph, "torch::compile(fullgraph=true): module '",
              node_path, "' has hooks that cannot be inlined (", hooks->summary(),
              "); its call would split the graph. Register forward hooks with HookOptions().traceable() if they "
              "only transform tensors, or compile without fullgraph");
  auto call = std::make_shared<OpaqueCall>();
  call->module = module;
  call->body = body;
  if (!hooks->leaf && ctx) {
    CompileOptions child = ctx->options();
    child.input_names.clear();
    call->compiled = std::make_shared<CompiledFunction>(child, module, ctx->name() + "." + node_path);
  }
  std::vector<at::Tensor> outs;
  tracer->before_module_call(inputs);
  {
    capture::Tracer::Suspension off;
    outs = call->run(inputs, spec);
  }
  tracer->record_module_call(node_path, inputs, outs,
                             [call](const std::vector<at::Tensor>& ins) {
                               OutputSpec s;
                               return call->run(ins, s);
                             });
  return outs;
}

}  // namespace torchcompile::runtime
