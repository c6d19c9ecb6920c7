// Runs an M5-like gated block (LayerNorm, GELU, sigmoid gate, tanh, residual) compiled with a
// named backend, twice (the second call runs the compiled graph), for the repro program test:
//   repro_writer <plugin> <backend>
// TORCHCOMPILE_REPRO_* come from the environment.
#include <torchcompile/backends/registry.h>
#include <torchcompile/torchcompile.h>

#include "repro/gated_block.h"

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: repro_writer <plugin> <backend>\n";
    return 64;
  }
  torchcompile::load_backend_library(argv[1]);
  torch::manual_seed(0);
  auto block = std::make_shared<GatedBlock>();
  auto fast = torch::compile(block, argv[2]);
  torch::Tensor x = torch::randn({8, 32});
  for (int i = 0; i < 2; ++i) fast->forward(x);
  return 0;
}
