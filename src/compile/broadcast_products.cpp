#include "compile/broadcast_products.h"

#include <torchcompile/ir/passes.h>

#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <optional>
#include <set>

namespace torchcompile::compile_stage {

namespace {

/// A shape as expressions of the graph's symbols, with its values at their example values (in a
/// static graph, `sym` stays empty).
struct Shape {
  std::vector<int64_t> values;
  std::vector<ir::SymExpr> sym;
};

Shape shape_of(const ir::TensorMeta& m) { return {m.sizes, m.sym_sizes}; }

/// dims[i] of `shape`, as a shape of its own.
Shape pick(const Shape& shape, std::initializer_list<int> dims) {
  Shape s;
  for (int d : dims) {
    s.values.push_back(d < 0 ? 1 : shape.values[d]);
    if (!shape.sym.empty()) s.sym.push_back(d < 0 ? ir::SymExpr(1) : shape.sym[d]);
  }
  return s;
}

/// Strides of a 2-d shape: contiguous, or of a [1, C] tensor expanded along its rows (row stride
/// 0), or of an [R, 1] tensor expanded along its columns (strides 1, 0).
Shape strides_2d(const Shape& shape, bool rows_broadcast, bool cols_broadcast) {
  Shape s;
  s.values = {rows_broadcast ? 0 : cols_broadcast ? 1 : shape.values[1], cols_broadcast ? 0 : 1};
  if (!shape.sym.empty())
    s.sym = {rows_broadcast ? ir::SymExpr(0) : cols_broadcast ? ir::SymExpr(1) : shape.sym[1], ir::SymExpr(cols_broadcast ? 0 : 1)};
  return s;
}

ir::TensorMeta meta_like(const ir::TensorMeta& of, const Shape& sizes, const Shape& strides) {
  ir::TensorMeta m;
  m.dtype = of.dtype;
  m.device = of.device;
  m.requires_grad = of.requires_grad;
  m.sizes = sizes.values;
  m.strides = strides.values;
  m.sym_sizes = sizes.sym;
  m.sym_strides = strides.sym;
  return m;
}

const ir::TensorMeta& meta(const ir::Value& v) { return v.node->output_meta().at(v.index); }

/// Whether the tensor has exactly one element at every size of the graph's symbols.
bool one_element(const ir::TensorMeta& m) {
  if (!m.symbolic()) return c10::multiply_integers(m.sizes) == 1;
  return std::all_of(m.sym_sizes.begin(), m.sym_sizes.end(), [](const ir::SymExpr& e) { return e.constant() == 1; });
}

// The one-element tensor `v` is a broadcast view of: followed back through operators that only
// view their first argument (every element of the view is an element of it); nullopt if `v` is not
// such a view.
std::optional<ir::Value> broadcast_source(ir::Value v) {
  static const std::set<std::string> views = {
      "aten::expand",   "aten::t",          "aten::transpose.int", "aten::permute", "aten::view",
      "aten::reshape",  "aten::_reshape_alias", "aten::_unsafe_view", "aten::unsqueeze", "aten::squeeze",
      "aten::squeeze.dim", "aten::alias", "aten::slice.Tensor", "aten::narrow", "aten::select.int"};
  for (;;) {
    const ir::TensorMeta& m = meta(v);
    if (!m.defined) return std::nullopt;
    if (one_element(m)) return v;
    const ir::Node* n = v.node;
    if (n->kind() != ir::NodeKind::CallFunction || n->callable() || !views.count(n->target()) || n->args().empty() ||
        !n->args()[0].is_value())
      return std::nullopt;
    v = n->args()[0].value();
  }
}

std::string dims(const ir::TensorMeta& m) {
  auto dim = [&](size_t i) { return m.symbolic() ? m.sym_sizes[i].str() : std::to_string(m.sizes[i]); };
  return dim(0) + " x " + dim(1);
}

}  // namespace

std::vector<std::string> simplify_broadcast_products(GraphModule& gm) {
  ir::Graph& g = gm.graph();
  std::vector<ir::Node*> products;
  for (const auto& n : g.nodes())
    if (n->kind() == ir::NodeKind::CallFunction && !n->callable() && n->target() == "aten::mm") products.push_back(n.get());
  std::vector<std::string> lines;
  for (ir::Node* n : products) {
    if (n->args().size() < 2 || !n->args()[0].is_value() || !n->args()[1].is_value()) continue;
    const ir::Value a = n->args()[0].value(), b = n->args()[1].value();
    const ir::TensorMeta &am = meta(a), &bm = meta(b), &om = n->output_meta().at(0);
    if (!am.defined || !bm.defined || !om.defined) continue;
    if (!c10::isFloatingType(om.dtype) || am.sizes.size() != 2 || bm.sizes.size() != 2) continue;
    // A broadcast first operand: every row of the product is s * (the column sums of B). A
    // broadcast second operand: every column is s * (the row sums of A).
    std::optional<ir::Value> source = broadcast_source(a);
    const bool first = source.has_value();
    if (!first) source = broadcast_source(b);
    if (!source) continue;
    const ir::Value other = first ? b : a;
    // The product's shape [M, N]; the sums have [1, N] or [M, 1].
    const Shape out = shape_of(om);
    const Shape reduced = first ? pick(out, {-1, 1}) : pick(out, {0, -1});
    const Shape reduced_strides = strides_2d(reduced, false, false);

    g.set_insert_point(n);
    auto add = [&](const char* op, std::vector<ir::Argument> args, ir::TensorMeta m) {
      ir::Node* made = g.call_function(ir::find_op(op), std::move(args), {std::move(m)});
      made->set_module_path(n->module_path());
      return made->output(0);
    };
    ir::Value s = *source;
    if (!meta(s).sizes.empty()) s = add("aten::view", {s, c10::IValue(std::vector<int64_t>{})}, meta_like(om, {}, {}));
    ir::Value sum = add("aten::sum.dim_IntList",
                        {other, c10::IValue(std::vector<int64_t>{first ? 0 : 1}), c10::IValue(true), c10::IValue()},
                        meta_like(om, reduced, reduced_strides));
    ir::Value scaled = add("aten::mul.Tensor", {sum, s}, meta_like(om, reduced, reduced_strides));
    const ir::Argument out_sizes =
        om.symbolic() ? ir::Argument::size_expression(om.sym_sizes, c10::IValue(om.sizes)) : ir::Argument(c10::IValue(om.sizes));
    ir::Value spread =
        add("aten::expand", {scaled, out_sizes, c10::IValue(false)}, meta_like(om, out, strides_2d(out, first, !first)));
    ir::Value result = add("aten::clone", {spread, c10::IValue(c10::MemoryFormat::Contiguous)}, om);
    g.set_insert_point(nullptr);
    lines.push_back(n->name() + " [" + dims(am) + " @ " + dims(bm) + "]: " +
                    (first ? "column sums of its second operand" : "row sums of its first operand") +
                    " times one value (its " + (first ? "first" : "second") + " operand is that value broadcast)");
    g.replace_all_uses(n->output(0), result);
    g.erase(n);
  }
  if (!lines.empty()) {
    ir::eliminate_dead_code(g);  // the views that only the products read
    gm.recompile();
  }
  return lines;
}

}  // namespace torchcompile::compile_stage
