// A matrix product one of whose operands is a single value broadcast — every element the same,
// as the gradient of a `sum()` loss is (`expand` of a 0-d tangent) — is a sum times that value:
//   mm(s broadcast to [M, K], B [K, N]) = s * B.sum(0) repeated over M rows,
//   mm(A [M, K], s broadcast to [K, N]) = s * A.sum(1) repeated over N columns.
// LibTorch runs such a product as a full GEMM (it makes the broadcast operand contiguous first):
// 2·M·K·N flops where K·N (or M·K) additions do. The `default` composition rewrites it before
// partitioning; the rewritten nodes are ordinary operators (a reduction, a multiply, an expand and
// a contiguous copy), so any backend runs them. The sums are taken in another order than the
// GEMM's, so results differ from eager's by float rounding only.
#pragma once

#include <torchcompile/backends/backend.h>

#include <string>
#include <vector>

namespace torchcompile::compile_stage {

/// Rewrites every `aten::mm` of `gm` (floating dtype) one of whose operands is a view chain
/// (`expand`, `t`, `view`, `_reshape_alias`, ...) of a one-element tensor, as above. In a graph with
/// size symbols the new nodes carry the product's symbolic sizes (the expand takes them as a size
/// expression), and a tensor counts as one element only if each of its sizes is the constant 1.
/// Returns one line per rewrite for the compile report ("mm_2 [512 x 4096 @ 4096 x 2048]: ...",
/// "mm_2 [2048 x 128*s0 @ 128*s0 x 512]: ..." with symbols).
std::vector<std::string> simplify_broadcast_products(GraphModule& gm);

}  // namespace torchcompile::compile_stage
