// The `torchscript` backend (the "speedy" backend of PyTorch's custom-backends guide): converts the captured graph to a
// torch::jit::Graph, runs TorchScript's inference-safe passes on it and executes it with a
// torch::jit::GraphExecutor. A graph it cannot express runs with the interpreter (one warning).
#pragma once

#include <torchcompile/backends/registry.h>

namespace torchcompile::backends {

/// Compile `gm` with TorchScript. Parameters, buffers and graph constants are extra graph
/// inputs read from `gm` at each call, so in-place updates are seen. The GraphModule must
/// outlive the CompiledFn (the runtime keeps it alive in the cache entry).
CompiledFn torchscript_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

}  // namespace torchcompile::backends
