// torchcompile::explain: what torch._dynamo.explain reports, for a C++ module or function.
#pragma once

#include <torchcompile/runtime/compiled_function.h>

#include <ostream>
#include <string>
#include <vector>

namespace torchcompile {

/// The graphs, graph breaks and guards one call produced.
struct ExplainOutput {
  size_t graph_count = 0;
  size_t graph_break_count = 0;
  size_t op_count = 0;
  std::vector<std::string> break_reasons;           ///< one per break, in trace order
  std::vector<std::vector<std::string>> ops_per_graph;  ///< operator targets of each graph
  std::vector<std::string> guards;                  ///< of the entry that ran
  std::vector<std::string> graphs;                  ///< each graph in the text format
  std::vector<CompileReport> compiled;              ///< per graph: backend, partition, declines, steps
  std::string eager_reason;                         ///< set if the call could not be compiled
  std::vector<std::string> size_symbols;            ///< a dynamic entry's symbols (docs/dynamic-shapes.md)
  size_t sizes_compiled = 0;                        ///< a dynamic entry: compiled functions (1 for a graph with size symbols)
  bool symbolic_graph = false;                      ///< a dynamic entry whose backend compiled the graph with size symbols

  /// The report, laid out as torch._dynamo.explain prints it, then which backend compiled each
  /// graph (its parts and every decline).
  std::string str() const;
};
std::ostream& operator<<(std::ostream& os, const ExplainOutput& e);

namespace runtime {
/// Summarize the trace tree of `entry` (the graphs reached so far).
ExplainOutput explain_entry(const CompiledEntry& entry);
}  // namespace runtime

}  // namespace torchcompile
