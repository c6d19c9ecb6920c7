// Models of the seed documents the tests reproduce (PyTorch's own examples, in C++).
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

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

namespace tc_test {

// A GPT in the shape of nanoGPT (and its C++ ports): token and position embeddings
// (`arange(T)`), blocks of causal self-attention (the mask buffer sliced to `[:T, :T]`, heads
// split with `view({B, T, n_head, C / n_head})`) and an MLP, a final LayerNorm and a head.
// Its forward reads the sequence length T and the batch B in host code.
struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(int64_t n_embd, int64_t n_head, int64_t block_size) : n_head(n_head) {
    c_attn = register_module("c_attn", torch::nn::Linear(n_embd, 3 * n_embd));
    c_proj = register_module("c_proj", torch::nn::Linear(n_embd, n_embd));
    bias = register_buffer("bias", torch::ones({block_size, block_size}).tril().view({1, 1, block_size, block_size}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    auto qkv = c_attn(x).split(C, 2);
    auto q = qkv[0].view({B, T, n_head, C / n_head}).transpose(1, 2);
    auto k = qkv[1].view({B, T, n_head, C / n_head}).transpose(1, 2);
    auto v = qkv[2].view({B, T, n_head, C / n_head}).transpose(1, 2);
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(C / n_head)));
    att = att.masked_fill(bias.slice(2, 0, T).slice(3, 0, T) == 0, -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
    return c_proj(y);
  }
  int64_t n_head;
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::Tensor bias;
};
TORCH_MODULE(CausalSelfAttention);

struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t n_embd, int64_t n_head, int64_t block_size) {
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({n_embd})));
    attn = register_module("attn", CausalSelfAttention(n_embd, n_head, block_size));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({n_embd})));
    fc = register_module("fc", torch::nn::Linear(n_embd, 4 * n_embd));
    proj = register_module("proj", torch::nn::Linear(4 * n_embd, n_embd));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + proj(torch::gelu(fc(ln_2(x))));
  }
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(GptBlock);

struct TinyGptImpl : torch::nn::Module {
  TinyGptImpl(int64_t vocab = 96, int64_t block_size = 64, int64_t n_layer = 2, int64_t n_head = 4,
              int64_t n_embd = 64) {
    wte = register_module("wte", torch::nn::Embedding(vocab, n_embd));
    wpe = register_module("wpe", torch::nn::Embedding(block_size, n_embd));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < n_layer; ++i) blocks->push_back(GptBlock(n_embd, n_head, block_size));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({n_embd})));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(n_embd, vocab).bias(false)));
  }
  // Logits of every position: [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& idx) {
    const int64_t T = idx.size(1);
    auto pos = torch::arange(0, T, torch::dtype(torch::kLong));
    auto x = wte(idx) + wpe(pos);
    for (const auto& b : *blocks) x = b->as<GptBlock>()->forward(x);
    return lm_head(ln_f(x));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TinyGpt);

// Greedy generation as nanoGPT's `generate`: `steps` tokens, one at a time, each from the logits
// of the last position of the sequence so far.
template <typename Forward>
torch::Tensor generate(Forward&& forward, torch::Tensor idx, int steps) {
  for (int i = 0; i < steps; ++i) {
    auto logits = forward(idx);
    auto next = logits.select(1, logits.size(1) - 1).argmax(-1, /*keepdim=*/true);
    idx = torch::cat({idx, next}, 1);
  }
  return idx;
}

// An EmbeddingBag text classifier (as pytorch/examples' text classification): the mean of each
// bag's token embeddings, then a Linear. With `aten_op` the forward calls the ATen operator
// `torch::embedding_bag` with the module's weight instead of the module, which checks its offsets
// on the host (two data reads per call).
struct BagClassifierImpl : torch::nn::Module {
  explicit BagClassifierImpl(bool aten_op)
      : aten_op(aten_op),
        bag(register_module("bag", torch::nn::EmbeddingBag(torch::nn::EmbeddingBagOptions(1000, 32).mode(torch::kMean)))),
        fc(register_module("fc", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(torch::Tensor text, torch::Tensor offsets) {
    if (!aten_op) return fc(bag(text, offsets));
    return fc(std::get<0>(torch::embedding_bag(bag->weight, text, offsets, /*scale_grad_by_freq=*/false,
                                               /*mode=mean*/ 1)));
  }
  bool aten_op;
  torch::nn::EmbeddingBag bag;
  torch::nn::Linear fc;
};
TORCH_MODULE(BagClassifier);

// `n` serving requests of 1-64 bags of 1-30 tokens each: (tokens, offsets).
inline std::vector<std::pair<torch::Tensor, torch::Tensor>> bag_requests(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> requests;
  for (int i = 0; i < n; ++i) {
    const int bags = std::uniform_int_distribution<int>(1, 64)(rng);
    std::vector<int64_t> offsets;
    int64_t tokens = 0;
    for (int b = 0; b < bags; ++b) {
      offsets.push_back(tokens);
      tokens += std::uniform_int_distribution<int>(1, 30)(rng);
    }
    requests.emplace_back(torch::randint(0, 1000, {tokens}), torch::tensor(offsets));
  }
  return requests;
}

}  // namespace tc_test
