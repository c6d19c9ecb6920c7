#include <torchcompile/runtime/explain_output.h>

#include <torchcompile/ir/printer.h>

#include "runtime/guards.h"

#include <sstream>

namespace torchcompile {

std::string ExplainOutput::str() const {
  std::ostringstream os;
  os << "Graph Count: " << graph_count << "\n";
  os << "Graph Break Count: " << graph_break_count << "\n";
  os << "Op Count: " << op_count << "\n";
  if (!eager_reason.empty()) os << "Runs eagerly: " << eager_reason << "\n";
  os << "Break Reasons:\n";
  for (size_t i = 0; i < break_reasons.size(); ++i) os << "  Break Reason " << i + 1 << ": " << break_reasons[i] << "\n";
  os << "Ops per Graph:\n";
  for (size_t i = 0; i < ops_per_graph.size(); ++i) {
    os << "  Ops per Graph " << i + 1 << ":\n";
    for (const auto& op : ops_per_graph[i]) os << "    " << op << "\n";
  }
  if (!size_symbols.empty()) {
    if (symbolic_graph)
      os << "Dynamic Shapes (1 compiled function for every size: the graph has size symbols):\n";
    else
      os << "Dynamic Shapes (" << sizes_compiled << " sizes compiled):\n";
    for (const auto& s : size_symbols) os << "  " << s << "\n";
  }
  os << "Out Guards:\n";
  for (size_t i = 0; i < guards.size(); ++i) os << "  Guard " << i + 1 << ": " << guards[i] << "\n";
  if (!compiled.empty()) os << "Compiled Graphs:\n";
  for (size_t i = 0; i < compiled.size(); ++i) {
    const std::vector<std::string> lines = compiled[i].describe();
    os << "  Graph " << i + 1 << ": " << lines.front() << "\n";
    for (size_t l = 1; l < lines.size(); ++l) os << "  " << lines[l] << "\n";
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const ExplainOutput& e) { return os << e.str(); }

namespace runtime {

ExplainOutput explain_entry(const CompiledEntry& entry) {
  ExplainOutput out;
  out.eager_reason = entry.eager_reason();
  if (entry.runs_eagerly() && !out.eager_reason.empty()) out.break_reasons.push_back(out.eager_reason);
  entry.visit(
      [&](const GraphModule& gm, const CompileReport& report) {
        out.compiled.push_back(report);
        std::vector<std::string> ops;
        for (const auto& n : gm.graph().nodes())
          if (n->kind() == ir::NodeKind::CallFunction) ops.push_back(n->target());
        out.op_count += ops.size();
        out.ops_per_graph.push_back(std::move(ops));
        out.graphs.push_back(ir::to_text(gm.graph()));
      },
      [&](const std::string& op, const std::string& value) {
        out.break_reasons.push_back("data-dependent host read " + op + " (returned " + value + " when traced)");
      });
  out.size_symbols = entry.size_symbols();
  out.sizes_compiled = entry.num_specializations();
  out.symbolic_graph = entry.symbolic_graph();
  out.graph_count = out.ops_per_graph.size();
  out.graph_break_count = out.break_reasons.size();
  if (!entry.runs_eagerly() || entry.eager_reason() != "cache size limit reached") out.guards = entry.guards().describe();
  return out;
}

}  // namespace runtime
}  // namespace torchcompile
