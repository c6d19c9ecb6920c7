// What a trace with graph breaks records, for the runtime's trace tree: the graph segments, the
// host read that ended each one and the value it returned (the key of a branch). Private to the
// library: the installed capture/tracer.h declares only the tracer itself.
#pragma once

#include <torchcompile/capture/tracer.h>
#include <torchcompile/ir/graph_module.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchcompile::capture {

/// The host read that ended a segment, and the value it returned when traced.
struct BranchRecord {
  c10::OperatorHandle op;
  std::vector<c10::IValue> stack_template;                  ///< constants; tensor positions hold None
  std::vector<std::pair<uint32_t, uint32_t>> tensor_args;   ///< (stack index, slot)
  std::vector<c10::IValue> key;                             ///< the read's results
};

/// A recorded graph segment.
struct SegmentRecord {
  std::unique_ptr<ir::GraphModule> gm;
  std::vector<uint32_t> input_slots;   ///< slot read by each placeholder, in order
  /// For each placeholder: a copy of the value its tensor had when the segment read it, where an
  /// in-place op later in the trace wrote that tensor (undefined where the slot's tensor still
  /// holds it). The example inputs of the segment's graph (example_inputs()).
  std::vector<at::Tensor> values_before_writes;
  std::vector<uint32_t> output_slots;  ///< for a segment ending in a branch: slot of each output
  std::optional<BranchRecord> branch;  ///< empty for the last segment (its outputs are results)
};

/// Whether two branch keys are the same value (doubles bitwise, NaN equal to NaN).
bool same_key(const std::vector<c10::IValue>& a, const std::vector<c10::IValue>& b);
/// `1.5`, `true`, ... for messages.
std::string key_repr(const std::vector<c10::IValue>& key);

/// Finish `tracer`'s trace: close the last segment with `outputs` as its outputs and return the
/// segments in order (each but the last ends in a branch). The graphs are returned as recorded:
/// neither dead-code elimination nor lint runs here (the compile pipeline runs both on each
/// graph). Only valid if !tracer.failed(), the forward was recorded to its end and the tracer is
/// no longer active. Returns no segment if an output cannot be resolved to a graph value (the
/// trace then fails).
std::vector<SegmentRecord> finish_segments(Tracer& tracer, const std::vector<at::Tensor>& outputs);

/// The tensors of every slot of `tracer`'s trace (example inputs of the segments).
const std::vector<at::Tensor>& slot_tensors(const Tracer& tracer);

/// The example inputs of `record`'s graph: the values its placeholders had when the traced call
/// ran the segment (`slots`: the trace's slot tensors).
std::vector<at::Tensor> example_inputs(const SegmentRecord& record, const std::vector<at::Tensor>& slots);

}  // namespace torchcompile::capture
