// Comparing IValues (results' structures, TorchScript attributes).
#pragma once

#include <ATen/core/ivalue.h>

namespace torchcompile::runtime {

/// Whether `a` and `b` are the same value: containers of the same kinds and lengths, element by
/// element; ints, bools, strings and devices equal, doubles equal (a NaN to a NaN); tensors the
/// same tensor, or with `any_tensor` any two tensors (structures with tensors left out); anything
/// else the same object.
bool same_ivalue(const c10::IValue& a, const c10::IValue& b, bool any_tensor);

}  // namespace torchcompile::runtime
