// Row operations of the `fused` backend: softmax and log-softmax over the last dimension, layer
// normalization over the trailing dimensions, each run as one vectorized pass per row (reduce,
// then the pointwise pass that uses the reduction) with the backend's own exp; and reductions
// (sum, mean, amax, amin) over a block of adjacent dimensions.
#pragma once

#include "fused_program.h"

#include <memory>
#include <string>
#include <vector>

namespace torchcompile::fused {

/// Whether `n` is a row operation the backend runs: `softmax.int` / `_softmax` / `log_softmax.int`
/// / `_log_softmax` over the last dimension and their gradients `_softmax_backward_data` /
/// `_log_softmax_backward_data`, `layer_norm` and `native_layer_norm` (also returning each row's
/// mean and rstd) over the trailing dimensions with optional weight and bias of the normalized
/// shape, and its gradient `native_layer_norm_backward`, `sum` / `sum.dim_IntList` / `mean.dim` /
/// `amax` / `amin` / `var` / `std` (`.dim`, `.correction`) over adjacent dimensions (any keepdim); float32 CPU tensors, contiguous input
/// and output, no dtype conversion.
bool row_fusible(const ir::Node& n);

/// A graph of one row operation, compiled.
class RowProgram {
 public:
  /// The program for `gm` (one call_function node, row_fusible, whose result is the graph's
  /// output), or nullptr with the reason in `*why`. `gm` must outlive the program.
  ///
  /// A graph with size symbols gives one program for every size when each size of its inputs and
  /// results is a constant or one symbol and a layer norm's normalized dimensions are constants:
  /// the program reads the symbols' values from its inputs at each call, and the rows (and a
  /// softmax's row length, a reduction's blocks) follow them. Otherwise build() fails, with the
  /// reason.
  static std::shared_ptr<const RowProgram> build(const ir::GraphModule& gm, std::string* why);

  /// Run on the graph's inputs (placeholders, in order); checks dtypes and sizes.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) const;

  /// "fused: softmax (rows of 128, avx512)", "fused: softmax (rows of any length, every size, avx512)"
  std::string describe() const;

  /// The row operations (row_fusible tells which one a node is).
  enum class Kind {
    Softmax,
    LogSoftmax,
    SoftmaxBackward,
    LogSoftmaxBackward,
    LayerNorm,
    NativeLayerNorm,
    LayerNormBackward,
    Reduce
  };

 private:
  RowProgram() = default;
  // The sizes of one call: the symbols' values (a program for every size) and the blocks rows are
  // made of.
  struct CallSizes {
    c10::SmallVector<int64_t, 8> symbols;
    int64_t outer = 1, cols = 1, inner = 1;
  };
  const at::Tensor& source(const TensorSource& s, const std::vector<at::Tensor>& inputs, const char* what,
                           const CallSizes& call) const;
  std::vector<int64_t> result_sizes(size_t i, const CallSizes& call) const;
  at::Tensor reduce(const at::Tensor& x, const CallSizes& call) const;
  std::vector<at::Tensor> rows(const std::vector<at::Tensor>& inputs, const at::Tensor& x, const CallSizes& call) const;
  std::vector<at::Tensor> layer_norm_backward(const std::vector<at::Tensor>& inputs, const at::Tensor& grad,
                                              const CallSizes& call) const;

  Kind kind_ = Kind::Softmax;
  // Reduce: the input as (outer, cols, inner), its dimensions [first_, last_] reduced (cols).
  int64_t first_ = 0, last_ = 0;
  ReduceOp reduce_ = ReduceOp::Sum;
  bool mean_ = false;
  double correction_ = 0;  // var / std: the divisor is max(0, N - correction)
  std::string name_;
  TensorSource x_, weight_, bias_;
  TensorSource y_;  // softmax backward: the forward's result (x_ is the gradient)
  std::vector<size_t> output_index_;               // the graph's outputs: results of the operator, by index
  std::vector<std::vector<SymbolicDim>> result_dims_;  // the operator's results' sizes (constants unless symbolic_)
  TensorSource mean_src_, rstd_src_;               // layer_norm_backward: the forward's statistics
  bool output_mask_[3] = {false, false, false};    // layer_norm_backward: the gradients computed
  // A program for every size: the (input, dimension) giving each symbol's value.
  bool symbolic_ = false;
  std::vector<std::pair<size_t, int64_t>> bindings_;
  // As traced (describe); a layer norm's row length at every size.
  int64_t outer_ = 1, inner_ = 1;
  int64_t cols_ = 1;
  float eps_ = 1e-5f;
  Isa isa_ = Isa::Sse2;
  const IsaKernels* kernels_ = nullptr;
};

}  // namespace torchcompile::fused
