// The tracer: records every ATen operator the forward calls on this thread into a Graph.
//
// A boxed fallback on compat::kTracingKey (a functionality key above Autograd) is included in
// the dispatch TLS only on the tracing thread and only while a Tracer is active. It records the
// operator, its constant arguments and which earlier values its tensor arguments are (tracked by
// TensorImpl), then redispatches below itself with its own key excluded, so ops called from
// inside other ops are not recorded twice. The traced call computes its real results.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <memory>
#include <string>
#include <vector>

namespace torchcompile::capture {

/// Register the tracing fallback with the dispatcher (idempotent, thread-safe). Called by the
/// runtime before the first trace.
void register_tracing_fallback();

/// Why a trace had to be abandoned (e.g. a data-dependent host read).
struct TraceFailure {
  std::string reason;  ///< "data-dependent host read (aten::item) in the forward"
  std::string op;      ///< the operator, `aten::item`
};

/// One trace. Not thread-safe: a Tracer belongs to the thread that activates it.
class Tracer {
 public:
  Tracer();
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// Declare a graph input (a placeholder) bound to the tensor `t`. An undefined tensor is
  /// allowed and never referenced.
  void add_input(const at::Tensor& t, const std::string& name);
  /// Declare module state: uses of `t` become get_attr nodes reading `qualified_name`.
  void add_attribute(const std::string& qualified_name, const at::Tensor& t, ir::AttributeKind kind);

  /// While alive, this thread's ATen calls are recorded into this tracer.
  class Activation {
   public:
    explicit Activation(Tracer& t);
    ~Activation();
    Activation(const Activation&) = delete;
    Activation& operator=(const Activation&) = delete;

   private:
    Tracer* previous_;
    bool previous_included_;
  };

  /// The tracer active on this thread, or nullptr.
  static Tracer* current();

  /// Whether recording stopped early, and why.
  bool failed() const { return failure_ != nullptr; }
  const TraceFailure* failure() const { return failure_.get(); }

  /// Finish: add the output node for `outputs` (each must be a traced value, an input, an
  /// attribute, or becomes a constant), run dead-code elimination and lint, and return the
  /// GraphModule. Only valid if !failed().
  std::unique_ptr<ir::GraphModule> finish(const std::vector<at::Tensor>& outputs);

  /// Stop recording: the rest of the forward runs untraced and finish() may not be called.
  /// The first failure is kept.
  void fail(std::string reason, std::string op);

  // Called by the dispatcher fallback.
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<TraceFailure> failure_;
  friend struct Impl;
};

}  // namespace torchcompile::capture
