// Giving a graph recorded at concrete sizes its size symbols, from the same graph recorded at other
// values of the symbols: integers and metadata that vary are fitted as expressions of the symbols
// that give the recorded number at every point (a constant, `a*s + b`, `a*s*t + b`,
// `a*s + c*t + b`, `a*((s + r)//c) + b`, products of sizes already fitted). A pure IR analysis:
// the dynamic entries of the runtime use it for the forward's graph, AOT for its joint graph.
#pragma once

#include <torchcompile/ir/graph.h>
#include <torchcompile/ir/symbolic.h>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace torchcompile::ir::size_fit {

/// The symbols' values at one point, in the order of the basis's symbols.
using Point = std::vector<int64_t>;

/// The symbols' example values (point 0) and three other points: for each symbol three other
/// values distinct from its example, from each other and from the other symbols' values at the
/// same point, inside its range and at least 2 (its example plus 1, plus 2, twice it plus 3 where
/// they fit), and none of `avoid` (static sizes of the graph, where a size equal to one may take
/// another path in LibTorch's code). None, with `why`, for a range too narrow.
std::optional<std::vector<Point>> probe_points(const std::vector<SizeSymbolDecl>& symbols, std::string& why,
                                               const std::set<int64_t>& avoid = {});

/// A basis function of the fits: an expression of the symbols and its value at a point.
struct Feature {
  SymExpr expr;
  std::function<int64_t(const Point&)> at;
};

/// The basis functions over `symbols` (names; a point holds their values in this order): each
/// symbol, each product of two (and of all, for three or more), and floor divisions
/// `(s + r)//c` for c in 2..8 (r in 0..c-1 with `with_offsets`, else 0).
struct Basis {
  std::vector<std::string> symbols;
  std::vector<Feature> singles, products, floors;
};
Basis basis_of(const std::vector<std::string>& symbols, bool with_offsets);

/// The expression for a size or stride, the first that gives y[p] at pts[p] for every p: a
/// constant, an affine function of a symbol, of a size fitted before (`known`), of a product, a
/// sum of two symbols, a floor division (two different floor divisions: none).
std::optional<SymExpr> fit(const std::vector<Point>& pts, const std::vector<int64_t>& y, const Basis& basis,
                           const std::vector<Feature>& known);

/// The simplest expression through the points, for an integer argument: a constant, else
/// `a*s + b` for one symbol, else `a*s*t + b`, else `a*s + c*t + b` (four points or more), else
/// `a*(s//c) + b`; at the first of these that fits, two different fits set `ambiguous` (more
/// points are needed to tell them apart).
std::optional<SymExpr> fit_simplest(const std::vector<Point>& pts, const std::vector<int64_t>& y, const Basis& basis,
                                    bool& ambiguous);

/// Fits every size and stride of every value of `g` (placeholders included) from its metadata at
/// each point: `metas_at(node, p, out)` fills the node's metadata at pts[p] (p >= 1; pts[0] is
/// the graph's own) or returns why it cannot. Sets the symbolic metadata of every node when all
/// fit (a node with no symbolic size or stride keeps static metadata); otherwise changes nothing
/// and returns why. `describe_points` names the points in messages.
std::string fit_metadata(Graph& g, const std::vector<Point>& pts, const Basis& basis,
                         const std::function<std::string(const Node&, size_t, std::vector<TensorMeta>&)>& metas_at,
                         const std::function<std::string()>& describe_points);

/// "node 'name' (target)".
std::string describe_node(const Node& n);

/// Whether two constants are the same (neither a size expression).
bool same_constant(const c10::IValue& a, const c10::IValue& b);

/// Walks two graphs node by node, calling `on_constant(node of a, argument index, constant of b)`
/// for each constant argument; returns the first structural difference (another operator,
/// another value read, a result of another dtype, rank or requires_grad), or "".
std::string walk_pair(const Graph& a, const Graph& b,
                      const std::function<std::string(Node&, size_t, const c10::IValue&)>& on_constant);

/// Gives the integer arguments of `g` that differ in `others` (the same graph recorded at
/// pts[1..], `g` at pts[0]) the simplest expressions through the points (fit_simplest), as size
/// expressions. Returns why not ("" when done; `ambiguous` says that more points would decide);
/// `fitted` counts the arguments that became size expressions. Changes nothing on failure.
std::string fit_arguments(Graph& g, const std::vector<const Graph*>& others, const std::vector<Point>& pts,
                          const Basis& basis, bool& ambiguous, size_t* fitted = nullptr);

}  // namespace torchcompile::ir::size_fit
