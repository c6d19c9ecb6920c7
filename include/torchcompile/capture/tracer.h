// The tracer: records every ATen operator the forward calls on this thread into graphs.
//
// A boxed fallback on compat::kTracingKey (a functionality key above Autograd) is included in
// the dispatch TLS only on the tracing thread and only while a Tracer is active. It records the
// operator, its constant arguments and which earlier values its tensor arguments are (tracked by
// TensorImpl), then redispatches below itself with its own key excluded, so ops called from
// inside other ops are not recorded twice. The traced call computes its real results.
//
// Graph breaks. A data-dependent host read (`item()`, `is_nonzero`,
// `equal`, ...) ends the current graph *segment*: the tensors the forward still holds become
// the segment's outputs, stored in numbered *slots* of the call's environment (inputs are slots
// 0..n-1), the read is executed and its value becomes the key of a branch, and recording goes
// on in a new segment whose placeholders read slots. A later call that reads a value with no
// traced continuation restores the state the compiled segments changed and runs the forward
// again from the start under a new tracer (see src/runtime/trace_tree.cpp). The segment records
// and finish_segments are the library's own (src/capture/segment_records.h).
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace torchcompile::capture {

class SizeReads;

/// Where a tracer records. `AboveAutograd` (compat::kTracingKey) sees the forward's ops as the
/// module calls them: the level-1 graph. `BelowAutograd` (compat::kBelowAutogradTracingKey, below
/// Autograd and Functionalize) sees what reaches the kernels: composite ops decomposed, in-place
/// ops functionalized, and during `backward()` the derivative formulas (AOT's joint graph).
/// Each level has its own active tracer per thread.
enum class TraceLevel : uint8_t { AboveAutograd = 0, BelowAutograd = 1 };

/// Register the tracing fallbacks (both levels) with the dispatcher (idempotent, thread-safe).
/// Called by the runtime before the first trace.
void register_tracing_fallback();

/// Handles an operator instead of the tracer recording it (a decomposition): returns false to
/// let the op be recorded, or consumes its arguments from the stack, pushes its results and
/// returns true. Ops it calls are recorded in turn.
using OpInterceptor = std::function<bool(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack)>;
/// Computes an operator's results in place of its kernel (replacing its arguments on the stack
/// with its results), or returns false to let the kernel run. The operator is recorded as usual.
using OpSubstitute = std::function<bool(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack)>;

/// Why a trace had to be abandoned.
struct TraceFailure {
  std::string reason;  ///< "a tensor sharing memory with an input ..."
  std::string op;      ///< the operator, if one caused it
};

/// Operators seen to fail on meta tensors and then to succeed on zero-filled tensors of the same
/// sizes (no meta kernel, in them or in what they call; an error at wrong sizes is not one): runs
/// of shapes only (Tracer::set_shapes_only, the runtime's probes at other sizes) call them on
/// zero-filled tensors directly, instead of paying for another error (a backtrace) each time.
bool known_without_meta_kernel(const c10::OperatorHandle& op);
/// `v` with `f` applied to every tensor in it (a tensor, a tensor list, a list of optional
/// tensors), for running an operator's arguments elsewhere (on meta, on zeros).
c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f);
void note_without_meta_kernel(const c10::OperatorHandle& op);

/// Thrown out of the forward by a shape-only trace (Tracer::set_shapes_only) at a host read of
/// data, or at the next op after the trace failed (the forward cannot go on with meta tensors).
struct ShapesOnlyStopped : std::runtime_error {
  explicit ShapesOnlyStopped(const std::string& why);
};

/// One trace. Not thread-safe: a Tracer belongs to the thread that activates it.
class Tracer {
 public:
  explicit Tracer(bool fullgraph = false, TraceLevel level = TraceLevel::AboveAutograd);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// Declare a graph input bound to the tensor `t` (the next slot). An undefined tensor is
  /// allowed and never referenced. May be called while recording: the placeholder goes after
  /// the existing ones (AOT's tangents are declared once the forward has run).
  void add_input(const at::Tensor& t, const std::string& name);
  /// Declare module state: uses of `t` become get_attr nodes reading `qualified_name`.
  void add_attribute(const std::string& qualified_name, const at::Tensor& t, ir::AttributeKind kind);

  /// While alive, this thread's ATen calls are recorded into this tracer.
  class Activation {
   public:
    explicit Activation(Tracer& t) : Activation(&t, t.level()) {}
    ~Activation();
    Activation(const Activation&) = delete;
    Activation& operator=(const Activation&) = delete;

   protected:
    /// Make `t` this thread's tracer at `level` (null: none, with the tracing key off) until
    /// destruction.
    Activation(Tracer* t, TraceLevel level);

   private:
    TraceLevel level_;
    Tracer* previous_;
    bool previous_included_;
  };

  /// The tracer active on this thread at `level`, or nullptr.
  static Tracer* current(TraceLevel level = TraceLevel::AboveAutograd);
  TraceLevel level() const { return level_; }
  /// Let `f` handle operators before they are recorded (record mode only).
  void set_interceptor(OpInterceptor f);
  /// Let `f` compute operators in place of their kernels while recording them (record mode; not
  /// with set_shapes_only). The compile stage's reduced precision uses it so that the call that
  /// traces computes what the compiled graph will.
  void set_substitute(OpSubstitute f);
  /// The qualified name of the module attribute (parameter, buffer) whose memory `t` is, directly
  /// or through views the trace recorded; nullopt for anything else.
  std::optional<std::string> attribute_behind(const at::Tensor& t) const;
  /// Record shapes only: every op runs on meta tensors standing for its arguments (no data, no
  /// compute; an op without a meta kernel runs on zero-filled tensors of the same sizes), and
  /// the forward continues with meta results. The graph is recorded as usual, its metadata that
  /// of the real run. A host read of data (`item()`, `data_ptr`, ...) throws ShapesOnlyStopped
  /// out of the forward: only a real trace can read data. Level AboveAutograd; the caller keeps
  /// the RNG state (ops run on zeros may draw numbers) and runs it with grad mode off.
  void set_shapes_only();


  /// Observe the forward's reads (src/capture/observed.h): the results of recorded ops are
  /// observed in turn; host reads of their sizes count their candidate dimensions, and a host
  /// read of their data (`data_ptr`, an accessor) ends the segment with a branch keyed by the
  /// contents, as `item()` does. With `autograd_records` (grad mode is on and something requires
  /// grad), results autograd tracks (views) are not observed: a copy would lose that. Level
  /// AboveAutograd only, before activation.
  void observe_reads(std::shared_ptr<SizeReads> reads, bool autograd_records);
  /// After the forward returned, before finishing: fail the trace if host code changed, through
  /// a pointer, the data of a tensor whose data it had read (the graph would not compute it).
  void check_host_writes();
  /// Why the trace's size reads may be incomplete (a result that could not be observed), or
  /// empty.
  const std::string& unobserved_reason() const;

  /// Whether recording stopped early, and why.
  bool failed() const { return failure_ != nullptr; }
  const TraceFailure* failure() const { return failure_.get(); }
  /// Stop recording: the rest of the forward runs untraced. The first failure is kept.
  void fail(std::string reason, std::string op);

  /// The segments recorded so far were ended by these host reads (for logs and explain).
  size_t num_breaks() const;

  // ---- module calls (torchcompile::call) ----

  /// Whether the forward's calls are being recorded: false after a failure.
  bool following() const;
  /// Ops recorded until the matching pop get `path` as their module path (nn_module_stack).
  void push_module_path(std::string path);
  void pop_module_path();
  /// Record an opaque module call that ran with recording suspended: a call_module node named
  /// after `path`, reading `inputs` and producing `outputs`; `fn` runs the call on later calls.
  void record_module_call(const std::string& path, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, ir::ModuleFn fn);
  /// Call before running an opaque module call on `inputs` (it may write to them).
  void before_module_call(const std::vector<at::Tensor>& inputs);

  /// While alive, nothing this thread calls is recorded at `level` and Tracer::current(level) is
  /// null (an opaque module's own forward runs under it).
  class Suspension : public Activation {
   public:
    explicit Suspension(TraceLevel level = TraceLevel::AboveAutograd) : Activation(nullptr, level) {}
  };

  /// Finish a trace without graph breaks: its single graph, with `outputs` as its outputs, as
  /// recorded (neither dead-code elimination nor lint runs here); null if an output cannot be
  /// resolved to a graph value (the trace then fails). Only valid if !failed(), the forward was
  /// recorded to its end and the tracer is no longer active.
  std::unique_ptr<ir::GraphModule> finish(const std::vector<at::Tensor>& outputs);

 private:
  // The recording state. The dispatcher fallback, finish_segments and slot_tensors
  // (src/capture/segment_records.h) reach it through TracerAccess (src/capture/tracer.cpp).
  struct Impl;
  friend struct Impl;
  friend struct TracerAccess;

  TraceLevel level_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<TraceFailure> failure_;
};

}  // namespace torchcompile::capture
