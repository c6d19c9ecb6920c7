#include "debug_backend.h"

#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/printer.h>

#include <iostream>
#include <memory>

namespace torchcompile::backends {

CompiledFn debug_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  std::cout << "debug backend called with graph:\n";
  ir::print_tabular(gm.graph(), std::cout);
  std::cout << std::endl;
  auto interpreter = std::make_shared<ir::Interpreter>(gm);
  return [interpreter](std::vector<at::Tensor> inputs) { return interpreter->run(std::move(inputs)); };
}

void register_debug_backend() { register_backend("debug", &debug_backend, {"debug"}); }

}  // namespace torchcompile::backends
