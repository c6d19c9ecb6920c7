// Splitting the joint graph into forward and backward graphs.
//
// Save-all: the forward computes what the forward outputs need; every forward value the
// backward reads is saved; everything else the gradients need (a `t` of a weight, say) is
// computed in the backward from saved values.
//
// Min cut (functorch's min_cut_rematerialization_partition): each value v becomes an edge
// v_in -> v_out whose capacity is its size in bytes; an op's inputs feed its outputs with
// infinite capacity; primals hang off the source; whatever a backward op (one depending on a
// tangent) reads and every tangent-independent gradient drain into the sink. Ops that may not be
// recomputed (anything but pointwise ops and views, random ops included) are tied to the source
// when the forward needs them anyway. The minimum cut is the cheapest set of values to save such
// that the backward can recompute everything else from them and the tangents.
#include "aot/aot_internal.h"

#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::aot {

namespace {

using ir::input_values;
using ir::Node;
using ir::Value;
using ir::value_name;

int64_t bytes_of(const ir::TensorMeta& m) {
  if (!m.defined) return 0;
  int64_t numel = 1;
  for (int64_t s : m.sizes) numel *= s;
  return numel * static_cast<int64_t>(c10::elementSize(m.dtype));
}

// Ops cheap enough to recompute in the backward instead of saving their results: views,
// pointwise ops and factories that draw no random numbers and write nothing.
bool recomputable(const Node* n) {
  const ir::OpProperties p = ir::node_properties(*n);
  if (p.view()) return true;
  if (p.random || p.mutating) return false;
  return p.pointwise() || p.kind == ir::OpKind::Factory;
}

// What owns the memory of `v`: its producer, or, through views, the value they view.
const Node* memory_owner(Value v) {
  while (ir::is_view_node(v.node)) {
    auto ins = input_values(*v.node);
    if (ins.empty()) break;
    v = ins.front();
  }
  return v.node;
}

// A new GraphModule computing `outputs` from `inputs` (which become its placeholders, in order)
// with the joint graph's nodes; names are kept, attributes copied. In a joint graph with size
// symbols, the new graph declares those it uses if its placeholders bind them all; otherwise it is
// made static (ir::carry_symbols) and `lost_symbols` is set. Without `carry_symbols` it keeps the
// joint graph's symbolic metadata and declares nothing (to see which symbols it would use).
std::unique_ptr<ir::GraphModule> extract(const ir::GraphModule& joint, const std::vector<Value>& inputs,
                                         const std::vector<Value>& outputs, const char* what,
                                         const std::vector<Value>& also_run = {}, bool* lost_symbols = nullptr,
                                         bool carry_symbols = true) {
  auto gm = std::make_unique<ir::GraphModule>();
  ir::Graph& g = gm->graph();
  std::unordered_map<Value, Value, ir::ValueHash> env;
  for (const Value& v : inputs) env.emplace(v, g.placeholder(value_name(v), v.node->output_meta().at(v.index)));
  std::unordered_set<const Node*> needed;
  std::vector<Value> todo(outputs.begin(), outputs.end());
  todo.insert(todo.end(), also_run.begin(), also_run.end());
  while (!todo.empty()) {
    Value v = todo.back();
    todo.pop_back();
    if (env.count(v) || !needed.insert(v.node).second) continue;
    TORCH_INTERNAL_ASSERT(v.node->kind() != ir::NodeKind::Placeholder, "aot partition: the ", what,
                          " graph needs '", v.node->name(), "', which it does not receive");
    for (const Value& in : input_values(*v.node)) todo.push_back(in);
  }
  auto map = [&](const Value& v) { return env.at(v); };
  for (const auto& owned : joint.graph().nodes()) {
    Node* n = owned.get();
    if (!needed.count(n)) continue;
    if (n->kind() == ir::NodeKind::GetAttr) {
      env[n->output(0)] = g.get_attr(n->target(), n->output_meta().at(0));
      gm->set_attribute(n->target(), joint.attribute(n->target()), joint.attribute_kind(n->target()));
      continue;
    }
    TORCH_INTERNAL_ASSERT(n->kind() == ir::NodeKind::CallFunction, "aot partition: unexpected node ", n->name());
    Node* copy = ir::copy_node(g, *n, map);
    for (size_t i = 0; i < n->num_outputs(); ++i) env[n->output(i)] = copy->output(i);
  }
  std::vector<Value> outs;
  for (const Value& v : outputs) outs.push_back(map(v));
  g.output(std::move(outs));
  if (carry_symbols && !ir::carry_symbols(joint, g) && lost_symbols) *lost_symbols = true;
  return gm;
}

// Nodes `roots` depend on, walking back until `stop` says so (stopped nodes are not included).
std::unordered_set<const Node*> ancestors(const std::vector<Value>& roots, const std::function<bool(const Node*)>& stop) {
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> todo;
  for (const Value& v : roots) todo.push_back(v.node);
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (stop(n) || !seen.insert(n).second) continue;
    for (const Value& in : input_values(*n)) todo.push_back(in.node);
  }
  return seen;
}

// Maximum flow / minimum cut (Dinic) over int64 capacities; kInf edges are never cut.
class MinCut {
 public:
  static constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

  explicit MinCut(size_t n) : adj_(n), level_(n), next_(n) {}
  void add(int from, int to, int64_t cap) {
    adj_[from].push_back({to, adj_[to].size(), cap});
    adj_[to].push_back({from, adj_[from].size() - 1, 0});
  }
  // Returns which nodes stay on the source's side of a minimum cut.
  std::vector<bool> solve(int s, int t) {
    while (bfs(s, t)) {
      std::fill(next_.begin(), next_.end(), 0);
      while (dfs(s, t, kInf) > 0) {
      }
    }
    std::vector<bool> reach(adj_.size(), false);
    bfs(s, -1);
    for (size_t i = 0; i < adj_.size(); ++i) reach[i] = level_[i] >= 0;
    return reach;
  }

 private:
  struct Edge {
    int to;
    size_t rev;
    int64_t cap;
  };
  bool bfs(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::queue<int> q;
    level_[s] = 0;
    q.push(s);
    while (!q.empty()) {
      int u = q.front();
      q.pop();
      for (const Edge& e : adj_[u]) {
        if (e.cap > 0 && level_[e.to] < 0) {
          level_[e.to] = level_[u] + 1;
          q.push(e.to);
        }
      }
    }
    return t >= 0 && level_[t] >= 0;
  }
  int64_t dfs(int u, int t, int64_t f) {
    if (u == t) return f;
    for (size_t& i = next_[u]; i < adj_[u].size(); ++i) {
      Edge& e = adj_[u][i];
      if (e.cap <= 0 || level_[e.to] != level_[u] + 1) continue;
      int64_t d = dfs(e.to, t, std::min(f, e.cap));
      if (d > 0) {
        e.cap -= d;
        if (adj_[e.to][e.rev].cap < kInf) adj_[e.to][e.rev].cap += d;
        return d;
      }
    }
    return 0;
  }
  std::vector<std::vector<Edge>> adj_;
  std::vector<int> level_;
  std::vector<size_t> next_;
};

// `mutated` are the primals the forward updates in place: the backward cannot read them (they
// hold the new values by then), so the cut never passes through one (what the backward needs
// of them is saved as a value computed from them, e.g. BatchNorm's updated running statistics).
std::vector<Value> min_cut_saved(const ir::Graph& g, const std::unordered_set<const Node*>& tangent_dependent,
                                 const std::unordered_set<const Node*>& required_fw,
                                 const std::vector<Value>& grad_outputs, const std::unordered_set<Value, ir::ValueHash>& mutated) {
  std::unordered_map<Value, int, ir::ValueHash> id;
  std::vector<Value> values;
  for (const auto& owned : g.nodes()) {
    Node* n = owned.get();
    if (n->kind() == ir::NodeKind::GetAttr || n->kind() == ir::NodeKind::Output || tangent_dependent.count(n)) continue;
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      id.emplace(n->output(i), static_cast<int>(values.size()));
      values.push_back(n->output(i));
    }
  }
  const int source = 0, sink = 1;
  auto in = [&](const Value& v) { return 2 + 2 * id.at(v); };
  auto out = [&](const Value& v) { return 3 + 2 * id.at(v); };
  MinCut net(2 + 2 * values.size());
  for (const auto& owned : g.nodes()) {
    Node* n = owned.get();
    if (n->kind() == ir::NodeKind::GetAttr || n->kind() == ir::NodeKind::Output) continue;
    std::vector<Value> ins;
    for (const Value& v : input_values(*n))
      if (id.count(v)) ins.push_back(v);
    if (tangent_dependent.count(n)) {
      for (const Value& v : ins) net.add(out(v), sink, MinCut::kInf);
      continue;
    }
    const bool primal = n->kind() == ir::NodeKind::Placeholder;
    const bool pinned = primal || (required_fw.count(n) && !recomputable(n));
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      Value o = n->output(i);
      net.add(in(o), out(o), mutated.count(o) ? MinCut::kInf : bytes_of(n->output_meta()[i]));
      if (pinned) net.add(source, in(o), MinCut::kInf);
      for (const Value& v : ins) net.add(out(v), in(o), MinCut::kInf);
    }
  }
  for (const Value& v : grad_outputs)
    if (id.count(v)) net.add(out(v), sink, MinCut::kInf);
  std::vector<bool> reach = net.solve(source, sink);
  std::vector<Value> saved;
  for (const Value& v : values)
    if (reach[in(v)] && !reach[out(v)]) saved.push_back(v);
  return saved;
}

size_t count_ops(const ir::GraphModule& gm) {
  size_t k = 0;
  for (const auto& n : gm.graph().nodes()) k += n->kind() == ir::NodeKind::CallFunction;
  return k;
}

}  // namespace


// A joint graph with size symbols: the backward computes sizes from the symbols (`expand(%t,
// [%s0, 64])`), and its inputs bind them only where a saved value or a tangent has the symbol as
// a dimension. For each symbol the backward uses and its inputs do not bind, the primal that binds
// it in the joint graph is saved too (as seed graphs save the symbol itself, `primals_7`); it is
// an input of the call, so saving it costs no memory the call does not hold anyway.
void save_symbol_bindings(const JointGraph& j, const std::vector<Value>& primals, const std::vector<Value>& tangents,
                          const std::vector<Value>& grad_outputs, std::vector<Value>& saved) {
  const ir::Graph& g = j.gm->graph();
  std::vector<Value> backward_inputs = saved;
  backward_inputs.insert(backward_inputs.end(), tangents.begin(), tangents.end());
  auto trial = extract(*j.gm, backward_inputs, grad_outputs, "backward", {}, nullptr, /*carry_symbols=*/false);
  const std::set<std::string> used = ir::used_symbols(trial->graph());
  std::set<std::string> bound;
  for (const Value& v : backward_inputs)
    for (const ir::SymExpr& e : v.node->output_meta().at(v.index).sym_sizes)
      if (auto s = e.as_symbol()) bound.insert(*s);
  const std::vector<std::pair<size_t, int64_t>> bindings = g.symbol_bindings();
  const std::vector<Node*> placeholders = g.placeholders();
  for (size_t k = 0; k < g.symbols().size(); ++k) {
    const std::string& name = g.symbols()[k].name;
    if (!used.count(name) || bound.count(name)) continue;
    const Value binder = placeholders.at(bindings[k].first)->output(0);
    if (std::find(primals.begin(), primals.end(), binder) == primals.end()) continue;
    bool mutated = false;
    for (size_t m : j.mutated_primals) mutated = mutated || primals.at(m) == binder;
    if (mutated || std::find(saved.begin(), saved.end(), binder) != saved.end()) continue;
    saved.push_back(binder);
    for (const ir::SymExpr& e : binder.node->output_meta().at(0).sym_sizes)
      if (auto s = e.as_symbol()) bound.insert(*s);
  }
}

Partition partition_joint(const JointGraph& j, Partitioner partitioner) {
  const ir::GraphModule& jgm = *j.gm;
  const ir::Graph& g = jgm.graph();
  std::vector<Value> outs;
  for (const auto& v : g.output_node()->args().at(0).list()) outs.push_back(*v);
  const size_t num_forward = j.num_fw_outputs + j.mutated_primals.size();
  TORCH_INTERNAL_ASSERT(outs.size() == num_forward + j.grad_primals.size(), "aot partition: joint output count");
  std::vector<Value> fw_outputs(outs.begin(), outs.begin() + num_forward);
  std::vector<Value> grad_outputs(outs.begin() + num_forward, outs.end());
  std::vector<Value> primals, tangents;
  for (Node* p : g.placeholders()) (primals.size() < j.primals.size() ? primals : tangents).push_back(p->output(0));

  std::unordered_set<const Node*> tangent_dependent;
  for (const Value& t : tangents) tangent_dependent.insert(t.node);
  for (const auto& owned : g.nodes()) {
    if (owned->kind() != ir::NodeKind::CallFunction) continue;
    for (const Value& v : input_values(*owned)) {
      if (tangent_dependent.count(v.node)) {
        tangent_dependent.insert(owned.get());
        break;
      }
    }
  }
  // Random ops of the forward run even when nothing reads their result: each call must draw
  // from the generator as eager does.
  std::vector<Value> random_draws;
  for (const auto& owned : g.nodes())
    if (owned->kind() == ir::NodeKind::CallFunction && ir::node_is_random(*owned) &&
        !tangent_dependent.count(owned.get()))
      random_draws.push_back(owned->output(0));

  Partition part;
  part.report.partitioner = partitioner;
  if (!j.training) {
    part.forward = extract(jgm, primals, fw_outputs, "forward", random_draws, &part.lost_symbols);
    part.report.forward_nodes = count_ops(*part.forward);
    return part;
  }

  std::vector<Value> fw_roots = fw_outputs;
  fw_roots.insert(fw_roots.end(), random_draws.begin(), random_draws.end());
  const auto required_fw = ancestors(fw_roots, [](const Node*) { return false; });
  auto available_in_forward = [&](const Node* n) {
    return n->kind() == ir::NodeKind::GetAttr || n->kind() == ir::NodeKind::Placeholder
               ? !tangent_dependent.count(n)
               : required_fw.count(n) != 0;
  };

  std::vector<Value> saved;
  if (partitioner == Partitioner::SaveAll) {
    // The backward computes what the gradients need beyond the forward's values, and reads
    // those forward values it uses.
    const auto backward = ancestors(grad_outputs, available_in_forward);
    std::unordered_set<Value, ir::ValueHash> chosen;
    auto save = [&](const Value& v) {
      if (v.node->kind() == ir::NodeKind::GetAttr || !available_in_forward(v.node)) return;
      chosen.insert(v);
    };
    for (const Node* n : backward)
      for (const Value& v : input_values(*n)) save(v);
    for (const Value& v : grad_outputs) save(v);
    for (const auto& owned : g.nodes())
      for (size_t i = 0; i < owned->num_outputs(); ++i)
        if (chosen.count(owned->output(i))) saved.push_back(owned->output(i));
  } else {
    std::unordered_set<Value, ir::ValueHash> mutated;
    for (size_t m : j.mutated_primals) mutated.insert(primals.at(m));
    saved = min_cut_saved(g, tangent_dependent, required_fw, grad_outputs, mutated);
  }
  for (const Value& v : saved) {
    if (v.node->kind() != ir::NodeKind::Placeholder) continue;
    for (size_t m = 0; m < j.mutated_primals.size(); ++m)
      TORCH_CHECK(primals.at(j.mutated_primals[m]) != v, "aot_autograd: the backward reads '", v.node->name(),
                  "', which the forward updates in place");
  }

  if (!g.symbols().empty()) save_symbol_bindings(j, primals, tangents, grad_outputs, saved);
  std::vector<Value> forward_outputs = fw_outputs;
  forward_outputs.insert(forward_outputs.end(), saved.begin(), saved.end());
  part.forward = extract(jgm, primals, forward_outputs, "forward", random_draws, &part.lost_symbols);
  std::vector<Value> backward_inputs = saved;
  backward_inputs.insert(backward_inputs.end(), tangents.begin(), tangents.end());
  part.backward = extract(jgm, backward_inputs, grad_outputs, "backward", {}, &part.lost_symbols);
  part.num_saved = saved.size();

  PartitionReport& r = part.report;
  r.forward_nodes = count_ops(*part.forward);
  r.backward_nodes = count_ops(*part.backward);
  r.saved_values = saved.size();
  for (const Value& v : saved) {
    r.saved_names.push_back(value_name(v));
    if (v.node->kind() == ir::NodeKind::Placeholder) ++r.saved_primals;
    if (memory_owner(v)->kind() != ir::NodeKind::Placeholder) r.saved_activation_bytes += bytes_of(v.node->output_meta()[v.index]);
  }
  return part;
}

}  // namespace torchcompile::aot
