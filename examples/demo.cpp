// The torch::compile demo: compile a small MLP (M1 of the model set), show its captured graph,
// check the compiled result against eager, and time eager vs compiled.
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
#include "models.h"

namespace {

using torchcompile_examples::Mlp;

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

  Mlp net;
  net->eval();
  torch::Tensor x = torch::randn({64, 784});

  // 1. The "debug" backend prints the captured graph, then runs it like "eager".
  std::cout << "== torch::compile(net, \"debug\"): the captured graph ==\n";
  auto debug_net = torch::compile(net, "debug");
  torch::Tensor y_debug = debug_net(x);

  // 2. The "eager" backend replays the captured graph with the interpreter.
  auto fast = torch::compile(net, "eager");
  torch::Tensor y_eager = net(x);
  torch::Tensor y_first = fast(x);   // traces: runs the forward under the tracer
  torch::Tensor y_fast = fast(x);    // cache hit: runs the compiled graph

  const bool ok = torch::allclose(y_first, y_eager) && torch::allclose(y_fast, y_eager) &&
                  torch::allclose(y_debug, y_eager);
  const double max_diff = (y_fast - y_eager).abs().max().item<double>();
  std::cout << "== check ==\n"
            << "output shape " << y_fast.sizes() << ", max |compiled - eager| = " << max_diff << " -> "
            << (ok ? "allclose: OK" : "MISMATCH") << "\n"
            << "compiled entries: " << fast.state().num_entries() << "\n";
  if (!ok) {
    std::cerr << "demo: the compiled result differs from eager\n";
    return 1;
  }

  // 3. Timing: after 20 warm-up calls of each, 200 eager and 200 compiled calls, interleaved
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

  std::cout << "== timing (M1 MLP, input (64, 784), 2 threads, medians of " << iters
            << " interleaved calls each) ==\n";
  std::printf("eager LibTorch          : %8.4f ms\n", eager_ms);
  std::printf("torch::compile \"eager\"  : %8.4f ms\n", compiled_ms);
  std::printf("compiled / eager        : %8.3f\n", compiled_ms / eager_ms);
  return 0;
}
