#include <torchcompile/ir/split.h>
#include <torchcompile/ir/passes.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::ir {

std::vector<Value> input_values(const Node& n) {
  std::vector<Value> vs;
  for (const auto& a : n.args()) a.for_each_value([&](const Value& v) { vs.push_back(v); });
  return vs;
}

std::string value_name(const Value& v) {
  return v.index == 0 ? v.node->name() : v.node->name() + "_" + std::to_string(v.index);
}

Node* copy_node(Graph& dst, const Node& n, const std::function<Value(const Value&)>& map) {
  std::vector<Argument> args;
  args.reserve(n.args().size());
  for (const Argument& a : n.args()) {
    if (a.is_value()) {
      args.emplace_back(map(a.value()));
    } else if (a.is_list()) {
      std::vector<std::optional<Value>> list;
      for (const auto& e : a.list()) list.push_back(e ? std::optional<Value>(map(*e)) : std::nullopt);
      args.emplace_back(std::move(list));
    } else {
      args.push_back(a);  // a size expression stays one
    }
  }
  Node* copy = nullptr;
  if (n.kind() == NodeKind::CallFunction) {
    copy = dst.call_function(n.op(), std::move(args), n.output_meta(), n.return_counts());
    if (n.callable()) dst.set_target(copy, n.callable());
  } else {
    TORCH_CHECK(n.kind() == NodeKind::CallModule, "copy_node: expected a call_function or call_module node, got ",
                n.name());
    copy = dst.call_module(n.target(), std::move(args), n.output_meta());
  }
  dst.rename(copy, n.name());
  copy->set_module_path(n.module_path());
  return copy;
}

std::unique_ptr<GraphModule> copy_module(const GraphModule& gm) {
  auto out = std::make_unique<GraphModule>();
  Graph& g = out->graph();
  for (const SizeSymbolDecl& s : gm.graph().symbols()) g.add_symbol(s);
  std::unordered_map<const Node*, Node*> copies;
  auto map = [&](const Value& v) { return Value{copies.at(v.node), v.index}; };
  for (const auto& owned : gm.graph().nodes()) {
    const Node& n = *owned;
    switch (n.kind()) {
      case NodeKind::Placeholder: {
        Value v = g.placeholder(n.target(), n.output_meta().at(0));
        g.rename(v.node, n.name());
        copies[&n] = v.node;
        break;
      }
      case NodeKind::GetAttr: {
        Value v = g.get_attr(n.target(), n.output_meta().at(0));
        g.rename(v.node, n.name());
        copies[&n] = v.node;
        break;
      }
      case NodeKind::Output: {
        std::vector<Value> outs;
        for (const auto& e : n.args().at(0).list()) outs.push_back(map(*e));
        g.output(std::move(outs));
        break;
      }
      default:
        copies[&n] = copy_node(g, n, map);
    }
  }
  for (const auto& [name, attr] : gm.attributes()) out->set_attribute(name, attr.first, attr.second);
  for (const auto& owned : gm.graph().nodes())
    if (owned->kind() == NodeKind::CallModule && !out->has_submodule(owned->target()))
      out->set_submodule(owned->target(), gm.submodule(owned->target()));
  return out;
}

std::vector<std::vector<const Node*>> group_by_support(const Graph& g,
                                                       const std::function<bool(const Node&)>& supported,
                                                       size_t min_size) {
  std::vector<std::vector<const Node*>> runs;
  std::vector<const Node*> run;
  auto close = [&] {
    if (!run.empty() && run.size() >= std::max<size_t>(min_size, 1)) runs.push_back(std::move(run));
    run.clear();
  };
  for (const auto& owned : g.nodes()) {
    const Node* n = owned.get();
    if (n->kind() == NodeKind::CallFunction && supported(*n)) {
      run.push_back(n);
    } else if (n->kind() != NodeKind::GetAttr && n->kind() != NodeKind::Placeholder) {
      close();
    }
  }
  close();
  return runs;
}

namespace {

std::string describe_group(const std::vector<const Node*>& group) {
  std::string s;
  for (size_t i = 0; i < group.size() && i < 6; ++i) s += (i ? ", " : "") + group[i]->name();
  if (group.size() > 6) s += ", ... (" + std::to_string(group.size()) + " nodes)";
  return s;
}

// A part being built: its module, the values of the original graph it reads (one per
// placeholder) and those it gives back (one per output).
struct PartPlan {
  std::vector<const Node*> nodes;  // in graph order
  std::vector<Value> inputs, outputs;
};

PartPlan plan_part(const std::vector<const Node*>& nodes, int group,
                   const std::unordered_map<const Node*, int>& group_of) {
  auto in_group = [&](const Node* n) {
    auto it = group_of.find(n);
    return it != group_of.end() && it->second == group;
  };
  PartPlan p;
  p.nodes = nodes;
  std::unordered_set<Value, ValueHash> seen;
  for (const Node* n : p.nodes)
    for (const Value& v : input_values(*n))
      if (!in_group(v.node) && v.node->kind() != NodeKind::GetAttr && seen.insert(v).second) p.inputs.push_back(v);
  for (const Node* n : p.nodes)
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      const auto& uses = n->uses(i);
      if (std::any_of(uses.begin(), uses.end(), [&](const Use& u) { return !in_group(u.user); }))
        p.outputs.push_back(const_cast<Node*>(n)->output(i));
    }
  return p;
}

std::shared_ptr<GraphModule> build_part(const GraphModule& gm, const PartPlan& p, bool* symbolic) {
  auto part = std::make_shared<GraphModule>();
  Graph& g = part->graph();
  std::unordered_map<Value, Value, ValueHash> env;
  for (const Value& v : p.inputs) env.emplace(v, g.placeholder(value_name(v), v.node->output_meta().at(v.index)));
  auto map = [&](const Value& v) -> Value {
    auto it = env.find(v);
    if (it != env.end()) return it->second;
    // Only attribute reads are not yet mapped: copy them in where first read.
    TORCH_INTERNAL_ASSERT(v.node->kind() == NodeKind::GetAttr, "split_module: unmapped value ", value_name(v));
    const std::string& name = v.node->target();
    Value a = g.get_attr(name, v.node->output_meta().at(0));
    if (!part->has_attribute(name)) part->set_attribute(name, gm.attribute(name), gm.attribute_kind(name));
    env.emplace(v, a);
    return a;
  };
  for (const Node* n : p.nodes) {
    Node* copy = copy_node(g, *n, map);
    for (size_t i = 0; i < n->num_outputs(); ++i) env[const_cast<Node*>(n)->output(i)] = copy->output(i);
  }
  std::vector<Value> outs;
  for (const Value& v : p.outputs) outs.push_back(env.at(v));
  g.output(std::move(outs));
  *symbolic = carry_symbols(gm, g);
  lint(g);
  return part;
}

}  // namespace

std::set<std::string> used_symbols(const Graph& g) {
  std::set<std::string> out;
  auto add = [&out](const SymExpr& e) {
    for (const std::string& s : e.symbols()) out.insert(s);
  };
  for (const auto& n : g.nodes()) {
    for (const TensorMeta& m : n->output_meta()) {
      for (const SymExpr& e : m.sym_sizes) add(e);
      for (const SymExpr& e : m.sym_strides) add(e);
    }
    for (const Argument& a : n->args())
      if (a.is_size_expression())
        for (const SymExpr& e : a.sym_ints()) add(e);
  }
  return out;
}

bool carry_symbols(const GraphModule& gm, Graph& part) {
  if (gm.graph().symbols().empty()) return true;
  const std::set<std::string> used = used_symbols(part);
  std::set<std::string> bound;
  for (const Node* ph : part.placeholders())
    for (const SymExpr& e : ph->output_meta().at(0).sym_sizes)
      if (auto s = e.as_symbol()) bound.insert(*s);
  const bool all_bound = std::includes(bound.begin(), bound.end(), used.begin(), used.end());
  for (const SizeSymbolDecl& s : gm.graph().symbols())
    if (used.count(s.name)) part.add_symbol(s);
  if (!all_bound) part.clear_symbols();
  return all_bound;
}


SplitGraph split_module(const GraphModule& gm, const std::vector<std::vector<const Node*>>& groups) {
  const Graph& g = gm.graph();
  std::vector<const Node*> nodes;  // every node but the output node, in order
  std::unordered_map<const Node*, size_t> pos;
  for (const auto& owned : g.nodes()) {
    if (owned->kind() == NodeKind::Output) continue;
    pos.emplace(owned.get(), nodes.size());
    nodes.push_back(owned.get());
  }

  // Units: each group is one, every other node one of its own.
  const int num_groups = static_cast<int>(groups.size());
  std::unordered_map<const Node*, int> group_of;
  std::vector<std::vector<const Node*>> sorted(groups.size());
  for (int k = 0; k < num_groups; ++k) {
    TORCH_CHECK(!groups[k].empty(), "split_module: group ", k, " is empty");
    for (const Node* n : groups[k]) {
      TORCH_CHECK(n && pos.count(n), "split_module: group ", k, " holds a node that is not in the graph");
      TORCH_CHECK(n->kind() == NodeKind::CallFunction, "split_module: group ", k, " holds ", n->name(),
                  ", which is not a call_function node; a group holds call_function nodes");
      TORCH_CHECK(group_of.emplace(n, k).second, "split_module: ", n->name(), " is in two groups");
    }
    sorted[k] = groups[k];
    std::sort(sorted[k].begin(), sorted[k].end(), [&](const Node* a, const Node* b) { return pos[a] < pos[b]; });
  }
  std::vector<int> unit_of(nodes.size());
  std::vector<size_t> unit_pos(groups.size());  // where a unit would run in the original order
  std::vector<const Node*> single;                // the node of each single-node unit
  for (int k = 0; k < num_groups; ++k) unit_pos[k] = pos[sorted[k].front()];
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto it = group_of.find(nodes[i]);
    if (it != group_of.end()) {
      unit_of[i] = it->second;
    } else {
      unit_of[i] = num_groups + static_cast<int>(single.size());
      single.push_back(nodes[i]);
      unit_pos.push_back(i);
    }
  }
  const size_t num_units = unit_pos.size();

  // Ordering constraints between units: data dependencies, and every side effect keeps its place
  // relative to every other node (placeholders and attribute reads have no place to keep).
  std::vector<std::unordered_set<int>> succ(num_units);
  std::vector<int> indegree(num_units, 0);
  auto edge = [&](int from, int to) {
    if (from != to && succ[from].insert(to).second) ++indegree[to];
  };
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const Value& v : input_values(*nodes[i])) edge(unit_of[pos.at(v.node)], unit_of[i]);
  auto ordered = [](const Node* n) { return n->kind() == NodeKind::CallFunction || n->kind() == NodeKind::CallModule; };
  for (size_t s = 0; s < nodes.size(); ++s) {
    if (!ordered(nodes[s]) || !nodes[s]->has_side_effects()) continue;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (i != s && ordered(nodes[i])) i < s ? edge(unit_of[i], unit_of[s]) : edge(unit_of[s], unit_of[i]);
  }

  // Kahn's algorithm, earliest original position first: with no groups the order is the graph's.
  using Ready = std::pair<size_t, int>;  // (position, unit)
  std::priority_queue<Ready, std::vector<Ready>, std::greater<Ready>> ready;
  for (size_t u = 0; u < num_units; ++u)
    if (indegree[u] == 0) ready.push({unit_pos[u], static_cast<int>(u)});
  std::vector<int> order;
  while (!ready.empty()) {
    const int u = ready.top().second;
    ready.pop();
    order.push_back(u);
    for (int v : succ[u])
      if (--indegree[v] == 0) ready.push({unit_pos[v], v});
  }
  if (order.size() != num_units) {
    for (int k = 0; k < num_groups; ++k)
      TORCH_CHECK(indegree[k] == 0, "split_module: group ", k, " (", describe_group(sorted[k]),
                  ") cannot be ordered with the rest of the graph: it reads a value computed from its own "
                  "result outside the group, or moving its nodes together would move them across a side effect "
                  "(a mutation, a random op or a module call) of a node outside it");
    TORCH_INTERNAL_ASSERT(false, "split_module: the graph's nodes cannot be ordered");
  }

  // The parts, then the parent in that order.
  SplitGraph out;
  std::vector<PartPlan> plans;
  for (int k = 0; k < num_groups; ++k) {
    plans.push_back(plan_part(sorted[k], k, group_of));
    bool symbolic = true;
    auto module = build_part(gm, plans.back(), &symbolic);
    out.parts.push_back({"submod_" + std::to_string(k), std::move(module), !symbolic});
  }
  out.parent = std::make_unique<GraphModule>();
  GraphModule& parent = *out.parent;
  Graph& pg = parent.graph();
  for (const SizeSymbolDecl& s : g.symbols()) pg.add_symbol(s);  // the same placeholders bind them
  std::unordered_map<Value, Value, ValueHash> env;
  auto map = [&](const Value& v) { return env.at(v); };
  auto read_outside_groups = [&](const Node* n) {
    for (size_t i = 0; i < n->num_outputs(); ++i)
      for (const Use& u : n->uses(i))
        if (!group_of.count(u.user)) return true;
    return false;
  };
  for (int u : order) {
    if (u < num_groups) {
      const PartPlan& p = plans[u];
      std::vector<Argument> args;
      for (const Value& v : p.inputs) args.emplace_back(map(v));
      std::vector<TensorMeta> metas;
      for (const Value& v : p.outputs) metas.push_back(v.node->output_meta().at(v.index));
      Node* call = pg.call_module(out.parts[u].path, std::move(args), std::move(metas));
      for (size_t i = 0; i < p.outputs.size(); ++i) env[p.outputs[i]] = call->output(i);
      std::shared_ptr<GraphModule> module = out.parts[u].module;
      parent.set_submodule(out.parts[u].path, [module](const std::vector<at::Tensor>& in) { return module->forward(in); });
      continue;
    }
    const Node* n = single[u - num_groups];
    switch (n->kind()) {
      case NodeKind::Placeholder:
        env[const_cast<Node*>(n)->output()] = pg.placeholder(n->name(), n->output_meta().at(0));
        break;
      case NodeKind::GetAttr:
        if (!read_outside_groups(n)) break;  // the parts read their own copies
        env[const_cast<Node*>(n)->output()] = pg.get_attr(n->target(), n->output_meta().at(0));
        pg.rename(env.at(const_cast<Node*>(n)->output()).node, n->name());
        if (!parent.has_attribute(n->target()))
          parent.set_attribute(n->target(), gm.attribute(n->target()), gm.attribute_kind(n->target()));
        break;
      default: {
        if (n->kind() == NodeKind::CallModule && !parent.has_submodule(n->target()))
          parent.set_submodule(n->target(), gm.submodule(n->target()));
        Node* copy = copy_node(pg, *n, map);
        for (size_t i = 0; i < n->num_outputs(); ++i) env[const_cast<Node*>(n)->output(i)] = copy->output(i);
      }
    }
  }
  std::vector<Value> outs;
  for (const auto& e : g.output_node()->args().at(0).list()) {
    TORCH_CHECK(e.has_value(), "split_module: the output node returns None");
    outs.push_back(map(*e));
  }
  pg.output(std::move(outs));
  lint(pg);
  return out;
}

}  // namespace torchcompile::ir
