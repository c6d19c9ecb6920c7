// The non-template core of a compiled module or function: the guarded cache of compiled
// entries, tracing on a miss, and the eager fallback. torchcompile.h wraps it in templates that
// flatten the user's arguments and rebuild the user's return type.
#pragma once

#include <torchcompile/runtime/compile_options.h>

#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace torchcompile {

/// Why a call did not (or could not) use a compiled graph. Values, not crashes: reported in
/// warnings and logs.
struct GraphBreak {
  std::string reason;  ///< "data-dependent host read: aten::item"
  std::string op;      ///< the operator that caused it, if any
};

namespace runtime {

/// One flattened argument of a call: its kind and, for scalars, its value (scalars are
/// specialized: a different value is a different entry).
struct ArgItem {
  /// A tensor and an optional tensor are one kind (the caller may pass a Tensor to an
  /// optional parameter); `i` is its presence.
  enum Kind : uint8_t { Tensor, TensorList, Int, Double, Bool };
  Kind kind;
  int64_t i = 0;  ///< tensor presence (0/1), list length, int or bool value
  double d = 0;   ///< double value
  bool operator==(const ArgItem& o) const;
};

/// A call's arguments, flattened: all tensors in order, and the structure with scalar values.
struct CallArgs {
  std::vector<at::Tensor> tensors;
  c10::SmallVector<ArgItem, 8> items;

  void add(const at::Tensor& t);
  void add(const std::vector<at::Tensor>& ts);
  void add(const c10::optional<at::Tensor>& t);
  void add(int64_t v);
  void add(double v);
  void add(bool v);
};

/// The shape of a call's result, recorded when it was traced: the length of each
/// `std::vector<Tensor>` in the return value, in order of appearance.
struct OutputSpec {
  std::vector<size_t> list_sizes;
};

class GuardSet;
class TraceSession;

/// A cache entry: the guards under which it is valid and what to run.
class CompiledEntry {
 public:
  CompiledEntry(std::unique_ptr<GuardSet> guards, CompiledFn fn, OutputSpec spec,
                std::shared_ptr<GraphModule> gm, std::string eager_reason);
  ~CompiledEntry();

  /// Whether this entry runs the C++ forward eagerly (tracing failed, or the backend threw).
  bool runs_eagerly() const { return !fn_; }
  const std::string& eager_reason() const { return eager_reason_; }
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs) const { return fn_(std::move(inputs)); }
  const OutputSpec& output_spec() const { return spec_; }
  const GuardSet& guards() const { return *guards_; }
  /// The captured graph (null for an eager entry).
  const std::shared_ptr<GraphModule>& graph_module() const { return gm_; }

 private:
  std::unique_ptr<GuardSet> guards_;
  CompiledFn fn_;
  OutputSpec spec_;
  std::shared_ptr<GraphModule> gm_;
  std::string eager_reason_;
};

/// The state shared by all copies of one compiled object.
class CompiledFunction {
 public:
  /// `root` is the compiled module (null for a plain function); its parameters and buffers
  /// become get_attr nodes and its submodules' training flags are guarded.
  CompiledFunction(CompileOptions options, std::shared_ptr<torch::nn::Module> root, std::string name);
  ~CompiledFunction();

  /// The entry whose guards accept `args`, most recently added first; nullptr on a miss.
  /// Once the cache is full, returns the shared eager entry (after warning once).
  std::shared_ptr<const CompiledEntry> lookup(const CallArgs& args);

  /// Start tracing this call on the current thread; the caller then runs the forward and
  /// hands its flattened outputs to finish_trace().
  std::shared_ptr<TraceSession> begin_trace(const CallArgs& args);
  /// Build the graph, compile it with the backend and insert the entry. Never throws for
  /// expected events (a host read, a failing backend): those insert an eager entry and warn
  /// once, unless `fullgraph` asks for an error.
  void finish_trace(TraceSession& session, const std::vector<at::Tensor>& outputs, OutputSpec spec);

  const CompileOptions& options() const { return options_; }
  const std::string& name() const { return name_; }
  torch::nn::Module* root() const { return root_.get(); }

  /// Number of entries compiled so far (tests: "two calls, one compile").
  size_t num_entries() const;
  /// The entries, most recently used first.
  std::vector<std::shared_ptr<const CompiledEntry>> entries() const;
  /// The reason the most recent miss happened, empty if none (the first call's is
  /// "no cached entry").
  std::string last_recompile_reason() const;

 private:
  Backend resolve_backend();
  void warn_once(const std::string& key, const std::string& message);

  CompileOptions options_;
  std::shared_ptr<torch::nn::Module> root_;
  std::string name_;
  Backend backend_;

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const CompiledEntry>> entries_;
  std::shared_ptr<const CompiledEntry> overflow_entry_;
  std::string last_reason_;
  std::vector<std::string> warned_;
};

}  // namespace runtime
}  // namespace torchcompile
