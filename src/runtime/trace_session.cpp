// A trace session (see trace_session.h): the tracer set up for one run of the forward, and the
// recorded segments compiled through the pipeline into a chain of the trace tree.
#include "runtime/trace_session.h"

#include "support/error_text.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/support/logging.h>

#include "capture/observed.h"
#include "compile/pipeline.h"
#include "runtime/guards.h"
#include "runtime/trace_context.h"

#include <torch/nn/module.h>

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

// After a dynamic trace (its segments resolved against the observed tensors): the call's
// results and the example inputs the backend compiles with that are observed inputs become the
// inputs themselves, and metadata the forward changed in place on an observed input
// (`unsqueeze_`, `resize_`) is applied to the input (the trace then stays static).
void restore_inputs(const ObservedInputs& observed, const CallArgs& args, TracedRun& t) {
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

TracedRun trace_forward(const CompiledFunction& fn, const GuardSet& guards, const CallArgs& args,
                        const ForwardFn& forward, OutputSpec& spec, const std::vector<std::string>& names,
                        const ObservedInputs* observed) {
  TracedRun t;
  capture::Tracer tracer(fn.options().fullgraph);
  const std::vector<at::Tensor>& inputs = observed ? observed->inputs : args.tensors;
  for (size_t i = 0; i < inputs.size(); ++i) tracer.add_input(inputs[i], names.at(i));
  add_module_state(tracer, fn.root());
  if (observed) tracer.observe_sizes(observed->reads);
  TraceContext context(fn.options(), fn.name(), fn.root());
  {
    // Observed tensors become ordinary ones when the forward ends, however it ends.
    struct EndObservation {
      const ObservedInputs* o;
      ~EndObservation() {
        if (o) o->reads->finish();
      }
    } end_observation{observed};
    SubstitutedInputs substituted(observed ? &observed->inputs : nullptr);
    TraceContext::Scope in_context(context);
    capture::Tracer::Activation active(tracer);
    if (observed) observed->reads->start();
    t.outputs = forward(spec);
  }
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
  if (observed) {
    t.unobserved = tracer.unobserved_reason();
    restore_inputs(*observed, args, t);
  }
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
    std::vector<at::Tensor> example_inputs;
    for (uint32_t s : seg->input_slots) example_inputs.push_back(traced.slots.at(s));
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
