#include "eager_backend.h"

#include <torchcompile/aot/aot_autograd.h>
#include <torchcompile/ir/interpreter.h>


namespace torchcompile::backends {

CompiledFn eager_backend(GraphModule& gm, const std::vector<at::Tensor>& /*example_inputs*/) {
  return ir::interpreter_fn(gm);
}

void register_eager_backend() {
  register_backend("eager", &eager_backend);
  // AOT forward and backward graphs, both run by the interpreter (PyTorch's aot_eager).
  register_backend("aot_eager", aot_autograd(&eager_backend));
}

}  // namespace torchcompile::backends
