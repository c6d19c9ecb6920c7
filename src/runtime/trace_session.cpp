// A trace session (see trace_session.h): the tracer set up for one run of the forward, and the
// recorded segments compiled through the pipeline into a chain of the trace tree.
#include "runtime/trace_session.h"

#include "support/error_text.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/support/logging.h>

#include "capture/observed.h"
#include "compile/pipeline.h"
#include "compile/precision.h"
#include "runtime/dynamic_entry.h"
#include "runtime/guards.h"
#include "runtime/trace_context.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <optional>

namespace torchcompile::runtime {

namespace {

// Declare the module state of `root` (may be null): its uses become get_attr nodes.
void add_module_state(capture::Tracer& tracer, const torch::nn::Module* root) {
  if (root == nullptr) return;
  for (const auto& p : root->named_parameters(/*recurse=*/true))
    tracer.add_attribute(p.key(), p.value(), ir::AttributeKind::Parameter);
  for (const auto& b : root->named_buffers(/*recurse=*/true))
    tracer.add_attribute(b.key(), b.value(), ir::AttributeKind::Buffer);
}

// After a trace (its segments resolved against the observed tensors): the call's
// results and the example inputs the backend compiles with that are observed inputs become the
// inputs themselves, and metadata the forward changed in place on an observed input
// (`unsqueeze_`, `resize_`) is applied to the input (the trace then stays static).
void restore_inputs(const ObservedInputs& observed, const CallArgs& args, TracedRun& t) {
  // An in-place op with grad mode on gave an observed input an autograd history (x.copy_(x + w)):
  // the caller's tensor gets it, as eager would have given it. A forward that made an input a
  // leaf that requires grad would leave the gradients on the observed copy: that runs eagerly.
  for (size_t i = 0; i < observed.inputs.size(); ++i) {
    const at::Tensor &o = observed.inputs[i], &a = args.tensors[i];
    if (!o.defined() || o.unsafeGetTensorImpl() == a.unsafeGetTensorImpl() || !o.requires_grad() || a.requires_grad())
      continue;
    if (o.grad_fn()) {
      torch::autograd::impl::set_gradient_edge(a, torch::autograd::impl::gradient_edge(o));
    } else if (t.failure.empty()) {
      t.failure = "the forward made input tensor " + std::to_string(i) + " require grad (requires_grad_)";
      t.records.clear();
    }
  }
  for (std::vector<at::Tensor>* tensors : {&t.outputs, &t.slots})
    for (at::Tensor& out : *tensors)
      for (size_t i = 0; i < observed.inputs.size(); ++i)
        if (out.defined() && out.unsafeGetTensorImpl() == observed.inputs[i].unsafeGetTensorImpl())
          out = args.tensors[i];
  for (size_t i = 0; i < observed.inputs.size(); ++i) {
    const at::Tensor &o = observed.inputs[i], &a = args.tensors[i];
    if (!o.defined() || o.unsafeGetTensorImpl() == a.unsafeGetTensorImpl()) continue;
    if (o.sizes() == a.sizes() && o.strides() == a.strides() && o.storage_offset() == a.storage_offset() &&
        o.storage().is_alias_of(a.storage()))
      continue;
    c10::TensorImpl* impl = a.unsafeGetTensorImpl();
    if (!o.storage().is_alias_of(a.storage())) impl->set_storage_keep_dtype(o.storage());
    impl->set_sizes_and_strides(o.sizes(), o.strides());
    impl->set_storage_offset(o.storage_offset());
    if (t.unobserved.empty()) t.unobserved = "the forward changed the sizes or strides of input tensor " + std::to_string(i) + " in place";
  }
}

}  // namespace

std::string autograd_reason(const CallArgs& args, const std::vector<std::string>& names, const torch::nn::Module* root) {
  if (!at::GradMode::is_enabled() || c10::InferenceMode::is_enabled()) return "";
  const std::string why = " (size reads are observed only when autograd does not record)";
  for (size_t i = 0; i < args.tensors.size(); ++i)
    if (args.tensors[i].defined() && args.tensors[i].requires_grad())
      return "autograd is recording: input '" + names[i] + "' requires grad" + why;
  if (root != nullptr)
    for (const auto& p : root->named_parameters(/*recurse=*/true))
      if (p.value().requires_grad()) return "autograd is recording: parameter '" + p.key() + "' requires grad" + why;
  return "";
}

ObservedInputs observe_inputs(const CallArgs& args, const std::vector<std::string>& names,
                              const std::vector<Candidate>& candidates, bool autograd_records) {
  ObservedInputs o;
  o.reads = std::make_shared<capture::SizeReads>();
  o.inputs = args.tensors;
  o.autograd_records = autograd_records;
  for (size_t i = 0; i < args.tensors.size(); ++i) {
    const at::Tensor& t = args.tensors[i];
    if (!t.defined() || t.layout() != c10::kStrided || !t.has_storage()) continue;
    std::vector<uint64_t> bits(t.dim(), 0);
    uint64_t all_bits = 0;
    for (size_t k = 0; k < candidates.size(); ++k)
      if (candidates[k].input == i) bits[candidates[k].dim] |= uint64_t{1} << k, all_bits |= uint64_t{1} << k;
    // The same tensor passed twice is observed once, with the candidates of both (on every
    // dimension: conservative).
    bool seen = false;
    for (size_t k = 0; k < i && !seen; ++k) {
      if (!args.tensors[k].defined() || args.tensors[k].unsafeGetTensorImpl() != t.unsafeGetTensorImpl()) continue;
      o.inputs[i] = o.inputs[k];
      if (auto* observed = capture::ObservedTensorImpl::of(o.inputs[k])) observed->add_bits(all_bits);
      seen = true;
    }
    if (seen) continue;
    // An input that requires grad, and while autograd records one that is a view autograd
    // tracks, stays the caller's tensor: a copy of its TensorImpl would lose that. So does one
    // that shares memory with another input: an in-place op through the other (a view of it)
    // would give the caller's tensor, not the copy, a new history. (An in-place op on the copy
    // itself gives it a history, which restore_inputs hands to the caller's tensor.)
    auto unobserved = [&](const std::string& why) {
      if (all_bits != 0 && o.unobserved.empty()) o.unobserved = "input '" + names[i] + "' " + why;
    };
    if (t.requires_grad()) {
      unobserved("requires grad");
      continue;
    }
    if (autograd_records) {
      if (t.unsafeGetTensorImpl()->autograd_meta() != nullptr) {
        unobserved("is known to autograd");
        continue;
      }
      bool shared = false;
      for (size_t k = 0; k < args.tensors.size() && !shared; ++k)
        shared = args.tensors[k].defined() && args.tensors[k].unsafeGetTensorImpl() != t.unsafeGetTensorImpl() &&
                 args.tensors[k].has_storage() && args.tensors[k].storage().is_alias_of(t.storage());
      if (shared) {
        unobserved("shares memory with another input");
        continue;
      }
    }
    o.inputs[i] = capture::ObservedTensorImpl::make(t, o.reads, std::move(bits), "input '" + names[i] + "'");
  }
  return o;
}

TracedRun trace_forward(const CompiledFunction& fn, const GuardSet& guards, const CallArgs& args,
                        const ForwardFn& forward, OutputSpec& spec, const std::vector<std::string>& names,
                        const ObservedInputs* dynamic, bool shapes_only) {
  TracedRun t;
  capture::Tracer tracer(fn.options().fullgraph);
  if (shapes_only) tracer.set_shapes_only();
  // Under a reduced precision the call that traces computes its Linears as the compiled graph will.
  if (!shapes_only && fn.options().precision != Precision::Float32)
    tracer.set_substitute(compile_stage::trace_substitute(fn.options().precision_options(), tracer));
  std::optional<ObservedInputs> observed_here;
  if (!dynamic) observed_here = observe_inputs(args, names, {}, !autograd_reason(args, names, fn.root()).empty());
  const ObservedInputs* observed = dynamic ? dynamic : &*observed_here;
  const std::vector<at::Tensor>& inputs = observed->inputs;
  for (size_t i = 0; i < inputs.size(); ++i) tracer.add_input(inputs[i], names.at(i));
  add_module_state(tracer, fn.root());
  tracer.observe_reads(observed->reads, observed->autograd_records);
  TraceContext context(fn.options(), fn.name(), fn.root());
  {
    // Observed tensors become ordinary ones when the forward ends, however it ends.
    struct EndObservation {
      const ObservedInputs* o;
      ~EndObservation() { o->reads->finish(); }
    } end_observation{observed};
    SubstitutedInputs substituted(&observed->inputs);
    TraceContext::Scope in_context(context);
    capture::Tracer::Activation active(tracer);
    observed->reads->start();
    t.outputs = forward(spec);
  }
  tracer.check_host_writes();
  for (const auto& n : context.modules()) guards.add_hook_module(n.module, n.version, n.path);
  // Undefined results (an empty state passed through) are not graph values: the spec puts
  // them back around the graphs' outputs.
  spec.undefined.clear();
  std::vector<at::Tensor> defined;
  for (size_t i = 0; i < t.outputs.size(); ++i) {
    if (t.outputs[i].defined()) {
      defined.push_back(t.outputs[i]);
    } else {
      spec.undefined.push_back(i);
    }
  }
  if (!tracer.failed()) t.records = capture::finish_segments(tracer, defined);  // may fail on an output
  if (tracer.failed()) {
    t.failure = tracer.failure()->reason;
    t.records.clear();
    TORCHCOMPILE_LOG(logging::LogKind::GraphBreaks, "torch::compile(", fn.name(), "): trace abandoned: ", t.failure);
  }
  t.slots = capture::slot_tensors(tracer);
  if (dynamic) t.unobserved = tracer.unobserved_reason();
  restore_inputs(*observed, args, t);
  return t;
}

std::unique_ptr<Segment> compile_chain(TracedRun& traced, size_t from, const OutputSpec& spec, const Backend& backend,
                                       const std::string& backend_name, const std::string& name,
                                       std::string& failure) {
  // Compile in program order (a debugging backend prints the prefix first), then link.
  std::vector<std::unique_ptr<Segment>> chain;
  for (size_t i = from; i < traced.records.size(); ++i) {
    capture::SegmentRecord& r = traced.records[i];
    auto seg = std::make_unique<Segment>();
    seg->gm = std::shared_ptr<GraphModule>(std::move(r.gm));
    seg->key = ir::GraphKey(seg->gm->graph());
    TORCHCOMPILE_LOG(logging::LogKind::Graph, "torch::compile(", name, "): captured graph:\n", ir::to_text(seg->gm->graph()));
    seg->input_slots = r.input_slots;
    seg->output_slots = r.output_slots;
    seg->effects = effects_of(*seg->gm);
    const std::vector<at::Tensor> example_inputs = capture::example_inputs(r, traced.slots);
    try {
      compile_stage::CompiledGraph compiled = compile_stage::compile_graph(*seg->gm, example_inputs, backend, backend_name, name);
      seg->fn = std::move(compiled.fn);
      seg->report = std::move(compiled.report);
    } catch (const std::exception& e) {
      failure = "backend '" + backend_name + "' failed to compile: " + support::error_message(e);
    }
    if (!failure.empty()) return nullptr;
    if (r.branch) {
      TORCHCOMPILE_LOG(logging::LogKind::GraphBreaks, "torch::compile(", name, "): graph break: data-dependent host read ",
                       ir::op_target_name(r.branch->op), " returned ", capture::key_repr(r.branch->key));
      seg->branch = std::make_unique<BranchPoint>(*r.branch);
    }
    chain.push_back(std::move(seg));
  }
  chain.back()->spec = spec;  // the last segment's outputs are the call's results
  for (size_t i = chain.size() - 1; i-- > 0;) {
    BranchPoint& bp = *chain[i]->branch;
    bp.remember(bp.record.key, chain[i + 1].get());
    bp.children.push_back(std::move(chain[i + 1]));
  }
  return std::move(chain.front());
}

}  // namespace torchcompile::runtime
