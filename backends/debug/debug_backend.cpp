#include "debug_backend.h"

#include "../eager/eager_backend.h"

#include <torchcompile/ir/printer.h>

#include <iostream>

namespace torchcompile::backends {

CompiledFn debug_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  std::cout << "debug backend called with graph:\n";
  ir::print_tabular(gm.graph(), std::cout);
  std::cout << std::endl;
  return eager_backend(gm, example_inputs);
}

}  // namespace torchcompile::backends
