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

using ir::SymExpr;
using ir::TensorMeta;
using Point = std::vector<int64_t>;  // one value per symbol

// Basis functions of the fits: a name and its value at a point.
struct Feature {
  SymExpr expr;
  std::function<int64_t(const Point&)> at;
};

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t z = 1;
  for (size_t d = sizes.size(); d-- > 0;) strides[d] = z, z *= std::max<int64_t>(sizes[d], 1);
  return strides;
}

int64_t floordiv_int(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// a*f + b through the points, with integer a and b, if one exists.
std::optional<SymExpr> fit_affine(const Feature& f, const std::vector<Point>& pts, const std::vector<int64_t>& y) {
  size_t i = 0, j = 0;
  for (j = 1; j < pts.size(); ++j)
    if (f.at(pts[j]) != f.at(pts[i])) break;
  if (j == pts.size()) return std::nullopt;
  const int64_t df = f.at(pts[j]) - f.at(pts[i]), dy = y[j] - y[i];
  if (dy % df != 0) return std::nullopt;
  const int64_t a = dy / df, b = y[i] - a * f.at(pts[i]);
  if (a == 0) return std::nullopt;
  for (size_t p = 0; p < pts.size(); ++p)
    if (a * f.at(pts[p]) + b != y[p]) return std::nullopt;
  return SymExpr(a) * f.expr + SymExpr(b);
}

// a*f + c*g + b through the points (integer coefficients), if one exists.
std::optional<SymExpr> fit_sum(const Feature& f, const Feature& g, const std::vector<Point>& pts,
                               const std::vector<int64_t>& y) {
  const size_t n = pts.size();
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j)
      for (size_t k = j + 1; k < n; ++k) {
        // Differences from point i remove b: a*df + c*dg = dy at j and k.
        const double f1 = double(f.at(pts[j]) - f.at(pts[i])), g1 = double(g.at(pts[j]) - g.at(pts[i]));
        const double f2 = double(f.at(pts[k]) - f.at(pts[i])), g2 = double(g.at(pts[k]) - g.at(pts[i]));
        const double y1 = double(y[j] - y[i]), y2 = double(y[k] - y[i]);
        const double det = f1 * g2 - f2 * g1;
        if (det == 0) continue;
        const int64_t a = std::llround((y1 * g2 - y2 * g1) / det), c = std::llround((f1 * y2 - f2 * y1) / det);
        if (a == 0 || c == 0) return std::nullopt;
        const int64_t b = y[i] - a * f.at(pts[i]) - c * g.at(pts[i]);
        for (size_t p = 0; p < n; ++p)
          if (a * f.at(pts[p]) + c * g.at(pts[p]) + b != y[p]) return std::nullopt;
        return SymExpr(a) * f.expr + SymExpr(c) * g.expr + SymExpr(b);
      }
  return std::nullopt;
}

Feature product(const Feature& f, const Feature& g) {
  return {f.expr * g.expr, [f, g](const Point& p) { return f.at(p) * g.at(p); }};
}

// An expression of the symbols s0, s1, ... (named by their index) as a feature.
Feature feature_of(const SymExpr& e) {
  return {e, [e](const Point& p) {
            return e.evaluate([&](const std::string& name) { return p.at(std::stoul(name.substr(1))); });
          }};
}

// The basis functions of the fits over a plan's symbols: each symbol, each product of two (and of
// all, for three or more), and floor divisions `(s + r)//c` for c in 2..8 (r in 0..c-1 with
// `with_offsets`, else 0).
struct Basis {
  std::vector<Feature> singles, products, floors;
};

Basis basis_of(const DynamicPlan& plan, bool with_offsets) {
  Basis b;
  const size_t nsym = plan.symbols.size();
  for (size_t k = 0; k < nsym; ++k)
    b.singles.push_back({SymExpr::symbol(plan.symbols[k].name), [k](const Point& p) { return p[k]; }});
  for (size_t i = 0; i < nsym; ++i)
    for (size_t j = i; j < nsym; ++j)
      b.products.push_back({b.singles[i].expr * b.singles[j].expr, [i, j](const Point& p) { return p[i] * p[j]; }});
  if (nsym >= 3) {
    SymExpr all(1);
    for (const Feature& f : b.singles) all = all * f.expr;
    b.products.push_back({all, [](const Point& p) {
                            int64_t v = 1;
                            for (int64_t x : p) v *= x;
                            return v;
                          }});
  }
  for (size_t k = 0; k < nsym; ++k)
    for (int64_t c = 2; c <= 8; ++c)
      for (int64_t r = 0; r < (with_offsets ? c : 1); ++r)
        b.floors.push_back({floordiv(b.singles[k].expr + SymExpr(r), c),
                            [k, c, r](const Point& p) { return floordiv_int(p[k] + r, c); }});
  return b;
}

// Stride d of output o, if at every point the layout is dense (each stride the product of the
// sizes of the dimensions with smaller strides, as in a contiguous tensor or a permutation of
// one): that product of the fitted sizes.
std::optional<SymExpr> dense_stride(const std::vector<SymExpr>& sizes, const std::vector<std::vector<TensorMeta>>& at,
                                    size_t o, size_t d) {
  std::optional<std::vector<size_t>> inner;  // the dimensions inside d, the same at every point
  for (const std::vector<TensorMeta>& metas : at) {
    const TensorMeta& m = metas.at(o);
    // Dimensions ordered by stride, innermost first (ties by index, larger index inside).
    std::vector<size_t> order(m.sizes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return m.strides[a] != m.strides[b] ? m.strides[a] < m.strides[b] : a > b;
    });
    int64_t expected = 1;
    std::vector<size_t> inside;
    for (size_t i : order) {
      if (m.sizes[i] < 2) {  // the stride of a size-1 dimension is arbitrary
        if (i == d) return std::nullopt;
        continue;
      }
      if (m.strides[i] != expected) return std::nullopt;
      if (i == d) break;
      inside.push_back(i);
      expected *= m.sizes[i];
    }
    std::sort(inside.begin(), inside.end());
    if (inner && *inner != inside) return std::nullopt;
    inner = inside;
  }
  SymExpr e(1);
  for (size_t i : *inner) e = e * sizes.at(i);
  return e;
}

// The expression of the symbols that gives y[p] at pts[p] for every p (see the file comment).
std::optional<SymExpr> fit(const std::vector<Point>& pts, const std::vector<int64_t>& y,
                           const std::vector<Feature>& singles, const std::vector<Feature>& products,
                           const std::vector<Feature>& floors, const std::vector<Feature>& known) {
  bool constant = true;
  for (int64_t v : y) constant = constant && v == y[0];
  if (constant) return SymExpr(y[0]);
  for (const Feature& f : singles)
    if (auto e = fit_affine(f, pts, y)) return e;
  for (const Feature& f : known)
    if (auto e = fit_affine(f, pts, y)) return e;
  for (const Feature& f : products)
    if (auto e = fit_affine(f, pts, y)) return e;
  for (size_t i = 0; i < known.size(); ++i) {
    for (size_t j = i; j < known.size(); ++j)
      if (auto e = fit_affine(product(known[i], known[j]), pts, y)) return e;
    for (const Feature& f : singles)
      if (auto e = fit_affine(product(known[i], f), pts, y)) return e;
  }
  for (size_t i = 0; i < singles.size(); ++i)
    for (size_t j = i + 1; j < singles.size(); ++j)
      if (auto e = fit_sum(singles[i], singles[j], pts, y)) return e;
  std::optional<SymExpr> found;
  for (const Feature& f : floors) {
    auto e = fit_affine(f, pts, y);
    if (!e) continue;
    if (found && *found != *e) return std::nullopt;  // two floor divisions fit: not determined
    found = e;
  }
  return found;
}

// Three other values for each symbol, distinct from the traced one, from each other and from the
// other symbols' values at the same probe, inside the symbol's range.
std::optional<std::vector<Point>> probe_points(const DynamicPlan& plan, std::string& why) {
  std::vector<Point> pts(4, Point(plan.symbols.size()));
  for (size_t k = 0; k < plan.symbols.size(); ++k) pts[0][k] = plan.symbols[k].traced;
  for (size_t p = 1; p < 4; ++p) {
    for (size_t k = 0; k < plan.symbols.size(); ++k) {
      const SizeSymbol& s = plan.symbols[k];
      const int64_t t = s.traced;
      const int64_t wanted[] = {t + 1, t + 2, 2 * t + 3, t - 1, t - 2, t + 3, t + 4, t - 3, 2 * t + 1, t + 5};
      bool chosen = false;
      for (int64_t v : wanted) {
        if (v < s.min || v > s.max || v < 2) continue;
        bool taken = false;
        for (size_t q = 0; q < p; ++q) taken = taken || pts[q][k] == v;
        for (size_t j = 0; j < k; ++j) taken = taken || pts[p][j] == v;
        if (taken) continue;
        pts[p][k] = v, chosen = true;
        break;
      }
      if (!chosen) {
        why = s.name + "'s range " + size_range(s.min, s.max) + " is too narrow to fit sizes as expressions of it";
        return std::nullopt;
      }
    }
  }
  return pts;
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

  // Basis functions.
  const Basis basis = basis_of(plan, /*with_offsets=*/true);
  const std::vector<Feature>&singles = basis.singles, &products = basis.products, &floors = basis.floors;

  // Fit every size and stride of every value. Sizes already fitted (`(s0 + 1)//2` after a
  // strided convolution) are candidates for the later ones, alone or in products.
  std::vector<Feature> known;
  std::vector<std::pair<ir::Node*, std::vector<TensorMeta>>> fitted;
  size_t input = 0;
  for (const auto& node : g.nodes()) {
    ir::Node* n = node.get();
    if (n->kind() == ir::NodeKind::Output || n->num_outputs() == 0) continue;
    std::vector<TensorMeta> metas = n->output_meta();
    // The node's metadata at each probe.
    std::vector<std::vector<TensorMeta>> at(pts->size());
    at[0] = metas;
    for (size_t p = 1; p < pts->size(); ++p) {
      if (n->kind() == ir::NodeKind::GetAttr) {
        at[p] = metas;
        continue;
      }
      if (n->kind() == ir::NodeKind::Placeholder) {
        TensorMeta m = metas.at(0);
        for (const SymbolicDim& d : plan.dims)
          if (d.input == input) m.sizes[d.dim] = (*pts)[p][d.symbol];
        m.strides = m.sizes.empty() || metas[0].sizes == m.sizes ? metas[0].strides : contiguous_strides(m.sizes);
        at[p] = {m};
        continue;
      }
      auto it = seen[p].find(n->name());
      if (it == seen[p].end()) return "node '" + n->name() + "' did not run at other sizes";
      at[p] = it->second;
    }
    if (n->kind() == ir::NodeKind::Placeholder) ++input;
    bool any_symbolic = false;
    for (size_t o = 0; o < metas.size(); ++o) {
      TensorMeta& m = metas[o];
      if (!m.defined) continue;
      std::vector<SymExpr> sizes, strides;
      for (size_t p = 1; p < pts->size(); ++p) {
        const TensorMeta& q = at[p].size() == metas.size() ? at[p][o] : TensorMeta();
        if (at[p].size() != metas.size() || q.defined != m.defined || q.dtype != m.dtype ||
            q.sizes.size() != m.sizes.size())
          return "node '" + n->name() + "' changes its number of results, dtype or rank with the sizes";
      }
      for (int part = 0; part < 2; ++part) {
        const std::vector<int64_t>& base = part == 0 ? m.sizes : m.strides;
        for (size_t d = 0; d < base.size(); ++d) {
          std::vector<int64_t> y;
          for (size_t p = 0; p < pts->size(); ++p) y.push_back(part == 0 ? at[p][o].sizes[d] : at[p][o].strides[d]);
          std::optional<SymExpr> e;
          if (part == 1) e = dense_stride(sizes, at, o, d);  // strides of dense layouts: products of sizes
          if (!e) e = fit(*pts, y, singles, products, floors, known);
          // The stride of a dimension of size 1 is any number (a slice of a longer tensor).
          if (!e && part == 1 && sizes.at(d).constant() == 1) e = SymExpr(y[0]);
          if (e && part == 0 && !e->is_constant() && !e->as_symbol() &&
              std::find_if(known.begin(), known.end(), [&](const Feature& f) { return f.expr == *e; }) == known.end())
            known.push_back(feature_of(*e));
          if (!e)
            return std::string(part == 0 ? "size " : "stride ") + std::to_string(d) + " of '" + n->name() +
                   "' is no expression of the symbols we fit (" + c10::str(c10::IntArrayRef(y)) + " at " + [&] {
                     std::string s;
                     for (size_t p = 0; p < pts->size(); ++p) s += (p ? ", " : "") + plan.key_str(SizeKey((*pts)[p].begin(), (*pts)[p].end()));
                     return s;
                   }() + ")";
          (part == 0 ? sizes : strides).push_back(*e);
          any_symbolic = any_symbolic || !e->is_constant();
        }
      }
      m.sym_sizes = std::move(sizes), m.sym_strides = std::move(strides);
    }
    if (!any_symbolic)
      for (TensorMeta& m : metas) m.sym_sizes.clear(), m.sym_strides.clear();
    fitted.emplace_back(n, std::move(metas));
  }
  if (!declared)
    for (const SizeSymbol& s : plan.symbols) g.add_symbol(ir::SizeSymbolDecl{s.name, s.traced, s.min, s.max});
  for (auto& [n, metas] : fitted)
    for (size_t o = 0; o < metas.size(); ++o) n->set_output_meta(o, std::move(metas[o]));
  try {
    ir::lint(g);
  } catch (const std::exception& e) {
    g.clear_symbols();
    return std::string("the symbolic graph does not lint: ") + e.what();
  }
  return "";
}

namespace {

std::string describe_node(const ir::Node& n) { return "node '" + n.name() + "' (" + n.target() + ")"; }

// Whether two constants are the same (neither a size expression).
bool same_constant(const c10::IValue& a, const c10::IValue& b) {
  if (a.tagKind() != b.tagKind()) return false;
  try {
    return a == b;
  } catch (const std::exception&) {
    return false;
  }
}

// Walks two graphs node by node, calling `on_constant(node of a, argument index, constant of b)`
// for each constant argument; returns the first structural difference, or "".
std::string walk_pair(const ir::Graph& a, const ir::Graph& b,
                      const std::function<std::string(ir::Node&, size_t, const c10::IValue&)>& on_constant) {
  if (a.size() != b.size())
    return "the forward recorded " + std::to_string(b.size()) + " nodes instead of " + std::to_string(a.size());
  std::unordered_map<const ir::Node*, size_t> index_a, index_b;
  auto ia = a.nodes().begin();
  auto ib = b.nodes().begin();
  auto same_value = [&](const ir::Value& x, const ir::Value& y) {
    auto fx = index_a.find(x.node);
    auto fy = index_b.find(y.node);
    return fx != index_a.end() && fy != index_b.end() && fx->second == fy->second && x.index == y.index;
  };
  for (size_t k = 0; ia != a.nodes().end(); ++ia, ++ib, ++k) {
    ir::Node& na = **ia;
    const ir::Node& nb = **ib;
    index_a[&na] = k, index_b[&nb] = k;
    if (na.kind() != nb.kind() || na.target() != nb.target() || na.callable() != nb.callable() ||
        na.args().size() != nb.args().size() || na.num_outputs() != nb.num_outputs() ||
        na.return_counts() != nb.return_counts())
      return describe_node(na) + " became " + describe_node(nb);
    if (na.kind() == ir::NodeKind::CallModule) return "the graph calls the opaque module '" + na.target() + "'";
    for (size_t o = 0; o < na.num_outputs(); ++o) {
      const ir::TensorMeta &ma = na.output_meta()[o], &mb = nb.output_meta()[o];
      // (Not the device: a shape-only trace's results are meta tensors; a device change is an
      // argument.)
      if (ma.defined != mb.defined || ma.dtype != mb.dtype || ma.sizes.size() != mb.sizes.size() ||
          ma.requires_grad != mb.requires_grad)
        return describe_node(na) + " changed the dtype, rank or requires_grad of a result";
    }
    for (size_t i = 0; i < na.args().size(); ++i) {
      const ir::Argument &x = na.args()[i], &y = nb.args()[i];
      if (x.kind() != y.kind()) return "argument " + std::to_string(i) + " of " + describe_node(na) + " changed";
      if (x.is_value() && !same_value(x.value(), y.value()))
        return "argument " + std::to_string(i) + " of " + describe_node(na) + " is another value";
      if (x.is_list()) {
        bool same = x.list().size() == y.list().size();
        for (size_t j = 0; same && j < x.list().size(); ++j)
          same = x.list()[j].has_value() == y.list()[j].has_value() &&
                 (!x.list()[j] || same_value(*x.list()[j], *y.list()[j]));
        if (!same) return "argument " + std::to_string(i) + " of " + describe_node(na) + " is another list of values";
      }
      if (x.is_constant()) {
        std::string why = on_constant(na, i, y.constant());
        if (!why.empty()) return why;
      }
    }
  }
  return "";
}

}  // namespace

namespace {

// The simplest expression through the points, for generalize: a constant, else `a*s + b` for one
// symbol, else `a*s*t + b`, else `a*s + c*t + b`, else `a*(s//c) + b`; at the first of these
// that fits, two different fits make it ambiguous (more sizes are needed to tell them apart).
std::optional<SymExpr> fit_simplest(const std::vector<Point>& pts, const std::vector<int64_t>& y,
                                    const std::vector<Feature>& singles, const std::vector<Feature>& products,
                                    const std::vector<Feature>& floors, bool& ambiguous) {
  bool constant = true;
  for (int64_t v : y) constant = constant && v == y[0];
  if (constant) return SymExpr(y[0]);
  std::vector<std::function<std::optional<SymExpr>(size_t)>> levels;
  auto first_fit = [&](const std::vector<std::optional<SymExpr>>& fits) -> std::optional<std::optional<SymExpr>> {
    std::optional<SymExpr> found;
    for (const auto& f : fits) {
      if (!f) continue;
      if (found && *found != *f) {
        ambiguous = true;
        return std::optional<SymExpr>();
      }
      found = f;
    }
    if (found) return found;
    return std::nullopt;
  };
  std::vector<std::optional<SymExpr>> fits;
  for (const Feature& f : singles) fits.push_back(fit_affine(f, pts, y));
  if (auto r = first_fit(fits)) return *r;
  fits.clear();
  for (const Feature& f : products) fits.push_back(fit_affine(f, pts, y));
  if (auto r = first_fit(fits)) return *r;
  fits.clear();
  if (pts.size() > 3)  // three points fit any a*s + c*t + b
    for (size_t i = 0; i < singles.size(); ++i)
      for (size_t j = i + 1; j < singles.size(); ++j) fits.push_back(fit_sum(singles[i], singles[j], pts, y));
  if (auto r = first_fit(fits)) return *r;
  fits.clear();
  for (const Feature& f : floors) fits.push_back(fit_affine(f, pts, y));
  if (auto r = first_fit(fits)) return *r;
  return std::nullopt;
}

}  // namespace

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
  std::map<std::pair<ir::Node*, size_t>, std::vector<std::vector<int64_t>>> ints;  // (node, arg) -> per sample
  for (const auto& [graph, k] : samples) {
    std::string why = walk_pair(g, *graph, [&](ir::Node& n, size_t i, const c10::IValue& other) -> std::string {
      const c10::IValue& mine = n.args()[i].constant();
      const auto a = ir::int_values(mine), b = ir::int_values(other);
      if (a && b && a->size() == b->size() && mine.isInt() == other.isInt()) {
        ints[{&n, i}].push_back(*b);
        return "";
      }
      if (same_constant(mine, other)) return "";
      return "argument " + std::to_string(i) + " of " + describe_node(n) + " changed with the sizes";
    });
    if (!why.empty()) return why;
  }
  const Basis basis = basis_of(reduced, /*with_offsets=*/false);
  const std::vector<Feature>&singles = basis.singles, &products = basis.products, &floors = basis.floors;
  std::vector<std::pair<std::pair<ir::Node*, size_t>, std::vector<SymExpr>>> fitted;
  for (auto& [where, per_sample] : ints) {
    ir::Node* n = where.first;
    const std::vector<int64_t> values = *ir::int_values(n->args()[where.second].constant());
    std::vector<SymExpr> exprs;
    bool any = false;
    for (size_t j = 0; j < values.size(); ++j) {
      std::vector<int64_t> y;
      for (const auto& s : per_sample) y.push_back(s[j]);
      y.push_back(values[j]);
      bool ambiguous = false;
      std::optional<SymExpr> e = fit_simplest(pts, y, singles, products, floors, ambiguous);
      const std::string which = "integer " + std::to_string(j) + " of argument " + std::to_string(where.second) +
                                " of " + describe_node(*n) + " (" + c10::str(c10::IntArrayRef(y)) + ")";
      if (ambiguous) return std::string(kGeneralizeNeedsMoreSizes) + which + " fits two expressions of the sizes";
      if (!e) return which + " is no expression of the sizes we fit";
      any = any || !e->is_constant();
      exprs.push_back(*e);
    }
    if (any) fitted.emplace_back(where, std::move(exprs));
  }
  for (auto& [where, exprs] : fitted)
    where.first->set_arg(where.second,
                         ir::Argument::size_expression(std::move(exprs), where.first->args()[where.second].constant()));
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
                   " sizes differ only in integers that are expressions of the sizes: ", fitted.size(),
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
  return walk_pair(const_cast<ir::Graph&>(g), traced.graph(),
                   [&](ir::Node& n, size_t i, const c10::IValue& other) -> std::string {
                     const ir::Argument& a = n.args()[i];
                     if (a.is_size_expression()) {
                       const c10::IValue expected = a.constant_at(value);
                       const auto x = ir::int_values(expected), y = ir::int_values(other);
                       if (x && y && *x == *y) return "";
                       return "argument " + std::to_string(i) + " of " + describe_node(n) + " is " +
                              ir::constant_repr(other) + "; the graph's size expression gives " +
                              ir::constant_repr(expected);
                     }
                     if (same_constant(a.constant(), other)) return "";
                     return "argument " + std::to_string(i) + " of " + describe_node(n) + " changed with the sizes";
                   });
}

}  // namespace torchcompile::runtime
