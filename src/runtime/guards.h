// The guards of a cache entry: a flat, ordered list of cheap checks built when the entry was
// traced. check() is the hot path; failure_reason() explains the first failing check.
//
// The checks, in evaluation order (describe() lists them in the same order):
//   1. the argument structure and scalar values (scalars are specialized);
//   2. each input tensor: definedness, dtype, device, dispatch key set (layout, conj/neg bits,
//      inference tensor), requires_grad, dim, sizes, strides;
//   3. which inputs were the same tensor;
//   4. global state that changes results: inference mode, grad mode, default dtype,
//      deterministic-algorithms flag, CPU autocast (enabled; its dtype only while enabled);
//   5. for every module under the root (pre-order, each module once): its training flag, its
//      registered submodules (identity, in order), and its registered parameters and buffers:
//      identity (the TensorImpl, held so its address cannot be reused), dtype, device,
//      requires_grad and sizes.
// Not guarded: global state that cannot change a CPU result (thread counts, the CUDA autocast
// state while no CUDA tensor is involved), values and version counters of parameters (an
// in-place optimizer step keeps the entry), and module members that were assigned without
// registering them (`module->weight = t`): LibTorch itself (parameters(), the optimizer,
// serialization) does not see those either; re-register or use set_data.
#pragma once

#include <torchcompile/runtime/compiled_function.h>

#include <c10/core/DispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <c10/util/typeid.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

namespace torchcompile::runtime {

struct DynamicPlan;

/// A GuardSet as a saved package holds it (frontend/package.cpp): the argument and input checks
/// and the global state, without modules (a package holds the weights it was traced with) and
/// with dispatch keys named by kind (their bits differ between LibTorch versions).
struct PortableGuards {
  struct Tensor {
    bool defined = false;
    c10::ScalarType dtype = c10::ScalarType::Float;
    bool inference = false;  // an inference tensor (made under c10::InferenceMode)
    std::vector<int64_t> sizes, strides;
    uint64_t symbolic = 0;  // bit d: dimension d is a symbol
  };
  struct SymDim {
    uint32_t input = 0, dim = 0, first_input = 0, first_dim = 0;
    int64_t min = 2, max = 0;
    std::string symbol;
  };
  c10::SmallVector<ArgItem, 8> items;
  std::vector<Tensor> tensors;
  std::vector<SymDim> sym_dims;
  std::vector<int32_t> same_as;  // per input: the earlier input it was the same tensor as, or -1
  c10::ScalarType default_dtype = c10::ScalarType::Float;
  bool deterministic = false;
  bool autocast_cpu = false;
  c10::ScalarType autocast_cpu_dtype = c10::ScalarType::BFloat16;
  std::vector<std::string> tensor_names;
};

class GuardSet {
 public:
  /// These guards as a package holds them, or why they cannot be (an input on another device,
  /// of another layout, or one of the module's own parameters passed as an argument).
  std::string to_portable(PortableGuards& out) const;
  /// Guards from a package: no module is guarded, nor grad mode, nor whether an input is an
  /// inference tensor (a loaded package runs the forward graphs it holds whatever the autograd
  /// state is; its inputs must not require grad).
  static std::unique_ptr<GuardSet> from_portable(const PortableGuards& p);

  /// Guards for a call with `args` to the compiled object whose root module is `root` (may
  /// be null): the argument structure and scalar values; each input tensor's dtype, device,
  /// sizes, strides and requires_grad; which inputs are the same tensor; grad mode, inference
  /// mode, default dtype, deterministic algorithms and autocast; the training flag, submodules,
  /// parameters and buffers of every module under `root`.
  static std::unique_ptr<GuardSet> build(const CallArgs& args, const std::shared_ptr<torch::nn::Module>& root,
                                         std::vector<std::string> input_names);

  /// Make the entry dynamic: the dimensions of `plan` accept any size in their symbol's range
  /// (dimensions sharing a symbol must be equal), and their tensors must be contiguous instead
  /// of having the traced strides.
  void make_symbolic(const DynamicPlan& plan);

  /// Whether a call with `args` may use the entry. Allocation-free.
  bool check(const CallArgs& args) const;
  /// The first failing check, described: `tensor 'x' size mismatch at index 0: expected 64, got
  /// 32`. Empty if all pass.
  std::string failure_reason(const CallArgs& args) const;
  /// One line per guard, for logs.
  std::vector<std::string> describe() const;

  /// Guard the hooks of `m` (a module the trace called through torchcompile::call), seen at
  /// `version`. Modules under the root are guarded by build().
  void add_hook_module(const std::shared_ptr<torch::nn::Module>& m, uint64_t version, std::string path) const;
  /// Whether some guarded module's hooks changed since the trace. Hook versions only grow, so
  /// such an entry can never match again.
  bool hooks_stale() const;

  /// Number of guarded input tensors, modules and registered parameters + buffers.
  size_t num_tensors() const { return tensors_.size(); }
  size_t num_modules() const { return modules_.size(); }
  size_t num_attributes() const { return attrs_.size(); }

 private:
  // An input tensor. Sizes (then strides, if strided) live in dims_ from `dims`.
  struct TensorGuard {
    c10::DispatchKeySet keys;
    caffe2::TypeMeta dtype;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    uint32_t dims = 0;
    uint8_t ndim = 0;
    bool defined = false;
    bool requires_grad = false;
    bool strided = false;
    uint64_t symbolic = 0;  // bit d: dimension d is a symbol (checked in sym_dims_); then the
                            // tensor must be contiguous instead of having the traced strides
  };
  // A symbolic dimension of an input: its size is in [min, max] and, unless it is its symbol's
  // first dimension, equal to the size of that first dimension.
  struct SymDimGuard {
    uint32_t input, dim;
    uint32_t first_input, first_dim;
    int64_t min, max;
    std::string symbol;
  };
  // A registered parameter or buffer of one module. Sizes live in dims_ from `dims`.
  struct AttrGuard {
    at::Tensor tensor;  // the registered tensor (identity; keeps the TensorImpl alive)
    caffe2::TypeMeta dtype;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    uint32_t dims = 0;
    uint8_t ndim = 0;
    bool defined = false;
    bool requires_grad = false;
    bool buffer = false;  // a buffer, else a parameter
  };
  struct ModuleGuard {
    std::shared_ptr<torch::nn::Module> module;
    bool training;
    uint32_t params_begin, buffers_begin, attrs_end;  // into attrs_: [params)[buffers)
    uint32_t children_begin, children_end;            // into children_
  };

  // The hooks of one module as the trace saw them. check() reads
  // them only when the global hook epoch moved since the last passing check.
  struct HookGuard {
    std::shared_ptr<torch::nn::Module> module;
    uint64_t version;
    std::string path;
    std::vector<std::pair<std::string, std::string>> counts;  // detail::HookSet::counts()
  };
  bool hooks_changed(std::string* reason) const;  // sets the reason if given

  template <bool kWithReason>
  bool evaluate(const CallArgs& args, std::string* reason) const;
  template <bool kWithReason>
  bool check_attr(const AttrGuard& g, size_t index, const at::Tensor& t, std::string* reason) const;

  // Hot data.
  c10::SmallVector<ArgItem, 8> items_;
  std::vector<TensorGuard> tensors_;
  std::vector<int64_t> dims_;
  std::vector<SymDimGuard> sym_dims_;
  // What each input tensor was when traced: the same TensorImpl as an earlier input (`input`),
  // as a registered parameter or buffer (`attr`, into attrs_), or neither (both -1). The trace
  // resolves a tensor by identity, so a graph is only right for this pattern, in both directions.
  struct Identity {
    int32_t input = -1;
    int32_t attr = -1;
  };
  c10::SmallVector<Identity, 8> identity_;
  std::vector<std::pair<const c10::TensorImpl*, uint32_t>> attr_impls_;  // sorted; defined attrs
  static c10::SmallVector<Identity, 8> identities_of(const at::Tensor* tensors, size_t n);  // `input` only
  int32_t attr_of(const at::Tensor& t) const;  // the attribute that is `t`, or -1
  bool autograd_guarded_ = true;  // false for guards from a package: grad and inference mode unchecked
  bool grad_mode_ = true;
  bool inference_mode_ = false;
  bool deterministic_ = false;
  bool autocast_cpu_ = false;
  c10::ScalarType autocast_cpu_dtype_ = c10::ScalarType::BFloat16;  // checked only if autocast_cpu_
  caffe2::TypeMeta default_dtype_;
  std::vector<ModuleGuard> modules_;
  std::vector<AttrGuard> attrs_;
  std::vector<const torch::nn::Module*> children_;  // each module's registered submodules, in order

  mutable std::atomic<uint64_t> hook_epoch_seen_{0};
  mutable std::mutex hook_mutex_;
  mutable std::vector<HookGuard> hook_guards_;  // grows when a retrace calls a new module

  // Cold data: names for reasons and describe().
  std::vector<std::string> tensor_names_;
  std::vector<std::string> module_paths_;  // "<root>", "fc", "block.0"
  std::vector<std::string> attr_names_;    // qualified: "fc.weight"
  std::vector<std::string> child_names_;   // parallel to children_
};

/// Placeholder names for the flattened tensors of `args`: `names[k]` names argument k (a list
/// argument `xs` gives `xs_0`, `xs_1`, ...); missing names default to `arg<k>`.
std::vector<std::string> tensor_input_names(const CallArgs& args, const std::vector<std::string>& names);

}  // namespace torchcompile::runtime
