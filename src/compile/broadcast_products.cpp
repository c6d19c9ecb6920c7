#include "compile/broadcast_products.h"

#include <torchcompile/ir/passes.h>

#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>

#include <optional>
#include <set>

namespace torchcompile::compile_stage {

namespace {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  const auto strides = c10::contiguous_strides(sizes);
  return std::vector<int64_t>(strides.begin(), strides.end());
}

ir::TensorMeta meta_like(const ir::TensorMeta& of, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
  ir::TensorMeta m;
  m.dtype = of.dtype;
  m.device = of.device;
  m.requires_grad = of.requires_grad;
  m.sizes = std::move(sizes);
  m.strides = std::move(strides);
  return m;
}

const ir::TensorMeta& meta(const ir::Value& v) { return v.node->output_meta().at(v.index); }

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
    if (!m.defined || m.symbolic()) return std::nullopt;
    if (c10::multiply_integers(m.sizes) == 1) return v;
    const ir::Node* n = v.node;
    if (n->kind() != ir::NodeKind::CallFunction || n->callable() || !views.count(n->target()) || n->args().empty() ||
        !n->args()[0].is_value())
      return std::nullopt;
    v = n->args()[0].value();
  }
}

std::string dims(const ir::TensorMeta& m) { return std::to_string(m.sizes[0]) + " x " + std::to_string(m.sizes[1]); }

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
    if (!am.defined || !bm.defined || am.symbolic() || bm.symbolic() || om.symbolic()) continue;
    if (!c10::isFloatingType(om.dtype) || am.sizes.size() != 2 || bm.sizes.size() != 2) continue;
    // A broadcast first operand: every row of the product is s * (the column sums of B). A
    // broadcast second operand: every column is s * (the row sums of A).
    std::optional<ir::Value> source = broadcast_source(a);
    const bool first = source.has_value();
    if (!first) source = broadcast_source(b);
    if (!source) continue;
    const ir::Value other = first ? b : a;
    const int64_t M = am.sizes[0], N = bm.sizes[1];
    const std::vector<int64_t> reduced = first ? std::vector<int64_t>{1, N} : std::vector<int64_t>{M, 1};

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
                        meta_like(om, reduced, contiguous_strides(reduced)));
    ir::Value scaled = add("aten::mul.Tensor", {sum, s}, meta_like(om, reduced, contiguous_strides(reduced)));
    ir::Value spread = add("aten::expand", {scaled, c10::IValue(om.sizes), c10::IValue(false)},
                           meta_like(om, om.sizes, first ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{1, 0}));
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
