// The trace tree of a cache entry: compiled graph segments and, at each graph break, the
// continuations keyed by the value the host read returned. A call runs an entry by walking its
// tree (CompiledFunction::run_entry); a value with no continuation restores the state and runs
// the forward again, traced, and the new continuation joins the tree
// (CompiledFunction::retrace_branch). Both are defined in trace_tree.cpp; the segments of one
// trace are compiled into a chain by compile_chain (trace_session.h).
#pragma once

#include <torchcompile/runtime/compiled_function.h>

#include <torchcompile/ir/structure.h>

#include "capture/segment_records.h"
#include "runtime/call_state.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchcompile::runtime {

struct BranchPoint;
class ShapeSpecializations;

/// A compiled graph segment of a trace tree.
struct Segment {
  std::shared_ptr<GraphModule> gm;
  CompiledFn fn;
  std::vector<uint32_t> input_slots;
  std::vector<uint32_t> output_slots;
  CompileReport report;                 // which backend compiled it, declines, pipeline steps
  GraphEffects effects;                 // what running it changes: saved before, on calls that may re-run
  ir::GraphKey key;                     // the captured graph's identity: identical continuations are shared
  std::unique_ptr<BranchPoint> branch;  // null: the outputs are the call's results
  OutputSpec spec;                      // of the results (a segment without branch)
  std::shared_ptr<ShapeSpecializations> dynamic;  // a dynamic entry's graph: fn runs it

  size_t count_graphs() const;
  size_t count_breaks() const;
};

/// A graph break: the host read that ended a segment and the continuations seen so far.
struct BranchPoint {
  explicit BranchPoint(capture::BranchRecord r) : record(std::move(r)), op_name(ir::op_target_name(record.op)) {}

  capture::BranchRecord record;
  std::string op_name;
  std::vector<std::unique_ptr<Segment>> children;                    // distinct continuations
  std::vector<std::pair<std::vector<c10::IValue>, Segment*>> known;  // recent values, newest first
  bool closed = false;  // too many distinct continuations: new values run the rest eagerly

  static constexpr size_t kKnownValues = 64;

  Segment* find(const std::vector<c10::IValue>& key) {
    for (size_t i = 0; i < known.size(); ++i) {
      if (!capture::same_key(known[i].first, key)) continue;
      if (i != 0) std::rotate(known.begin(), known.begin() + i, known.begin() + i + 1);
      return known.front().second;
    }
    return nullptr;
  }
  void remember(const std::vector<c10::IValue>& key, Segment* s) {
    known.insert(known.begin(), {key, s});
    if (known.size() > kKnownValues) known.pop_back();
  }
};

/// Run a trace tree that does not grow (a loaded package's, frontend/package.cpp) on `inputs`:
/// each break's value must have a continuation. A value with none is read again from the
/// segment run by the interpreter (ATen's own results, which the trace read; for a segment
/// without effects): if that one is known, the call takes its continuation and the compiled
/// value is remembered for it. Otherwise `on_miss(branch, value)` is called and must throw.
/// `tree_mutex` guards the branch tables.
std::vector<at::Tensor> run_fixed_tree(
    const Segment& root, const std::vector<at::Tensor>& inputs, OutputSpec& spec, std::mutex& tree_mutex,
    const std::function<void(const BranchPoint&, const std::vector<c10::IValue>&)>& on_miss);

}  // namespace torchcompile::runtime
