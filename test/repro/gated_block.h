// The M5-like block of the repro tests: LayerNorm, GELU, a sigmoid gate, tanh and a residual.
#pragma once

#include <torch/torch.h>

struct GatedBlock : torch::nn::Module {
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, gate{nullptr}, down{nullptr};
  GatedBlock() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    up = register_module("up", torch::nn::Linear(32, 64));
    gate = register_module("gate", torch::nn::Linear(32, 64));
    down = register_module("down", torch::nn::Linear(64, 32));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = norm(x);
    torch::Tensor a = torch::gelu(up(h)) * torch::sigmoid(gate(h));
    return x + down(torch::tanh(a) + a);
  }
};
