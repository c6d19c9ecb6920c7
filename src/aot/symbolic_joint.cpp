// The joint graph of a graph with size symbols, for every size.
//
// The joint graph is recorded below autograd at concrete sizes: the integers in it (the sizes a
// backward formula expands a gradient to, the shape of a view a composite operator makes) are
// those of the traced call, computed by LibTorch's C++ (its composite operators and derivative
// formulas), which reads the sizes. So, as the runtime does for a forward whose host code reads
// sizes, we record the joint graph at the example sizes and at three other combinations of the
// symbols' values (the captured graph runs at any size: its size expressions are evaluated from
// its inputs), require the same operators reading the same values, and fit every integer that
// differs, and every size and stride, as an expression of the symbols (ir/size_fit.h). A
// difference of anything else (another operator, a floating-point constant computed from a size,
// a different number of results) leaves the graph to compile_per_shape, one joint graph per size.
#include "aot/aot_internal.h"
#include "ir/size_fit.h"
#include "support/error_text.h"

#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/passes.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <set>
#include <unordered_map>

namespace torchcompile::aot {

namespace {

namespace size_fit = ir::size_fit;

// An input of the captured graph at other values of its symbols: the example's values repeated
// over the new sizes (indices into a table stay valid), contiguous (inputs with symbolic sizes
// are), requiring grad as the example does.
at::Tensor input_at(const at::Tensor& example, const ir::TensorMeta& meta,
                    const std::function<int64_t(const std::string&)>& value) {
  if (!example.defined() || !meta.symbolic()) return example;
  std::vector<int64_t> sizes;
  int64_t numel = 1;
  for (const ir::SymExpr& e : meta.sym_sizes) sizes.push_back(e.evaluate(value)), numel *= sizes.back();
  at::Tensor data;
  {
    at::NoGradGuard no_grad;
    const at::Tensor flat = example.detach().reshape(-1);
    if (flat.numel() == 0 || numel == 0) {
      data = at::zeros(sizes, example.options().requires_grad(false));
    } else {
      const int64_t copies = (numel + flat.numel() - 1) / flat.numel();
      data = flat.repeat({copies}).narrow(0, 0, numel).reshape(sizes).clone(at::MemoryFormat::Contiguous);
    }
  }
  if (example.requires_grad()) data.requires_grad_(true);
  return data;
}

bool same_outputs(const std::vector<OutputSource>& a, const std::vector<OutputSource>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].graph_output != b[i].graph_output || a[i].alias_primal != b[i].alias_primal) return false;
  return true;
}

// Why the joint graph recorded at other sizes does not correspond to `a`, or "".
std::string same_shape_of_joint(const JointGraph& a, const JointGraph& b) {
  if (!b.decline_reason.empty()) return b.decline_reason;
  if (a.primals.size() != b.primals.size() || a.num_tangents != b.num_tangents || a.num_fw_outputs != b.num_fw_outputs ||
      a.tangent_of_fw_output != b.tangent_of_fw_output || a.mutated_primals != b.mutated_primals ||
      a.grad_primals != b.grad_primals || a.training != b.training || !same_outputs(a.outputs, b.outputs))
    return "the joint graph has other inputs, outputs or gradients at other sizes";
  return "";
}

}  // namespace

std::optional<JointGraph> build_symbolic_joint(const ir::GraphModule& gm, const std::vector<at::Tensor>& example_inputs,
                                               const DecompositionTable& decompositions, std::string& why) {
  const ir::Graph& g = gm.graph();
  const std::vector<ir::SizeSymbolDecl>& symbols = g.symbols();
  TORCH_INTERNAL_ASSERT(!symbols.empty(), "build_symbolic_joint: a graph without size symbols");
  // An operator whose result sizes depend on the data: its recorded sizes (and any integer
  // computed from them) may happen to fit an expression of the symbols at the four points.
  auto data_dependent = [&](const ir::Graph& graph) {
    const ir::Node* n = ir::first_node_with_data_dependent_sizes(graph);
    if (n) why = "the result sizes of " + size_fit::describe_node(*n) + " depend on the data";
    return n != nullptr;
  };
  if (data_dependent(g)) return std::nullopt;
  // Other values than the static sizes of the graph's inputs and module state: at a batch size
  // equal to the feature size, LibTorch's code may record other operators (a reduction of a
  // broadcast that is no longer needed, say).
  std::set<int64_t> static_sizes;
  for (const auto& n : g.nodes()) {
    if (n->kind() != ir::NodeKind::Placeholder && n->kind() != ir::NodeKind::GetAttr) continue;
    for (const ir::TensorMeta& m : n->output_meta())
      for (size_t d = 0; d < m.sizes.size(); ++d)
        if (!m.symbolic() || m.sym_sizes[d].is_constant()) static_sizes.insert(m.sizes[d]);
  }
  const auto pts = size_fit::probe_points(symbols, why, static_sizes);
  if (!pts) return std::nullopt;
  JointGraph joint = build_joint(gm, example_inputs, decompositions);
  if (!joint.decline_reason.empty()) {
    why = joint.decline_reason;
    return std::nullopt;
  }
  for (const OutputSource& o : joint.outputs)
    if (o.alias_primal >= 0) {
      why = "an output is a view of an input, rebuilt with the sizes of the traced call";
      return std::nullopt;
    }

  if (data_dependent(joint.gm->graph())) return std::nullopt;

  // The joint graph at the other points.
  const std::vector<ir::Node*> placeholders = g.placeholders();
  std::vector<JointGraph> others;
  for (size_t p = 1; p < pts->size(); ++p) {
    auto value = [&](const std::string& name) {
      for (size_t k = 0; k < symbols.size(); ++k)
        if (symbols[k].name == name) return (*pts)[p][k];
      TORCH_INTERNAL_ASSERT(false, "build_symbolic_joint: unknown symbol ", name);
    };
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < example_inputs.size(); ++i)
      inputs.push_back(input_at(example_inputs[i], placeholders.at(i)->output_meta().at(0), value));
    try {
      others.push_back(build_joint(gm, inputs, decompositions));
    } catch (const std::exception& e) {
      why = "recording the joint graph at other sizes failed: " + support::error_first_line(e);
      return std::nullopt;
    }
    why = same_shape_of_joint(joint, others.back());
    if (!why.empty()) return std::nullopt;
  }

  // Integers that differ become size expressions; then every size and stride is fitted. Dead
  // nodes (a view LibTorch's code made and dropped at one size and not at another) are dropped
  // first: the partition would not keep them anyway (random operators are never dead).
  ir::Graph& jg = joint.gm->graph();
  ir::eliminate_dead_code(jg);
  for (JointGraph& o : others) ir::eliminate_dead_code(o.gm->graph());
  std::vector<std::string> names;
  for (const ir::SizeSymbolDecl& s : symbols) names.push_back(s.name);
  std::vector<const ir::Graph*> other_graphs;
  for (const JointGraph& o : others) other_graphs.push_back(&o.gm->graph());
  bool ambiguous = false;
  why = size_fit::fit_arguments(jg, other_graphs, *pts, size_fit::basis_of(names, /*with_offsets=*/false), ambiguous);
  if (!why.empty()) return std::nullopt;
  std::vector<std::vector<const ir::Node*>> nodes_of(others.size());
  for (size_t o = 0; o < others.size(); ++o)
    for (const auto& n : other_graphs[o]->nodes()) nodes_of[o].push_back(n.get());
  std::unordered_map<const ir::Node*, size_t> index;
  for (const auto& n : jg.nodes()) index.emplace(n.get(), index.size());
  auto metas_at = [&](const ir::Node& n, size_t p, std::vector<ir::TensorMeta>& out) -> std::string {
    out = nodes_of.at(p - 1).at(index.at(&n))->output_meta();
    return "";
  };
  auto describe_points = [&] {
    std::string s;
    for (size_t p = 0; p < pts->size(); ++p) {
      s += p ? "; " : "";
      for (size_t k = 0; k < names.size(); ++k) s += (k ? ", " : "") + names[k] + "=" + std::to_string((*pts)[p][k]);
    }
    return s;
  };
  why = size_fit::fit_metadata(jg, *pts, size_fit::basis_of(names, /*with_offsets=*/true), metas_at, describe_points);
  if (!why.empty()) return std::nullopt;
  for (const ir::SizeSymbolDecl& s : symbols) jg.add_symbol(s);
  try {
    jg.symbol_bindings();
    ir::lint(jg);
  } catch (const std::exception& e) {
    why = "the joint graph with size symbols is not valid: " + support::error_first_line(e);
    return std::nullopt;
  }
  return joint;
}

}  // namespace torchcompile::aot
