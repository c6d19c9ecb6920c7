// Symbolic metadata of a dynamic entry's graph (runtime/dynamic_entry.h, make_symbolic).
//
// The graph was recorded at the traced sizes. Host code read none of the symbols, so every
// integer the graph holds is independent of their values and the graph computes the same
// function at any size; what varies is the metadata. We run the graph's ops again at three
// other combinations of symbol values ("probes") on meta tensors (no data, no compute; an op
// without a meta kernel runs on zero-filled tensors of the probe's sizes), and fit each size and
// stride of each value as an expression of the symbols that gives the recorded number at all
// four points: a constant, `a*s + b`, `a*s*t + b`, `a*s + c*t + b`, or `a*((s + r)//c) + b`. A
// number no expression fits, or that two floor divisions fit differently, leaves the entry
// without symbolic metadata (the per-size path), with the reason.
//
// The metadata describes the graph (printing, explain, the text format, a backend's choices);
// no result depends on it being right: backends that compile for concrete sizes record the
// metadata of each new size by running the graph (compile_per_shape), and the runtime checks the
// sizes of every result of a graph with symbols against its expressions.
#include "capture/metadata_at.h"
#include "ir/size_fit.h"
#include "runtime/dynamic_entry.h"
#include "support/rng_state_guard.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>
#include <torchcompile/support/logging.h>

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

namespace torchcompile::runtime {

namespace {

namespace size_fit = ir::size_fit;
using ir::SymExpr;
using ir::TensorMeta;
using Point = size_fit::Point;

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t z = 1;
  for (size_t d = sizes.size(); d-- > 0;) strides[d] = z, z *= std::max<int64_t>(sizes[d], 1);
  return strides;
}

size_fit::Basis basis_of(const DynamicPlan& plan, bool with_offsets) {
  std::vector<std::string> names;
  for (const SizeSymbol& s : plan.symbols) names.push_back(s.name);
  return size_fit::basis_of(names, with_offsets);
}

std::optional<std::vector<Point>> probe_points(const DynamicPlan& plan, std::string& why) {
  std::vector<ir::SizeSymbolDecl> symbols;
  for (const SizeSymbol& s : plan.symbols) symbols.push_back(ir::SizeSymbolDecl{s.name, s.traced, s.min, s.max});
  return size_fit::probe_points(symbols, why);
}

// The inputs' metadata when the symbols take the values of `point`: symbolic dimensions take
// them (inputs with a symbolic dimension are contiguous).
std::vector<TensorMeta> input_metas_at(const DynamicPlan& plan, const std::vector<at::Tensor>& inputs,
                                       const Point& point) {
  std::vector<TensorMeta> metas;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TensorMeta m = TensorMeta::of(inputs[i]);
    bool symbolic = false;
    for (const SymbolicDim& d : plan.dims)
      if (d.input == i) m.sizes[d.dim] = point[d.symbol], symbolic = true;
    if (symbolic) m.strides = contiguous_strides(m.sizes);
    metas.push_back(std::move(m));
  }
  return metas;
}

std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string msg = c10_error ? c10_error->what_without_backtrace() : e.what();
  return msg.substr(0, msg.find('\n'));
}

// `plan` without the symbols `drop` marks; the others renamed s0, s1, ... in order.
DynamicPlan without_symbols(const DynamicPlan& plan, const std::vector<bool>& drop) {
  DynamicPlan out;
  out.input_names = plan.input_names;
  out.replay_reason = plan.replay_reason;
  std::vector<int> renumber(plan.symbols.size(), -1);
  for (size_t k = 0; k < plan.symbols.size(); ++k) {
    if (drop[k]) continue;
    renumber[k] = static_cast<int>(out.symbols.size());
    SizeSymbol s = plan.symbols[k];
    s.name = "s" + std::to_string(out.symbols.size());
    out.symbols.push_back(s);
  }
  for (const SymbolicDim& d : plan.dims)
    if (renumber[d.symbol] >= 0) out.dims.push_back(SymbolicDim{d.input, d.dim, static_cast<uint32_t>(renumber[d.symbol])});
  if (out.empty()) out.replay_reason.clear();
  return out;
}

}  // namespace

std::string make_symbolic(GraphModule& gm, DynamicPlan& plan, const std::vector<at::Tensor>& inputs,
                          const std::string& owner) {
  ir::Graph& g = gm.graph();
  if (plan.empty() || plan.replays_forward()) return "the entry replays the forward";
  // A graph with size expressions (generalize) has its symbols declared already: they cannot be
  // dropped.
  const bool declared = !g.symbols().empty();
  for (const auto& n : g.nodes())
    if (n->kind() == ir::NodeKind::CallModule) return "the graph calls the opaque module '" + n->target() + "'";
  at::NoGradGuard no_grad;
  support::RngStateGuard keep_rng;  // an op run on zeros may draw numbers

  // A symbol the graph's ops reject at another value (alone) is a size they fix: it stays static.
  {
    std::string why;
    const auto pts = probe_points(plan, why);
    if (!pts) return why;
    std::vector<bool> drop(plan.symbols.size(), false);
    bool any = false;
    for (size_t k = 0; k < plan.symbols.size(); ++k) {
      Point point = (*pts)[0];
      point[k] = (*pts)[1][k];
      try {
        capture::metadata_at(gm, input_metas_at(plan, inputs, point));
      } catch (const std::exception& e) {
        drop[k] = any = true;
        std::string dims;
        for (const SymbolicDim& d : plan.dims)
          if (d.symbol == k)
            dims += (dims.empty() ? "" : ", ") + std::string("size ") + std::to_string(d.dim) + " of '" +
                    plan.input_names.at(d.input) + "'";
        TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", owner, "): ", plan.symbols[k].name, " (", dims,
                         ") stays static at ", plan.symbols[k].traced, ": the graph's ops do not accept ",
                         point[k], " (", first_line(e), ")");
      }
    }
    if (any && declared) return "the graph's ops do not accept other values of a size symbol";
    if (any) plan = without_symbols(plan, drop);
    if (plan.empty()) return "no symbol can take other values";
  }

  std::string why;
  const auto pts = probe_points(plan, why);
  if (!pts) return why;
  std::vector<std::unordered_map<std::string, std::vector<TensorMeta>>> seen(pts->size());
  try {
    for (size_t p = 1; p < pts->size(); ++p) seen[p] = capture::metadata_at(gm, input_metas_at(plan, inputs, (*pts)[p]));
  } catch (const std::exception& e) {
    return "running the graph's ops at other sizes failed: " + first_line(e);
  }

  // Placeholders take the probes' values in their symbolic dimensions, attributes keep their
  // metadata, the other nodes have what running the ops gave.
  std::unordered_map<const ir::Node*, size_t> input_of;
  for (ir::Node* p : g.placeholders()) input_of.emplace(p, input_of.size());
  auto metas_at = [&](const ir::Node& n, size_t p, std::vector<TensorMeta>& out) -> std::string {
    const std::vector<TensorMeta>& metas = n.output_meta();
    if (n.kind() == ir::NodeKind::GetAttr) {
      out = metas;
    } else if (n.kind() == ir::NodeKind::Placeholder) {
      TensorMeta m = metas.at(0);
      for (const SymbolicDim& d : plan.dims)
        if (d.input == input_of.at(&n)) m.sizes[d.dim] = (*pts)[p][d.symbol];
      m.strides = m.sizes.empty() || metas[0].sizes == m.sizes ? metas[0].strides : contiguous_strides(m.sizes);
      out = {m};
    } else {
      auto it = seen[p].find(n.name());
      if (it == seen[p].end()) return "node '" + n.name() + "' did not run at other sizes";
      out = it->second;
    }
    return "";
  };
  std::string unfit = size_fit::fit_metadata(g, *pts, basis_of(plan, /*with_offsets=*/true), metas_at, [&] {
    std::string s;
    for (size_t p = 0; p < pts->size(); ++p) s += (p ? ", " : "") + plan.key_str(SizeKey((*pts)[p].begin(), (*pts)[p].end()));
    return s;
  });
  if (!unfit.empty()) return unfit;
  if (!declared)
    for (const SizeSymbol& s : plan.symbols) g.add_symbol(ir::SizeSymbolDecl{s.name, s.traced, s.min, s.max});
  try {
    ir::lint(g);
  } catch (const std::exception& e) {
    g.clear_symbols();
    return std::string("the symbolic graph does not lint: ") + e.what();
  }
  return "";
}

const char* const kGeneralizeNeedsMoreSizes = "more sizes are needed: ";

std::string generalize(GraphModule& gm, const std::vector<std::pair<const ir::Graph*, SizeKey>>& samples,
                       const SizeKey& key, DynamicPlan& plan, const std::vector<at::Tensor>& inputs,
                       const std::string& owner) {
  ir::Graph& g = gm.graph();
  // The symbols that took other values in the samples (the others stay static in the graph).
  std::vector<Point> full;
  for (const auto& [graph, k] : samples) full.emplace_back(k.begin(), k.end());
  full.emplace_back(key.begin(), key.end());
  std::vector<bool> drop(plan.symbols.size(), true);
  for (size_t k = 0; k < plan.symbols.size(); ++k)
    for (const Point& p : full) drop[k] = drop[k] && p[k] == full.back()[k];
  std::vector<size_t> kept;
  for (size_t k = 0; k < drop.size(); ++k)
    if (!drop[k]) kept.push_back(k);
  if (kept.empty()) return std::string(kGeneralizeNeedsMoreSizes) + "no size differs between the traces";
  DynamicPlan reduced = without_symbols(plan, drop);
  std::vector<Point> pts;
  for (const Point& p : full) {
    Point q;
    for (size_t k : kept) q.push_back(p[k]);
    for (const Point& other : pts)
      if (other == q) return std::string(kGeneralizeNeedsMoreSizes) + "two traces at the same sizes";
    pts.push_back(std::move(q));
  }
  const size_t nsym = kept.size();
  // The graph's own point first.
  std::rotate(pts.rbegin(), pts.rbegin() + 1, pts.rend());
  std::vector<const ir::Graph*> others;
  for (const auto& sample : samples) others.push_back(sample.first);
  bool ambiguous = false;
  size_t fitted = 0;
  std::string unfit =
      size_fit::fit_arguments(g, others, pts, basis_of(reduced, /*with_offsets=*/false), ambiguous, &fitted);
  if (!unfit.empty()) return (ambiguous ? std::string(kGeneralizeNeedsMoreSizes) : std::string()) + unfit;
  // The symbols, bound by the inputs' dimensions as traced now.
  for (size_t k = 0; k < nsym; ++k) reduced.symbols[k].traced = key[kept[k]];
  reduced.replay_reason.clear();
  for (const SizeSymbol& s : reduced.symbols) g.add_symbol(ir::SizeSymbolDecl{s.name, s.traced, s.min, s.max});
  size_t input = 0;
  for (ir::Node* p : g.placeholders()) {
    ir::TensorMeta m = p->output_meta().at(0);
    bool symbolic = false;
    for (const SymbolicDim& d : reduced.dims) symbolic = symbolic || d.input == input;
    if (symbolic && m.defined) {
      for (size_t d = 0; d < m.sizes.size(); ++d) {
        const int k = reduced.symbol_of(static_cast<uint32_t>(input), static_cast<uint32_t>(d));
        m.sym_sizes.push_back(k >= 0 ? SymExpr::symbol(reduced.symbols[k].name) : SymExpr(m.sizes[d]));
      }
      for (int64_t st : m.strides) m.sym_strides.emplace_back(st);
      p->set_output_meta(0, std::move(m));
    }
    ++input;
  }
  std::string why = make_symbolic(gm, reduced, inputs, owner);
  if (!why.empty()) return why;
  TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "torch::compile(", owner, "): the traces at ", pts.size(),
                   " sizes differ only in integers that are expressions of the sizes: ", fitted,
                   " arguments became size expressions");
  plan = std::move(reduced);
  return "";
}

std::string same_graph_at(const GraphModule& symbolic, const GraphModule& traced, const std::vector<at::Tensor>& inputs) {
  const ir::Graph& g = symbolic.graph();
  const std::map<std::string, int64_t> values = g.symbol_values(inputs);
  auto value = [&](const std::string& name) { return values.at(name); };
  // Inputs: the sizes and strides the graph's metadata gives at these values (dimensions that
  // are not symbols are the traced ones).
  const std::vector<ir::Node*> mine = g.placeholders(), theirs = traced.graph().placeholders();
  if (mine.size() != theirs.size()) return "the forward has another number of inputs";
  for (size_t i = 0; i < mine.size(); ++i) {
    const ir::TensorMeta &a = mine[i]->output_meta().at(0), &b = theirs[i]->output_meta().at(0);
    if (!a.defined || !b.defined) continue;
    std::vector<int64_t> sizes = a.sizes, strides = a.strides;
    if (a.symbolic()) {
      for (size_t d = 0; d < sizes.size(); ++d) sizes[d] = a.sym_sizes[d].evaluate(value);
      for (size_t d = 0; d < strides.size(); ++d) strides[d] = a.sym_strides[d].evaluate(value);
    }
    for (size_t d = 0; d < strides.size() && d < b.strides.size(); ++d)
      if (sizes[d] == 1) strides[d] = b.strides[d];  // any stride for a dimension of size 1
    if (sizes != b.sizes || strides != b.strides)
      return "input '" + mine[i]->name() + "' is " + b.str() + "; the graph has " + a.str() + " there";
  }
  return size_fit::walk_pair(g, traced.graph(),
                   [&](ir::Node& n, size_t i, const c10::IValue& other) -> std::string {
                     const ir::Argument& a = n.args()[i];
                     if (a.is_size_expression()) {
                       const c10::IValue expected = a.constant_at(value);
                       const auto x = ir::int_values(expected), y = ir::int_values(other);
                       if (x && y && *x == *y) return "";
                       return "argument " + std::to_string(i) + " of " + size_fit::describe_node(n) + " is " +
                              ir::constant_repr(other) + "; the graph's size expression gives " +
                              ir::constant_repr(expected);
                     }
                     if (size_fit::same_constant(a.constant(), other)) return "";
                     return "argument " + std::to_string(i) + " of " + size_fit::describe_node(n) + " changed with the sizes";
                   });
}

}  // namespace torchcompile::runtime
