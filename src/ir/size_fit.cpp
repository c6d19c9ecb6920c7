#include "ir/size_fit.h"

#include <torchcompile/ir/printer.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

namespace torchcompile::ir::size_fit {

namespace {

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

// An expression of the basis's symbols as a feature.
Feature feature_of(const SymExpr& e, const std::vector<std::string>& symbols) {
  return {e, [e, symbols](const Point& p) {
            return e.evaluate([&](const std::string& name) {
              const auto it = std::find(symbols.begin(), symbols.end(), name);
              TORCH_INTERNAL_ASSERT(it != symbols.end(), "size_fit: unknown symbol ", name);
              return p.at(static_cast<size_t>(it - symbols.begin()));
            });
          }};
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

}  // namespace

std::optional<std::vector<Point>> probe_points(const std::vector<SizeSymbolDecl>& symbols, std::string& why,
                                               const std::set<int64_t>& avoid) {
  std::vector<Point> pts(4, Point(symbols.size()));
  for (size_t k = 0; k < symbols.size(); ++k) pts[0][k] = symbols[k].example;
  for (size_t p = 1; p < 4; ++p) {
    for (size_t k = 0; k < symbols.size(); ++k) {
      const SizeSymbolDecl& s = symbols[k];
      const int64_t t = s.example;
      const int64_t wanted[] = {t + 1, t + 2, 2 * t + 3, t - 1, t - 2, t + 3, t + 4, t - 3, 2 * t + 1, t + 5,
                                t + 6, t + 7, 2 * t + 5, 2 * t + 7};
      bool chosen = false;
      for (int64_t v : wanted) {
        if (v < s.min || v > s.max || v < 2 || avoid.count(v)) continue;
        bool taken = false;
        for (size_t q = 0; q < p; ++q) taken = taken || pts[q][k] == v;
        for (size_t j = 0; j < k; ++j) taken = taken || pts[p][j] == v;
        if (taken) continue;
        pts[p][k] = v, chosen = true;
        break;
      }
      if (!chosen) {
        why = s.name + "'s range [" + std::to_string(s.min) + ", " +
              (s.max == std::numeric_limits<int64_t>::max() ? std::string("inf)") : std::to_string(s.max) + "]") +
              " is too narrow to fit sizes as expressions of it";
        return std::nullopt;
      }
    }
  }
  return pts;
}

Basis basis_of(const std::vector<std::string>& symbols, bool with_offsets) {
  Basis b;
  b.symbols = symbols;
  const size_t nsym = symbols.size();
  for (size_t k = 0; k < nsym; ++k) b.singles.push_back({SymExpr::symbol(symbols[k]), [k](const Point& p) { return p[k]; }});
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

std::optional<SymExpr> fit(const std::vector<Point>& pts, const std::vector<int64_t>& y, const Basis& basis,
                           const std::vector<Feature>& known) {
  bool constant = true;
  for (int64_t v : y) constant = constant && v == y[0];
  if (constant) return SymExpr(y[0]);
  for (const Feature& f : basis.singles)
    if (auto e = fit_affine(f, pts, y)) return e;
  for (const Feature& f : known)
    if (auto e = fit_affine(f, pts, y)) return e;
  for (const Feature& f : basis.products)
    if (auto e = fit_affine(f, pts, y)) return e;
  for (size_t i = 0; i < known.size(); ++i) {
    for (size_t j = i; j < known.size(); ++j)
      if (auto e = fit_affine(product(known[i], known[j]), pts, y)) return e;
    for (const Feature& f : basis.singles)
      if (auto e = fit_affine(product(known[i], f), pts, y)) return e;
  }
  for (size_t i = 0; i < basis.singles.size(); ++i)
    for (size_t j = i + 1; j < basis.singles.size(); ++j)
      if (auto e = fit_sum(basis.singles[i], basis.singles[j], pts, y)) return e;
  std::optional<SymExpr> found;
  for (const Feature& f : basis.floors) {
    auto e = fit_affine(f, pts, y);
    if (!e) continue;
    if (found && *found != *e) return std::nullopt;  // two floor divisions fit: not determined
    found = e;
  }
  return found;
}

std::optional<SymExpr> fit_simplest(const std::vector<Point>& pts, const std::vector<int64_t>& y, const Basis& basis,
                                    bool& ambiguous) {
  bool constant = true;
  for (int64_t v : y) constant = constant && v == y[0];
  if (constant) return SymExpr(y[0]);
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
  for (const Feature& f : basis.singles) fits.push_back(fit_affine(f, pts, y));
  if (auto r = first_fit(fits)) return *r;
  fits.clear();
  for (const Feature& f : basis.products) fits.push_back(fit_affine(f, pts, y));
  if (auto r = first_fit(fits)) return *r;
  fits.clear();
  if (pts.size() > 3)  // three points fit any a*s + c*t + b
    for (size_t i = 0; i < basis.singles.size(); ++i)
      for (size_t j = i + 1; j < basis.singles.size(); ++j)
        fits.push_back(fit_sum(basis.singles[i], basis.singles[j], pts, y));
  if (auto r = first_fit(fits)) return *r;
  fits.clear();
  for (const Feature& f : basis.floors) fits.push_back(fit_affine(f, pts, y));
  if (auto r = first_fit(fits)) return *r;
  return std::nullopt;
}

std::string fit_metadata(Graph& g, const std::vector<Point>& pts, const Basis& basis,
                         const std::function<std::string(const Node&, size_t, std::vector<TensorMeta>&)>& metas_at,
                         const std::function<std::string()>& describe_points) {
  // Sizes already fitted (`(s0 + 1)//2` after a strided convolution) are candidates for the later
  // ones, alone or in products.
  std::vector<Feature> known;
  std::vector<std::pair<Node*, std::vector<TensorMeta>>> fitted;
  for (const auto& node : g.nodes()) {
    Node* n = node.get();
    if (n->kind() == NodeKind::Output || n->num_outputs() == 0) continue;
    std::vector<TensorMeta> metas = n->output_meta();
    // The node's metadata at each point.
    std::vector<std::vector<TensorMeta>> at(pts.size());
    at[0] = metas;
    for (size_t p = 1; p < pts.size(); ++p) {
      std::string why = metas_at(*n, p, at[p]);
      if (!why.empty()) return why;
    }
    bool any_symbolic = false;
    for (size_t o = 0; o < metas.size(); ++o) {
      TensorMeta& m = metas[o];
      if (!m.defined) continue;
      for (size_t p = 1; p < pts.size(); ++p) {
        const TensorMeta& q = at[p].size() == metas.size() ? at[p][o] : TensorMeta();
        if (at[p].size() != metas.size() || q.defined != m.defined || q.dtype != m.dtype ||
            q.sizes.size() != m.sizes.size() || q.strides.size() != m.strides.size())
          return "node '" + n->name() + "' changes its number of results, dtype or rank with the sizes";
      }
      std::vector<SymExpr> sizes, strides;
      for (int part = 0; part < 2; ++part) {
        const std::vector<int64_t>& base = part == 0 ? m.sizes : m.strides;
        for (size_t d = 0; d < base.size(); ++d) {
          std::vector<int64_t> y;
          for (size_t p = 0; p < pts.size(); ++p) y.push_back(part == 0 ? at[p][o].sizes[d] : at[p][o].strides[d]);
          std::optional<SymExpr> e;
          if (part == 1) e = dense_stride(sizes, at, o, d);  // strides of dense layouts: products of sizes
          if (!e) e = fit(pts, y, basis, known);
          // The stride of a dimension of size 1 is any number (a slice of a longer tensor).
          if (!e && part == 1 && sizes.at(d).constant() == 1) e = SymExpr(y[0]);
          if (e && part == 0 && !e->is_constant() && !e->as_symbol() &&
              std::find_if(known.begin(), known.end(), [&](const Feature& f) { return f.expr == *e; }) == known.end())
            known.push_back(feature_of(*e, basis.symbols));
          if (!e)
            return std::string(part == 0 ? "size " : "stride ") + std::to_string(d) + " of '" + n->name() +
                   "' is no expression of the symbols we fit (" + c10::str(c10::IntArrayRef(y)) + " at " +
                   describe_points() + ")";
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
  for (auto& [n, metas] : fitted)
    for (size_t o = 0; o < metas.size(); ++o) n->set_output_meta(o, std::move(metas[o]));
  return "";
}

std::string describe_node(const Node& n) { return "node '" + n.name() + "' (" + n.target() + ")"; }

bool same_constant(const c10::IValue& a, const c10::IValue& b) {
  if (a.tagKind() != b.tagKind()) return false;
  try {
    return a == b;
  } catch (const std::exception&) {
    return false;
  }
}

std::string walk_pair(const Graph& a, const Graph& b,
                      const std::function<std::string(Node&, size_t, const c10::IValue&)>& on_constant) {
  if (a.size() != b.size())
    return "the recording has " + std::to_string(b.size()) + " nodes instead of " + std::to_string(a.size());
  std::unordered_map<const Node*, size_t> index_a, index_b;
  auto ia = a.nodes().begin();
  auto ib = b.nodes().begin();
  auto same_value = [&](const Value& x, const Value& y) {
    auto fx = index_a.find(x.node);
    auto fy = index_b.find(y.node);
    return fx != index_a.end() && fy != index_b.end() && fx->second == fy->second && x.index == y.index;
  };
  for (size_t k = 0; ia != a.nodes().end(); ++ia, ++ib, ++k) {
    Node& na = **ia;
    const Node& nb = **ib;
    index_a[&na] = k, index_b[&nb] = k;
    if (na.kind() != nb.kind() || na.target() != nb.target() || na.callable() != nb.callable() ||
        na.args().size() != nb.args().size() || na.num_outputs() != nb.num_outputs() ||
        na.return_counts() != nb.return_counts())
      return describe_node(na) + " became " + describe_node(nb);
    if (na.kind() == NodeKind::CallModule) return "the graph calls the opaque module '" + na.target() + "'";
    for (size_t o = 0; o < na.num_outputs(); ++o) {
      const TensorMeta &ma = na.output_meta()[o], &mb = nb.output_meta()[o];
      // (Not the device: a shape-only trace's results are meta tensors; a device change is an
      // argument.)
      if (ma.defined != mb.defined || ma.dtype != mb.dtype || ma.sizes.size() != mb.sizes.size() ||
          ma.requires_grad != mb.requires_grad)
        return describe_node(na) + " changed the dtype, rank or requires_grad of a result";
    }
    for (size_t i = 0; i < na.args().size(); ++i) {
      const Argument &x = na.args()[i], &y = nb.args()[i];
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

std::string fit_arguments(Graph& g, const std::vector<const Graph*>& others, const std::vector<Point>& pts,
                          const Basis& basis, bool& ambiguous, size_t* fitted_count) {
  TORCH_INTERNAL_ASSERT(pts.size() == others.size() + 1, "size_fit::fit_arguments: one point per graph");
  std::map<std::pair<Node*, size_t>, std::vector<std::vector<int64_t>>> ints;  // (node, arg) -> per other graph
  for (const Graph* other_graph : others) {
    std::string why = walk_pair(g, *other_graph, [&](Node& n, size_t i, const c10::IValue& other) -> std::string {
      const c10::IValue& mine = n.args()[i].constant();
      const auto a = int_values(mine), b = int_values(other);
      if (a && b && a->size() == b->size() && mine.isInt() == other.isInt()) {
        ints[{&n, i}].push_back(*b);
        return "";
      }
      if (same_constant(mine, other)) return "";
      return "argument " + std::to_string(i) + " of " + describe_node(n) + " changed with the sizes";
    });
    if (!why.empty()) return why;
  }
  std::vector<std::pair<std::pair<Node*, size_t>, std::vector<SymExpr>>> fitted;
  for (auto& [where, per_graph] : ints) {
    Node* n = where.first;
    const std::vector<int64_t> values = *int_values(n->args()[where.second].constant());
    std::vector<SymExpr> exprs;
    bool any = false;
    for (size_t j = 0; j < values.size(); ++j) {
      std::vector<int64_t> y{values[j]};
      for (const auto& s : per_graph) y.push_back(s[j]);
      std::optional<SymExpr> e = fit_simplest(pts, y, basis, ambiguous);
      const std::string which = "integer " + std::to_string(j) + " of argument " + std::to_string(where.second) +
                                " of " + describe_node(*n) + " (" + c10::str(c10::IntArrayRef(y)) + ")";
      if (ambiguous) return which + " fits two expressions of the sizes";
      if (!e) return which + " is no expression of the sizes we fit";
      any = any || !e->is_constant();
      exprs.push_back(*e);
    }
    if (any) fitted.emplace_back(where, std::move(exprs));
  }
  for (auto& [where, exprs] : fitted)
    where.first->set_arg(where.second,
                         Argument::size_expression(std::move(exprs), where.first->args()[where.second].constant()));
  if (fitted_count) *fitted_count = fitted.size();
  return "";
}

}  // namespace torchcompile::ir::size_fit
