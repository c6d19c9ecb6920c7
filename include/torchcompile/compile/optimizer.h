// A compiled optimizer step: torchcompile::compile_optimizer(opt).step() does what opt.step()
// does for torch::optim::SGD, Adam and AdamW, in one pass over each parameter (LibTorch's step
// makes 3-8 passes and allocates temporaries), on the optimizer's own state (the same
// momentum buffers and moments, created as LibTorch creates them), so the two steps can be mixed
// and the optimizer saved and loaded as usual. Each value is computed with the same operations
// in the same order as LibTorch's step, so results are bit-equal to it (at most 1 ULP apart
// where the LibTorch build rounds one operation differently). docs/training.md says more.
#pragma once

#include <memory>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace torchcompile {

class CompiledOptimizer {
 public:
  /// `optimizer` must be a torch::optim::SGD, Adam or AdamW (else a c10::Error saying which it
  /// is); it must outlive this object.
  explicit CompiledOptimizer(torch::optim::Optimizer& optimizer);

  /// One step of the optimizer with its current options (per parameter group) and state.
  /// Parameters without a gradient are skipped, as LibTorch skips them. Float32 CPU parameters
  /// whose gradient and state tensors are contiguous take the fused pass; any other parameter
  /// (another dtype, a sparse gradient, a non-contiguous layout) takes LibTorch's operations.
  void step();

  torch::optim::Optimizer& optimizer() const;
  /// "SGD", "Adam" or "AdamW".
  const char* kind() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// CompiledOptimizer(optimizer), named like torch::compile.
CompiledOptimizer compile_optimizer(torch::optim::Optimizer& optimizer);

}  // namespace torchcompile
