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
#include "support/error_text.h"
#include "support/rng_state_guard.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>
#include <torchcompile/ir/structure.h>
#include <torchcompile/support/logging.h>

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <tuple>
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

// The value of `e` when the plan's symbols take the values of `point`.
int64_t value_at(const DynamicPlan& plan, const SymExpr& e, const Point& point) {
  return e.evaluate([&](const std::string& name) -> int64_t {
    for (size_t k = 0; k < plan.symbols.size(); ++k)
      if (plan.symbols[k].name == name) return point.at(k);
    TORCH_INTERNAL_ASSERT(false, "no value for the size symbol ", name);
  });
}

// Input `input`'s sizes when the symbols take the values of `point` (`m`: as traced); returns
// whether any is symbolic (then the input is contiguous).
bool sizes_at(const DynamicPlan& plan, size_t input, const Point& point, TensorMeta& m) {
  bool symbolic = false;
  for (const SymbolicDim& d : plan.dims)
    if (d.input == input) m.sizes[d.dim] = point[d.symbol], symbolic = true;
  for (const ExpressionDim& d : plan.expression_dims)
    if (d.input == input) m.sizes[d.dim] = value_at(plan, d.size, point), symbolic = true;
  return symbolic;
}

// The inputs' metadata when the symbols take the values of `point`: symbolic dimensions take
// them (inputs with a symbolic dimension are contiguous).
std::vector<TensorMeta> input_metas_at(const DynamicPlan& plan, const std::vector<at::Tensor>& inputs,
                                       const Point& point) {
  std::vector<TensorMeta> metas;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TensorMeta m = TensorMeta::of(inputs[i]);
    if (sizes_at(plan, i, point, m)) m.strides = contiguous_strides(m.sizes);
    metas.push_back(std::move(m));
  }
  return metas;
}

// `plan` without the symbols `drop` marks; the others renamed s0, s1, ... in order (unless not
// `rename`: expression dimensions name them, and use none of those dropped).
DynamicPlan without_symbols(const DynamicPlan& plan, const std::vector<bool>& drop, bool rename = true) {
  DynamicPlan out;
  out.input_names = plan.input_names;
  out.replay_reason = plan.replay_reason;
  out.expression_dims = plan.expression_dims;
  std::vector<int> renumber(plan.symbols.size(), -1);
  for (size_t k = 0; k < plan.symbols.size(); ++k) {
    if (drop[k]) continue;
    renumber[k] = static_cast<int>(out.symbols.size());
    SizeSymbol s = plan.symbols[k];
    if (rename) s.name = "s" + std::to_string(out.symbols.size());
    out.symbols.push_back(s);
  }
  for (const SymbolicDim& d : plan.dims)
    if (renumber[d.symbol] >= 0) out.dims.push_back(SymbolicDim{d.input, d.dim, static_cast<uint32_t>(renumber[d.symbol])});
  if (out.empty()) out.replay_reason.clear();
  return out;
}

}  // namespace

std::string make_symbolic(GraphModule& gm, DynamicPlan& plan, const std::vector<at::Tensor>& inputs,
                          const std::string& owner, const std::vector<std::pair<const ir::Graph*, Point>>& known) {
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
  // Declared symbols cannot stay static: the probes below fail for them as this check would (and
  // running the graph's ops once more costs about as much as tracing it on meta tensors).
  if (!declared) {
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
                         point[k], " (", support::error_first_line(e), ")");
      }
    }
    if (any) plan = without_symbols(plan, drop);
    if (plan.empty()) return "no symbol can take other values";
  }

  std::string why;
  auto pts = probe_points(plan, why);
  if (!pts) return why;
  std::vector<std::unordered_map<std::string, std::vector<TensorMeta>>> seen(pts->size());
  // A graph of the same forward traced at another value of a single symbol (generalize's sample)
  // is the ops run at that value: its metadata stands for one probe point, whose run is saved.
  // Where its nodes are not this graph's by name, or the fit fails with it, the probe points run.
  size_t from_known = 0;  // the probe point a known graph gives, or 0
  if (plan.symbols.size() == 1) {
    for (const auto& [graph, q] : known) {
      if (from_known || q.size() != 1 || q == (*pts)[0] || q[0] < std::max<int64_t>(2, plan.symbols[0].min) ||
          q[0] > plan.symbols[0].max)
        continue;
      std::unordered_map<std::string, std::vector<TensorMeta>> metas;
      for (const auto& n : graph->nodes())
        if (n->kind() != ir::NodeKind::Placeholder && n->kind() != ir::NodeKind::Output)
          metas.emplace(n->name(), n->output_meta());
      bool all = true;
      for (const auto& n : g.nodes()) {
        if (n->kind() == ir::NodeKind::Placeholder || n->kind() == ir::NodeKind::Output ||
            n->kind() == ir::NodeKind::GetAttr || n->num_outputs() == 0)
          continue;
        auto it = metas.find(n->name());
        all = all && it != metas.end() && it->second.size() == n->output_meta().size();
      }
      if (!all) continue;
      size_t slot = 1;
      for (size_t p = 1; p < pts->size(); ++p)
        if ((*pts)[p] == q) slot = p;
      (*pts)[slot] = q;
      seen[slot] = std::move(metas);
      from_known = slot;
    }
  }
  try {
    std::vector<std::vector<TensorMeta>> run_at;
    for (size_t p = 1; p < pts->size(); ++p)
      if (p != from_known) run_at.push_back(input_metas_at(plan, inputs, (*pts)[p]));
    std::vector<std::unordered_map<std::string, std::vector<TensorMeta>>> ran = capture::metadata_at_points(gm, run_at);
    for (size_t p = 1, r = 0; p < pts->size(); ++p)
      if (p != from_known) seen[p] = std::move(ran[r++]);
  } catch (const std::exception& e) {
    if (from_known) return make_symbolic(gm, plan, inputs, owner);
    return "running the graph's ops at other sizes failed: " + support::error_first_line(e);
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
      sizes_at(plan, input_of.at(&n), (*pts)[p], m);
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
  if (!unfit.empty()) return from_known ? make_symbolic(gm, plan, inputs, owner) : unfit;
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
                       const std::string& owner, bool keep_names) {
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
  DynamicPlan reduced = without_symbols(plan, drop, /*rename=*/!keep_names);
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
    for (const ExpressionDim& d : reduced.expression_dims) symbolic = symbolic || d.input == input;
    if (symbolic && m.defined) {
      for (size_t d = 0; d < m.sizes.size(); ++d) {
        const int k = reduced.symbol_of(static_cast<uint32_t>(input), static_cast<uint32_t>(d));
        SymExpr size = k >= 0 ? SymExpr::symbol(reduced.symbols[k].name) : SymExpr(m.sizes[d]);
        for (const ExpressionDim& e : reduced.expression_dims)
          if (e.input == input && e.dim == d) size = e.size;
        m.sym_sizes.push_back(size);
      }
      for (int64_t st : m.strides) m.sym_strides.emplace_back(st);
      p->set_output_meta(0, std::move(m));
    }
    ++input;
  }
  std::vector<std::pair<const ir::Graph*, Point>> known;
  for (const auto& [graph, k] : samples) {
    Point q;
    for (size_t i : kept) q.push_back(k[i]);
    known.emplace_back(graph, std::move(q));
  }
  std::string why = make_symbolic(gm, reduced, inputs, owner, known);
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

// ---- traces with graph breaks -----------------------------------------------------------------

namespace torchcompile::runtime {

namespace {

// Whether two constant stacks of a host read are the same (None where a tensor goes).
bool same_stack(const std::vector<c10::IValue>& a, const std::vector<c10::IValue>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].isNone() && b[i].isNone()) continue;
    if (!capture::same_key({a[i]}, {b[i]})) return false;
  }
  return true;
}

// "" if `a` and `b` have the same segments (slots, host reads and the values they returned).
std::string same_segments(const std::vector<capture::SegmentRecord>& a, const std::vector<capture::SegmentRecord>& b) {
  if (a.size() != b.size())
    return "the traces have " + std::to_string(a.size()) + " and " + std::to_string(b.size()) + " graph segments";
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string where = "segment " + std::to_string(i);
    if (a[i].input_slots != b[i].input_slots || a[i].output_slots != b[i].output_slots)
      return where + " reads or keeps other values";
    if (a[i].branch.has_value() != b[i].branch.has_value()) return where + " ends differently";
    if (!a[i].branch) continue;
    const capture::BranchRecord &x = *a[i].branch, &y = *b[i].branch;
    const std::string op = ir::op_target_name(x.op);
    if (&x.op.schema() != &y.op.schema() || x.tensor_args != y.tensor_args || !same_stack(x.stack_template, y.stack_template))
      return "the graph break after " + where + " is another host read";
    if (!capture::same_key(x.key, y.key))
      return "the graph break after " + where + " (" + op + ") read " + capture::key_repr(x.key) + " at one size and " +
             capture::key_repr(y.key) + " at another";
  }
  return "";
}

// The plan of a segment of a trace (inputs: its placeholders, `inputs` their values): the
// forward inputs' symbolic dimensions keep their symbols (`plan`'s, with their names); a size
// of a value computed before a break that differs between the traces (`points[p]`, the symbols'
// values in trace p, with `size_at(p, placeholder, dim)`; this trace last) is fitted as the
// simplest expression of the symbols through them. Returns "" or why not.
std::string segment_plan(const capture::SegmentRecord& r, const std::vector<at::Tensor>& inputs, const DynamicPlan& plan,
                         const std::vector<SizeKey>& points,
                         const std::function<int64_t(size_t point, size_t placeholder, size_t dim)>& size_at,
                         DynamicPlan& out) {
  out = DynamicPlan();
  out.symbols = plan.symbols;
  const std::vector<ir::Node*> placeholders = r.gm->graph().placeholders();
  for (ir::Node* p : placeholders) out.input_names.push_back(p->name());
  // The symbols that take other values in the traces, the basis of the fits.
  std::vector<size_t> varying;
  std::vector<std::string> names;
  for (size_t k = 0; k < plan.symbols.size(); ++k) {
    bool differs = false;
    for (const SizeKey& p : points) differs = differs || p[k] != points.back()[k];
    if (differs) varying.push_back(k), names.push_back(plan.symbols[k].name);
  }
  const size_fit::Basis basis = size_fit::basis_of(names, /*with_offsets=*/true);
  std::vector<Point> pts;
  for (const SizeKey& p : points) {
    Point q;
    for (size_t k : varying) q.push_back(p[k]);
    pts.push_back(std::move(q));
  }
  std::vector<bool> bound(plan.symbols.size(), false);
  const size_t num_inputs = plan.input_names.size();
  for (uint32_t j = 0; j < placeholders.size() && j < inputs.size(); ++j) {
    const uint32_t slot = r.input_slots.at(j);
    const at::Tensor& t = inputs[j];
    if (!t.defined() || t.layout() != c10::kStrided) continue;
    if (slot < num_inputs) {
      for (const SymbolicDim& d : plan.dims) {
        if (d.input != slot) continue;
        if (!bound[d.symbol]) out.symbols[d.symbol].input = j, out.symbols[d.symbol].dim = d.dim;
        bound[d.symbol] = true;
        out.dims.push_back(SymbolicDim{j, d.dim, d.symbol});
      }
      continue;
    }
    for (uint32_t d = 0; d < static_cast<uint32_t>(t.dim()); ++d) {
      std::vector<int64_t> y;
      for (size_t p = 0; p < points.size(); ++p) y.push_back(size_at(p, j, d));
      if (std::all_of(y.begin(), y.end(), [&](int64_t v) { return v == y.back(); })) continue;
      const std::string what = "size " + std::to_string(d) + " of input '" + out.input_names[j] + "'";
      if (!t.is_contiguous()) return what + " differs between the traces, and the input is not contiguous";
      bool ambiguous = false;
      std::optional<SymExpr> e = varying.empty() ? std::nullopt : size_fit::fit_simplest(pts, y, basis, ambiguous);
      if (ambiguous) return std::string(kGeneralizeNeedsMoreSizes) + what + " fits two expressions of the sizes";
      if (!e) return what + " is no expression of the sizes";
      out.expression_dims.push_back(ExpressionDim{j, d, *e});
    }
  }
  std::vector<bool> unbound(bound.size());
  for (size_t k = 0; k < bound.size(); ++k) unbound[k] = !bound[k];
  out = without_symbols(out, unbound, /*rename=*/false);
  for (const ExpressionDim& e : out.expression_dims)
    for (const std::string& name : e.size.symbols()) {
      bool known = false;
      for (const SizeSymbol& sym : out.symbols) known = known || sym.name == name;
      if (!known) return "a size of input '" + out.input_names[e.input] + "' depends on " + name + ", no input binds it";
    }
  return "";
}

}  // namespace

std::vector<capture::SegmentRecord> copy_records(const std::vector<capture::SegmentRecord>& records, bool with_values) {
  std::vector<capture::SegmentRecord> out;
  for (const capture::SegmentRecord& r : records) {
    capture::SegmentRecord c;
    c.gm = ir::copy_module(*r.gm);
    c.input_slots = r.input_slots;
    if (with_values) c.values_before_writes = r.values_before_writes;
    c.output_slots = r.output_slots;
    c.branch = r.branch;
    out.push_back(std::move(c));
  }
  return out;
}

void with_forward_inputs(std::vector<capture::SegmentRecord>& records, const std::vector<at::Tensor>& slots,
                         size_t num_inputs) {
  if (records.size() < 2) return;
  const std::vector<ir::Node*> first = records.front().gm->graph().placeholders();
  for (size_t i = 1; i < records.size(); ++i) {
    capture::SegmentRecord& r = records[i];
    ir::Graph& g = r.gm->graph();
    ir::Node* first_op = nullptr;
    for (const auto& n : g.nodes())
      if (n->kind() != ir::NodeKind::Placeholder) {
        first_op = n.get();
        break;
      }
    for (uint32_t s = 0; s < num_inputs && s < slots.size() && s < first.size(); ++s) {
      if (std::find(r.input_slots.begin(), r.input_slots.end(), s) != r.input_slots.end()) continue;
      g.set_insert_point(first_op);
      g.placeholder(first[s]->target(), first[s]->output_meta().at(0));
      g.set_insert_point(nullptr);
      r.input_slots.push_back(s);
      if (!r.values_before_writes.empty()) r.values_before_writes.resize(r.input_slots.size());
    }
  }
}

std::string generalize_segments(std::vector<capture::SegmentRecord>& records, const std::vector<at::Tensor>& slots,
                                const std::vector<const TraceSample*>& samples, const SizeKey& key,
                                const DynamicPlan& plan, std::vector<DynamicPlan>& plans, const std::string& owner) {
  for (const TraceSample* s : samples) {
    std::string why = same_segments(records, s->records);
    if (!why.empty()) return why;
  }
  // A segment ends after an operator whose result sizes depend on the data, and its break reads
  // them: that result has no size expression (at other data it has other sizes at the same
  // symbols' values), and the breaks' values, those sizes, tell the trees apart anyway.
  for (size_t i = 0; i < records.size(); ++i)
    if (const ir::Node* n = ir::first_node_with_data_dependent_sizes(records[i].gm->graph()))
      return "segment " + std::to_string(i) + ": the result sizes of " + size_fit::describe_node(*n) + " depend on the data";
  // The samples' points, then this trace's.
  std::vector<SizeKey> points;
  for (const TraceSample* s : samples) points.push_back(s->key);
  points.push_back(key);
  std::vector<DynamicPlan> out;
  for (size_t i = 0; i < records.size(); ++i) {
    capture::SegmentRecord& r = records[i];
    const std::vector<at::Tensor> inputs = capture::example_inputs(r, slots);
    auto size_at = [&](size_t p, size_t j, size_t d) -> int64_t {
      if (p == samples.size()) return inputs[j].size(static_cast<int64_t>(d));
      const ir::TensorMeta& m = samples[p]->records[i].gm->graph().placeholders().at(j)->output_meta().at(0);
      return m.defined && d < m.sizes.size() ? m.sizes[d] : -1;
    };
    // "segment i: why", after the prefix saying that more sizes may help.
    auto in_segment = [&](const std::string& why) {
      const std::string where = "segment " + std::to_string(i) + ": ";
      const std::string more = kGeneralizeNeedsMoreSizes;
      return why.rfind(more, 0) == 0 ? more + where + why.substr(more.size()) : where + why;
    };
    DynamicPlan seg;
    std::string why = segment_plan(r, inputs, plan, points, size_at, seg);
    if (!why.empty()) return in_segment(why);
    // Whether a symbol this segment sees took other values in the traces.
    bool varies = false;
    std::vector<size_t> entry_symbol;  // the entry's symbol of each of the segment's
    for (const SizeSymbol& s : seg.symbols)
      for (size_t k = 0; k < plan.symbols.size(); ++k)
        if (plan.symbols[k].name == s.name) entry_symbol.push_back(k);
    for (size_t k : entry_symbol)
      for (const SizeKey& p : points) varies = varies || p[k] != key[k];
    if (!varies) {
      // No size this segment sees took other values: its graph must be the same in every trace.
      for (const TraceSample* s : samples) {
        std::string why = same_graph_at(*r.gm, *s->records[i].gm, inputs);
        if (!why.empty()) return in_segment("its inputs' sizes are the same in every trace, its graph is not (" + why + ")");
      }
      out.emplace_back();
      out.back().input_names = seg.input_names;
      continue;
    }
    // The samples at other values of the segment's symbols (traces that differ only in sizes the
    // segment does not see tell nothing more).
    SizeKey seg_key;
    for (size_t e : entry_symbol) seg_key.push_back(key[e]);
    std::vector<std::pair<const ir::Graph*, SizeKey>> seg_samples;
    for (const TraceSample* s : samples) {
      SizeKey k;
      for (size_t e : entry_symbol) k.push_back(s->key[e]);
      bool seen = k == seg_key;
      for (const auto& other : seg_samples) seen = seen || other.second == k;
      if (!seen) seg_samples.emplace_back(&s->records[i].gm->graph(), std::move(k));
    }
    why = generalize(*r.gm, seg_samples, seg_key, seg, inputs, owner, /*keep_names=*/true);
    if (!why.empty()) return in_segment(why);
    out.push_back(std::move(seg));
  }
  plans = std::move(out);
  return "";
}

std::string same_trace_at(const std::vector<capture::SegmentRecord>& general,
                          const std::vector<capture::SegmentRecord>& traced, const std::vector<at::Tensor>& slots) {
  std::string why = same_segments(general, traced);
  if (!why.empty()) return why;
  for (size_t i = 0; i < general.size(); ++i) {
    why = same_graph_at(*general[i].gm, *traced[i].gm, capture::example_inputs(traced[i], slots));
    if (!why.empty()) return general.size() == 1 ? why : "segment " + std::to_string(i) + ": " + why;
  }
  return "";
}

}  // namespace torchcompile::runtime
