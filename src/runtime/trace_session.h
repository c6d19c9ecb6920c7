// A trace session: one run of the user's forward under a new tracer, the same for the first
// trace of a cache entry and for the retrace of a new graph-break value, and the compilation of
// the segments it recorded into a chain of the trace tree.
#pragma once

#include <torchcompile/runtime/compiled_function.h>

#include "capture/segment_records.h"
#include "runtime/trace_tree.h"

#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace torchcompile::runtime {

class GuardSet;

struct Candidate;

/// The forward of a trace receives observed tensors (capture/observed.h) instead of the call's
/// inputs: host reads of their data are graph breaks, and in a dynamic trace the size reads of
/// candidate dimensions are counted in `reads`.
struct ObservedInputs {
  std::shared_ptr<capture::SizeReads> reads;
  std::vector<at::Tensor> inputs;  // one per input tensor: observed, or the input itself
  bool autograd_records = false;   // see observe_inputs
  /// A candidate input left unobserved (its size reads cannot be counted), or empty.
  std::string unobserved;
};

/// Why autograd records during a trace of the forward on `args` (grad mode is on and an input or
/// a parameter of `root` requires grad), or empty. Then a copy of a TensorImpl that autograd
/// knows (a view it tracks) would lose what autograd must see: observed tensors are not made for
/// them, and size reads are not counted (a dynamic entry traces each new size).
std::string autograd_reason(const CallArgs& args, const std::vector<std::string>& names, const torch::nn::Module* root);

/// The observed inputs of a trace: each strided input with storage is observed, its candidate
/// dimensions tagged with their bits (bit k: candidates[k]; none for a static trace). Inputs that
/// require grad are not (a copy of the TensorImpl would lose that); when `autograd_records`
/// (autograd_reason), neither are views autograd tracks, nor inputs sharing memory with another
/// input (an in-place update through one gives the caller's tensor, not the copy, a history).
ObservedInputs observe_inputs(const CallArgs& args, const std::vector<std::string>& names,
                              const std::vector<Candidate>& candidates, bool autograd_records);

/// A trace of one run of the forward: its results, and its segments or why it failed.
struct TracedRun {
  std::vector<at::Tensor> outputs;              // the call's flattened results
  std::vector<capture::SegmentRecord> records;  // empty if the trace failed
  std::vector<at::Tensor> slots;                // the slot tensors (example inputs)
  std::string failure;
  std::string unobserved;  // a dynamic trace: why its size reads may be incomplete
};

/// Run `forward` under a new tracer for the compiled object `fn`: the tensors of `args` are the
/// graph inputs (named `names`), the root module's parameters and buffers its attributes, and
/// module calls see `fn`'s trace context. The modules whose hooks the run crossed are guarded in
/// `guards`. Undefined results are not graph outputs: `spec.undefined` lists their positions.
/// The forward runs on observed tensors: `observed` (a dynamic trace, whose size reads are
/// counted), or observed inputs without candidates.
/// With `shapes_only`, the ops run on meta tensors (capture::Tracer::set_shapes_only): the
/// trace records the graph without computing it, its outputs are meta tensors, and a host read of
/// data throws capture::ShapesOnlyStopped.
TracedRun trace_forward(const CompiledFunction& fn, const GuardSet& guards, const CallArgs& args,
                        const ForwardFn& forward, OutputSpec& spec, const std::vector<std::string>& names,
                        const ObservedInputs* observed = nullptr, bool shapes_only = false);

/// Compile `traced.records[from...]` with `backend` (registered as `backend_name`; `name` names
/// the compiled object in logs) into a chain: each segment the continuation of the one before
/// at the value its branch read when traced; the last one returns results shaped as `spec`.
/// On failure returns null and sets `failure`.
std::unique_ptr<Segment> compile_chain(TracedRun& traced, size_t from, const OutputSpec& spec, const Backend& backend,
                                       const std::string& backend_name, const std::string& name,
                                       std::string& failure);

}  // namespace torchcompile::runtime
