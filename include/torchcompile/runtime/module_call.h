// The module call boundary behind torchcompile::call and the top-level compiled module: fires
// the module's hooks, and inside a trace decides whether the call is inlined into the graph
// (no hooks, or only traceable ones) or becomes an opaque call_module node (other hooks,
// backward hooks, leaf modules) that runs the hooks with the real tensors on every call.
#pragma once

#include <torchcompile/runtime/compiled_function.h>

#include <functional>
#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace torchcompile::runtime {

/// Runs the module's forward on `inputs` (its flattened tensor arguments, as the hooks left
/// them) and returns its flattened outputs, setting `spec`. Must stay callable after the call
/// that made it (an opaque call_module node keeps it): it owns what it captures.
using CallBody = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs, OutputSpec& spec)>;

/// Whether a call of `m` can skip the boundary entirely: no trace on this thread and no hooks
/// or leaf flag on `m`. Lock-free while no module in the process has hooks.
bool call_is_plain(const torch::nn::Module& m);

/// One call of `module` through the boundary (see the header comment).
std::vector<at::Tensor> call_module(const std::shared_ptr<torch::nn::Module>& module, std::vector<at::Tensor> inputs,
                                    const CallBody& body, OutputSpec& spec);

/// Whether the hooks of a compiled root module must run outside its compiled graph (some
/// hook is not traceable, or a backward hook exists).
bool hooks_run_outside(const torch::nn::Module& root);

/// Fire `module`'s current hooks around `body`: forward pre-hooks, backward-hook wrapping of
/// the inputs, the body, forward hooks, backward-hook wrapping of the outputs.
std::vector<at::Tensor> run_with_hooks(torch::nn::Module& module, std::vector<at::Tensor> inputs,
                                       const CallBody& body, OutputSpec& spec);

}  // namespace torchcompile::runtime
