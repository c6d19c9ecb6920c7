#include "eager_backend.h"

#include <torchcompile/ir/interpreter.h>

#include <memory>

namespace torchcompile::backends {

CompiledFn eager_backend(GraphModule& gm, const std::vector<at::Tensor>& /*example_inputs*/) {
  auto interpreter = std::make_shared<ir::Interpreter>(gm);
  return [interpreter](std::vector<at::Tensor> inputs) { return interpreter->run(std::move(inputs)); };
}

}  // namespace torchcompile::backends
