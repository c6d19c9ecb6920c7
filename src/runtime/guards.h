// The guards of a cache entry: a flat, ordered list of cheap checks built when the entry was
// traced. check() is the hot path; failure_reason() explains the first failing check.
#pragma once

#include <torchcompile/runtime/compiled_function.h>

#include <c10/util/SmallVector.h>

#include <memory>
#include <string>
#include <vector>

namespace torchcompile::runtime {

class GuardSet {
 public:
  /// Guards for a call with `args` to the compiled object whose root module is `root` (may
  /// be null): the argument structure and scalar values; each input tensor's dtype, device,
  /// sizes, strides and requires_grad; which inputs are the same tensor; grad mode and
  /// inference mode; the training flag of every module under `root`.
  static std::unique_ptr<GuardSet> build(const CallArgs& args, const std::shared_ptr<torch::nn::Module>& root,
                                         std::vector<std::string> input_names);

  /// Whether a call with `args` may use the entry.
  bool check(const CallArgs& args) const;
  /// The first failing check, described: `tensor 'x' size mismatch at index 0: expected 64, got
  /// 32`. Empty if all pass.
  std::string failure_reason(const CallArgs& args) const;
  /// One line per guard, for logs.
  std::vector<std::string> describe() const;

 private:
  struct TensorGuard {
    bool defined;
    c10::ScalarType dtype;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    bool requires_grad;
    c10::SmallVector<int64_t, 6> sizes;
    c10::SmallVector<int64_t, 6> strides;
  };
  struct ModuleGuard {
    std::shared_ptr<torch::nn::Module> module;
    std::string path;
    bool training;
  };

  // Fills `reason` (if non-null) and returns false at the first failing check.
  bool evaluate(const CallArgs& args, std::string* reason) const;

  c10::SmallVector<ArgItem, 8> items_;
  std::vector<TensorGuard> tensors_;
  std::vector<std::string> tensor_names_;
  std::vector<std::pair<uint32_t, uint32_t>> same_tensor_;  // (i, j): input j is input i
  bool grad_mode_ = true;
  bool inference_mode_ = false;
  std::vector<ModuleGuard> modules_;
};

/// Placeholder names for the flattened tensors of `args`: `names[k]` names argument k (a list
/// argument `xs` gives `xs_0`, `xs_1`, ...); missing names default to `arg<k>`.
std::vector<std::string> tensor_input_names(const CallArgs& args, const std::vector<std::string>& names);

}  // namespace torchcompile::runtime
