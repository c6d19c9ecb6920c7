// Training with a compiled model: an MLP classifier on synthetic data, SGD with momentum, 50
// steps. The compiled copy uses `aot_eager` (AOT forward and backward graphs, run by the
// interpreter; any backend name or aot_autograd(...) works the same way); an eager copy with the
// same initial weights sees the same batches. Prints both loss trajectories and exits nonzero
// if they differ by more than 1e-4 (relative) at any step.
//
//   example_train_mlp [backend]      (default: aot_eager)
#include <torchcompile/torchcompile.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

struct ClassifierImpl : torch::nn::Cloneable<ClassifierImpl> {
  ClassifierImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(20, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x));
    x = torch::gelu(fc2(x));
    return fc3(x);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Classifier);

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "aot_eager";
  torch::manual_seed(0);
  // Synthetic task: the class is the argmax of four fixed random projections of the input.
  const auto projection = torch::randn({20, 4});
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int step = 0; step < 50; ++step) {
    auto x = torch::randn({32, 20});
    batches.emplace_back(x, x.matmul(projection).argmax(1));
  }

  Classifier eager_model;
  auto compiled_model = std::dynamic_pointer_cast<ClassifierImpl>(eager_model->clone());
  auto compiled = torch::compile(compiled_model, backend);
  torch::optim::SGD eager_opt(eager_model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD compiled_opt(compiled_model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  double worst = 0;
  std::printf("step   eager loss   %s loss   rel. diff\n", backend.c_str());
  for (size_t step = 0; step < batches.size(); ++step) {
    const auto& [x, y] = batches[step];
    eager_opt.zero_grad();
    auto eager_loss = torch::nn::functional::cross_entropy(eager_model->forward(x), y);
    eager_loss.backward();
    eager_opt.step();

    compiled_opt.zero_grad();
    auto compiled_loss = torch::nn::functional::cross_entropy(compiled(x), y);
    compiled_loss.backward();
    compiled_opt.step();

    const double e = eager_loss.item<double>(), c = compiled_loss.item<double>();
    const double rel = std::abs(e - c) / std::max(std::abs(e), 1e-12);
    worst = std::max(worst, rel);
    if (step % 10 == 0 || step + 1 == batches.size())
      std::printf("%4zu   %10.6f   %10.6f   %.2e\n", step, e, c, rel);
  }
  const auto& entries = compiled.state().entries();
  const bool compiled_ok = entries.size() == 1 && !entries.front()->runs_eagerly();
  std::printf("largest relative difference over %zu steps: %.2e (limit 1e-4); compiled entry: %s\n", batches.size(),
              worst, compiled_ok ? "yes" : "NO (ran eagerly)");
  return worst <= 1e-4 && compiled_ok ? 0 : 1;
}
