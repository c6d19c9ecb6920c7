// Dynamic shapes: which input dimensions become size symbols, and the compiled entry that
// serves every size of them.
//
// 1. Before a trace, dynamic_candidates() picks the candidate dimensions: every dimension with
//    CompileOptions::dynamic = true, the marked ones (torchcompile::mark_dynamic), and with
//    automatic dynamic the dimensions whose size changed since the first trace. Sizes 0 and 1
//    and mark_static dimensions are never candidates.
// 2. The trace runs on observed tensors (capture/observed.h): a candidate host code read (and
//    every candidate, if the trace cannot be observed completely) stays static.
// 3. plan_symbols() gives the remaining candidates symbols, one per distinct size (duck sizing:
//    dimensions equal when traced share a symbol and are guarded equal).
// 4. The entry's guards accept any sizes >= 2 (within mark_dynamic's bounds) for the symbols;
//    the entry runs the graph through ShapeSpecializations: the captured graph does not depend
//    on the symbols' values, so for each new combination of values it is run once under the
//    tracer (recording the same ops at the new sizes) and the backend compiles that static
//    graph; later calls with those sizes run it directly.
#pragma once

#include <torchcompile/backends/compile_report.h>
#include <torchcompile/backends/registry.h>
#include <torchcompile/runtime/compiled_function.h>

#include <c10/util/SmallVector.h>

#include <optional>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torchcompile::runtime {

/// A size symbol of a dynamic entry.
struct SizeSymbol {
  std::string name;        ///< s0, s1, ...
  uint32_t input = 0;      ///< its first dimension: input tensor index
  uint32_t dim = 0;        ///< and dimension
  int64_t traced = 0;      ///< the size when traced
  int64_t min = 2;         ///< accepted range
  int64_t max = std::numeric_limits<int64_t>::max();
};

/// `[2, inf)` or `[2, 16]`.
std::string size_range(int64_t min, int64_t max);

/// An input dimension that is a symbol.
struct SymbolicDim {
  uint32_t input = 0;
  uint32_t dim = 0;
  uint32_t symbol = 0;
};

/// The symbols of a dynamic entry.
struct DynamicPlan {
  std::vector<SizeSymbol> symbols;
  std::vector<SymbolicDim> dims;  ///< by input, then dimension
  std::vector<std::string> input_names;

  bool empty() const { return dims.empty(); }
  /// The symbol of dimension `dim` of input `input`, or -1.
  int symbol_of(uint32_t input, uint32_t dim) const;
  /// One line per symbol: `s0 = size 0 of 'x' (traced 8), range [2, inf), also size 0 of 'y'`.
  std::vector<std::string> describe() const;
};

/// A dimension that may become a symbol, before the trace.
struct Candidate {
  uint32_t input = 0;
  uint32_t dim = 0;
  int64_t min = 2;
  int64_t max = std::numeric_limits<int64_t>::max();
  bool marked = false;  ///< by mark_dynamic: warn if it stays static
};

/// What automatic dynamic remembers of a compiled object's calls: the sizes of the first trace
/// and the dimensions that changed since.
struct SizeHistory {
  std::vector<std::vector<int64_t>> first;
  std::vector<std::vector<bool>> changed;
};

/// The candidates of a call to be traced (step 1), updating `history`; logs each decision.
std::vector<Candidate> dynamic_candidates(const std::optional<bool>& dynamic, const CallArgs& args,
                                          const std::vector<std::string>& names, SizeHistory& history,
                                          const std::string& owner);

/// Step 3: the symbols of the candidates that stayed symbolic. `read` are the candidate bits
/// (bit k: candidates[k]) host code read, `first_reads` what was read for each bit;
/// `static_reason`, if not empty, keeps every candidate static. Logs each decision; warns for a
/// marked dimension that stays static.
DynamicPlan plan_symbols(const std::vector<Candidate>& candidates, uint64_t read,
                         const std::vector<std::string>& first_reads, const std::string& static_reason,
                         const CallArgs& args, const std::vector<std::string>& names, const std::string& owner);

/// The compiled forms of a dynamic entry's graph, one per combination of symbol values.
class ShapeSpecializations {
 public:
  /// `generic` is the captured graph (as traced, before any pass); `first` its compiled form at
  /// the traced sizes.
  ShapeSpecializations(DynamicPlan plan, std::shared_ptr<GraphModule> generic, Backend backend,
                       std::string backend_name, std::string owner, CompiledFn first);

  /// Run the graph on `inputs` (the entry's guards passed).
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs);

  const DynamicPlan& plan() const { return plan_; }
  /// The graph as captured, for explain.
  const GraphModule& generic() const { return *generic_; }
  /// Number of sizes compiled so far.
  size_t num_specializations() const;

  /// Combinations kept; beyond it the least recently used one is dropped.
  static constexpr size_t kMaxSpecializations = 64;

 private:
  using Key = c10::SmallVector<int64_t, 4>;
  struct Compiled {
    Key key;
    std::shared_ptr<const CompiledFn> fn;
  };
  Key key_of(const std::vector<at::Tensor>& inputs) const;
  // The compiled form for `key` (made most recently used), or null.
  std::shared_ptr<const CompiledFn> find(const Key& key);
  // Trace the generic graph at the sizes of `inputs` and compile it; returns this call's results.
  std::vector<at::Tensor> specialize(const Key& key, const std::vector<at::Tensor>& inputs);

  DynamicPlan plan_;
  std::shared_ptr<GraphModule> generic_;
  Backend backend_;
  std::string backend_name_;
  std::string owner_;
  mutable std::mutex mutex_;         // guards compiled_
  std::mutex specialize_mutex_;      // one specialization at a time
  std::vector<Compiled> compiled_;  // most recently used first
};

}  // namespace torchcompile::runtime
