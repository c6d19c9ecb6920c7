// Gradient buckets of data-parallel training (src/distributed/): a compiled training graph that
// reads parameters of more than one bucket is compiled as one part per bucket, as PyTorch's
// DDPOptimizer splits Dynamo's graphs, so that each part's backward is its own autograd node: a
// bucket's gradients are complete, and its all-reduce starts, while the earlier parts' backward
// still runs (one backward node for the whole graph would produce every gradient at its end).
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace torchcompile::compile_stage {

/// Parameters registered by one DistributedDataParallel; unregistered when the last copy of the
/// handle is dropped.
struct GradientBucketsRegistration;

/// Register `params` (their gradients are reduced in buckets of `bucket_bytes`, the bucket of the
/// last parameters at most `first_bucket_bytes`).
std::shared_ptr<GradientBucketsRegistration> register_gradient_buckets(const std::vector<at::Tensor>& params,
                                                                      size_t bucket_bytes, size_t first_bucket_bytes);

/// The call_function nodes of `gm`, grouped by gradient bucket in graph order, when grad mode
/// is on and `gm` reads registered parameters that fill more than one bucket; otherwise empty.
/// Buckets are formed as DDPOptimizer forms them: walking the graph backwards (the backward's
/// order), a node joins the current bucket, which closes once the parameters its nodes read
/// reach the bucket size.
std::vector<std::vector<const ir::Node*>> gradient_bucket_groups(const ir::GraphModule& gm);

}  // namespace torchcompile::compile_stage
