// Models of the seed documents the tests reproduce (PyTorch's own examples, in C++).
#pragma once

#include <torch/torch.h>

namespace tc_test {

// Seed 003's SimpleNN.
struct SimpleNNImpl : torch::nn::Cloneable<SimpleNNImpl> {
  explicit SimpleNNImpl(int64_t input_dim) : input_dim(input_dim) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(input_dim, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 32));
    fc3 = register_module("fc3", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x));
    x = torch::relu(fc2(x));
    return fc3(x);
  }
  int64_t input_dim;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(SimpleNN);

}  // namespace tc_test
