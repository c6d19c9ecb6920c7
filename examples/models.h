// Models of ../shared/targets.md shared by the demo and the benchmarks (same shapes everywhere).
#pragma once

#include <torch/torch.h>

namespace torchcompile_examples {

// M1: Linear(784,512)-ReLU-Linear(512,512)-ReLU-Linear(512,10).
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 512))),
        fc2(register_module("fc2", torch::nn::Linear(512, 512))),
        fc3(register_module("fc3", torch::nn::Linear(512, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x));
    x = torch::relu(fc2(x));
    return fc3(x);
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// M8 of targets.md: 50 chained tiny ops cycling x+0.5, x*0.9, relu, sin.
inline torch::Tensor chain50(torch::Tensor x) {
  for (int i = 0; i < 50; ++i) {
    switch (i % 4) {
      case 0: x = x + 0.5; break;
      case 1: x = x * 0.9; break;
      case 2: x = torch::relu(x); break;
      default: x = torch::sin(x); break;
    }
  }
  return x;
}

}  // namespace torchcompile_examples
