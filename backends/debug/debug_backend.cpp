#include "debug_backend.h"

#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/printer.h>

#include <iostream>

namespace torchcompile::backends {

CompiledFn debug_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  std::cout << "debug backend called with graph:\n";
  ir::print_tabular(gm.graph(), std::cout);
  std::cout << std::endl;
  return ir::interpreter_fn(gm);
}

void register_debug_backend() { register_backend("debug", &debug_backend, {"debug"}); }

}  // namespace torchcompile::backends
