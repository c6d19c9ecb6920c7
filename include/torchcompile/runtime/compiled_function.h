// The non-template core of a compiled module or function: the guarded cache of compiled
// entries, tracing on a miss, and the eager fallback. torchcompile.h wraps it in templates that
// flatten the user's arguments and rebuild the user's return type. What the entries hold (the
// trace tree) and how a forward is traced are the library's own (src/runtime/).
#pragma once

#include <torchcompile/compile/compile_report.h>
#include <torchcompile/runtime/compile_options.h>

#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace torchcompile {

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
  /// Positions of undefined tensors in the flattened result (they are not graph outputs).
  std::vector<size_t> undefined;
  /// The result of a TorchScript method (frontend/script_module.h) with every tensor in it
  /// undefined: the flattened outputs are those tensors, in order. None for C++ forwards.
  c10::IValue structure;
  /// The C++ result type of a C++ forward, as frontend/codecs.h's ResultType describes it
  /// (`T`, `L<T>`, `(T,O<T>)`): what a saved package rebuilds its results from. Null for
  /// TorchScript methods (their `structure` says it).
  const char* result_type = nullptr;
  /// Whether two results have the same shape (lists, undefined tensors, structure).
  bool same_shape(const OutputSpec& o) const;
};

class GuardSet;
struct Segment;
struct BranchPoint;

/// Runs the user's forward (eagerly, or under the tracer set up by the caller) and returns its
/// flattened outputs, recording the result's shape in the OutputSpec.
using ForwardFn = std::function<std::vector<at::Tensor>(OutputSpec& spec)>;

/// While a dynamic trace runs the forward, the tensors the frontend passes to it instead of the
/// call's own (observed tensors, flattened as CallArgs::tensors); null otherwise. Taken once:
/// the first forward to ask gets them, so a compiled object called from inside it does not.
const std::vector<at::Tensor>* take_substituted_inputs();

/// Sets the tensors take_substituted_inputs() returns on this thread, until destruction.
class SubstitutedInputs {
 public:
  explicit SubstitutedInputs(const std::vector<at::Tensor>* inputs);
  ~SubstitutedInputs();
  SubstitutedInputs(const SubstitutedInputs&) = delete;
  SubstitutedInputs& operator=(const SubstitutedInputs&) = delete;

 private:
  const std::vector<at::Tensor>* previous_;
};

struct SizeHistory;
struct ForwardReplays;

/// A cache entry: the guards under which it is valid and its trace tree: a compiled graph
/// segment, and at each graph break the continuations keyed by the value the forward read.
class CompiledEntry {
 public:
  friend struct PackageAccess;  // frontend/package.cpp reads and builds trees
  CompiledEntry(std::shared_ptr<GuardSet> guards, std::unique_ptr<Segment> root, std::vector<std::string> input_names,
                std::string eager_reason);
  ~CompiledEntry();

  /// Whether this entry runs the C++ forward eagerly (tracing failed, the backend threw, or a
  /// graph break met more values than cache_size_limit).
  bool runs_eagerly() const {
    return (root_ == nullptr && replays_ == nullptr) || eager_.load(std::memory_order_relaxed);
  }
  const std::string& eager_reason() const;
  const GuardSet& guards() const { return *guards_; }
  /// The first graph segment's module (null for an eager entry).
  std::shared_ptr<GraphModule> graph_module() const;
  /// Compiled graphs in the trace tree (a dynamic entry with a tree per size: in all of them).
  size_t num_graphs() const;
  /// Graph breaks (branch points) in the trace tree (or trees).
  size_t num_breaks() const;
  /// A dynamic entry: one line per size symbol (`s0 = size 0 of 'x' (traced 8), range [2,
  /// inf)`); empty for a static entry.
  std::vector<std::string> size_symbols() const;
  /// A dynamic entry: the combinations of symbol values compiled so far (0 for a static entry).
  size_t num_specializations() const;
  /// Whether the entry's backend compiled its graph with size symbols (one function for every size).
  bool symbolic_graph() const;
  /// Visit the tree depth first: each graph with its compile report, and each break (its host
  /// read and first value).
  void visit(const std::function<void(const GraphModule& graph, const CompileReport& report)>& on_graph,
             const std::function<void(const std::string& op, const std::string& value)>& on_break) const;

 private:
  friend class CompiledFunction;
  // The tree of the entry, and what the queries above describe: root_, or for a dynamic entry
  // that runs the forward again at each new size, the first size's tree.
  const CompiledEntry& described() const;

  std::shared_ptr<GuardSet> guards_;      // shared with the trees of replays_
  std::unique_ptr<Segment> root_;         // null for an eager entry or one with replays_
  std::shared_ptr<ForwardReplays> replays_;  // a dynamic entry with a tree per size
  // The tree with size expressions of that entry (ForwardReplays::general), which it owns: a new
  // value at one of its graph breaks gives the call's sizes a tree of their own.
  ForwardReplays* general_of_ = nullptr;
  std::vector<std::string> input_names_;
  std::string eager_reason_;
  mutable std::mutex tree_mutex_;  // guards the branch tables of the tree
  mutable std::atomic<bool> eager_{false};  // set once a branch point is past its limit
};

/// The state shared by all copies of one compiled object.
class CompiledFunction {
 public:
  friend struct PackageAccess;
  /// `root` is the compiled module (null for a plain function); its parameters and buffers
  /// become get_attr nodes and its submodules' training flags are guarded.
  CompiledFunction(CompileOptions options, std::shared_ptr<torch::nn::Module> root, std::string name);
  ~CompiledFunction();

  /// One call: find the entry whose guards accept `args` (tracing a new one on a miss) and run
  /// its trace tree; `forward` runs the user's forward when tracing, retracing a new branch,
  /// or running eagerly. Returns the flattened outputs and sets `spec` to their shape.
  std::vector<at::Tensor> call(const CallArgs& args, const ForwardFn& forward, OutputSpec& spec);

  /// The entry whose guards accept `args`, most recently used first; nullptr on a miss.
  /// Once the cache is full, returns the shared eager entry (after warning once).
  std::shared_ptr<const CompiledEntry> lookup(const CallArgs& args);

  const CompileOptions& options() const { return options_; }
  const std::string& name() const { return name_; }
  torch::nn::Module* root() const { return root_.get(); }
  const std::shared_ptr<torch::nn::Module>& root_ptr() const { return root_; }

  /// Number of entries compiled so far (tests: "two calls, one compile").
  size_t num_entries() const;
  /// The entries, most recently used first.
  std::vector<std::shared_ptr<const CompiledEntry>> entries() const;
  /// The reason the most recent miss happened ("no cached entry" for the first call).
  std::string last_recompile_reason() const;
  /// In verify mode: the first mismatch found so far (empty if none).
  std::string verify_failure() const;

 private:
  Backend resolve_backend();
  /// Under a reduced precision: throws if this call would need autograd (grad mode on and an
  /// input or a parameter requires grad).
  void check_inference(const CallArgs& args) const;
  void warn_once(const std::string& key, const std::string& message);
  std::vector<at::Tensor> call_compiled(const CallArgs& args, const ForwardFn& forward, OutputSpec& spec);
  /// Verify mode (verify.cpp): run the forward eagerly, put the state back, run call_compiled
  /// and compare the results.
  std::vector<at::Tensor> call_verified(const CallArgs& args, const ForwardFn& forward, OutputSpec& spec);
  /// A miss: trace the forward, compile its segments and add the new entry (eager if that failed).
  std::vector<at::Tensor> trace_new_entry(const CallArgs& args, const ForwardFn& forward, OutputSpec& spec);
  /// Run `entry`'s trace tree on `args` (trace_tree.cpp).
  std::vector<at::Tensor> run_entry(const CompiledEntry& entry, const CallArgs& args, const ForwardFn& forward,
                                    OutputSpec& spec);
  /// A dynamic entry with a tree per size (src/runtime/dynamic_entry.h, ForwardReplays): run the tree of
  /// the call's sizes, tracing the forward at them first if they are new.
  std::vector<at::Tensor> run_replayed(const CompiledEntry& entry, const CallArgs& args, const ForwardFn& forward,
                                       OutputSpec& spec);
  /// run_replayed at sizes with no tree yet: trace the forward at them; the tree is the graph
  /// with size expressions if the trace records it, else compiled from the trace (which may
  /// first become that graph).
  std::vector<at::Tensor> trace_new_sizes(const CompiledEntry& entry, const CallArgs& args, const ForwardFn& forward,
                                          OutputSpec& spec);
  /// A branch value with no compiled continuation, the state put back as it was when the call
  /// began: run the forward again, traced (the new continuation joins the tree) or, if `record`
  /// is false, eagerly (trace_tree.cpp). `missed_at` and `missed_key` are the branch point where
  /// the compiled segments' value found no continuation, and that value: when the eager forward
  /// reads another value there (a backend's result differs from ATen's in the last bits), the
  /// compiled value is remembered for the continuation the eager one took, or every later call
  /// with these inputs would miss and run the forward again.
  std::vector<at::Tensor> retrace_branch(const CompiledEntry& entry, const CallArgs& args, bool record,
                                         const ForwardFn& forward, OutputSpec& spec,
                                         BranchPoint* missed_at = nullptr,
                                         const std::vector<c10::IValue>* missed_key = nullptr);

  CompileOptions options_;
  std::shared_ptr<torch::nn::Module> root_;
  std::string name_;
  Backend backend_;

  mutable std::mutex mutex_;
  std::mutex trace_mutex_;  // held while tracing or retracing; never while running an entry
  std::vector<std::shared_ptr<const CompiledEntry>> entries_;
  std::shared_ptr<const CompiledEntry> overflow_entry_;
  std::string last_reason_;
  std::string evicted_reason_;  // why the last entries were dropped, until a new one is added
  std::vector<std::string> warned_;
  std::unique_ptr<SizeHistory> size_history_;  // automatic dynamic (guarded by trace_mutex_)
  bool verify_ = false;
  std::string verify_failure_;
};

}  // namespace runtime
}  // namespace torchcompile
