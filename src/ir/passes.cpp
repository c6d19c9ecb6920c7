// lint() and dead-code elimination over a Graph.
#include <torchcompile/ir/passes.h>

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace torchcompile::ir {

namespace {

std::string value_name(const Value& v) {
  if (!v.node) return "<null>";
  return "%" + v.node->name() + (v.node->num_outputs() == 1 ? "" : "." + std::to_string(v.index));
}

// A one-line picture of a node for lint messages.
std::string describe(const Node& n) {
  std::ostringstream os;
  os << "%" << n.name() << " = " << to_string(n.kind()) << "[target=" << n.target() << "](";
  for (size_t i = 0; i < n.args().size(); ++i) {
    if (i) os << ", ";
    const Argument& a = n.args()[i];
    if (a.is_value()) {
      os << value_name(a.value());
    } else if (a.is_list()) {
      os << "[";
      for (size_t j = 0; j < a.list().size(); ++j)
        os << (j ? ", " : "") << (a.list()[j] ? value_name(*a.list()[j]) : "None");
      os << "]";
    } else {
      os << "<constant>";
    }
  }
  os << ")";
  return os.str();
}

#define LINT_CHECK(cond, node, ...) \
  TORCH_CHECK(cond, "lint: ", __VA_ARGS__, "\n  offending node: ", describe(node))


void check_call_function(const Node& n) {
  const auto& schema = n.schema();
  const auto& formals = schema.arguments();
  LINT_CHECK(n.args().size() == formals.size(), n, "expected ", formals.size(), " arguments for ", n.target(),
             ", got ", n.args().size());
  for (size_t i = 0; i < formals.size(); ++i) {
    const auto& t = formals[i].type();
    const Argument& a = n.args()[i];
    bool ok;
    if (is_tensor_type(t)) {
      ok = a.is_value();
    } else if (is_optional_tensor_type(t)) {
      ok = a.is_value() || (a.is_constant() && a.constant().isNone());
    } else if (is_tensor_list_type(t)) {
      ok = a.is_list();
    } else {
      ok = a.is_constant();
    }
    LINT_CHECK(ok, n, "argument '", formals[i].name(), "' has the wrong kind for its type ", t->annotation_str());
  }
  const auto& returns = schema.returns();
  LINT_CHECK(n.return_counts().size() == returns.size(), n, "expected ", returns.size(), " return counts, got ",
             n.return_counts().size());
  size_t total = 0;
  for (size_t r = 0; r < returns.size(); ++r) {
    LINT_CHECK(returns[r].type()->kind() == c10::TypeKind::ListType || n.return_counts()[r] == 1, n, "return ", r,
               " is not a list but has count ", n.return_counts()[r]);
    total += n.return_counts()[r];
  }
  LINT_CHECK(total == n.num_outputs(), n, "return counts add up to ", total, " outputs, but the node has metadata for ",
             n.num_outputs());
}

// Size symbols: every symbol a node's metadata uses is declared; every declared symbol is bound
// (a placeholder dimension whose size is exactly the symbol); example sizes and strides are the
// expressions' values for the symbols' example values.
void lint_symbols(const Graph& g) {
  const std::map<std::string, int64_t> examples = g.symbol_examples();
  std::set<std::string> bound;
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    for (size_t k = 0; k < n.output_meta().size(); ++k) {
      const TensorMeta& m = n.output_meta()[k];
      if (!m.symbolic()) continue;
      LINT_CHECK(m.sym_sizes.size() == m.sizes.size() && m.sym_strides.size() == m.strides.size(), n, "output ", k,
                 ": symbolic sizes and strides must give every dimension");
      for (const auto* pair : {&m.sym_sizes, &m.sym_strides}) {
        const std::vector<int64_t>& values = pair == &m.sym_sizes ? m.sizes : m.strides;
        for (size_t d = 0; d < pair->size(); ++d) {
          const SymExpr& e = (*pair)[d];
          for (const std::string& s : e.symbols())
            LINT_CHECK(examples.count(s) != 0, n, "output ", k, " uses the size symbol ", s, ", which is not declared");
          LINT_CHECK(e.evaluate(examples) == values[d], n, "output ", k, ": ", e.str(), " is ", e.evaluate(examples),
                     " for the symbols' example values, but the example run had ", values[d]);
        }
      }
      if (n.kind() != NodeKind::Placeholder) continue;
      for (const SymExpr& e : m.sym_sizes)
        if (auto s = e.as_symbol()) bound.insert(*s);
    }
    for (size_t i = 0; i < n.args().size(); ++i) {
      const Argument& a = n.args()[i];
      if (!a.is_constant() || !a.is_size_expression()) continue;
      const auto ints = int_values(a.constant());
      LINT_CHECK(ints && ints->size() == a.sym_ints().size(), n, "argument ", i,
                 ": a size expression needs one expression per integer");
      for (size_t j = 0; j < a.sym_ints().size(); ++j) {
        const SymExpr& e = a.sym_ints()[j];
        for (const std::string& s : e.symbols())
          LINT_CHECK(examples.count(s) != 0, n, "argument ", i, " uses the size symbol ", s, ", which is not declared");
        LINT_CHECK(e.evaluate(examples) == (*ints)[j], n, "argument ", i, ": ", e.str(), " is ", e.evaluate(examples),
                   " for the symbols' example values, but the argument's example value is ", (*ints)[j]);
      }
    }
  }
  for (const SizeSymbolDecl& s : g.symbols())
    TORCH_CHECK(bound.count(s.name) != 0, "lint: size symbol ", s.name,
                " is not bound: no placeholder has a dimension of size exactly ", s.name);
}

}  // namespace

void lint(const Graph& g) {
  std::unordered_set<const Node*> defined;
  std::unordered_set<std::string> names;
  // Expected use lists, rebuilt from the arguments: (producer, output) -> sorted uses.
  std::map<std::pair<const Node*, uint32_t>, std::vector<std::pair<const Node*, size_t>>> expected;
  bool seen_non_placeholder = false;
  const Node* output = nullptr;

  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    LINT_CHECK(n.owning_graph() == &g, n, "node is owned by another graph");
    LINT_CHECK(names.insert(n.name()).second, n, "name '", n.name(), "' is used by two nodes");
    LINT_CHECK(output == nullptr, n, "node comes after the output node '", output ? output->name() : "", "'");
    if (n.kind() == NodeKind::Placeholder) {
      LINT_CHECK(!seen_non_placeholder, n, "placeholder after a non-placeholder node");
    } else {
      seen_non_placeholder = true;
    }
    for (size_t i = 0; i < n.args().size(); ++i) {
      n.args()[i].for_each_value([&](const Value& v) {
        LINT_CHECK(v.node != nullptr, n, "argument ", i, " is a null value");
        LINT_CHECK(defined.count(v.node), n, "argument ", i, " refers to a node that is not defined before it in "
                                                          "this graph");
        LINT_CHECK(v.index < v.node->num_outputs(), n, "argument ", i, " refers to output ", v.index, " of '",
                   v.node->name(), "', which has ", v.node->num_outputs(), " outputs");
        expected[{v.node, v.index}].emplace_back(&n, i);
      });
    }
    switch (n.kind()) {
      case NodeKind::Placeholder:
      case NodeKind::GetAttr:
        LINT_CHECK(n.args().empty() && n.num_outputs() == 1, n, "expected no arguments and one output");
        break;
      case NodeKind::CallFunction:
        LINT_CHECK(n.has_op(), n, "call_function node without an operator");
        check_call_function(n);
        break;
      case NodeKind::CallModule:
        break;
      case NodeKind::Output:
        LINT_CHECK(n.args().size() == 1 && n.args()[0].is_list() && n.num_outputs() == 0, n,
                   "expected the output node to have one value list argument and no outputs");
        output = &n;
        break;
    }
    defined.insert(&n);
  }
  TORCH_CHECK(output != nullptr, "lint: expected an output node at the end of the graph, found none");
  lint_symbols(g);

  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    for (uint32_t k = 0; k < n.num_outputs(); ++k) {
      std::vector<std::pair<const Node*, size_t>> actual;
      for (const Use& u : n.uses(k)) actual.emplace_back(u.user, u.arg_index);
      auto want = expected[{&n, k}];
      std::sort(actual.begin(), actual.end());
      std::sort(want.begin(), want.end());
      if (actual == want) continue;
      std::ostringstream os;
      for (const auto& [user, i] : actual) {
        os << " " << (defined.count(user) ? user->name() : std::string("<not in graph>")) << "@" << i;
      }
      os << " vs. expected";
      for (const auto& [user, i] : want) os << " " << user->name() << "@" << i;
      LINT_CHECK(false, n, "use list of output ", k, " does not match the arguments that use it:", os.str());
    }
  }
}

bool eliminate_dead_code(Graph& g) {
  bool changed = false;
  bool again = true;
  while (again) {
    again = false;
    // Users come after their producers, so walking backwards frees whole dead chains in one go.
    std::vector<Node*> order;
    for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) order.push_back(it->get());
    for (Node* n : order) {
      if (n->kind() == NodeKind::Placeholder || n->kind() == NodeKind::Output) continue;
      if (n->has_uses() || n->has_side_effects()) continue;
      g.erase(n);
      again = changed = true;
    }
  }
  return changed;
}

}  // namespace torchcompile::ir
