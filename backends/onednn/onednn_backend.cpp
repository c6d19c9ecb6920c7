// The onednn backend's entry points: compile (match, then build the program), claim (the nodes
// `default` gives it), the registered backend and its report, and the introspection functions of
// onednn_backend.h. What the backend matches and how it runs: onednn_backend.h; where each part
// of the compiler is: onednn_internal.h.
#include "onednn_internal.h"

#include <torchcompile/compile/partitioner.h>
#include <torchcompile/ir/split.h>
#include <torchcompile/support/logging.h>

#include <ATen/Parallel.h>

#include <map>
#include <mutex>

namespace torchcompile::backends {

namespace onednn {

using namespace detail;

namespace {

// Every decline of compile(): torchcompile::decline records the reason for the pipeline
// (explain(), the logs) and gives the empty function; `reason` keeps it for compile()'s callers.
Compiled declined(std::string reason) {
  Compiled result;
  result.reason = reason;
  result.fn = decline(std::move(reason));
  return result;
}

Compiled compile_error(const std::exception& e) {
  TORCH_WARN("onednn backend: cannot compile the graph (", e.what(), "); declining it");
  return declined(std::string("compile error: ") + e.what());
}

}  // namespace

namespace {

// oneDNN's primitives fix their number of threads when they are created (the intra-op count of
// the creating thread: at::get_num_threads()), and run with that many whatever LibTorch's count is
// later. So a program serves the count it was built with; a call made with another count (after
// at::set_num_threads, or from a thread whose count differs) runs a program built for that count,
// made from the same graph at its first such call and kept.
struct ProgramsByThreads {
  int threads = 0;
  std::shared_ptr<Program> first;
  std::mutex mutex;
  std::map<int, std::shared_ptr<Program>> others;
};

CompiledFn for_thread_counts(GraphModule& gm, bool vary_rows, int64_t weight_bytes, const ScanKernels& scan,
                             std::shared_ptr<Program> prog) {
  auto state = std::make_shared<ProgramsByThreads>();
  state->threads = at::get_num_threads();
  state->first = std::move(prog);
  GraphModule* graph = &gm;  // lives as long as the compiled function (the backend contract)
  const ScanKernels* kernels = &scan;
  return [state, graph, vary_rows, weight_bytes, kernels](std::vector<at::Tensor> inputs) {
    const int threads = at::get_num_threads();
    if (C10_LIKELY(threads == state->threads)) return state->first->run(std::move(inputs));
    std::shared_ptr<Program> prog;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      auto& slot = state->others[threads];
      if (!slot) {
        TORCHCOMPILE_LOG(logging::LogKind::Recompiles, "onednn: rebuilding a program's primitives for ", threads,
                         " intra-op thread(s) (built for ", state->threads, ")");
        Compiler c(*graph);
        if (vary_rows) c.vary_rows();
        c.set_weight_bytes(weight_bytes);
        c.match();
        slot = c.build(*kernels);
      }
      prog = slot;
    }
    return prog->run(std::move(inputs));
  };
}

// `weight_bytes`: Compiler::set_weight_bytes, where not this compile's graph_weight_bytes (< 0).
Compiled compile_graph(GraphModule& gm, const std::vector<at::Tensor>& example_inputs, bool vary_rows,
                       int64_t weight_bytes = -1) {
  if (needs_autograd(gm, example_inputs)) return declined(kNeedsAutogradReason);
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == NodeKind::CallModule) return declined("the graph has call_module nodes");
  if (vary_rows && gm.graph().has_size_expressions())
    return declined("an argument is an expression of the size symbols");
  std::unique_ptr<Compiler> c;
  try {
    c = std::make_unique<Compiler>(gm);
    if (vary_rows) c->vary_rows();
    if (weight_bytes >= 0) c->set_weight_bytes(weight_bytes);
    c->match();
  } catch (const std::exception& e) {
    return compile_error(e);
  }
  if (c->num_groups() == 0) return declined("nothing to fuse");
  if (!c->rows_obstacle().empty()) return declined("not one program for every size: " + c->rows_obstacle());
  // As for the fused backend's kernels, an unknown or unsupported TORCHCOMPILE_ISA is an error
  // (thrown to the pipeline), not a decline.
  const ScanKernels& scan = selected_scan();
  Compiled result;
  try {
    std::shared_ptr<Program> prog = c->build(scan);
    if (c->fused().empty()) return declined("oneDNN accepted no fused primitive");
    result.fused = c->fused();
    result.blocked_values = c->blocked_values();
    result.winograd_convs = c->winograd_convs();
    result.scan_isa = scan.name;
    result.impls = c->impls();
    for (const auto& step : prog->steps) {
      result.aten_ops += dynamic_cast<const AtenStep*>(step.get()) != nullptr;
      const auto* mm = dynamic_cast<const MatmulStep*>(step.get());
      result.rows_gemms += mm && mm->rows_k;
    }
    result.fn = for_thread_counts(gm, vary_rows, c->weight_bytes(), scan, std::move(prog));
  } catch (const std::exception& e) {
    return compile_error(e);
  }
  return result;
}

}  // namespace

Compiled compile(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  return compile_graph(gm, example_inputs, /*vary_rows=*/false);
}

Compiled compile_rows(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  return compile_graph(gm, example_inputs, /*vary_rows=*/true);
}

std::unordered_set<const Node*> claim(const GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  if (needs_autograd(gm, example_inputs)) {
    decline(kNeedsAutogradReason);
    return {};
  }
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == NodeKind::CallModule) return {};
  Compiler c(const_cast<GraphModule&>(gm));  // matching reads the graph only
  c.match();
  return c.group_nodes();
}

bool winograd_available() {
  static const bool available = [] {
    try {
      const md_t src({1, 16, 16, 16}, dt::f32, tag::any), wei({16, 16, 3, 3}, dt::f32, tag::any);
      auto pd = compat::conv_forward_pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::convolution_winograd, src, wei, md_t(), src, {1, 1}, {0, 0},
                                        {1, 1}, {1, 1}, dnnl::primitive_attr());
      return !is_ref_impl(pd.impl_info_str());
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

const char* scan_isa() { return selected_scan().name; }

bool scan_finds(const float* p, size_t n, bool or_infinity) {
  return selected_scan().magnitude_above(p, n, or_infinity ? kNonFiniteAbove : kNanAbove);
}

}  // namespace onednn

namespace {

void report(const onednn::Compiled& c) {
  for (const auto& f : c.fused) report_partition("onednn: " + f);
  if (c.winograd_convs) report_partition("onednn: " + std::to_string(c.winograd_convs) + " conv(s) with the Winograd algorithm");
  if (c.blocked_values) report_partition("onednn: " + std::to_string(c.blocked_values) + " value(s) kept in blocked layout");
  if (c.aten_ops) report_partition("aten: " + std::to_string(c.aten_ops) + " other operator(s)");
}

// A compiled graph's function, its partitions reported; nullptr where onednn declined (the
// reason given to torchcompile::decline).
CompiledFn reported(onednn::Compiled c) {
  if (!c.fn) return nullptr;
  report(c);
  return std::move(c.fn);
}

// A graph with size symbols: one program for every size where they size only GEMM rows
// (compile_rows), else one compiled graph per combination of the symbols' values. The example
// sizes keep a program of their own where oneDNN's kernels for fixed sizes are other than its
// kernels with run-time rows (brgemm on AVX-512 machines, faster on the same sizes; on AVX2
// machines both are its jit gemm, and the one program serves every size).
CompiledFn compile_symbolic(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  onednn::Compiled rows = onednn::compile_rows(gm, example_inputs);
  if (!rows.fn) {
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "onednn: primitives per size: ", rows.reason);
    torchcompile::detail::take_decline_reason();
    // The sizes compiled later (outside a partitioned compile) keep this graph's weight bytes.
    const int64_t weight_bytes = graph_weight_bytes(gm);
    return compile_per_shape(gm, example_inputs, [weight_bytes](GraphModule& g, const std::vector<at::Tensor>& in) {
      return reported(onednn::compile_graph(g, in, /*vary_rows=*/false, weight_bytes));
    });
  }
  std::shared_ptr<GraphModule> example(ir::copy_module(gm));
  example->graph().clear_symbols();
  onednn::Compiled fixed = onednn::compile(*example, example_inputs);
  if (!fixed.fn) torchcompile::detail::take_decline_reason();
  report(rows);
  report_partition("onednn: " + std::to_string(rows.rows_gemms) + " GEMM(s) with run-time rows serve every size");
  TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "onednn: one program for every size (",
                   rows.rows_gemms, " GEMM(s) with run-time rows)",
                   fixed.fn && fixed.impls != rows.impls ? "; the example sizes keep primitives built for them" : "");
  if (!fixed.fn || fixed.impls == rows.impls) return std::move(rows.fn);
  std::vector<std::pair<size_t, int64_t>> bindings = gm.graph().symbol_bindings();
  std::vector<int64_t> at_example;
  for (const auto& [input, dim] : bindings) at_example.push_back(example_inputs.at(input).size(dim));
  return [example, bindings = std::move(bindings), at_example = std::move(at_example), any = std::move(rows.fn),
          fixed = std::move(fixed.fn)](std::vector<at::Tensor> inputs) {
    bool same = true;
    for (size_t k = 0; same && k < bindings.size(); ++k) {
      const auto& [input, dim] = bindings[k];
      same = input < inputs.size() && dim < inputs[input].dim() && inputs[input].size(dim) == at_example[k];
    }
    return same ? fixed(std::move(inputs)) : any(std::move(inputs));
  };
}

}  // namespace

CompiledFn onednn_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  if (!gm.graph().symbols().empty()) return compile_symbolic(gm, example_inputs);
  return reported(onednn::compile(gm, example_inputs));
}

void register_onednn_backend() {
  register_backend("onednn", &onednn_backend, Claim(&onednn::claim));
}

}  // namespace torchcompile::backends
