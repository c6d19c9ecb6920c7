// Feature extraction from a compiled model with forward hooks (PyTorch's nn.Module hooks guide: its activation-capture
// use case), a traceable hook inlined into the graph, a backward hook, and what happens when a
// hook is removed after compilation. Checks every result against eager LibTorch and exits
// nonzero on a mismatch.
#include <torchcompile/torchcompile.h>

#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>

namespace tc = torchcompile;

// A small CNN whose forward calls its layers through torchcompile::call, so their hooks fire
// (in eager and in compiled calls alike).
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(16 * 8 * 8, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(tc::call(conv1, x)), 2);
    x = torch::max_pool2d(torch::relu(tc::call(conv2, x)), 2);
    return tc::call(fc, x.flatten(1));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(SmallCnn);

int main() {
  torch::manual_seed(0);
  SmallCnn model;
  model->eval();
  bool ok = true;
  auto check = [&](const char* what, const torch::Tensor& expected, const torch::Tensor& actual) {
    const bool same = expected.sizes() == actual.sizes() && torch::allclose(expected, actual, 1e-4, 1e-5);
    std::printf("  %-34s %s\n", what, same ? "matches eager" : "DIFFERS from eager");
    ok = ok && same;
  };

  // 1. Feature extraction: a forward hook on each conv layer stores its output.
  std::map<std::string, torch::Tensor> features;
  std::vector<tc::RemovableHandle> handles;
  for (const auto& item : model->named_children()) {
    if (item.key() == "fc") continue;
    handles.push_back(tc::register_forward_hook(
        item.value(), [&features, name = item.key()](torch::nn::Module&, const tc::Tensors&, const tc::Tensors& out) {
          features[name] = out[0].detach();
        }));
  }
  auto fast = torch::compile(model, "eager");
  std::printf("feature extraction with a compiled model:\n");
  for (int batch = 0; batch < 3; ++batch) {
    torch::NoGradGuard no_grad;
    auto images = torch::randn({4, 3, 32, 32});
    features.clear();
    auto logits = fast(images);
    auto compiled_features = features;
    features.clear();
    auto expected = tc::call(model, images);  // eager, same hooks
    std::printf(" batch %d: conv1 features %s, conv2 features %s\n", batch,
                c10::str(compiled_features.at("conv1").sizes()).c_str(),
                c10::str(compiled_features.at("conv2").sizes()).c_str());
    check("logits", expected, logits);
    check("conv1 features", features.at("conv1"), compiled_features.at("conv1"));
    check("conv2 features", features.at("conv2"), compiled_features.at("conv2"));
  }
  std::printf("  (conv layers with these hooks run as opaque call_module nodes, each compiled as its own "
              "graph; %zu entries)\n",
              fast.state().num_entries());

  // 2. Removing the hooks after compilation: the next call notices and recompiles.
  for (auto& h : handles) h.remove();
  {
    torch::NoGradGuard no_grad;
    auto images = torch::randn({4, 3, 32, 32});
    features.clear();
    check("logits after removing the hooks", model->forward(images), fast(images));
    std::printf("  hooks fired after removal: %zu\n  recompile reason: %s\n", features.size(),
                fast.state().last_recompile_reason().c_str());
    ok = ok && features.empty();
  }

  // 3. A traceable hook (it only transforms tensors) is inlined: one graph, no split.
  auto scale = tc::register_forward_hook(
      model->fc, [](torch::nn::Module&, const tc::Tensors&, const tc::Tensors& out) { return tc::Tensors{out[0] / 2}; },
      tc::HookOptions().traceable());
  {
    torch::NoGradGuard no_grad;
    auto images = torch::randn({4, 3, 32, 32});
    check("logits with a traceable fc hook", tc::call(model, images), fast(images));
    std::printf("  graphs in the entry: %zu\n", fast.state().entries().front()->num_graphs());
  }
  scale.remove();

  // 4. A backward hook on the compiled model's fc layer sees grad_output and grad_input.
  double grad_norm = -1;
  tc::register_full_backward_hook(model->fc, [&](torch::nn::Module&, const tc::Tensors& grad_input,
                                                const tc::Tensors& grad_output) {
    grad_norm = grad_output[0].norm().item<double>();
  });
  model->train();
  auto images = torch::randn({4, 3, 32, 32});
  fast(images).pow(2).sum().backward();
  const double compiled_norm = grad_norm;
  grad_norm = -1;
  tc::call(model, images).pow(2).sum().backward();
  std::printf("backward hook on fc: |grad_output| compiled %.6f, eager %.6f\n", compiled_norm, grad_norm);
  ok = ok && compiled_norm > 0 && std::abs(compiled_norm - grad_norm) <= 1e-4 * grad_norm;

  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
