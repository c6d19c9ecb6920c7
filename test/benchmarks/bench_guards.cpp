// Guard evaluation time per call (GuardSet::check, the hot path of every compiled call).
//
//   BM_GuardCheck/N            N input tensors of shape (8, 16), no module (a compiled
//                              function): arguments, per-tensor metadata, global state.
//   BM_GuardCheck4D/N          the same with 4-d inputs (1, 3, 32, 32).
//   BM_GuardCheckDynamic/N     BM_GuardCheck's inputs with size 0 a symbol shared by all of
//                              them (a dynamic entry: range and equality checks, contiguity
//                              instead of strides), called at another batch size.
//   BM_GuardCheckModule        one (8, 32) input and a module with 10 Linear submodules (20
//                              parameters): adds training flags, submodule identity and each
//                              parameter's identity, dtype, device, requires_grad and sizes.
//   BM_NamedParametersIterate  for comparison: what one named_parameters() walk of the same
//                              module costs (why check() reads the registries directly).
//   BM_FailureReason/4         building the reason string of a miss (cold path).
//
// Time is per check() (or per walk / per reason), in ns.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "runtime/dynamic_entry.h"
#include "runtime/guards.h"

#include <memory>
#include <string>
#include <vector>

namespace {

using torchcompile::runtime::CallArgs;
using torchcompile::runtime::DynamicPlan;
using torchcompile::runtime::GuardSet;

CallArgs make_args(int n, std::vector<int64_t> shape) {
  CallArgs args;
  for (int i = 0; i < n; ++i) args.add(torch::randn(shape));
  return args;
}

std::vector<std::string> names(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("x" + std::to_string(i));
  return out;
}

void run_checks(benchmark::State& state, const GuardSet& guards, const CallArgs& args) {
  if (!guards.check(args)) {
    state.SkipWithError(("guards fail: " + guards.failure_reason(args)).c_str());
    return;
  }
  for (auto _ : state) {
    bool ok = guards.check(args);
    benchmark::DoNotOptimize(ok);
  }
}

void BM_GuardCheck(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto traced = make_args(n, {8, 16});
  auto guards = GuardSet::build(traced, nullptr, names(n));
  auto call = make_args(n, {8, 16});  // new tensors, same metadata: a hit
  run_checks(state, *guards, call);
}
BENCHMARK(BM_GuardCheck)->Arg(1)->Arg(4)->Arg(16);

void BM_GuardCheckDynamic(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto guards = GuardSet::build(make_args(n, {8, 16}), nullptr, names(n));
  DynamicPlan plan;
  plan.input_names = names(n);
  torchcompile::runtime::SizeSymbol s0;
  s0.name = "s0", s0.traced = 8;
  plan.symbols.push_back(s0);
  for (int i = 0; i < n; ++i) plan.dims.push_back({static_cast<uint32_t>(i), 0, 0});
  guards->make_symbolic(plan);
  run_checks(state, *guards, make_args(n, {5, 16}));  // another batch size: a hit
}
BENCHMARK(BM_GuardCheckDynamic)->Arg(1)->Arg(4)->Arg(16);

void BM_GuardCheck4D(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto guards = GuardSet::build(make_args(n, {1, 3, 32, 32}), nullptr, names(n));
  run_checks(state, *guards, make_args(n, {1, 3, 32, 32}));
}
BENCHMARK(BM_GuardCheck4D)->Arg(4);

struct TenLayers : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;
  TenLayers() {
    for (int i = 0; i < 10; ++i) layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(32, 32)));
  }
};

void BM_GuardCheckModule(benchmark::State& state) {
  auto net = std::make_shared<TenLayers>();
  auto guards = GuardSet::build(make_args(1, {8, 32}), net, {"x"});
  if (guards->num_modules() != 11 || guards->num_attributes() != 20) {
    state.SkipWithError("unexpected module structure");
    return;
  }
  run_checks(state, *guards, make_args(1, {8, 32}));
}
BENCHMARK(BM_GuardCheckModule);

void BM_NamedParametersIterate(benchmark::State& state) {
  auto net = std::make_shared<TenLayers>();
  for (auto _ : state) {
    int64_t total = 0;
    for (const auto& p : net->named_parameters(/*recurse=*/true)) total += p.value().dim();
    benchmark::DoNotOptimize(total);
  }
}
BENCHMARK(BM_NamedParametersIterate);

void BM_FailureReason(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto guards = GuardSet::build(make_args(n, {8, 16}), nullptr, names(n));
  auto call = make_args(n, {8, 16});
  call.tensors.back() = torch::randn({9, 16});
  for (auto _ : state) {
    std::string reason = guards->failure_reason(call);
    benchmark::DoNotOptimize(reason);
  }
}
BENCHMARK(BM_FailureReason)->Arg(4);

}  // namespace

BENCHMARK_MAIN();
