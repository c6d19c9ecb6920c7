// The torch::compile demo: compile a small model where both of `default`'s backends matter (two
// linear layers for oneDNN, a chain of pointwise operators for the fused backend), show its
// captured graph and who runs each part, check the compiled result against eager, and time eager
// vs compiled.
//
//     build/examples/demo            (scripts/demo.sh builds and runs it)
//
// Exits with status 1 if the compiled result differs from eager.
#include <torch/torch.h>
#include <torchcompile/torchcompile.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

namespace {

// A feed-forward block with a gated activation and a smooth output head: the linear layers (with
// the ReLU after the second) are oneDNN's, the pointwise work between and after them the fused
// backend's.
struct BlockImpl : torch::nn::Module {
  BlockImpl() : up(register_module("up", torch::nn::Linear(256, 1024))), down(register_module("down", torch::nn::Linear(1024, 256))) {}
  torch::Tensor forward(torch::Tensor x) {
    auto h = up(x);
    h = h * torch::sigmoid(h * 1.702) * torch::tanh(h * 0.5 + 0.1);  // gated activation
    auto y = torch::relu(down(h));
    return torch::sigmoid(y) * torch::gelu(y) + torch::tanh(y) * 0.25;  // output head
  }
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Wall time of one call of `f`, in milliseconds.
template <typename F>
double time_ms(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace

int main() {
  torch::manual_seed(0);
  torch::set_num_threads(2);
  torch::NoGradGuard no_grad;

  Block net;
  net->eval();
  torch::Tensor x = torch::randn({512, 256});

  // 1. The "debug" backend prints the captured graph, then runs it like "eager".
  std::cout << "== torch::compile(net, \"debug\"): the captured graph ==\n";
  auto debug_net = torch::compile(net, "debug");
  torch::Tensor y_debug = debug_net(x);

  // 2. What "default" makes of it: which backend runs each part of the graph.
  std::cout << "== torchcompile::explain(\"default\", net, x): who runs what ==\n";
  auto report = torchcompile::explain("default", net, x);
  for (const auto& graph : report.compiled) {
    std::cout << "graph compiled by " << graph.backend << "\n";
    for (const auto& part : graph.partition) std::cout << "  " << part << "\n";
  }

  // 3. The "default" backend: oneDNN for the linear layers, the fused backend for the rest.
  auto fast = torch::compile(net, "default");
  torch::Tensor y_eager = net(x);
  torch::Tensor y_first = fast(x);   // traces: runs the forward under the tracer
  torch::Tensor y_fast = fast(x);    // cache hit: runs the compiled graph

  // oneDNN's GEMMs sum in another order and the fused backend's math functions are its own
  // (a few ULP from ATen's): equal within float32 rounding, not bitwise.
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) { return torch::allclose(a, b, 1e-4, 1e-5); };
  const bool ok = close(y_first, y_eager) && close(y_fast, y_eager) && close(y_debug, y_eager);
  const double max_diff = (y_fast - y_eager).abs().max().item<double>();
  std::cout << "== check ==\n"
            << "output shape " << y_fast.sizes() << ", max |compiled - eager| = " << max_diff << " -> "
            << (ok ? "allclose: OK" : "MISMATCH") << "\n"
            << "compiled entries: " << fast.state().num_entries() << "\n";
  if (!ok) {
    std::cerr << "demo: the compiled result differs from eager\n";
    return 1;
  }

  // 4. Timing: after 20 warm-up calls of each, 200 eager and 200 compiled calls, interleaved
  // (alternating which goes first) so that both see the same load on a shared machine;
  // the medians are compared. On a heavily loaded machine the loop stops after ~5 s.
  const int warmup = 20, max_iters = 200;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (int i = 0; i < warmup; ++i) {
    net(x);
    fast(x);
  }
  std::vector<double> eager_t, compiled_t;
  for (int i = 0; i < max_iters && (i < 20 || std::chrono::steady_clock::now() < deadline); ++i) {
    if (i % 2 == 0) {
      eager_t.push_back(time_ms([&] { net(x); }));
      compiled_t.push_back(time_ms([&] { fast(x); }));
    } else {
      compiled_t.push_back(time_ms([&] { fast(x); }));
      eager_t.push_back(time_ms([&] { net(x); }));
    }
  }
  const double eager_ms = median(eager_t), compiled_ms = median(compiled_t);
  const size_t iters = eager_t.size();

  std::cout << "== timing (input (512, 256), " << torch::get_num_threads() << " threads, medians of " << iters
            << " interleaved calls each) ==\n";
  std::printf("eager LibTorch             : %8.4f ms\n", eager_ms);
  std::printf("torch::compile \"default\"   : %8.4f ms\n", compiled_ms);
  std::printf("speedup (eager / compiled) : %8.2fx\n", eager_ms / compiled_ms);
  return 0;
}
