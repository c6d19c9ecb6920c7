// Values of TorchScript calls as the runtime sees them: arguments encoded as CallArgs, results
// rebuilt from their structure. Shared by compiled TorchScript modules (script_module.cpp) and
// loaded packages (frontend/package.cpp), which call with the same encoding.
#pragma once

#include <torchcompile/runtime/compiled_function.h>

#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <vector>

namespace torchcompile::detail {

/// `v` with every tensor replaced by `f(tensor)` (new containers, dict keys included; `v` unchanged).
c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f);

/// The call's arguments as the runtime sees them: one item per argument (a tensor, an absent
/// tensor, a scalar, or the tensors of a container as a list), then the structure of the
/// containers (their kinds, lengths, scalars and strings). `names` name the arguments in errors.
runtime::CallArgs encode_args(const std::vector<c10::IValue>& inputs, const std::vector<std::string>& names);

/// The result from its structure (OutputSpec::structure: tensors undefined) and the flattened tensors.
c10::IValue rebuild_result(const c10::IValue& structure, const std::vector<at::Tensor>& flat);

}  // namespace torchcompile::detail
