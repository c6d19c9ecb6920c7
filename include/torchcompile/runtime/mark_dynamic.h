// Marking dimensions of an input tensor dynamic or static (Python's torch._dynamo.mark_dynamic
// and mark_static). A mark belongs to the tensor object and is read when a call with that tensor
// is traced; it does not change the tensor.
//
//     auto x = torch::randn({8, 784});
//     torchcompile::mark_dynamic(x, 0);          // the batch dimension is a size symbol
//     auto y = compiled(x);                      // one entry for every batch size >= 2
//
// See docs/dynamic-shapes.md for what becomes symbolic and what stays static.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <optional>

namespace torchcompile {

/// Make dimension `dim` of `t` a size symbol when a compiled object traces a call with `t`, even
/// on the first trace. `min`/`max` bound the sizes the entry accepts (a call outside them misses
/// the entry and traces anew); sizes 0 and 1 are never symbolic. If host code in the forward
/// reads this size the dimension stays static and a warning says so.
void mark_dynamic(const at::Tensor& t, int64_t dim, std::optional<int64_t> min = std::nullopt,
                  std::optional<int64_t> max = std::nullopt);

/// Keep dimension `dim` of `t` static, whatever CompileOptions::dynamic says.
void mark_static(const at::Tensor& t, int64_t dim);

namespace detail {
/// How a dimension of a tensor was marked.
struct DimMark {
  enum Kind : uint8_t { None, Dynamic, Static } kind = None;
  int64_t min = 2;
  int64_t max = std::numeric_limits<int64_t>::max();
};
/// The mark of dimension `dim` of `t` (None if unmarked).
DimMark dim_mark(const at::Tensor& t, int64_t dim);
}  // namespace detail

}  // namespace torchcompile
