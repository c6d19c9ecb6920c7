// Data-parallel scaling: a training step (SGD with momentum) on one global batch, by one rank
// with one thread against two ranks with one thread each (each on half of the batch, gradients
// averaged by DistributedDataParallel over Gloo on loopback), uncompiled and compiled with
// `default`; plus the time each two-rank step waits for communication after its backward has
// computed its last gradient (counter comm_wait_us). Rows are interleaved with
// --benchmark_enable_random_interleaving; the summary after the table gives each model's
// speedup (1-rank time / 2-rank time) and scaling efficiency (speedup / 2). The row
// Allreduce/2ranks/M1-gradients times the all-reduce of M1's 2.7 MB of gradients alone: the
// communication floor of an M1 step.
//
// This process is rank 0; it starts rank 1 (itself, with RANK=1) and tells it, before every
// benchmark run, which step to run how many times. Both ranks build the same models in the same
// order and warm them up (compilation) before timing.
//
//   scripts/bench.sh-style environment: MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296
//   build/test/benchmarks/bench_ddp --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
#include "examples/models.h"
#include "test/benchmarks/bench_context.h"

#include <torchcompile/distributed/ddp.h>
#include <torchcompile/torchcompile.h>

#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>

namespace {

using Clock = std::chrono::steady_clock;

struct Setup {
  std::string model;    // "M1" or "M3"
  std::string backend;  // "eager" (uncompiled) or "default"
  bool distributed;     // two ranks (DDP, half batch each) or one rank (whole batch)
};

struct Trainer {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::unique_ptr<torchcompile::DistributedDataParallel> ddp;
  std::unique_ptr<torch::optim::SGD> opt;
  torch::Tensor first_weight;
  torch::Tensor x, y;
  double comm_wait_us = 0;  // of the last step

  void step() {
    opt->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(forward(x), y);
    Clock::time_point last_grad{};
    auto h = first_weight.register_hook([&](torch::Tensor g) {
      last_grad = Clock::now();
      return g;
    });
    loss.backward();
    const auto done = Clock::now();
    first_weight.remove_hook(h);
    comm_wait_us = std::chrono::duration<double, std::micro>(done - last_grad).count();
    opt->step();
  }
};

template <typename Holder>
void attach(Trainer& t, Holder net, const Setup& s, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  t.module = net.ptr();
  t.first_weight = t.module->parameters()[0];
  if (s.distributed) t.ddp = std::make_unique<torchcompile::DistributedDataParallel>(net, pg);
  if (s.backend == "eager") {
    t.forward = [net](const torch::Tensor& x) { return torchcompile::call(net, x); };
  } else {
    auto c = std::make_shared<decltype(torch::compile(net, s.backend))>(torch::compile(net, s.backend));
    t.forward = [c](const torch::Tensor& x) { return (*c)(x); };
  }
  t.opt = std::make_unique<torch::optim::SGD>(t.module->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
}

std::vector<Setup> setups() {
  std::vector<Setup> out;
  for (const char* m : {"M1", "M3"})
    for (const char* b : {"eager", "default"})
      for (bool d : {false, true}) out.push_back({m, b, d});
  return out;
}

// Every rank builds every two-rank trainer (collectively, in order); rank 0 also the one-rank ones.
std::vector<std::unique_ptr<Trainer>> build(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  const int rank = pg->getRank(), world = pg->getSize();
  std::vector<std::unique_ptr<Trainer>> out;
  for (const Setup& s : setups()) {
    if (!s.distributed && rank != 0) {
      out.emplace_back();
      continue;
    }
    auto t = std::make_unique<Trainer>();
    torch::manual_seed(0);
    if (s.model == "M1")
      attach(*t, torchcompile_examples::Mlp(), s, pg);
    else
      attach(*t, torchcompile_examples::ConvNet(), s, pg);
    torch::manual_seed(1);
    // The global batch: M1 (256, 784), M3 (16, 3, 64, 64); each rank of two takes its half.
    torch::Tensor x = s.model == "M1" ? torch::randn({256, 784}) : torch::randn({16, 3, 64, 64});
    torch::Tensor y = torch::randint(0, 10, {x.size(0)});
    if (s.distributed) {
      const int64_t half = x.size(0) / world;
      x = x.narrow(0, rank * half, half).contiguous();
      y = y.narrow(0, rank * half, half).contiguous();
    }
    t->x = x;
    t->y = y;
    for (int i = 0; i < 3; ++i) t->step();  // compile and warm up (two-rank ones in lockstep)
    out.push_back(std::move(t));
  }
  return out;
}

// Rank 0 -> rank 1: {trainer index, steps}; index -1 ends rank 1.
void command(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int64_t index, int64_t steps) {
  std::vector<at::Tensor> t{at::tensor({index, steps}, at::kLong)};
  pg->broadcast(t)->wait();
}

// The communication floor: one all-reduce of a buffer as large as M1's gradients (2.7 MB) over
// Gloo on loopback, as DDP's comm hook issues it.
constexpr int64_t kAllreduceRow = 1000;
int64_t m1_numel() {
  int64_t n = 0;
  torchcompile_examples::Mlp m;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}
void allreduce(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, at::Tensor& buffer) {
  std::vector<at::Tensor> t{buffer};
  pg->allreduce(t)->wait();
}

// Both ranks meet through a file store (no port to pick) and bind Gloo to loopback.
c10::intrusive_ptr<c10d::ProcessGroup> join() {
  return torchcompile::init_process_group(torchcompile::ProcessGroupOptions()
                                              .with_init_method(std::string("file://") + std::getenv("BENCH_DDP_STORE"))
                                              .with_hostname("127.0.0.1"));
}

int rank1_main() {
  at::set_num_threads(1);
  auto pg = join();
  auto trainers = build(pg);
  while (true) {
    std::vector<at::Tensor> t{at::empty({2}, at::kLong)};
    pg->broadcast(t)->wait();
    const int64_t index = t[0][0].item<int64_t>(), steps = t[0][1].item<int64_t>();
    if (index < 0) return 0;
    if (index == kAllreduceRow) {
      at::Tensor buffer = at::ones({m1_numel()});
      for (int64_t i = 0; i < steps; ++i) allreduce(pg, buffer);
      continue;
    }
    for (int64_t i = 0; i < steps; ++i) trainers[index]->step();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* r = std::getenv("RANK"); r && std::string(r) == "1") return rank1_main();
  const std::string store = "/tmp/bench_ddp_store_" + std::to_string(getpid());
  std::remove(store.c_str());
  setenv("BENCH_DDP_STORE", store.c_str(), 1);
  setenv("WORLD_SIZE", "2", 1);
  pid_t child = fork();
  if (child == 0) {
    setenv("RANK", "1", 1);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  setenv("RANK", "0", 1);
  benchmark::Initialize(&argc, argv);
  tc_bench::set_up_context();
  at::set_num_threads(1);
  benchmark::AddCustomContext("threads_per_rank", "1");
  auto pg = join();
  auto trainers = build(pg);
  const auto all = setups();
  for (size_t i = 0; i < all.size(); ++i) {
    const Setup s = all[i];
    const std::string name = "DDP-" + s.model + "/" + (s.distributed ? "2ranks" : "1rank") + "/" + s.backend;
    // Fixed iteration counts: rank 1 is told the count before the timed loop.
    const int64_t iters = s.model == "M1" ? 200 : 20;
    benchmark::RegisterBenchmark(name.c_str(), [&trainers, &pg, i, s, iters](benchmark::State& state) {
      Trainer& t = *trainers[i];
      if (s.distributed) command(pg, static_cast<int64_t>(i), iters);
      double wait = 0;
      for (auto _ : state) {
        t.step();
        wait += t.comm_wait_us;
      }
      if (s.distributed) state.counters["comm_wait_us"] = wait / static_cast<double>(iters);
    })->Iterations(iters)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  {
    const int64_t iters = 200;
    auto buffer = std::make_shared<at::Tensor>(at::ones({m1_numel()}));
    benchmark::RegisterBenchmark("Allreduce/2ranks/M1-gradients", [&pg, buffer, iters](benchmark::State& state) {
      command(pg, kAllreduceRow, iters);
      for (auto _ : state) allreduce(pg, *buffer);
      state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * buffer->numel() * 4);
    })->Iterations(iters)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  // The table, then each model's speedup and efficiency from the medians (or the single runs).
  struct Collect : benchmark::ConsoleReporter {
    std::map<std::string, std::vector<double>> times;
    void ReportRuns(const std::vector<Run>& runs) override {
      // Single runs, or (with --benchmark_display_aggregates_only) the medians of repetitions.
      for (const Run& r : runs)
        if (r.run_type == Run::RT_Iteration || r.aggregate_name == "median")
          times[r.run_name.function_name].push_back(r.GetAdjustedRealTime());
      ConsoleReporter::ReportRuns(runs);
    }
  } reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  command(pg, -1, 0);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::cout << "\nscaling on one global batch (median ms per step; 1 thread per rank):\n";
  for (const char* m : {"M1", "M3"})
    for (const char* b : {"eager", "default"}) {
      const std::string one = std::string("DDP-") + m + "/1rank/" + b, two = std::string("DDP-") + m + "/2ranks/" + b;
      if (!reporter.times.count(one) || !reporter.times.count(two)) continue;
      const double t1 = median(reporter.times[one]), t2 = median(reporter.times[two]);
      std::printf("  %s %-8s 1 rank %8.3f ms   2 ranks %8.3f ms   speedup %.2fx   efficiency %.0f%%\n", m, b, t1, t2,
                  t1 / t2, 100.0 * t1 / t2 / 2.0);
    }
  int st = 0;
  waitpid(child, &st, 0);
  std::remove(store.c_str());
  return 0;
}
