// AOT autograd: what the partitioners save, and what a compiled training step costs.
//
// First prints the partitioner report for a 6-layer MLP (Linear + GELU) and a
// TransformerEncoderLayer (M4's shape): for save-all and min-cut, the tensors saved for the
// backward, the bytes of those that are not inputs or parameters (activations), and the op
// counts of the forward and backward graphs.
//
// Then times one training step (forward, loss, backward; gradients reset each step) for each
// model, and for the benchmark models M1 and M5, in eager LibTorch and compiled with aot_autograd over the interpreter (the `aot_eager`
// backend, and the same with the min-cut partitioner): the cost of the AOT machinery before any
// fusing backend. The summary gives each median next to eager's median from the same run.
//
// Run with glibc malloc tuned (MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296)
// and --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true: the machine is
// shared and noisy, and interleaved repetitions spread load changes over all modes.
#include "bench_context.h"
#include "examples/models.h"

#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <torchcompile/torchcompile.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

namespace tc = torchcompile;
using Clock = std::chrono::steady_clock;

torch::nn::Sequential make_mlp6() {
  torch::nn::Sequential seq;
  for (int i = 0; i < 6; ++i) {
    seq->push_back(torch::nn::Linear(512, 512));
    if (i < 5) seq->push_back(torch::nn::GELU());
  }
  return seq;
}

torch::nn::TransformerEncoderLayer make_encoder() {
  return torch::nn::TransformerEncoderLayer(
      torch::nn::TransformerEncoderLayerOptions(256, 4).dim_feedforward(1024).dropout(0.0));
}

// M1: Linear(784,512)-ReLU-Linear(512,512)-ReLU-Linear(512,10).
torch::nn::Sequential make_m1() {
  return torch::nn::Sequential(torch::nn::Linear(784, 512), torch::nn::ReLU(), torch::nn::Linear(512, 512),
                               torch::nn::ReLU(), torch::nn::Linear(512, 10));
}

using torchcompile_examples::M5Impl;  // M5: LayerNorm -> Linear -> GELU -> Linear, plus residual

struct Model {
  std::string name;
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&)> forward;
  std::vector<int64_t> input;
  bool in_report = true;  ///< part of the partitioner report
};

torch::Tensor sequential_forward(torch::nn::Module& m, const torch::Tensor& x) {
  return dynamic_cast<torch::nn::SequentialImpl&>(m).forward(x);
}

const std::vector<Model>& models() {
  static const std::vector<Model> ms = {
      {"mlp6", [] { return make_mlp6().ptr(); }, sequential_forward, {64, 512}},
      {"encoder", [] { return make_encoder().ptr(); },
       [](torch::nn::Module& m, const torch::Tensor& x) {
         return dynamic_cast<torch::nn::TransformerEncoderLayerImpl&>(m).forward(x);
       },
       {128, 8, 256}},
      {"M1", [] { return make_m1().ptr(); }, sequential_forward, {64, 784}, false},
      {"M5", [] { return std::make_shared<M5Impl>(); },
       [](torch::nn::Module& m, const torch::Tensor& x) { return dynamic_cast<M5Impl&>(m).forward(x); },
       {32, 128, 512}, false},
  };
  return ms;
}

const char* partitioner_name(tc::Partitioner p) { return p == tc::Partitioner::SaveAll ? "save-all" : "min-cut"; }

void print_partition_report() {
  std::printf("Partitioner report (one training graph per model)\n");
  std::printf("%-9s %-9s %14s %12s %22s %10s %10s\n", "model", "partition", "saved_tensors", "of_which_in",
              "saved_activation_bytes", "fw_ops", "bw_ops");
  for (const Model& m : models()) {
    if (!m.in_report) continue;
    for (tc::Partitioner p : {tc::Partitioner::SaveAll, tc::Partitioner::MinCut}) {
      torch::manual_seed(0);
      auto module = m.make();
      tc::aot::PartitionReport report;
      auto probe = [&](tc::GraphModule& gm, const std::vector<at::Tensor>& xs) {
        report = tc::aot::trace_and_partition(gm, xs, {}, p).report;
        return tc::lookup_backend("eager")(gm, xs);
      };
      struct Call {
        const Model& m;
        std::shared_ptr<torch::nn::Module> module;
        torch::Tensor operator()(torch::Tensor x) const { return m.forward(*module, x); }
      };
      auto compiled = torch::compile(Call{m, module}, probe);
      compiled(torch::randn(m.input));
      std::printf("%-9s %-9s %14zu %12zu %22lld %10zu %10zu\n", m.name.c_str(), partitioner_name(p),
                  report.saved_values, report.saved_primals, static_cast<long long>(report.saved_activation_bytes),
                  report.forward_nodes, report.backward_nodes);
    }
  }
  std::printf("(of_which_in: saved tensors that are inputs or parameters, held anyway; activation bytes count\n"
              " only the others, views of inputs and parameters excluded)\n\n");
}

// Every timed step per benchmark, over all repetitions (interleaved by the --benchmark_enable_
// random_interleaving flag, so that load changes hit every mode alike).
std::map<std::string, std::vector<double>>& samples() {
  static std::map<std::string, std::vector<double>> m;
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One training step of model `index`: eager when backend is empty.
void training_step(benchmark::State& state, size_t index, std::string backend, tc::Partitioner p) {
  const Model& m = models()[index];
  torch::manual_seed(0);
  auto module = m.make();
  auto x = torch::randn(m.input);
  std::function<torch::Tensor(const torch::Tensor&)> fwd = [&](const torch::Tensor& in) { return m.forward(*module, in); };
  std::shared_ptr<void> keep;
  if (!backend.empty()) {
    struct Call {
      const Model* m;
      std::shared_ptr<torch::nn::Module> module;
      torch::Tensor operator()(torch::Tensor in) const { return m->forward(*module, in); }
    };
    tc::CompileOptions options = backend == "aot_eager" && p == tc::Partitioner::MinCut
                                     ? tc::CompileOptions(tc::aot_autograd(tc::lookup_backend("eager"), nullptr, {}, p))
                                     : tc::CompileOptions(backend);
    auto compiled = std::make_shared<decltype(torch::compile(Call{&m, module}, options))>(
        torch::compile(Call{&m, module}, options));
    keep = compiled;
    fwd = [compiled](const torch::Tensor& in) { return (*compiled)(in); };
  }
  auto step = [&] {
    for (auto& param : module->parameters()) param.mutable_grad() = torch::Tensor();
    fwd(x).pow(2).mean().backward();
  };
  for (int i = 0; i < 3; ++i) step();  // trace, compile, warm up
  std::vector<double>& times =
      samples()[m.name + "/" + (backend.empty() ? "eager" : backend + "/" + partitioner_name(p))];
  for (auto _ : state) {
    auto t0 = Clock::now();
    step();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(s);
    times.push_back(s * 1e3);
  }
}


}  // namespace

int main(int argc, char** argv) {
  tc_bench::set_up_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  print_partition_report();
  for (size_t i = 0; i < models().size(); ++i) {
    const std::string& name = models()[i].name;
    benchmark::RegisterBenchmark(("TrainStep/" + name + "/eager").c_str(), training_step, i, "", tc::Partitioner::SaveAll)
        ->UseManualTime()->Unit(benchmark::kMillisecond);
    for (tc::Partitioner p : {tc::Partitioner::SaveAll, tc::Partitioner::MinCut})
      benchmark::RegisterBenchmark(("TrainStep/" + name + "/aot_eager/" + partitioner_name(p)).c_str(), training_step, i,
                                   "aot_eager", p)
          ->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\nTraining step, median ms over all timed steps (same run; ratio = median / eager median)\n");
  for (const auto& [key, times] : samples()) {
    const std::string model = key.substr(0, key.find('/'));
    const double ms = median(times);
    auto eager = samples().find(model + "/eager");
    const double eager_ms = eager != samples().end() ? median(eager->second) : 0;
    std::printf("%-32s %10.3f %8.3f %8zu steps\n", key.c_str(), ms, eager_ms > 0 ? ms / eager_ms : 0.0, times.size());
  }
  return 0;
}
