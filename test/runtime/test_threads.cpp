// Many threads calling one compiled module: exactly one trace per entry, results equal eager.
// Also run under ThreadSanitizer by the `tsan` CTest label (test/tsan/).
#include "support/test_util.h"

#include <atomic>
#include <chrono>
#include <thread>

using tc_test::CompileCounter;

namespace {

struct Mlp : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  Mlp() {
    a = register_module("a", torch::nn::Linear(16, 32));
    b = register_module("b", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(a->forward(x));
    if (h.mean().item<double>() > 0.2) h = h * 0.5;  // a graph break on a data-dependent read
    return b->forward(h);
  }
};

int calls_per_thread() {
  // Fewer calls under ThreadSanitizer, which runs the test ~20x slower.
  const char* env = std::getenv("TORCHCOMPILE_STRESS_CALLS");
  return env ? std::atoi(env) : 1000;
}

void eight_threads_mixed_shapes(bool dynamic) {
  torch::NoGradGuard no_grad;
  auto model = std::make_shared<Mlp>();
  CompileCounter cc;
  auto fast = torch::compile(model, torchcompile::CompileOptions(cc.backend()).with_dynamic(dynamic));
  const std::vector<int64_t> batch_sizes{1, 2, 3, 5};
  std::vector<torch::Tensor> inputs, expected;
  torch::manual_seed(0);
  for (int i = 0; i < 16; ++i) {
    inputs.push_back(torch::randn({batch_sizes[i % 4], 16}) + (i % 2 ? 1.0 : -1.0));
    expected.push_back(model->forward(inputs.back()));
  }
  const int n = calls_per_thread();
  std::atomic<int> ready{0}, mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      torch::NoGradGuard thread_no_grad;  // grad mode is thread-local
      ++ready;
      while (ready.load() < 8) std::this_thread::yield();  // all first calls at once
      for (int i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(t * 7 + i) % inputs.size();
        if (!torch::allclose(expected[k], fast(inputs[k]), 1e-5, 1e-6)) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(fast.state().num_entries(), dynamic ? 2u : batch_sizes.size()) << "traced once per entry and size";
  size_t graphs = 0;
  for (const auto& e : fast.state().entries()) graphs += e->num_graphs();
  EXPECT_EQ(static_cast<size_t>(cc.frames()), graphs) << "no graph was compiled twice";
}

// Eight threads call at four batch sizes at once, with static entries (one per size) and with a
// dynamic one (the forward has a graph break, so each new size runs it again in that entry;
// size 1 has its own): every result as eager's, and no graph compiled twice.
TEST(Threads, EightThreadsMixedShapesMatchEagerAndTraceOncePerEntry) {
  for (bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "dynamic = true" : "dynamic = false");
    eight_threads_mixed_shapes(dynamic);
  }
}

TEST(Threads, CompiledModuleCalledInsideACompiledForwardIsInlined) {
  auto inner_fn = [](torch::Tensor a) { return a.sin() * 2; };
  CompileCounter inner_cc, outer_cc;
  auto inner = torch::compile(inner_fn, inner_cc.backend());
  auto outer = torch::compile([&inner](torch::Tensor a) { return inner(a + 1).cos(); }, outer_cc.backend());
  auto x = torch::randn({4});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(tc_test::tensors_close(((x + 1).sin() * 2).cos(), outer(x)));
  EXPECT_EQ(outer_cc.frames(), 1);
  EXPECT_EQ(inner_cc.frames(), 0) << "the inner forward is part of the outer graph";
  EXPECT_EQ(tc_test::count_calls(*outer.state().entries().front()->graph_module()->shared_graph()), 4u);
}

struct HookedMlp : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  HookedMlp() {
    a = register_module("a", torch::nn::Linear(16, 32));
    b = register_module("b", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return torchcompile::call(b, torch::relu(torchcompile::call(a, x))); }
};

// Hooks registered and removed by one thread while others call the compiled module: every
// result matches eager (the hook only counts), the entry is replaced as hooks change, and the
// hook fires on compiled calls while registered.
TEST(Threads, HooksChangingWhileThreadsCallTheCompiledModule) {
  torch::manual_seed(0);
  auto net = std::make_shared<HookedMlp>();
  auto fast = torch::compile(net, "eager");
  auto x = torch::randn({8, 16});
  torch::Tensor expected;
  {
    torch::NoGradGuard g;
    expected = net->forward(x);
  }
  std::atomic<int64_t> fired{0};
  std::atomic<bool> done{false}, mismatch{false};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      torch::NoGradGuard g;
      while (!done.load()) {
        if (!torch::allclose(expected, fast(x))) mismatch = true;
      }
    });
  }
  const int toggles = std::max(5, calls_per_thread() / 20);
  for (int i = 0; i < toggles; ++i) {
    auto h = torchcompile::register_forward_hook(
        net->b, [&](torch::nn::Module&, const torchcompile::Tensors&, const torchcompile::Tensors&) { ++fired; });
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    h.remove();
  }
  done = true;
  for (auto& th : callers) th.join();
  EXPECT_FALSE(mismatch.load());
  EXPECT_GT(fired.load(), 0);
  const int64_t after = fired.load();
  torch::NoGradGuard g;
  fast(x);
  EXPECT_EQ(fired.load(), after) << "a removed hook must not fire";
  EXPECT_LE(fast.state().num_entries(), 2u) << "stale entries are dropped";
}

}  // namespace
