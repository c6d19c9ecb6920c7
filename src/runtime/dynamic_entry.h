// Dynamic shapes: which input dimensions become size symbols, and the compiled entry that
// serves every size of them.
//
// 1. Before a trace, dynamic_candidates() picks the candidate dimensions: every dimension with
//    CompileOptions::dynamic = true, the marked ones (torchcompile::mark_dynamic), and with
//    automatic dynamic the dimensions whose size changed since the first trace. Sizes 0 and 1
//    and mark_static dimensions are never candidates.
// 2. The trace runs on observed tensors (capture/observed.h), which count the candidates host
//    code read.
// 3. plan_symbols() gives the candidates symbols, one per distinct size (duck sizing:
//    dimensions equal when traced share a symbol and are guarded equal).
// 4. The entry's guards accept any sizes >= 2 (within mark_dynamic's bounds) for the symbols.
//    a. No symbol was read, and the trace was observed completely: the captured graph does not
//       depend on the symbols' values. make_symbolic() declares the symbols in it and fits each
//       value's sizes and strides as expressions of them; the backend compiles that graph once
//       and its compiled function serves every size (compile_per_shape, for backends that
//       compile for concrete sizes, records new sizes inside it). If the graph cannot be given
//       symbols, or the backend declines it, ShapeSpecializations runs the static graph once
//       under the tracer for each new combination of values (recording the same ops at the new
//       sizes) and the backend compiles that static graph; later calls with those sizes run it.
//    b. Otherwise (host code read a symbol, so the trace recorded integers computed from it or
//       branched on it; or the trace could not be observed: graph breaks, autograd recording):
//       ForwardReplays keeps one trace tree per combination of values, each made by running the
//       forward again under the tracer at those sizes, host code included. Each is exactly the
//       trace a static entry would make at those sizes.
#pragma once

#include <torchcompile/compile/compile_report.h>
#include <torchcompile/backends/registry.h>
#include <torchcompile/runtime/compiled_function.h>

#include "capture/segment_records.h"
#include "support/by_size.h"

#include <optional>

#include <algorithm>
#include <atomic>
#include <functional>
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

/// The values of a dynamic entry's symbols in one call, in symbol order.
using support::SizeKey;

/// An input dimension that is a symbol.
struct SymbolicDim {
  uint32_t input = 0;
  uint32_t dim = 0;
  uint32_t symbol = 0;
};


/// An input dimension whose size is an expression of the symbols (a value computed before a
/// graph break, as a later segment's input: `s0*s1`).
struct ExpressionDim {
  uint32_t input = 0;
  uint32_t dim = 0;
  ir::SymExpr size;
};

/// The symbols of a dynamic entry.
struct DynamicPlan {
  std::vector<SizeSymbol> symbols;
  std::vector<SymbolicDim> dims;  ///< by input, then dimension
  /// Dimensions of contiguous inputs that are expressions of the symbols (a segment after a
  /// graph break: generalize_segments); they bind no symbol.
  std::vector<ExpressionDim> expression_dims;
  std::vector<std::string> input_names;
  /// Why the captured graph may depend on the symbols' values (host code read one, or the trace
  /// could not be observed completely); empty if it cannot. Then each new combination of values
  /// runs the forward again (step 4b).
  std::string replay_reason;

  bool empty() const { return dims.empty(); }
  bool replays_forward() const { return !replay_reason.empty(); }
  /// The symbol of dimension `dim` of input `input`, or -1.
  int symbol_of(uint32_t input, uint32_t dim) const;
  /// One line per symbol: `s0 = size 0 of 'x' (traced 8), range [2, inf), also size 0 of 'y'`,
  /// and for a plan that replays the forward, a line saying why.
  std::vector<std::string> describe() const;
  /// The symbols' values in a call whose guards passed; those of the trace.
  SizeKey key_of(const std::vector<at::Tensor>& inputs) const;
  SizeKey traced_key() const;
  /// `s0=9, s1=4`.
  std::string key_str(const SizeKey& key) const;
};

using support::BySize;

/// A dimension that may become a symbol, before the trace.
struct Candidate {
  uint32_t input = 0;
  uint32_t dim = 0;
  int64_t min = 2;
  int64_t max = std::numeric_limits<int64_t>::max();
  bool marked = false;  ///< by mark_dynamic: warn if it stays static
  /// Only because of dynamic = true (not marked, not seen to change): if host code reads it, it
  /// stays static (a later change makes it an automatic candidate).
  bool blanket = false;
};

/// What automatic dynamic remembers of a compiled object's calls: the sizes of the first trace
/// and the dimensions that changed since; and the first trace itself while it is the static
/// entry's (one segment, recorded): a dynamic entry that runs the forward again at new sizes
/// takes it as a trace at a second size (first_trace_key), so its graph with size expressions
/// is made at the sizes that made it dynamic instead of at the next new ones.
struct SizeHistory {
  std::vector<std::vector<int64_t>> first;
  std::vector<std::vector<bool>> changed;
  std::vector<capture::SegmentRecord> first_trace;  ///< empty once used or given up
  bool first_trace_kept = false;                    ///< (at most once per compiled object)
  /// Meta stand-ins of the first trace's tensor inputs (sizes, strides, dtype; undefined where
  /// the input was undefined or not strided).
  std::vector<at::Tensor> first_inputs;
};

/// The values of `plan`'s symbols in the first trace of `history`, if it was traced on inputs that
/// differ from `inputs` only in the sizes of those symbols (each within its range), one at least.
std::optional<SizeKey> first_trace_key(const SizeHistory& history, const DynamicPlan& plan,
                                       const std::vector<at::Tensor>& inputs);

/// The candidates of a call to be traced (step 1), updating `history`; logs each decision.
std::vector<Candidate> dynamic_candidates(const std::optional<bool>& dynamic, const CallArgs& args,
                                          const std::vector<std::string>& names, SizeHistory& history,
                                          const std::string& owner);

/// Step 3: the symbols of the candidates. `read` are the candidate bits (bit k: candidates[k])
/// host code read, `first_reads` what was read for each bit: a read symbol makes the plan
/// replay the forward. `static_reason`, if not empty, keeps every candidate static;
/// `replay_reason`, if not empty, makes the plan replay the forward whatever was read. Logs
/// each decision; warns for a marked dimension that stays static.
/// With `specialize_blanket_reads`, a `blanket` candidate host code read stays static instead.
DynamicPlan plan_symbols(const std::vector<Candidate>& candidates, uint64_t read,
                         const std::vector<std::string>& first_reads, const std::string& static_reason,
                         const std::string& replay_reason, const CallArgs& args,
                         const std::vector<std::string>& names, const std::string& owner,
                         bool specialize_blanket_reads);

/// Step 4a: give `gm` (the captured graph of a plan that does not replay the forward, as traced
/// with `inputs`) the plan's size symbols and metadata that are expressions of them, fitted to
/// the metadata of its ops run at other sizes (runtime/symbolize.cpp says how and why it is
/// sound). A symbol at whose other values the graph's ops fail (a size a weight fixes: the 784
/// features of an MLP's input under dynamic = true) is dropped from `plan`: its dimensions stay
/// static (logged). Returns an empty string, or why the graph could not be given symbols (then
/// `gm` is unchanged).
/// `known`: graphs of the same forward traced at other values of the plan's symbols (their
/// values, in the plan's order), whose metadata may stand for one run of the ops at those sizes.
std::string make_symbolic(GraphModule& gm, DynamicPlan& plan, const std::vector<at::Tensor>& inputs,
                          const std::string& owner,
                          const std::vector<std::pair<const ir::Graph*, std::vector<int64_t>>>& known = {});

/// Step 4b made general: `gm` is the forward traced at sizes `key` (one segment), `samples` the
/// same forward traced at other sizes. If every sample records the same nodes with the same
/// arguments except integers, and each integer is an expression of the symbols at every point
/// (fitted as make_symbolic fits sizes), those integers become size expressions of `gm`
/// (`view(x, [s0, -1])`), `gm` gets the plan's symbols and symbolic metadata (make_symbolic),
/// and "" is returned; otherwise why not (then `gm` is to be discarded). The result is a guess
/// that holds at the samples' sizes: the runtime checks it at every new size (same_graph_at).
/// `plan` is the entry's; on success it becomes the plan of `gm`'s symbols: those that took
/// other values in the samples (renamed s0, s1, ... in order; the others stay static in `gm`).
/// A reason starting with kGeneralizeNeedsMoreSizes means more samples may succeed.
/// With `keep_names`, the symbols keep the plan's names (the segments of one trace share them).
std::string generalize(GraphModule& gm, const std::vector<std::pair<const ir::Graph*, SizeKey>>& samples,
                       const SizeKey& key, DynamicPlan& plan, const std::vector<at::Tensor>& inputs,
                       const std::string& owner, bool keep_names = false);
extern const char* const kGeneralizeNeedsMoreSizes;

/// Whether `traced` (the forward traced on `inputs`) is `symbolic` (a generalized graph) at the
/// sizes of `inputs`: the same nodes, the same constants, and size expressions whose values are
/// the integers traced. Returns "" or the first difference.
std::string same_graph_at(const GraphModule& symbolic, const GraphModule& traced, const std::vector<at::Tensor>& inputs);

/// A trace of the forward kept to compare with traces at other sizes: its segments as recorded
/// (graphs, slots, and the host read ending each one with the value it returned).
struct TraceSample {
  TraceSample(std::vector<capture::SegmentRecord> r, SizeKey k) : records(std::move(r)), key(std::move(k)) {}
  TraceSample(TraceSample&&) = default;  // (no copy: a vector of them moves)
  TraceSample& operator=(TraceSample&&) = default;

  std::vector<capture::SegmentRecord> records;  ///< graphs copied; values_before_writes dropped
  SizeKey key;                                  ///< the entry's symbols' values
};
/// A copy of `records` (graphs copied), with the values before writes if `with_values`.
std::vector<capture::SegmentRecord> copy_records(const std::vector<capture::SegmentRecord>& records,
                                                 bool with_values = false);

/// Gives every segment after the first of a trace (`slots` its slot tensors) a placeholder for
/// each of the forward's `num_inputs` inputs it does not read, after its own: a segment's graph
/// with size expressions takes its symbols' values from the forward's inputs, whatever sizes
/// the values it computes from have.
void with_forward_inputs(std::vector<capture::SegmentRecord>& records, const std::vector<at::Tensor>& slots,
                         size_t num_inputs);

/// generalize() for a forward traced with graph breaks: `records` (traced at `key`; `slots` the
/// trace's slot tensors) and every sample must have the same segments: the same slots, and each
/// break the same host read returning the same value; every record has been given the forward's
/// inputs (with_forward_inputs). Each segment's graph is generalized on its own (generalize()),
/// its symbols (the entry's names) bound by the forward inputs' symbolic dimensions; the sizes
/// of a contiguous value computed before a break are fitted as expressions of the symbols
/// through the traced sizes (ExpressionDim). On success the graphs of `records` are replaced by
/// those with size expressions, `plans` gets each segment's plan (inputs: its placeholders) and
/// "" is returned; otherwise why not (`records` may then be partly changed: discard them). A
/// reason starting with kGeneralizeNeedsMoreSizes means more samples may succeed.
std::string generalize_segments(std::vector<capture::SegmentRecord>& records, const std::vector<at::Tensor>& slots,
                                const std::vector<const TraceSample*>& samples, const SizeKey& key,
                                const DynamicPlan& plan, std::vector<DynamicPlan>& plans, const std::string& owner);

/// same_graph_at() for a trace with graph breaks: whether `traced` (the forward traced at new
/// sizes, `slots` its slot tensors) has the segments of `general` (generalize_segments' result),
/// each segment's graph being the generalized one at these sizes. Returns "" or the first
/// difference.
std::string same_trace_at(const std::vector<capture::SegmentRecord>& general,
                          const std::vector<capture::SegmentRecord>& traced, const std::vector<at::Tensor>& slots);

/// The compiled forms of a dynamic entry's graph: one for every size (the backend compiled the
/// graph with size symbols), or one per combination of symbol values (the backend received a
/// static graph: it declined the graph with symbols, or the graph could not be given them).
class ShapeSpecializations {
 public:
  /// `generic` is the captured graph (as traced, before any pass); `first` its compiled form,
  /// for every size if `symbolic` (then `generic` has the size symbols, and the sizes of the
  /// results are checked against its expressions at each new combination of the symbols' values
  /// a thread calls it with), else at the traced sizes;
  /// `static_reason` says why not symbolic.
  ShapeSpecializations(DynamicPlan plan, std::shared_ptr<GraphModule> generic, Backend backend,
                       std::string backend_name, std::string owner, CompiledFn first, bool symbolic,
                       std::string static_reason);

  /// Run the graph on `inputs` (the entry's guards passed).
  std::vector<at::Tensor> operator()(std::vector<at::Tensor> inputs);
  /// The entry's function: operator() of `self`, or for a symbolic graph its compiled function
  /// and the check of the results' sizes, called directly.
  static CompiledFn entry_function(const std::shared_ptr<ShapeSpecializations>& self);

  const DynamicPlan& plan() const { return plan_; }
  /// The graph as captured, for explain.
  const GraphModule& generic() const { return *generic_; }
  /// Number of compiled functions: 1 for a symbolic graph, else the sizes compiled so far.
  size_t num_specializations() const;
  /// Whether the backend compiled the graph with size symbols (one compiled function for all
  /// sizes); if not, why.
  bool symbolic() const { return symbolic_; }
  const std::string& static_reason() const { return static_reason_; }

  /// Combinations kept; beyond it the least recently used one is dropped.
  static constexpr size_t kMaxSpecializations = BySize<int>::kMax;

 private:
  // Trace the generic graph at the sizes of `inputs` and compile it; returns this call's results.
  std::vector<at::Tensor> specialize(const SizeKey& key, const std::vector<at::Tensor>& inputs);

  DynamicPlan plan_;
  std::shared_ptr<GraphModule> generic_;
  Backend backend_;
  std::string backend_name_;
  std::string owner_;
  // Whether each result's sizes are those the graph's expressions give for the symbols' values
  // `key` (in symbol order); the error saying which is not (throws).
  bool result_sizes_match(const int64_t* key, const std::vector<at::Tensor>& outputs) const;
  [[noreturn]] void result_sizes_error(const int64_t* key, const std::vector<at::Tensor>& outputs) const;
  size_t symbol_index(const std::string& name) const;
  // symbolic: `fn` (all_sizes_) on `inputs`, its results' sizes checked.
  std::vector<at::Tensor> run_symbolic(const CompiledFn& fn, std::vector<at::Tensor> inputs) const;
  std::vector<std::pair<uint32_t, uint32_t>> symbol_dims_;  // symbolic: each symbol's (input, dim)
  // symbolic: the symbols' values (packed, run_symbolic) at which the results' sizes were last
  // found right; a call at the same values (the steady state of a server or a loop) skips the
  // check. The check is there for a backend that compiled for its example sizes: its results
  // then have the wrong sizes at every other value, and the first call at each value checks them.
  // One word, so that a thread never reads half of another thread's values.
  static constexpr uint64_t kNoCheckedKey = ~uint64_t{0};
  unsigned key_bits_ = 63;  // symbolic: bits per symbol in that word, 63 / number of symbols
  mutable std::atomic<uint64_t> checked_key_{kNoCheckedKey};

  std::mutex specialize_mutex_;  // one specialization at a time
  BySize<std::shared_ptr<const CompiledFn>> compiled_;
  bool symbolic_ = false;
  std::string static_reason_;
  std::shared_ptr<const CompiledFn> all_sizes_;   // symbolic: the one compiled function
  // symbolic: each result's sizes; per dimension whether it is one symbol (its index) or a
  // constant (its value), for a check without evaluating.
  struct ResultDim {
    enum Kind { Symbol, Constant, Expression } kind = Expression;
    int64_t value = 0;
  };
  std::vector<std::vector<ir::SymExpr>> result_sizes_;
  std::vector<std::vector<ResultDim>> result_dims_;
};

struct Segment;

/// A dynamic entry's segment compiled from `generic` (its graph with size symbols if
/// `static_reason` is empty, else the static graph; `examples` gives its example inputs): its
/// function becomes a ShapeSpecializations serving every size. A backend that declined the
/// symbols compiles the static graph instead. Returns "" or why the backend failed.
std::string serve_all_sizes(Segment& root, DynamicPlan plan, std::shared_ptr<GraphModule> generic,
                            std::string static_reason, const std::function<std::vector<at::Tensor>()>& examples,
                            const Backend& backend, const std::string& backend_name, const std::string& owner);

/// How a new size that a graph with size expressions may serve is checked, chosen by what each
/// way has cost this forward: a trace of shapes only (host code runs, ops on meta tensors), then
/// the compiled call; or a real trace, whose kernels compute the call (an eager forward plus the
/// recording). The first is cheaper where the compiled call is much faster than eager (large
/// tensors), the second where the forward's work is small next to its host code (a GPT's step:
/// the compiled call would also build the new size's primitives, used once).
/// TORCHCOMPILE_NEW_SIZES=shapes or =trace forces one (read at torch::compile).
struct NewSizeCosts {
  enum class Forced { No, Shapes, Trace };
  Forced forced = Forced::No;
  double shapes_us = -1;  ///< trace of shapes + compiled call: running mean (< 0: not measured yet)
  double traced_us = -1;  ///< real trace at a new size: running mean (< 0: not measured yet)

  /// The kFirstRetry-th new size decided by cost takes the dearer way once, whose cost that call
  /// then replaces, and so do the 8x, 64x ... later ones: a cost measured once does not decide
  /// for good though it included one-time work (the first compiled call of a process: oneDNN
  /// generating its kernels, buffers touched first), and retries cost little over many sizes.
  /// The first decision retries too where the trace of shapes is the dearer way: its first
  /// measurement ran the compiled graph's first call at a new size, the call most likely to hold
  /// one-time work (a 6-layer GPT's first check by meta trace and compiled call took 45 ms in a
  /// new process, later ones ~4.5 ms; with the first retry at the 8th size, 7 lengths were
  /// checked by real traces of ~9 ms). A real trace's first cost is a trace's: no early retry.
  static constexpr unsigned kFirstRetry = 8;
  /// A scheduled retry (not the first decision's) takes place only where the dearer way's cost
  /// is at most this many times the cheaper's: further apart, drift is not what separates them,
  /// and the retry would cost the difference for nothing (a 6-layer GPT's generation: a real
  /// trace 7-9 ms, a check by shapes with the compiled call 4-4.5 ms; the retry at its 8th
  /// length cost one call 4 ms more, 3% of the 24 tokens' time).
  static constexpr double kRetryWithin = 1.5;
  unsigned decided = 0;             ///< new sizes decided by cost
  unsigned next_retry = kFirstRetry;  ///< the decision that retries
  bool retrying = false;            ///< the last decision took the dearer way

  /// TORCHCOMPILE_NEW_SIZES (unset or empty: by cost); throws on another value.
  static Forced forced_from_env();
  /// Check by a trace of shapes: forced, or not measured yet, or no dearer than a real trace.
  bool use_shapes() const;
  /// The way of the next new size: use_shapes(), but at a retry the other way.
  bool next_by_shapes();
  void add_shapes(double us) { add(shapes_us, us); }
  void add_traced(double us) { add(traced_us, us); }
  std::string str() const;  ///< for the dynamic log

 private:
  void add(double& mean, double us) {
    mean = mean < 0 || retrying ? us : (mean + us) / 2;
    retrying = false;
  }
};

/// A dynamic entry whose graph may depend on its symbols' values (step 4b): one trace tree per
/// combination of values, each traced by running the forward at those sizes. The trees share
/// the entry's guards (a retrace adds the modules whose hooks it crossed).
///
/// The graphs traced at the first sizes are kept as samples; from the second size on,
/// generalize() tries to make one graph with size expressions of them, compiled once
/// (`general`); until the traces tell the expressions apart, a new size's trace is not compiled.
/// From then on a new combination of values still runs the forward under the tracer (host code
/// decides as it would at those sizes), but when the recorded graph is `general` at those sizes
/// (same_graph_at) the backend is not called again: those sizes run `general`'s tree.
struct ForwardReplays {
  DynamicPlan plan;
  BySize<std::shared_ptr<const CompiledEntry>> trees;
  std::shared_ptr<const CompiledEntry> first;  // the first trace's tree (explain, graph_module)
  /// Traces at the first sizes, as recorded, with their sizes.
  std::vector<TraceSample> samples;
  /// The segments with size expressions, as generalized (one for a forward without graph
  /// breaks), and the breaks between them.
  std::vector<capture::SegmentRecord> general_trace;
  std::shared_ptr<const CompiledEntry> general;  // its compiled tree
  std::string general_reason;                    // why there is none (empty: not tried yet)
  size_t general_hits = 0;                       // new sizes served by `general` without a compile
  NewSizeCosts new_sizes;                        // how those sizes are checked
};

}  // namespace torchcompile::runtime
