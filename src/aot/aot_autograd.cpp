// aot_autograd(): the backend wrapper, and the runtime that runs a compiled forward/backward
// pair as one torch::autograd::Function.
#include "aot/aot_internal.h"
#include "backends/verify_text.h"
#include <torchcompile/support/logging.h>

#include <torchcompile/backends/backend.h>

#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <atomic>
#include <optional>

namespace torchcompile {

using aot::JointGraph;
using aot::Partition;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

CompiledFn make_boxed_func(std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn) {
  TORCH_CHECK(fn, "make_boxed_func: empty function");
  return [fn = std::move(fn)](std::vector<at::Tensor> inputs) { return fn(inputs); };
}

namespace aot {
namespace {

// Whether two tensors of one storage have an element byte in common (by the extents of their
// elements; conservative for interleaved strides).
bool memory_overlaps(const at::Tensor& a, const at::Tensor& b) {
  auto extent = [](const at::Tensor& t) {
    int64_t lo = t.storage_offset(), hi = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t span = (t.size(d) - 1) * t.stride(d);
      (span < 0 ? lo : hi) += span;
    }
    const auto item = static_cast<int64_t>(t.itemsize());
    return std::pair{lo * item, (hi + 1) * item};
  };
  const auto [alo, ahi] = extent(a);
  const auto [blo, bhi] = extent(b);
  return alo < bhi && blo < ahi;
}

// Everything a call needs, immutable after compilation and shared by concurrent calls (and by
// autograd graphs still waiting for their backward after the entry was dropped).
struct Runtime : torch::CustomClassHolder {
  std::vector<PrimalSource> primals;
  std::vector<OutputSource> outputs;
  size_t num_fw_outputs = 0;
  std::vector<int> tangent_of_fw_output;
  std::vector<size_t> mutated_primals;
  std::vector<bool> is_mutated;  // per primal
  std::vector<size_t> grad_primals;
  std::vector<bool> gets_grad;  // per primal: in grad_primals
  std::vector<ir::TensorMeta> fw_output_meta;
  size_t num_saved = 0;
  bool training = false;
  bool symbolic = false;  // the graphs have size symbols: fw_output_meta's sizes are the example's
  std::unique_ptr<ir::GraphModule> forward_gm, backward_gm;  // the compiled functions may refer to them
  CompiledFn forward, backward;
  // The captured graph, run by the interpreter on calls the compiled pair does not serve (set
  // only when one may come):
  // - The joint graph was traced with every primal in memory of its own, so the compiled pair is
  //   right only when no primal it updates in place shares memory with another primal (a view
  //   and its base both passed across a graph break; a caller passing a buffer of the module as
  //   an input). In the interpreter the ops see each other's updates through the shared memory
  //   as eager's do. Possible when the forward updates primals.
  // - Outputs that are views of a primal are rebuilt with the strides the primal had when
  //   traced; a call whose primal has other strides (the tensor a previous graph produced laid
  //   out otherwise than in the traced call) is not served. Possible when an output is such a view.
  std::shared_ptr<ir::Interpreter> interpreter;
  mutable std::atomic<bool> told_shared_memory{false}, told_layout{false};

  // This call by the interpreter, saying `why` in the log once (`told`).
  std::vector<at::Tensor> interpret(std::vector<at::Tensor> inputs, std::vector<at::Tensor>& ps, std::atomic<bool>& told,
                                    const char* why) const {
    if (!told.exchange(true))
      TORCHCOMPILE_LOG(logging::LogKind::Graph, "aot_autograd: ", why, "; such calls run the graph with the interpreter");
    for (size_t k = 0; k < ps.size(); ++k)
      if (primals[k].input >= 0) inputs[primals[k].input] = std::move(ps[k]);
    return interpreter->run(std::move(inputs));
  }

  bool aliased_primals_keep_their_layout(const std::vector<at::Tensor>& ps) const {
    for (const OutputSource& o : outputs)
      if (o.alias_primal >= 0 && ps[o.alias_primal].strides() != c10::IntArrayRef(o.primal_strides)) return false;
    return true;
  }

  std::vector<at::Tensor> gather(std::vector<at::Tensor>& inputs) const {
    std::vector<at::Tensor> ps;
    ps.reserve(primals.size());
    for (const PrimalSource& p : primals) ps.push_back(p.input < 0 ? p.tensor : std::move(inputs[p.input]));
    return ps;
  }

  // Copy the forward's new values of mutated primals into the real tensors.
  void write_back(const std::vector<at::Tensor>& ps, std::vector<at::Tensor>& outs) const {
    if (mutated_primals.empty()) return;
    at::NoGradGuard no_grad;
    for (size_t m = 0; m < mutated_primals.size(); ++m) ps[mutated_primals[m]].copy_(outs[num_fw_outputs + m]);
  }

  // Whether a primal updated in place shares memory with another primal.
  bool updated_primal_shares_memory(const std::vector<at::Tensor>& ps) const {
    // Sorted by storage, the only candidates are neighbours with the same storage.
    c10::SmallVector<std::pair<const c10::StorageImpl*, size_t>, 16> by_storage;
    for (size_t k = 0; k < ps.size(); ++k)
      if (ps[k].defined() && ps[k].has_storage() && ps[k].numel() > 0)
        by_storage.emplace_back(ps[k].storage().unsafeGetStorageImpl(), k);
    std::sort(by_storage.begin(), by_storage.end());
    for (size_t first = 0; first < by_storage.size();) {
      size_t last = first + 1;
      while (last < by_storage.size() && by_storage[last].first == by_storage[first].first) ++last;
      for (size_t a = first; a < last; ++a) {
        const size_t ka = by_storage[a].second;
        if (!is_mutated[ka]) continue;
        for (size_t b = first; b < last; ++b)
          if (b != a && memory_overlaps(ps[ka], ps[by_storage[b].second])) return true;
      }
      first = last;
    }
    return false;
  }

  std::vector<at::Tensor> assemble(std::vector<at::Tensor>& graph_outs, const std::vector<at::Tensor>& ps) const {
    std::vector<at::Tensor> result;
    result.reserve(outputs.size());
    for (const OutputSource& o : outputs) {
      if (o.graph_output >= 0) {
        result.push_back(std::move(graph_outs[o.graph_output]));
      } else {
        const at::Tensor& base = ps[o.alias_primal];
        result.push_back(base.as_strided(o.sizes, o.strides, base.storage_offset() + o.storage_offset));
      }
    }
    return result;
  }

  static std::vector<at::Tensor> call(const c10::intrusive_ptr<Runtime>& self, std::vector<at::Tensor> inputs);
};

struct CompiledGraph : torch::autograd::Function<CompiledGraph> {
  // The values the backward graph reads, outs[first_saved...]. Those sharing memory with a
  // primal (or undefined) go through save_for_backward, which checks their versions. Those
  // sharing memory with a result the caller gets (and no primal) are saved as copies: the
  // caller may update that result in place before the backward (the next segment after a graph
  // break does `h.mul_(0.5)`), which eager allows whenever its own autograd saved other tensors
  // (the producing op's inputs), and the backward needs the values of the forward. The others
  // are the forward's private intermediates, which nobody else can reach: they are kept as a
  // plain list that the backward takes over and drops unless the graph is retained, so the
  // backward graph frees each one after its last use (as eager's backward frees each saved
  // tensor once its node has run) instead of all of them at the end.
  static void save_for_backward(AutogradContext* ctx, at::TensorList primals, std::vector<at::Tensor>& outs,
                                size_t first_saved) {
    c10::SmallVector<const c10::StorageImpl*, 32> of_primals, of_results;
    auto storage_of = [](const at::Tensor& t) {
      return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    };
    for (const at::Tensor& t : primals)
      if (auto* s = storage_of(t)) of_primals.push_back(s);
    for (size_t i = 0; i < first_saved; ++i)
      if (auto* s = storage_of(outs[i])) of_results.push_back(s);
    auto in = [](const c10::SmallVector<const c10::StorageImpl*, 32>& v, const c10::StorageImpl* s) {
      return std::find(v.begin(), v.end(), s) != v.end();
    };
    std::vector<at::Tensor> checked;
    c10::List<at::Tensor> own;
    c10::List<bool> is_own;
    for (size_t i = first_saved; i < outs.size(); ++i) {
      const c10::StorageImpl* s = storage_of(outs[i]);
      const bool mine = s != nullptr && !in(of_primals, s);
      is_own.push_back(mine);
      if (mine) {
        own.push_back(in(of_results, s) ? outs[i].detach().clone() : std::move(outs[i]));
      } else {
        checked.push_back(std::move(outs[i]));
      }
    }
    ctx->save_for_backward(checked);
    ctx->saved_data["own"] = std::move(own);
    ctx->saved_data["is_own"] = std::move(is_own);
  }

  static std::vector<at::Tensor> saved_for_backward(AutogradContext* ctx) {
    std::vector<at::Tensor> checked = ctx->get_saved_variables();  // throws on a second backward
    c10::List<at::Tensor> own = ctx->saved_data.at("own").toTensorList();
    const c10::List<bool> is_own = ctx->saved_data.at("is_own").toBoolList();
    const bool keep = torch::autograd::get_current_graph_task_keep_graph();
    if (!keep) ctx->saved_data.erase("own");
    std::vector<at::Tensor> saved;
    saved.reserve(is_own.size());
    for (size_t i = 0, c = 0, o = 0; i < is_own.size(); ++i) {
      if (is_own.get(i)) {
        saved.push_back(keep ? own.get(o) : own.extract(o));
        ++o;
      } else {
        saved.push_back(std::move(checked[c++]));
      }
    }
    return saved;
  }

  static variable_list forward(AutogradContext* ctx, at::TensorList primals, c10::IValue state) {
    const auto& rt = *c10::static_intrusive_pointer_cast<Runtime>(state.toCapsule());
    // Autograd runs this forward with grad mode off, but kernels that consult it must see what
    // they saw when traced (LibTorch 2.x's oneDNN LSTM keeps the workspace its backward needs
    // only with grad mode on): run on detached primals with grad mode on, so no graph is built.
    std::vector<at::Tensor> detached;
    detached.reserve(primals.size());
    for (const at::Tensor& t : primals) detached.push_back(t.defined() ? t.detach() : t);
    std::vector<at::Tensor> outs;
    {
      at::AutoGradMode grad_mode(true);
      outs = rt.forward(std::move(detached));
    }
    rt.write_back(primals.vec(), outs);
    save_for_backward(ctx, primals, outs, rt.num_fw_outputs + rt.mutated_primals.size());
    ctx->saved_data["state"] = std::move(state);
    outs.resize(rt.num_fw_outputs);
    std::vector<at::Tensor> constant;
    for (size_t i = 0; i < outs.size(); ++i)
      if (rt.tangent_of_fw_output[i] < 0) constant.push_back(outs[i]);
    if (!constant.empty()) ctx->mark_non_differentiable(constant);
    if (rt.symbolic) {
      // A missing gradient becomes zeros of the output's sizes in this call.
      c10::List<c10::List<int64_t>> sizes;
      for (const at::Tensor& o : outs) sizes.push_back(c10::List<int64_t>(o.defined() ? o.sizes() : c10::IntArrayRef()));
      ctx->saved_data["output_sizes"] = std::move(sizes);
    }
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "torch::compile: double backward (create_graph=true) through a graph compiled with aot_autograd is "
                "not supported; compile with the 'eager' backend for higher-order gradients");
    const auto& rt = *c10::static_intrusive_pointer_cast<Runtime>(ctx->saved_data["state"].toCapsule());
    std::vector<at::Tensor> inputs = saved_for_backward(ctx);
    inputs.reserve(inputs.size() + grad_outputs.size());
    for (size_t i = 0; i < rt.num_fw_outputs; ++i) {
      if (rt.tangent_of_fw_output[i] < 0) continue;
      at::Tensor& g = grad_outputs[i];
      if (!g.defined()) {
        const ir::TensorMeta& m = rt.fw_output_meta[i];
        const std::vector<int64_t> sizes =
            rt.symbolic ? ctx->saved_data.at("output_sizes").toList().get(i).toIntVector() : m.sizes;
        g = at::zeros(sizes, at::TensorOptions().dtype(m.dtype).device(m.device));
      }
      // The backward graph was traced with contiguous tangents (as AOTAutograd does).
      inputs.push_back(g.contiguous());
      g.reset();
    }
    std::vector<at::Tensor> grads = rt.backward(std::move(inputs));
    TORCH_INTERNAL_ASSERT(grads.size() == rt.grad_primals.size(), "aot_autograd: the backward returned ",
                          grads.size(), " gradients, expected ", rt.grad_primals.size());
    variable_list result(rt.primals.size() + 1);  // the state argument has no gradient
    for (size_t k = 0; k < grads.size(); ++k) result[rt.grad_primals[k]] = std::move(grads[k]);
    return result;
  }
};

std::vector<at::Tensor> Runtime::call(const c10::intrusive_ptr<Runtime>& self, std::vector<at::Tensor> inputs) {
  std::vector<at::Tensor> ps = self->gather(inputs);
  if (!self->mutated_primals.empty() && self->updated_primal_shares_memory(ps))
    return self->interpret(std::move(inputs), ps, self->told_shared_memory,
                           "a tensor the graph updates in place shares memory with another of its inputs or module state");
  if (self->interpreter && !self->aliased_primals_keep_their_layout(ps))
    return self->interpret(std::move(inputs), ps, self->told_layout,
                           "an input of which an output is a view has other strides than when traced");
  std::vector<at::Tensor> outs;
  if (self->training) {
    // A primal that requires grad but gets no gradient from the graph goes in detached: as an
    // input of the Function it would give the Function's node an edge to its history, and the
    // backward would run nodes eager's never reaches (a node without a derivative, such as
    // `_unique`'s, then throws).
    std::vector<at::Tensor> detached;  // ps with those primals detached; made only if there is one
    for (size_t k = 0; k < ps.size(); ++k) {
      if (self->gets_grad[k] || !ps[k].defined() || !ps[k].requires_grad()) continue;
      if (detached.empty()) detached = ps;
      detached[k] = ps[k].detach();
    }
    outs = CompiledGraph::apply(at::TensorList(detached.empty() ? ps : detached), c10::IValue::make_capsule(self));
  } else {
    outs = self->forward(ps);
    self->write_back(ps, outs);
  }
  return self->assemble(outs, ps);
}


}  // namespace

std::vector<at::Tensor> zeros_like_placeholders(const ir::GraphModule& gm) {
  std::vector<at::Tensor> xs;
  for (const ir::Node* p : gm.graph().placeholders()) {
    const ir::TensorMeta& m = p->output_meta().at(0);
    xs.push_back(m.defined ? at::zeros_like(at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(m.device)))
                           : at::Tensor());
  }
  return xs;
}

AotGraphs trace_and_partition(GraphModule& gm, const std::vector<at::Tensor>& example_inputs,
                              const DecompositionTable& decompositions, Partitioner partition) {
  JointGraph joint = build_joint(gm, example_inputs, decompositions);
  Partition part = partition_joint(joint, partition);
  AotGraphs out;
  out.joint = ir::to_text(joint.gm->graph());
  out.forward = ir::to_text(part.forward->graph());
  if (part.backward) out.backward = ir::to_text(part.backward->graph());
  out.report = std::move(part.report);
  return out;
}

}  // namespace aot

namespace aot {
namespace {

// The compiled pair of a joint graph (static, or with size symbols) and its partition.
CompiledFn compile_pair(GraphModule& gm, const std::vector<at::Tensor>& example_inputs, JointGraph joint,
                        Partition part, const Backend& fw_compiler, const Backend& bw_compiler) {
  std::optional<TimedStep> step;
  ir::lint(part.forward->graph());
  if (part.backward) ir::lint(part.backward->graph());
  if (logging::log_enabled(logging::LogKind::Graph)) {
    logging::log(logging::LogKind::Graph, "aot_autograd: joint graph:\n" + ir::to_text(joint.gm->graph()));
    logging::log(logging::LogKind::Graph, "aot_autograd: forward graph:\n" + ir::to_text(part.forward->graph()));
    if (part.backward)
      logging::log(logging::LogKind::Graph, "aot_autograd: backward graph:\n" + ir::to_text(part.backward->graph()));
  }
  auto rt = c10::make_intrusive<Runtime>();
  rt->primals = std::move(joint.primals);
  for (auto& p : rt->primals)
    if (p.input >= 0) p.tensor.reset();  // inputs come with each call; only module state is kept
  rt->outputs = std::move(joint.outputs);
  rt->num_fw_outputs = joint.num_fw_outputs;
  rt->tangent_of_fw_output = std::move(joint.tangent_of_fw_output);
  rt->mutated_primals = std::move(joint.mutated_primals);
  rt->is_mutated.assign(rt->primals.size(), false);
  for (size_t k : rt->mutated_primals) rt->is_mutated[k] = true;
  bool may_interpret = !rt->mutated_primals.empty();
  for (const OutputSource& o : rt->outputs) may_interpret = may_interpret || o.alias_primal >= 0;
  if (may_interpret) rt->interpreter = std::make_shared<ir::Interpreter>(gm);
  rt->grad_primals = std::move(joint.grad_primals);
  rt->gets_grad.assign(rt->primals.size(), false);
  for (size_t k : rt->grad_primals) rt->gets_grad[k] = true;
  rt->training = joint.training;
  rt->num_saved = part.num_saved;
  rt->symbolic = !joint.gm->graph().symbols().empty();
  const ir::Node* out_node = part.forward->graph().output_node();
  for (size_t i = 0; i < rt->num_fw_outputs; ++i) {
    const auto& v = *out_node->args().at(0).list().at(i);
    rt->fw_output_meta.push_back(v.node->output_meta().at(v.index));
  }
  // Forward example inputs: the real primals of the traced call, detached as the forward runs
  // them (CompiledGraph::forward): its kernels need record no autograd graph.
  std::vector<at::Tensor> fw_examples;
  for (const auto& p : rt->primals) {
    const at::Tensor& t = p.input < 0 ? p.tensor : example_inputs.at(p.input);
    fw_examples.push_back(t.defined() ? t.detach() : t);
  }
  // A graph its compiler declines runs with the interpreter (still without autograd inside).
  auto or_interpreter = [](CompiledFn fn, const ir::GraphModule& g, const char* which) {
    std::string why = detail::take_decline_reason();
    if (fn) return fn;
    report_partition(std::string("aot: ") + which + " graph run by the interpreter (its compiler declined" +
                     (why.empty() ? "" : ": " + why) + ")");
    return CompiledFn(ir::interpreter_fn(g));
  };
  rt->forward_gm = std::move(part.forward);
  step.emplace("aot: forward compiler");
  detail::verify_text_round_trip(*rt->forward_gm, fw_examples);
  detail::take_decline_reason();
  rt->forward = or_interpreter(fw_compiler(*rt->forward_gm, fw_examples), *rt->forward_gm, "forward");
  if (rt->training) {
    // Backward example inputs carry the traced metadata (Python passes fake tensors here); the
    // backward runs with grad mode off (no double backward).
    rt->backward_gm = std::move(part.backward);
    step.emplace("aot: backward compiler");
    at::NoGradGuard no_grad;
    const std::vector<at::Tensor> bw_examples = zeros_like_placeholders(*rt->backward_gm);
    detail::verify_text_round_trip(*rt->backward_gm, bw_examples);
    detail::take_decline_reason();
    rt->backward = or_interpreter(bw_compiler(*rt->backward_gm, bw_examples), *rt->backward_gm, "backward");
  }
  return [rt](std::vector<at::Tensor> inputs) { return Runtime::call(rt, std::move(inputs)); };
}

}  // namespace
}  // namespace aot

Backend aot_autograd(Backend fw_compiler, Backend bw_compiler, DecompositionTable decompositions,
                     Partitioner partition) {
  TORCH_CHECK(fw_compiler, "aot_autograd: a forward compiler is required");
  if (!bw_compiler) bw_compiler = fw_compiler;
  Backend static_aot = [fw_compiler, bw_compiler, decompositions,
                        partition](GraphModule& gm, const std::vector<at::Tensor>& example_inputs) -> CompiledFn {
    std::string why;
    if (!aot::liftable(gm, aot::wants_gradients(gm, example_inputs), &why)) {
      // The pipeline runs the graph with the interpreter under autograd.
      return decline("aot_autograd: " + why);
    }
    // The steps below are steps of the compile pipeline: timed into the graph's report and
    // logged with TORCHCOMPILE_LOGS=passes; the partitioned graphs are linted.
    std::optional<TimedStep> step;
    step.emplace("aot: joint graph (functionalized forward and backward)");
    JointGraph joint = aot::build_joint(gm, example_inputs, decompositions);
    if (!joint.decline_reason.empty()) return decline("aot_autograd: " + joint.decline_reason);
    step.emplace("aot: partition");
    Partition part = aot::partition_joint(joint, partition);
    step.reset();
    return aot::compile_pair(gm, example_inputs, std::move(joint), std::move(part), fw_compiler, bw_compiler);
  };
  // A graph with size symbols: one joint graph with the symbols when the joint graphs recorded at
  // other sizes generalize (aot/symbolic_joint.cpp), its forward and backward compiled once;
  // otherwise one joint graph per combination of the symbols' values.
  return [static_aot = std::move(static_aot), fw_compiler = std::move(fw_compiler),
          bw_compiler = std::move(bw_compiler), decompositions = std::move(decompositions),
          partition](GraphModule& gm, const std::vector<at::Tensor>& example_inputs) -> CompiledFn {
    if (gm.graph().symbols().empty()) return static_aot(gm, example_inputs);
    std::string why;
    if (aot::liftable(gm, aot::wants_gradients(gm, example_inputs), &why)) {
      std::optional<TimedStep> step;
      step.emplace("aot: joint graph with size symbols (recorded at 4 sizes)");
      std::optional<JointGraph> joint = aot::build_symbolic_joint(gm, example_inputs, decompositions, why);
      if (joint) {
        step.emplace("aot: partition");
        Partition part = aot::partition_joint(*joint, partition);
        if (!part.lost_symbols) {
          step.reset();
          TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "aot_autograd: one joint graph for every size (",
                           gm.graph().symbols().size(), " size symbols)");
          report_partition("aot: one forward and backward graph for every size (size symbols)");
          return aot::compile_pair(gm, example_inputs, std::move(*joint), std::move(part), fw_compiler, bw_compiler);
        }
        why = "the forward or backward graph cannot bind every size symbol it uses";
      }
      TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "aot_autograd: one joint graph per size: ", why);
    }
    return compile_per_shape(gm, example_inputs, static_aot);
  };
}

}  // namespace torchcompile
