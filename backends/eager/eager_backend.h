// The `eager` backend: runs the captured graph with the interpreter. The reference backend.
#pragma once

#include <torchcompile/backends/registry.h>

namespace torchcompile::backends {

/// Prepare the interpreter's call plan once and return a CompiledFn running it. The GraphModule
/// must outlive the CompiledFn (the runtime keeps it alive in the cache entry).
CompiledFn eager_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

}  // namespace torchcompile::backends
