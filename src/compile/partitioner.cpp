// partitioned_backend (compile/partitioner.h): claims, split, one backend per part.
#include <torchcompile/compile/partitioner.h>

#include "backends/verify_text.h"
#include "compile/pipeline.h"

#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/split.h>

#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>

namespace torchcompile {

namespace {

size_t count_calls(const ir::Graph& g) {
  size_t n = 0;
  for (const auto& node : g.nodes()) n += node->kind() == ir::NodeKind::CallFunction;
  return n;
}

std::string op_list(const ir::GraphModule& gm) {
  std::string s;
  size_t n = 0;
  for (const auto& node : gm.graph().nodes()) {
    if (node->kind() != ir::NodeKind::CallFunction) continue;
    if (++n > 4) {
      s += ", ...";
      break;
    }
    s += (s.empty() ? "" : ", ") + node->target();
  }
  return s;
}

// Example inputs of a part: the graph's own inputs where the part reads them, tensors with the
// traced metadata elsewhere.
std::vector<at::Tensor> part_examples(const ir::GraphModule& parent, const std::string& path,
                                      const std::vector<at::Tensor>& example_inputs) {
  std::unordered_map<const ir::Node*, size_t> input_index;
  for (const ir::Node* p : parent.graph().placeholders()) input_index.emplace(p, input_index.size());
  std::vector<at::Tensor> out;
  for (const auto& n : parent.graph().nodes()) {
    if (n->kind() != ir::NodeKind::CallModule || n->target() != path) continue;
    for (const ir::Value& v : ir::input_values(*n)) {
      auto it = input_index.find(v.node);
      if (it != input_index.end() && it->second < example_inputs.size()) {
        out.push_back(example_inputs[it->second]);
        continue;
      }
      const ir::TensorMeta& m = v.node->output_meta().at(v.index);
      if (!m.defined) {
        out.emplace_back();
        continue;
      }
      at::Tensor t = at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(m.device));
      if (m.requires_grad && c10::isFloatingType(m.dtype)) t.requires_grad_(true);
      out.push_back(std::move(t));
    }
    break;
  }
  return out;
}

}  // namespace

PartitionBackend partition_backend(const std::string& name) {
  PartitionBackend b;
  b.name = name;
  b.compile = lookup_backend(name);
  b.claim = lookup_claim(name);
  TORCH_CHECK(b.claim, "partition_backend: backend '", name,
              "' has no claim (register_claim); it cannot be part of a partitioned composition");
  return b;
}

namespace {

int64_t attribute_bytes(const GraphModule& gm) {
  int64_t bytes = 0;
  for (const auto& [name, attr] : gm.attributes())
    if (attr.first.defined() && attr.first.is_floating_point()) bytes += static_cast<int64_t>(attr.first.nbytes());
  return bytes;
}

thread_local int64_t tls_whole_graph_weight_bytes = -1;  // while a part compiles

// The whole graph's weight bytes for graph_weight_bytes() while a part compiles.
class WholeGraphScope {
 public:
  explicit WholeGraphScope(int64_t bytes) : before_(tls_whole_graph_weight_bytes) { tls_whole_graph_weight_bytes = bytes; }
  ~WholeGraphScope() { tls_whole_graph_weight_bytes = before_; }
  WholeGraphScope(const WholeGraphScope&) = delete;
  WholeGraphScope& operator=(const WholeGraphScope&) = delete;

 private:
  int64_t before_;
};

}  // namespace

int64_t graph_weight_bytes(const GraphModule& gm) {
  return tls_whole_graph_weight_bytes >= 0 ? tls_whole_graph_weight_bytes : attribute_bytes(gm);
}

Backend partitioned_backend(std::vector<PartitionBackend> backends, size_t min_size) {
  TORCH_CHECK(!backends.empty(), "partitioned_backend: expected at least one backend");
  for (const auto& b : backends)
    TORCH_CHECK(b.claim && b.compile, "partitioned_backend: backend '", b.name, "' needs a claim and a compile function");
  // Splits `gm` and compiles its parts. A graph with size symbols is split once, its claims made
  // at the example sizes, and each part keeps the symbols it uses (the part's backend serves its
  // sizes, compile_per_shape keyed by the part's own inputs); nullopt if a part cannot keep them.
  auto partitioned = [backends = std::move(backends), min_size](
                         GraphModule& gm, const std::vector<at::Tensor>& example_inputs) -> std::optional<CompiledFn> {
    // Who runs each node: the first backend claiming it.
    std::unordered_map<const ir::Node*, size_t> owner;
    std::string empty_claims;  // why backends claimed nothing, where they said (decline())
    for (size_t k = 0; k < backends.size(); ++k) {
      detail::take_decline_reason();
      auto claimed = backends[k].claim(gm, example_inputs);
      std::string why = detail::take_decline_reason();
      const std::string said = backends[k].name + ": " + why;
      if (claimed.empty() && !why.empty() && empty_claims.find(said) == std::string::npos)
        empty_claims += (empty_claims.empty() ? "" : "; ") + said;
      for (const ir::Node* n : claimed) owner.emplace(n, k);
    }
    struct Run {
      std::vector<const ir::Node*> nodes;
      size_t backend;
    };
    std::vector<Run> runs;
    for (size_t k = 0; k < backends.size(); ++k) {
      auto mine = [&](const ir::Node& n) {
        auto it = owner.find(&n);
        return it != owner.end() && it->second == k;
      };
      for (auto& group : ir::group_by_support(gm.graph(), mine, min_size)) runs.push_back({std::move(group), k});
    }
    std::string names;  // each name once (a backend may contribute several kinds of parts)
    for (size_t k = 0; k < backends.size(); ++k) {
      bool seen = false;
      for (size_t j = 0; j < k; ++j) seen |= backends[j].name == backends[k].name;
      if (!seen) names += (names.empty() ? "" : ", ") + backends[k].name;
    }
    if (runs.empty())
      return decline("no operator of the graph is one that " + names + " compiles" +
                     (empty_claims.empty() ? "" : " (" + empty_claims + ")"));

    // One run covering every operator: its backend gets the graph unsplit (and is the one the
    // report names).
    if (runs.size() == 1 && runs[0].nodes.size() == count_calls(gm.graph())) {
      const PartitionBackend& b = backends[runs[0].backend];
      return compile_stage::call_backend(b.compile, b.name, gm, example_inputs);
    }

    // Graph order, so that parts are numbered as they run.
    std::unordered_map<const ir::Node*, size_t> pos;
    for (const auto& n : gm.graph().nodes()) pos.emplace(n.get(), pos.size());
    std::sort(runs.begin(), runs.end(), [&](const Run& a, const Run& b) { return pos[a.nodes[0]] < pos[b.nodes[0]]; });
    std::vector<std::vector<const ir::Node*>> groups;
    for (const auto& r : runs) groups.push_back(r.nodes);
    ir::SplitGraph split = ir::split_module(gm, groups);
    for (const ir::SplitPart& part : split.parts)
      if (part.made_static) return std::nullopt;

    size_t compiled = 0, interpreted_ops = count_calls(split.parent->graph());  // call_module nodes not counted
    std::vector<std::string> declines;
    WholeGraphScope whole_graph(attribute_bytes(gm));
    for (size_t i = 0; i < split.parts.size(); ++i) {
      const ir::SplitPart& part = split.parts[i];
      const PartitionBackend& b = backends[runs[i].backend];
      const size_t ops = runs[i].nodes.size();
      detail::take_decline_reason();
      CompiledFn fn;
      std::string failure, why;
      CompileReport part_report;  // the part's own: its lines join this graph's partition
      const std::vector<at::Tensor> examples = part_examples(*split.parent, part.path, example_inputs);
      detail::verify_text_round_trip(*part.module, examples);  // throws: not a backend's failure
      try {
        detail::ReportScope scope(&part_report);
        fn = b.compile(*part.module, examples);
        why = detail::take_decline_reason();
      } catch (const std::exception& e) {
        failure = e.what();
        TORCH_WARN("torch::compile: backend '", b.name, "' failed on a part of the graph (", op_list(*part.module),
                   "); that part runs with the interpreter: ", failure);
      }
      for (auto& line : part_report.partition) report_partition(std::move(line));
      if (fn) {
        ++compiled;
        auto module = part.module;  // the part's graph module lives as long as its function
        split.parent->set_submodule(part.path, [module, fn](const std::vector<at::Tensor>& in) { return fn(in); });
        continue;
      }
      if (!failure.empty()) why = "failed: " + failure;
      interpreted_ops += ops;
      std::string line = "interpreter: " + std::to_string(ops) + " op(s) (" + op_list(*part.module) + "), " + b.name +
                         (failure.empty() ? " declined" : "") + (why.empty() ? "" : ": " + why);
      report_partition(line);
      declines.push_back(b.name + (why.empty() ? " declined a part" : ": " + why));
    }
    if (compiled == 0) {
      std::string reason = "every part was declined";
      for (const auto& d : declines) reason += "; " + d;
      return decline(reason);
    }
    if (interpreted_ops) report_partition("interpreter: " + std::to_string(interpreted_ops) + " operator(s) in all");
    split.parent->recompile();
    std::shared_ptr<GraphModule> parent(std::move(split.parent));
    auto run = ir::interpreter_fn(*parent);
    return [parent, run](std::vector<at::Tensor> inputs) { return run(std::move(inputs)); };
  };
  // A graph with size symbols: split once when every part can keep the symbols it uses, so that a
  // new size rebuilds only the parts whose inputs' sizes changed (a part the interpreter runs
  // never); else one split per combination of the symbols' values (compile_per_shape).
  return [partitioned = std::move(partitioned)](GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
    if (!gm.graph().symbols().empty()) {
      if (std::optional<CompiledFn> fn = partitioned(gm, example_inputs)) {
        // Declined at the example sizes (claims and parts saw them): as compile_per_shape says it.
        if (!*fn) return decline(std::string(detail::kDeclinedAtExampleSizes) + detail::take_decline_reason());
        return *fn;
      }
    }
    return compile_per_shape(gm, example_inputs, [partitioned](GraphModule& g, const std::vector<at::Tensor>& in) {
      std::optional<CompiledFn> fn = partitioned(g, in);
      TORCH_INTERNAL_ASSERT(fn, "partitioned_backend: a graph without size symbols kept none");
      return *fn;
    });
  };
}

}  // namespace torchcompile
