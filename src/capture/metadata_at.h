// Shape propagation without data: the metadata a graph's values take at other input sizes.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchcompile::capture {

/// The metadata of every node's outputs, by node name, when `gm` runs on inputs with the
/// metadata `inputs`, computed without data: every op runs on meta tensors (attributes too), an
/// op without a meta kernel on zeros of its arguments' sizes (known_without_meta_kernel). The
/// sizes of an op whose result sizes depend on the data (ir::node_results_depend_on_data) are
/// those of zeros: callers that need them run such graphs on the real inputs. Devices are
/// `meta` and nothing requires grad: callers keep those of the traced metadata. Throws what an
/// op throws at these sizes.
std::unordered_map<std::string, std::vector<ir::TensorMeta>> metadata_at(const ir::GraphModule& gm,
                                                                       const std::vector<ir::TensorMeta>& inputs);

/// metadata_at at several input metadata, one result per entry of `points` (in order): the graph
/// is copied and prepared for meta tensors once.
std::vector<std::unordered_map<std::string, std::vector<ir::TensorMeta>>> metadata_at_points(
    const ir::GraphModule& gm, const std::vector<std::vector<ir::TensorMeta>>& points);

/// The result of a pointwise operator without a meta kernel (`relu` in LibTorch 1.13) on the
/// meta tensors in `args`, as a meta tensor: its dtype from a call on one-element zeros, its
/// sizes the arguments' broadcast and its strides as TensorIterator lays out the kernel's result.
/// Nothing runs on data of the real sizes. Nullopt where this does not apply (not pointwise, in
/// place, random, more than one result, tensors in lists) or fails.
std::optional<at::Tensor> pointwise_on_meta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args);

/// The result of a convolution (`aten::convolution`, `_convolution`, `conv1d`/`2d`/`3d` with
/// integer or "valid"/"same" padding, `conv_transpose1d`/`2d`/`3d`) on the meta tensors in `args`,
/// from its shape formula: LibTorch 1.13 has no meta kernel for them, and running one on zeros of
/// real sizes costs a real convolution. Only where the result's layout is certain: a contiguous
/// input and weight of one floating dtype give a contiguous result. Nullopt otherwise.
std::optional<at::Tensor> convolution_on_meta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args);

/// The results of `aten::native_layer_norm` (no meta kernel in LibTorch 1.13) on the meta
/// tensors in `args`: the normalized input, contiguous, and the mean and reciprocal standard
/// deviation, one per row, of the input's leading sizes followed by ones, as the CPU kernel lays
/// them out; of `aten::layer_norm` (what LayerNorm modules call), the first of them. For float
/// and double inputs whose trailing sizes are the normalized shape and whose weight and bias (if
/// any) have it; nullopt otherwise (the op decides, or throws).
std::optional<std::vector<at::Tensor>> layer_norm_on_meta(const c10::OperatorHandle& op,
                                                          const std::vector<c10::IValue>& args);

/// The result of `aten::embedding` (no meta kernel in LibTorch 1.13: it runs `index_select`) on
/// the meta tensors in `args`: the indices' sizes followed by the embedding dimension, contiguous,
/// of the weight's dtype. For a 2-D weight and int64 or int32 indices; nullopt otherwise.
std::optional<at::Tensor> embedding_on_meta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args);

/// pointwise_on_meta, convolution_on_meta, embedding_on_meta, then layer_norm_on_meta: the
/// results of an op without a meta kernel that are known without running it.
std::optional<std::vector<at::Tensor>> result_on_meta(const c10::OperatorHandle& op,
                                                      const std::vector<c10::IValue>& args);

}  // namespace torchcompile::capture
