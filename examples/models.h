// Models of the benchmark suite (test/benchmarks/RESULTS.md) shared by the demo, the benchmarks and the
// tests (same shapes everywhere).
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

// M3: two conv-BN-ReLU blocks (3 -> c1 -> c2 channels), global average pooling, a classifier.
struct ConvNetImpl : torch::nn::Module {
  explicit ConvNetImpl(int64_t c1 = 32, int64_t c2 = 64)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, c1, 3).padding(1)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(c1))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c1, c2, 3).padding(1)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(c2))),
        fc(register_module("fc", torch::nn::Linear(c2, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    x = torch::relu(bn2(conv2(x)));
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc;
};
TORCH_MODULE(ConvNet);

// M4: one transformer encoder layer (input: seq, batch, feature).
struct M4Impl : torch::nn::Module {
  M4Impl()
      : layer(register_module("layer", torch::nn::TransformerEncoderLayer(
                                           torch::nn::TransformerEncoderLayerOptions(256, 4).dim_feedforward(1024).dropout(0.0)))) {}
  torch::Tensor forward(torch::Tensor x) { return layer(x); }
  torch::nn::TransformerEncoderLayer layer;
};
TORCH_MODULE(M4);

// M5: LayerNorm -> Linear -> GELU -> Linear, plus residual.
struct M5Impl : torch::nn::Module {
  M5Impl()
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({512})))),
        up(register_module("up", torch::nn::Linear(512, 2048))),
        down(register_module("down", torch::nn::Linear(2048, 512))) {}
  torch::Tensor forward(torch::Tensor x) { return x + down(torch::gelu(up(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(M5);

// M8: 50 chained tiny ops cycling x+0.5, x*0.9, relu, sin.
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
