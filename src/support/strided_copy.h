// A copy of a tensor with the same sizes and strides, for work that must see a tensor's layout
// as it is (a trace of views and reshapes, example inputs kept before an in-place write).
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

namespace torchcompile::support {

/// A detached copy of `t` with its sizes and strides: clone() keeps the strides of a dense
/// tensor only (a narrowed or sliced view becomes contiguous), so a non-dense one is copied into
/// memory laid out with its strides. A tensor that overlaps itself (expanded) cannot be
/// reproduced: its copy is clone()'s (dense; compare the strides to tell).
inline at::Tensor strided_copy(const at::Tensor& t) {
  if (!t.defined()) return t;
  at::NoGradGuard no_grad;
  const at::Tensor d = t.detach();
  if (d.is_non_overlapping_and_dense() || at::has_internal_overlap(d) == at::MemOverlap::Yes)
    return d.clone(at::MemoryFormat::Preserve);
  return at::empty_strided(d.sizes(), d.strides(), d.options()).copy_(d);
}

}  // namespace torchcompile::support
