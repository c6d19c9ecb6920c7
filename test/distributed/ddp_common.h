// Models, data and losses shared by the data-parallel worker and the test's single-process
// reference.
#pragma once

#include "examples/models.h"

#include <torch/torch.h>

namespace ddp_test {

constexpr int64_t kSteps = 20;

// A wider MLP, so that its parameters fill several 0.5 MiB gradient buckets and the first layer's
// backward takes long enough to see the all-reduce of later buckets start before it ends.
struct WideMlpImpl : torch::nn::Module {
  WideMlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 1024))),
        fc2(register_module("fc2", torch::nn::Linear(1024, 256))),
        fc3(register_module("fc3", torch::nn::Linear(256, 256))),
        fc4(register_module("fc4", torch::nn::Linear(256, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x));
    x = torch::relu(fc2(x));
    x = torch::relu(fc3(x));
    return fc4(x);
  }
  torch::nn::Linear fc1, fc2, fc3, fc4;
};
TORCH_MODULE(WideMlp);

// A parameter the forward never uses.
struct WithUnusedImpl : torch::nn::Module {
  WithUnusedImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 10))),
        spare(register_module("spare", torch::nn::Linear(32, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2, spare;
};
TORCH_MODULE(WithUnused);

struct Batch {
  torch::Tensor x, y;
};

// The global batch of step `k` (the same on every rank and in the reference).
inline Batch global_batch(const std::string& model, int64_t k) {
  torch::manual_seed(1000 + k);
  if (model == "cnn") return {torch::randn({8, 3, 16, 16}), torch::randint(0, 10, {8})};
  const int64_t n = model == "wide" ? 256 : 64;
  return {torch::randn({n, 784}), torch::randint(0, 10, {n})};
}

inline torch::Tensor loss_of(const std::string& model, const torch::Tensor& out, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(out, y);
}

}  // namespace ddp_test
