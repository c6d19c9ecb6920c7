// The `debug` backend (the debugging backend of PyTorch's custom-backends guide): prints each captured graph as FX's
// table to stdout, then runs it with the interpreter.
#pragma once

#include <torchcompile/backends/registry.h>

namespace torchcompile::backends {

CompiledFn debug_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

}  // namespace torchcompile::backends
