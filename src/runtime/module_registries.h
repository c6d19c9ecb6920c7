// Reading (and, for a module standing in for another, writing) the registries of a
// torch::nn::Module without copying them.
//
// torch::nn::Module keeps its registered parameters in `parameters_` (protected), and its
// buffers and submodules in `buffers_` and `children_` (private). The public accessors
// (named_parameters(), buffers(false), children(), ...) build a new vector or OrderedDict with
// string keys on every call: far too slow for the guards' check(). module_registries.cpp obtains
// member pointers to the members themselves, once, with two standard (if little-known) C++ idioms
// (see there); applying a member pointer to a Module (`m.*p`) is not access-checked. If a future
// LibTorch renames or retypes the members, this fails to compile (it does not misbehave). The
// members are the same in LibTorch 1.13 and 2.x.
#pragma once

#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <memory>
#include <string>

namespace torchcompile::runtime {

using TensorDict = torch::OrderedDict<std::string, at::Tensor>;
using ModuleDict = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;

namespace registries {
extern TensorDict torch::nn::Module::* const kParameters;
extern TensorDict torch::nn::Module::* const kBuffers;
extern ModuleDict torch::nn::Module::* const kChildren;
}  // namespace registries

inline const TensorDict& registered_parameters(const torch::nn::Module& m) { return m.*registries::kParameters; }
inline const TensorDict& registered_buffers(const torch::nn::Module& m) { return m.*registries::kBuffers; }
inline const ModuleDict& registered_children(const torch::nn::Module& m) { return m.*registries::kChildren; }

/// The registered tensor `name` of `m` (a parameter if `parameter`, else a buffer), to be
/// replaced in place by a module that stands in for another (frontend/script_module.cpp).
/// Throws if there is none.
at::Tensor& registered_tensor(torch::nn::Module& m, const std::string& name, bool parameter);

}  // namespace torchcompile::runtime
