// The model benchmark suite: models M1-M8 and four coverage rows (test/benchmarks/RESULTS.md; fp32, seed 0,
// 2 intra-op threads), each in every mode whose backend is registered, with medians, speedups
// over eager from the same run, first-call (trace + compile) times and the targets.
//
// Rows (one model each; all inputs fixed, drawn once after torch::manual_seed(0)):
//   M1        MLP Linear(784,512)-ReLU-Linear(512,512)-ReLU-Linear(512,10), input (64, 784)
//   M2        pointwise chain sigmoid(gelu(x*1.5+0.25))*x - tanh(x), input (4096, 1024)
//   M3        Conv2d(3,32,3,p1)-BN-ReLU-Conv2d(32,64,3,p1)-BN-ReLU-AdaptiveAvgPool(1)-Flatten-
//             Linear(64,10), eval(), input (16, 3, 64, 64)
//   M4        TransformerEncoderLayer(256, 4 heads, ff 1024, dropout 0), eval(), batch 8 x seq 128:
//             LibTorch's C++ layer has no batch_first, so the input is (128, 8, 256) (seq, batch,
//             feature), the same computation as Python's batch_first (8, 128, 256)
//   M5        x + Linear(2048,512)(GELU(Linear(512,2048)(LayerNorm(512)(x)))), input (32, 128, 512)
//   M6        training step of M1: forward, cross_entropy against fixed random targets, backward
//   M5-train  training step of M5: forward, sum() as the loss, backward
//   M3-train  training step of M3 in training mode (BatchNorm with batch statistics, updating its
//             running statistics): forward, sum() as the loss, backward
//   M6-SGD, M6-AdamW, M5-SGD, M5-AdamW
//             M6's and M5-train's steps followed by an optimizer step (SGD with momentum 0.9,
//             AdamW with weight decay 0.01): LibTorch's opt.step() under eager, a compiled
//             optimizer (torchcompile::compile_optimizer, one per mode) under the compiled modes.
//             The learning rate is 0, so every call computes the same loss and gradients; the
//             optimizers still do all their arithmetic (they do not test for a zero rate).
//   M4-train  training step of M4 in training mode (dropout 0): forward, the mean of the squared
//             outputs as the loss, backward (not sum(): the layer ends in a LayerNorm whose
//             outputs sum to zero per row, so that loss and every gradient but the final norm's
//             would be rounding noise, and comparing them with eager would be meaningless)
//   M7        seed 000's toy_example on two (10,) inputs; b is negated if needed so that
//             b.sum() < 0: every call takes the `b = b * -1` branch (a graph break whose
//             continuation is cached after the warm-up)
//   M8        50 chained tiny ops cycling x+0.5, x*0.9, relu, sin on (8, 8)
//   MLP1024-1T four Linear(1024,1024)-ReLU layers on (128, 1024) at one intra-op thread (set
//             around each call, the first included, and restored): a plain wide MLP in a program
//             that runs LibTorch single-threaded
//   DCGAN, MNIST, LSTM-LM, BiLSTM, BiGRU
//             layers real C++ programs use (see their definitions below): a DCGAN generator
//             (ConvTranspose2d), an MNIST CNN (max pooling, dropout), an LSTM language model and a
//             bidirectional LSTM and a batch-first bidirectional GRU classifier; eval()
//   TS-CNN, TS-Encoder, TS-LSTM, TS-Branch, TS-Method
//             TorchScript archives scripted and saved by Python's torch
//             (scripts/make_torchscript_models.py, made at build time), loaded with
//             torch::jit::load, eval(): a ResNet-style CNN on (8,3,64,64), a 2-layer transformer
//             encoder (128 features) with a key padding mask on tokens (8,64), an LSTM classifier
//             whose scripted forward loops over 32 time steps (batch 16), an MLP branching on its
//             data, a model calling a submodule's exported method. For these rows eager is the
//             module's own forward (TorchScript's interpreter), and the `torchscript` mode is the
//             archive frozen and optimized by TorchScript itself (torch::jit::freeze, then
//             torch::jit::optimize_for_inference), what a TorchScript user would deploy; the
//             other modes torch::compile the loaded module.
// Inference rows run under torch::NoGradGuard. A training step sets every gradient to none
// (PyTorch 2's zero_grad default), runs the compiled (or eager) forward including the loss, and
// calls backward() on the loss: for the compiled modes the loss is part of the compiled module.
//
// Modes (a cell each, named <row>/<mode>, e.g. M3/torchscript; --benchmark_filter selects cells):
//   eager          plain LibTorch
//   eager-backend  torch::compile(m, "eager"): the captured graph replayed by the interpreter
//   torchscript, onednn, fused, default
//                  torch::compile(m, "<name>")
//   aot_eager      training rows only: AOT autograd, forward and backward graphs interpreted
//   max-autotune   torch::compile(m, CompileOptions("default").with_mode("max-autotune")): each
//                  inference graph compiled with default, onednn, fused and the interpreter, timed
//                  on its inputs, the fastest kept (training rows compile as default)
//   default int8, default bf16
//                  inference rows only: `default` with Precision::Int8Dynamic / BFloat16
//                  (docs/precision.md), compared with eager's float32 result by relative error
//                  (bounds 2% / 1%), which the table shows beside the speedup; bf16 is n/a, with
//                  the reason, on a CPU without AVX512-BF16 or AMX
// A mode whose backend is not registered (torchcompile::has_backend) is skipped and shown as
// "n/a". Each compiled mode is checked against eager once (outputs, and the loss and gradients of
// a training step) before it is timed; a mismatch or an eager fallback is flagged in the tables.
//
// How a row is timed: one benchmark per row, <row>/rounds, times all its selected modes in
// rounds. A round calls each mode for a block of about 5 ms (at least one call; single calls
// timed with std::chrono, UseManualTime; a block of several calls starts with one untimed call,
// which finds the caches as the previous mode left them), the modes in an order that rotates and
// reverses from round to round, and keeps each block's median call. Per repetition, a mode's counters are
// "ms:<mode>" (the median of its blocks), "x:<mode>" (the median over the rounds of eager's block
// ÷ the mode's block in the same round: its speedup) and "rel:<mode>" (the median of the mode's
// block ÷ `default`'s block). The tables report, over the repetitions, the least of the "ms"
// figures (--statistic=min, the default) or their median (--statistic=median), and the median of
// the ratios with the least and the most repetition beside it. A repetition of a row runs for
// --benchmark_min_time times the number of its modes, so each mode gets the time the flag says.
// Why rounds: this kind of host has slow and fast phases lasting seconds to minutes (for minutes
// a sibling hyperthread of the host takes half of a vCPU's multiply-add throughput:
// test/benchmarks/RESULTS.md, "Notes on this run"). Timed in separate benchmarks, two modes
// running the same program differed by up to 20% (their repetitions fell in different phases);
// in one round every mode is timed within a fraction of a second, so a phase slows all the
// blocks of a round alike and a ratio of two blocks of one round is free of it. Why the least
// over repetitions for the times: interference only slows a repetition, so the least is the
// machine's own rate. Use --benchmark_repetitions=N and --benchmark_enable_random_interleaving=true
// (as scripts/bench-models.sh does) to spread a row's repetitions over the run.
// After the benchmarks, each compiled (row, mode) that ran is compiled afresh
// --first_call_reps=N times (default 3) and its first call timed: trace + backend compile + one
// run (one step for training rows), in a process that is already warm (one-time library
// initialization is not included).
//
// Flags besides Google Benchmark's:
//   --results_md=FILE    write the result tables (markdown) to FILE
//   --results_tsv=FILE   write the speedups (rows x compiled modes, "?" = missing) for plotting
//   --first_call_reps=N  fresh compiles timed per (row, mode); 0 skips the first-call table
//   --new_sizes=N        new sizes timed per dynamic mode on M1-M5 (default 5); 0 skips that table
//   --statistic=min|median  the figure over repetitions (default min; see above)
// The tables are also printed to stdout at the end.
//
// Run with glibc malloc tuned (scripts/bench-models.sh sets MALLOC_MMAP_THRESHOLD_ and
// MALLOC_TRIM_THRESHOLD_ as docs/testing.md ("Benchmarks") states).
#include "bench_context.h"

#include <benchmark/benchmark.h>
#include <c10/core/CPUAllocator.h>
#include "gemm_ceiling.h"

#include <torch/script.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <torchcompile/compat.h>
#include <torchcompile/torchcompile.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <sstream>
#include <string>
#include <vector>

#include "examples/models.h"

namespace {

using Clock = std::chrono::steady_clock;

// ---- models ----------------------------------------------------------------------------------

using torchcompile_examples::MlpImpl;

// M2: a pointwise chain.
torch::Tensor pointwise_chain(torch::Tensor x) {
  return torch::sigmoid(torch::gelu(x * 1.5 + 0.25)) * x - torch::tanh(x);
}

using torchcompile_examples::ConvNetImpl;  // M3

using torchcompile_examples::M4Impl;
using torchcompile_examples::M5Impl;

// Layers real C++ programs use (issue 16's coverage rows), eval(), fp32:
// DCGAN: a DCGAN generator, ConvTranspose2d-BN-ReLU x4 then ConvTranspose2d-Tanh, (16,100,1,1) ->
// (16,3,64,64).
struct DcganImpl : torch::nn::Module {
  torch::nn::Sequential net;
  DcganImpl() {
    auto up = [](int64_t in, int64_t out, int64_t stride, int64_t pad) {
      return torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(in, out, 4).stride(stride).padding(pad).bias(false));
    };
    net = register_module("net", torch::nn::Sequential(
        up(100, 256, 1, 0), torch::nn::BatchNorm2d(256), torch::nn::ReLU(),
        up(256, 128, 2, 1), torch::nn::BatchNorm2d(128), torch::nn::ReLU(),
        up(128, 64, 2, 1), torch::nn::BatchNorm2d(64), torch::nn::ReLU(),
        up(64, 32, 2, 1), torch::nn::BatchNorm2d(32), torch::nn::ReLU(),
        up(32, 3, 2, 1), torch::nn::Tanh()));
  }
  torch::Tensor forward(torch::Tensor z) { return net->forward(z); }
};

// MNIST: Conv2d(1,32,3)-ReLU-MaxPool2-Conv2d(32,64,3)-ReLU-MaxPool2-Dropout-Linear(1600,128)-ReLU-
// Linear(128,10), (64,1,28,28).
struct MnistImpl : torch::nn::Module {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::Linear f1{nullptr}, f2{nullptr};
  MnistImpl() {
    c1 = register_module("c1", torch::nn::Conv2d(1, 32, 3));
    c2 = register_module("c2", torch::nn::Conv2d(32, 64, 3));
    drop = register_module("drop", torch::nn::Dropout(0.25));
    f1 = register_module("f1", torch::nn::Linear(1600, 128));
    f2 = register_module("f2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(c1(x)), 2);
    x = torch::max_pool2d(torch::relu(c2(x)), 2);
    return f2(torch::relu(f1(drop(x.flatten(1)))));
  }
};

// LSTM-LM: Embedding(10000,128)-LSTM(128,256,2 layers)-Linear(256,10000) on tokens (32 steps, 16).
// BiLSTM: Embedding(10000,128)-bidirectional LSTM(128,256,2 layers)-Linear(512,2) on the last step.
// BiGRU: the same classifier with a batch-first bidirectional GRU on tokens (16, 32 steps).
struct LstmImpl : torch::nn::Module {
  torch::nn::Embedding embed{nullptr};
  torch::nn::LSTM lstm{nullptr};
  torch::nn::GRU gru{nullptr};
  torch::nn::Linear head{nullptr};
  bool classifier;
  explicit LstmImpl(bool bidirectional, bool use_gru = false) : classifier(bidirectional) {
    embed = register_module("embed", torch::nn::Embedding(10000, 128));
    if (use_gru)
      gru = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(128, 256).num_layers(2).bidirectional(true).batch_first(true)));
    else
      lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(128, 256).num_layers(2).bidirectional(bidirectional)));
    head = register_module("head", torch::nn::Linear(bidirectional ? 512 : 256, bidirectional ? 2 : 10000));
  }
  torch::Tensor forward(torch::Tensor tokens) {
    if (gru) return head(std::get<0>(gru->forward(embed(tokens))).select(1, -1));
    torch::Tensor h = std::get<0>(lstm->forward(embed(tokens)));
    return head(classifier ? h[-1] : h);
  }
};

// MLP1024-1T: Linear(1024,1024)-ReLU four times.
struct WideMlpImpl : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;
  WideMlpImpl() {
    for (int i = 0; i < 4; ++i) layers.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(1024, 1024)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l(x));
    return x;
  }
};

// Training steps: the model and its loss as one module, so a compiled mode captures both.
template <typename M>
struct CrossEntropyStep : torch::nn::Module {
  explicit CrossEntropyStep(std::shared_ptr<M> m) : model(register_module("model", std::move(m))) {}
  torch::Tensor forward(torch::Tensor x, torch::Tensor target) {
    return torch::nn::functional::cross_entropy(model->forward(x), target);
  }
  std::shared_ptr<M> model;
};

// A training step's loss over a model's output, for models whose output is not a class score.
using Loss = torch::Tensor (*)(const torch::Tensor&);
torch::Tensor sum_loss(const torch::Tensor& y) { return y.sum(); }
torch::Tensor mean_square_loss(const torch::Tensor& y) { return y.pow(2).mean(); }

template <typename M>
struct LossStep : torch::nn::Module {
  LossStep(std::shared_ptr<M> m, Loss l) : model(register_module("model", std::move(m))), loss(l) {}
  torch::Tensor forward(torch::Tensor x) { return loss(model->forward(x)); }
  std::shared_ptr<M> model;
  Loss loss;
};

// M7: seed 000's toy_example.
torch::Tensor toy_example(torch::Tensor a, torch::Tensor b) {
  auto x = a / (torch::abs(a) + 1);
  if (b.sum().item<float>() < 0) b = b * -1;
  return x * b;
}

using torchcompile_examples::chain50;  // M8

// ---- rows and modes --------------------------------------------------------------------------

/// What a compiled object reports after its calls: graphs, breaks, eager fallback.
struct CompileInfo {
  size_t entries = 0, graphs = 0, breaks = 0;
  std::string eager_reason;  ///< non-empty if an entry runs the C++ forward eagerly
};

/// A way to run a row: one call (inference) or one step (training; returns the loss).
struct Runner {
  std::function<torch::Tensor()> call;
  std::function<CompileInfo()> info;  ///< empty for eager
  /// Inference rows: a call with the first input's dimension 0 of size `n` (its rows repeated or
  /// cut), the input made now so that calls of the result time only the call.
  std::function<std::function<torch::Tensor()>(int64_t n)> at_rows;
};

/// `x` with `n` rows along dimension 0 (its rows repeated, then cut), contiguous.
torch::Tensor with_rows(const torch::Tensor& x, int64_t n) {
  std::vector<int64_t> reps(x.dim(), 1);
  reps[0] = (n + x.size(0) - 1) / x.size(0);
  return x.repeat(reps).narrow(0, 0, n).contiguous();
}

/// `inputs` with the first one at `n` rows (with_rows).
template <typename First, typename... Rest>
std::tuple<First, Rest...> inputs_with_rows(int64_t n, const First& first, const Rest&... rest) {
  return std::tuple<First, Rest...>(with_rows(first, n), rest...);
}

/// Runner::at_rows of a callable `f` taking `inputs`.
template <typename F, typename... In>
std::function<std::function<torch::Tensor()>(int64_t)> at_rows_of(F f, In... inputs) {
  return [f, inputs...](int64_t n) -> std::function<torch::Tensor()> {
    auto args = inputs_with_rows(n, inputs...);
    return [f, args]() mutable { return std::apply([&](auto&... a) { return f(a...); }, args); };
  };
}

/// A row's model and inputs, built once (seed 0) and shared by all its modes.
struct Instance {
  bool training = false;
  std::vector<torch::Tensor> params;  ///< training rows: gradients reset and checked
  int64_t traced_rows = 0;             ///< size of the first input's dimension 0
  Runner eager;
  /// A fresh torch::compile of the model with `backend` (nothing is called yet).
  std::function<Runner(const torchcompile::CompileOptions& options)> compile;
};

template <typename C>
std::function<CompileInfo()> info_of(C compiled) {
  return [compiled]() {
    CompileInfo info;
    for (const auto& e : compiled.state().entries()) {
      ++info.entries;
      if (e->runs_eagerly()) {
        info.eager_reason = e->eager_reason().empty() ? "runs eagerly" : e->eager_reason();
      } else {
        info.graphs += e->num_graphs();
        info.breaks += e->num_breaks();
      }
    }
    return info;
  };
}

/// Called between a training step's forward and its backward while memory is measured.
std::function<void()> g_after_forward;

/// `fwd` wrapped as a training step: gradients set to none, forward + loss, backward.
std::function<torch::Tensor()> as_step(std::vector<torch::Tensor> params, std::function<torch::Tensor()> fwd) {
  return [params = std::move(params), fwd = std::move(fwd)]() {
    for (auto p : params) p.mutable_grad() = torch::Tensor();
    torch::Tensor loss = fwd();
    if (g_after_forward) g_after_forward();
    loss.backward();
    return loss.detach();
  };
}

/// A row whose model is the module `m` called with `inputs`.
template <typename M, typename... In>
Instance module_instance(std::shared_ptr<M> m, bool training, In... inputs) {
  Instance inst;
  inst.training = training;
  std::function<torch::Tensor()> eager = [m, inputs...]() { return m->forward(inputs...); };
  if (training) {
    inst.params = m->parameters();
    eager = as_step(inst.params, eager);
  }
  inst.eager.call = eager;
  inst.traced_rows = std::get<0>(std::forward_as_tuple(inputs...)).size(0);
  if (!training) inst.eager.at_rows = at_rows_of([m](auto&... a) { return m->forward(a...); }, inputs...);
  inst.compile = [m, training, params = inst.params, inputs...](const torchcompile::CompileOptions& options) {
    auto c = torch::compile(m, options);
    std::function<torch::Tensor()> call = [c, inputs...]() mutable { return c(inputs...); };
    if (training) return Runner{as_step(params, call), info_of(c), {}};
    return Runner{call, info_of(c), at_rows_of([c](auto&... a) mutable { return c(a...); }, inputs...)};
  };
  return inst;
}

using MakeOptimizer = std::function<std::shared_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>&)>;

/// A training row of `m` called with `inputs` whose step ends with an optimizer step:
/// `make_optimizer`'s opt.step() under eager, a compiled optimizer of a fresh one per compiled mode.
template <typename M, typename... In>
Instance optimizer_instance(std::shared_ptr<M> m, MakeOptimizer make_optimizer, In... inputs) {
  Instance inst = module_instance(m, true, inputs...);
  auto opt = make_optimizer(inst.params);
  inst.eager.call = [step = inst.eager.call, opt]() {
    torch::Tensor loss = step();
    opt->step();
    return loss;
  };
  inst.compile = [compile = inst.compile, make_optimizer, params = inst.params](
                     const torchcompile::CompileOptions& options) {
    Runner r = compile(options);
    auto o = make_optimizer(params);
    auto compiled = std::make_shared<torchcompile::CompiledOptimizer>(*o);
    r.call = [step = r.call, o, compiled]() {
      torch::Tensor loss = step();
      compiled->step();
      return loss;
    };
    return r;
  };
  return inst;
}

std::shared_ptr<torch::optim::Optimizer> sgd_momentum(const std::vector<torch::Tensor>& params) {
  return std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.0).momentum(0.9));
}
std::shared_ptr<torch::optim::Optimizer> adamw(const std::vector<torch::Tensor>& params) {
  return std::make_shared<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.0).weight_decay(0.01));
}

/// An inference row whose model is the function `fn` called with `inputs`.
template <typename F, typename... In>
Instance function_instance(F fn, In... inputs) {
  Instance inst;
  inst.eager.call = [fn, inputs...]() { return fn(inputs...); };
  inst.traced_rows = std::get<0>(std::forward_as_tuple(inputs...)).size(0);
  inst.eager.at_rows = at_rows_of([fn](auto&... a) { return fn(a...); }, inputs...);
  inst.compile = [fn, inputs...](const torchcompile::CompileOptions& options) {
    auto c = torch::compile(fn, options);
    return Runner{[c, inputs...]() mutable { return c(inputs...); }, info_of(c),
                  at_rows_of([c](auto&... a) mutable { return c(a...); }, inputs...)};
  };
  return inst;
}

/// A row whose model is a TorchScript archive (scripts/make_torchscript_models.py) called with
/// `inputs`; its first result tensor (a tuple's first element) is the row's output.
Instance script_instance(const std::string& archive, std::vector<c10::IValue> inputs) {
  torch::jit::Module m = torch::jit::load(std::string(TORCHCOMPILE_TORCHSCRIPT_MODELS) + "/" + archive + ".pt");
  m.eval();
  auto first = [](const c10::IValue& v) { return v.isTuple() ? v.toTupleRef().elements()[0].toTensor() : v.toTensor(); };
  Instance inst;
  inst.eager.call = [m, inputs, first]() mutable { return first(m.forward(inputs)); };
  inst.traced_rows = inputs[0].toTensor().size(0);
  inst.compile = [m, inputs, first](const torchcompile::CompileOptions& options) {
    if (options.backend == "torchscript") {
      torch::jit::Module frozen = torch::jit::freeze(m.clone());
      frozen = torch::jit::optimize_for_inference(frozen);
      return Runner{[frozen, inputs, first]() mutable { return first(frozen.forward(inputs)); },
                    [] { return CompileInfo{1, 1, 0, ""}; }, {}};
    }
    auto c = torch::compile(m, options);
    return Runner{[c, inputs, first]() { return first(c.forward(inputs)); }, info_of(c), {}};
  };
  return inst;
}

/// `f` at one intra-op thread: the count set before the call and restored after it.
std::function<torch::Tensor()> at_one_thread(std::function<torch::Tensor()> f) {
  return [f]() {
    const int before = torch::get_num_threads();
    torch::set_num_threads(1);
    struct Restore {
      int n;
      ~Restore() { torch::set_num_threads(n); }
    } restore{before};
    return f();
  };
}

/// A row whose every call (eager, and each compiled mode's, the first call's trace and compile
/// included) runs at one intra-op thread.
Instance one_thread(Instance inst) {
  inst.eager.call = at_one_thread(inst.eager.call);
  inst.eager.at_rows = {};
  inst.compile = [compile = inst.compile](const torchcompile::CompileOptions& options) {
    Runner r = compile(options);
    r.call = at_one_thread(r.call);
    r.at_rows = {};
    return r;
  };
  return inst;
}

struct Row {
  std::string id;     ///< benchmark name prefix and table key
  std::string label;  ///< table label
  bool training;
  std::function<Instance()> make;
};

const std::vector<Row>& rows() {
  static const std::vector<Row> rs = {
      {"M1", "M1 MLP (64,784)", false,
       [] {
         auto m = std::make_shared<MlpImpl>();
         return module_instance(m, false, torch::randn({64, 784}));
       }},
      {"M2", "M2 pointwise (4096,1024)", false, [] { return function_instance(&pointwise_chain, torch::randn({4096, 1024})); }},
      {"M3", "M3 conv-BN-ReLU (16,3,64,64)", false,
       [] {
         auto m = std::make_shared<ConvNetImpl>();
         m->eval();
         return module_instance(m, false, torch::randn({16, 3, 64, 64}));
       }},
      {"M4", "M4 encoder layer (8,128,256)", false,
       [] {
         auto m = std::make_shared<M4Impl>();
         m->eval();
         return module_instance(m, false, torch::randn({128, 8, 256}));
       }},
      {"M5", "M5 LN-MLP-residual (32,128,512)", false,
       [] {
         auto m = std::make_shared<M5Impl>();
         return module_instance(m, false, torch::randn({32, 128, 512}));
       }},
      {"M6", "M6 M1 train step, CE (64,784)", true,
       [] {
         auto m = std::make_shared<CrossEntropyStep<MlpImpl>>(std::make_shared<MlpImpl>());
         auto x = torch::randn({64, 784});
         auto target = torch::randint(0, 10, {64}, torch::kLong);
         return module_instance(m, true, x, target);
       }},
      {"M5-train", "M5 train step, sum (32,128,512)", true,
       [] {
         auto m = std::make_shared<LossStep<M5Impl>>(std::make_shared<M5Impl>(), sum_loss);
         return module_instance(m, true, torch::randn({32, 128, 512}));
       }},
      {"M6-SGD", "M6 + SGD momentum step (64,784)", true,
       [] {
         auto m = std::make_shared<CrossEntropyStep<MlpImpl>>(std::make_shared<MlpImpl>());
         auto x = torch::randn({64, 784});
         auto target = torch::randint(0, 10, {64}, torch::kLong);
         return optimizer_instance(m, &sgd_momentum, x, target);
       }},
      {"M6-AdamW", "M6 + AdamW step (64,784)", true,
       [] {
         auto m = std::make_shared<CrossEntropyStep<MlpImpl>>(std::make_shared<MlpImpl>());
         auto x = torch::randn({64, 784});
         auto target = torch::randint(0, 10, {64}, torch::kLong);
         return optimizer_instance(m, &adamw, x, target);
       }},
      {"M5-SGD", "M5-train + SGD momentum step (32,128,512)", true,
       [] {
         auto m = std::make_shared<LossStep<M5Impl>>(std::make_shared<M5Impl>(), sum_loss);
         return optimizer_instance(m, &sgd_momentum, torch::randn({32, 128, 512}));
       }},
      {"M5-AdamW", "M5-train + AdamW step (32,128,512)", true,
       [] {
         auto m = std::make_shared<LossStep<M5Impl>>(std::make_shared<M5Impl>(), sum_loss);
         return optimizer_instance(m, &adamw, torch::randn({32, 128, 512}));
       }},
      {"M3-train", "M3 train step, sum (16,3,64,64)", true,
       [] {
         auto m = std::make_shared<LossStep<ConvNetImpl>>(std::make_shared<ConvNetImpl>(), sum_loss);
         return module_instance(m, true, torch::randn({16, 3, 64, 64}));
       }},
      {"M4-train", "M4 train step, mean square (8,128,256)", true,
       [] {
         auto m = std::make_shared<LossStep<M4Impl>>(std::make_shared<M4Impl>(), mean_square_loss);
         return module_instance(m, true, torch::randn({128, 8, 256}));
       }},
      {"M7", "M7 toy_example 2x(10,)", false,
       [] {
         auto a = torch::randn({10});
         auto b = torch::randn({10});
         if (b.sum().item<float>() >= 0) b = -b;  // the branch is always taken
         return function_instance(&toy_example, a, b);
       }},
      {"M8", "M8 50 tiny ops (8,8)", false, [] { return function_instance(&chain50, torch::randn({8, 8})); }},
      {"MLP1024-1T", "MLP 4x1024, 1 thread (128,1024)", false,
       [] {
         auto m = std::make_shared<WideMlpImpl>();
         return one_thread(module_instance(m, false, torch::randn({128, 1024})));
       }},
      {"DCGAN", "DCGAN generator (16,100)->64x64", false,
       [] {
         auto m = std::make_shared<DcganImpl>();
         m->eval();
         return module_instance(m, false, torch::randn({16, 100, 1, 1}));
       }},
      {"MNIST", "MNIST CNN (64,1,28,28)", false,
       [] {
         auto m = std::make_shared<MnistImpl>();
         m->eval();
         return module_instance(m, false, torch::randn({64, 1, 28, 28}));
       }},
      {"LSTM-LM", "LSTM LM 2x256 (32,16)", false,
       [] {
         auto m = std::make_shared<LstmImpl>(false);
         m->eval();
         return module_instance(m, false, torch::randint(0, 10000, {32, 16}, torch::kLong));
       }},
      {"BiLSTM", "BiLSTM classifier 2x256 (32,16)", false,
       [] {
         auto m = std::make_shared<LstmImpl>(true);
         m->eval();
         return module_instance(m, false, torch::randint(0, 10000, {32, 16}, torch::kLong));
       }},
      {"BiGRU", "BiGRU classifier 2x256 (16,32)", false,
       [] {
         auto m = std::make_shared<LstmImpl>(true, true);
         m->eval();
         return module_instance(m, false, torch::randint(0, 10000, {16, 32}, torch::kLong));
       }},
      {"TS-CNN", "TorchScript ResNet-style CNN (8,3,64,64)", false,
       [] { return script_instance("cnn", {torch::randn({8, 3, 64, 64})}); }},
      {"TS-Encoder", "TorchScript encoder, padding mask (8,64)", false,
       [] {
         auto lengths = torch::randint(16, 65, {8, 1});
         return script_instance("encoder", {torch::randint(0, 1000, {8, 64}), torch::arange(64).unsqueeze(0).ge(lengths)});
       }},
      {"TS-LSTM", "TorchScript LSTM loop (32,16,32)", false,
       [] { return script_instance("lstm", {torch::randn({32, 16, 32})}); }},
      {"TS-Branch", "TorchScript MLP, branch on data (8,16)", false,
       [] { return script_instance("branchy_mlp", {torch::randn({8, 16})}); }},
      {"TS-Method", "TorchScript submodule method (8,16)", false,
       [] { return script_instance("submethod", {torch::randn({8, 16})}); }},
  };
  return rs;
}

struct Mode {
  std::string name;
  std::string backend;  ///< empty for eager
  bool training_only;
  bool dynamic = false;  ///< CompileOptions::dynamic = true (else false: static)
  /// Inference rows only; compared with eager's float32 result by relative error (its bound:
  /// `max_rel_error`), which the table shows beside the speedup.
  torchcompile::Precision precision = torchcompile::Precision::Float32;
  double max_rel_error = 0;
  std::string compile_mode = "default";  ///< CompileOptions::mode

  torchcompile::CompileOptions options() const {
    return torchcompile::CompileOptions(backend).with_dynamic(dynamic).with_precision(precision).with_mode(compile_mode);
  }
};

const std::vector<Mode>& modes() {
  static const std::vector<Mode> ms = {
      {"eager", "", false},           {"eager-backend", "eager", false}, {"torchscript", "torchscript", false},
      {"onednn", "onednn", false},    {"fused", "fused", false},         {"default", "default", false},
      {"aot_eager", "aot_eager", true},
      // Dynamic shapes, called at the traced size: what a dynamic entry costs per call.
      {"eager-backend dyn", "eager", false, true}, {"default dyn", "default", false, true},
      // Reduced precision (docs/precision.md), inference rows.
      {"default int8", "default", false, false, torchcompile::Precision::Int8Dynamic, 0.02},
      {"default bf16", "default", false, false, torchcompile::Precision::BFloat16, 0.01},
      // CompileOptions::mode "max-autotune": each inference graph timed with default, onednn,
      // fused and the interpreter at compile time, the fastest kept (training rows: as default).
      {"max-autotune", "default", false, false, torchcompile::Precision::Float32, 0, "max-autotune"},
  };
  return ms;
}

bool applies(const Row& r, const Mode& m) {
  return (!m.training_only || r.training) && (m.precision == torchcompile::Precision::Float32 || !r.training);
}
bool available(const Mode& m) {
  if (!torchcompile::precision_unavailable(m.precision).empty()) return false;
  return m.backend.empty() || torchcompile::has_backend(m.backend);
}

size_t row_index(const std::string& id) {
  for (size_t r = 0; r < rows().size(); ++r)
    if (rows()[r].id == id) return r;
  return rows().size();
}

size_t mode_index(const std::string& name) {
  for (size_t m = 0; m < modes().size(); ++m)
    if (modes()[m].name == name) return m;
  return modes().size();
}

// Targets and measured anchors (median ms: eager LibTorch, TorchScript, Inductor; 2026-11-22, 2 cores of an AMD EPYC).
struct Target {
  std::string id;
  double eager_ms, torchscript_ms, target_ms;  // torchscript_ms < 0: no anchor
  std::string note;
};

const std::vector<Target>& targets() {
  static const std::vector<Target> ts = {
      {"M1", 0.609, 0.634, 0.48, "linear+relu fused, prepacked"},
      {"M2", 9.68, 9.03, 2.0, "one fused vectorized loop"},
      {"M3", 10.9, 7.40, 5.5, "conv+BN folded+ReLU, blocked layout kept"},
      {"M4", 12.8, 12.2, 9.5, ""},
      {"M5", 92.8, 92.7, 75, "~230 GFLOP/s on the two GEMMs"},
      {"M6", 1.81, -1, 1.3, ""},
      {"M7", 0.0069, 0.0097, 0.0075, "a graph break costs almost nothing"},
      {"M8", 0.0696, 0.0729, 0.005, "one fused kernel, sub-us dispatch"},
  };
  return ts;
}
constexpr double kFirstCallTargetMs = 1000;  // M1-M5 with the oneDNN backend

// ---- prepared cases --------------------------------------------------------------------------

struct Prepared {
  Runner runner;
  std::string error;     ///< set if compiling or the first call threw: the mode is not timed
  std::string mismatch;  ///< set if the result differs from eager
  double rel_error = -1;  ///< reduced precision: ||y - eager|| / ||eager|| of the second call
  CompileInfo info;
};

Instance& instance(size_t row) {
  static std::map<size_t, std::unique_ptr<Instance>> cache;
  auto& slot = cache[row];
  if (!slot) {
    torch::manual_seed(0);
    slot = std::make_unique<Instance>(rows()[row].make());
  }
  return *slot;
}

// Elementwise (rtol 1e-3, atol 1e-4), or within 1e-5 of eager's norm: a gradient summed over
// thousands of rows has elements that cancel to near zero, where two float32 programs summing in
// different orders differ beyond any elementwise tolerance (measured on M5-train: an element of
// 0.126 off by 3e-4 in a tensor whose largest is 2003; both results were equally far from the
// float64 gradient). The norm bound still catches a wrong element: one element of 2048 wrong by
// 0.1% moves the norm by ~2e-5.
std::string compare(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  if (got.sizes() != want.sizes()) return what + ": shape differs";
  if (torch::allclose(got, want, /*rtol=*/1e-3, /*atol=*/1e-4)) return "";
  const torch::Tensor d = got - want;
  const double diff = d.abs().max().item<double>();
  const double rel = d.norm().item<double>() / want.norm().item<double>();
  if (rel <= 1e-5) return "";
  return what + ": max abs difference " + std::to_string(diff) + ", relative difference in norm " + std::to_string(rel);
}

std::vector<torch::Tensor> grads_of(const Instance& inst) {
  std::vector<torch::Tensor> g;
  for (const auto& p : inst.params) g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return g;
}

// Compile the mode, call it twice (trace, then a cache hit) and check both against eager.
Prepared prepare(size_t row, const Mode& mode) {
  Instance& inst = instance(row);
  Prepared p;
  c10::optional<torch::NoGradGuard> no_grad;
  if (!inst.training) no_grad.emplace();
  try {
    torch::Tensor want = inst.eager.call();
    std::vector<torch::Tensor> want_grads = grads_of(inst);
    if (mode.backend.empty()) {
      p.runner = inst.eager;
      return p;
    }
    p.runner = inst.compile(mode.options());
    for (const char* which : {"first call", "second call"}) {
      torch::Tensor got = p.runner.call();
      if (mode.precision != torchcompile::Precision::Float32) {
        p.rel_error = got.sizes() == want.sizes() ? (got - want).norm().item<double>() / want.norm().item<double>() : 1e9;
        if (p.mismatch.empty() && !(p.rel_error <= mode.max_rel_error))
          p.mismatch = std::string(which) + ": relative error " + std::to_string(p.rel_error) + " above " +
                       std::to_string(mode.max_rel_error);
        continue;
      }
      std::string m = compare(got, want, std::string(which) + (inst.training ? " loss" : " output"));
      std::vector<torch::Tensor> got_grads = grads_of(inst);
      for (size_t i = 0; m.empty() && i < got_grads.size(); ++i) {
        if (got_grads[i].defined() != want_grads[i].defined()) {
          m = std::string(which) + ": gradient " + std::to_string(i) + " missing";
        } else if (got_grads[i].defined()) {
          m = compare(got_grads[i], want_grads[i], std::string(which) + " gradient " + std::to_string(i));
        }
      }
      if (p.mismatch.empty()) p.mismatch = m;
    }
    p.info = p.runner.info();
  } catch (const std::exception& e) {
    std::string what = e.what();
    p.error = what.substr(0, what.find('\n'));
  }
  return p;
}

Prepared& prepared(size_t row, size_t mode) {
  static std::map<std::pair<size_t, size_t>, std::unique_ptr<Prepared>> cache;
  auto& slot = cache[{row, mode}];
  if (!slot) slot = std::make_unique<Prepared>(prepare(row, modes()[mode]));
  return *slot;
}

// ---- measurement -----------------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double time_call_s(const std::function<torch::Tensor()>& f) {
  const auto t0 = Clock::now();
  torch::Tensor y = f();
  benchmark::DoNotOptimize(y);
  const auto t1 = Clock::now();  // before y is freed, as in bench_overhead
  return std::chrono::duration<double>(t1 - t0).count();
}

/// The (row, mode) cells --benchmark_filter selected (select_cell), each compiled and checked.
std::set<std::pair<size_t, size_t>>& executed() {
  static std::set<std::pair<size_t, size_t>> s;
  return s;
}

// The body of the benchmark <row>/<mode> of the selection pass: Google Benchmark's own filter
// decides which cells are timed; each selected one is compiled and checked here, before any
// timing.
void select_cell(benchmark::State& state, size_t row, size_t mode) {
  executed().insert({row, mode});
  prepared(row, mode);
  for (auto _ : state) {
  }
}

/// A reporter that shows nothing (the selection pass).
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// The benchmark <row>/rounds: the row's modes `ms` (mode indices, each compiled without error)
// called in rounds, a block of `calls` of each mode per round (see the header comment). The
// order rotates by one mode every round and reverses every other sweep, so that no mode always
// follows the same one.
void run_rounds(benchmark::State& state, size_t row, std::vector<size_t> ms) {
  c10::optional<torch::NoGradGuard> no_grad;
  if (!instance(row).training) no_grad.emplace();
  const size_t n = ms.size();
  // Calls per block, from the first warm-up of the row: about 5 ms (1 to 1000 calls).
  static std::map<size_t, std::vector<int>> calls_of_row;
  std::vector<int>& calls = calls_of_row[row];
  if (calls.empty()) {
    for (size_t m : ms) {
      const auto& call = prepared(row, m).runner.call;
      std::vector<double> t;
      const auto start = Clock::now();
      do t.push_back(time_call_s(call));
      while (t.size() < 20 && Clock::now() - start < std::chrono::milliseconds(20));
      calls.push_back(static_cast<int>(std::clamp(std::ceil(5e-3 / median(t)), 1.0, 1000.0)));
    }
  }
  static size_t round = 0;
  std::vector<std::vector<double>> blocks(n);  // per mode: each round's block median, s
  std::vector<double> block;
  std::vector<size_t> order(n);
  for (auto _ : state) {
    const size_t k = round++;
    for (size_t i = 0; i < n; ++i) order[i] = (k + i) % n;
    if ((k / n) % 2) std::reverse(order.begin(), order.end());
    double total = 0;
    for (size_t i : order) {
      const auto& call = prepared(row, ms[i]).runner.call;
      // A block of calls shorter than the block starts with one more, untimed: it finds the
      // caches as the previous mode left them (M2's 16 MiB input, read from memory instead of
      // the cache), which a program calling this mode in a loop does not see.
      if (calls[i] > 1) benchmark::DoNotOptimize(call());
      block.resize(static_cast<size_t>(calls[i]));
      for (double& t : block) total += t = time_call_s(call);
      blocks[i].push_back(median(block));
    }
    state.SetIterationTime(total);
  }
  auto position = [&](const char* name) {
    const size_t m = mode_index(name);
    return static_cast<size_t>(std::find(ms.begin(), ms.end(), m) - ms.begin());
  };
  // The median over the rounds of blocks[i] ÷ blocks[j].
  auto ratio = [&](size_t i, size_t j) {
    std::vector<double> v(blocks[i].size());
    for (size_t r = 0; r < v.size(); ++r) v[r] = blocks[i][r] / blocks[j][r];
    return median(v);
  };
  const size_t eager = position("eager"), def = position("default");
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = modes()[ms[i]].name;
    state.counters["ms:" + name] = median(blocks[i]) * 1e3;
    if (eager < n && i != eager) state.counters["x:" + name] = ratio(eager, i);
    if (def < n && i != def && i != eager) state.counters["rel:" + name] = ratio(i, def);
  }
}

// M2's floor: one pass that reads 16 MiB and writes 16 MiB (`copy_` of M2's input into a
// preallocated tensor), the least any M2 mode could take.
void run_m2_floor(benchmark::State& state) {
  torch::Tensor x = torch::randn({4096, 1024}), out = torch::empty_like(x);
  std::vector<double> times;
  for (auto _ : state) {
    const double t = time_call_s([&] { return out.copy_(x); });
    state.SetIterationTime(t);
    times.push_back(t);
  }
  state.counters["median_ms"] = median(times) * 1e3;
}
const char* const kM2Floor = "M2-floor/copy";

/// A ratio over a benchmark's repetitions: their median, the least and the most.
struct Spread {
  double median = NAN, low = NAN, high = NAN;
};

/// The figure reported over a benchmark's repetitions (--statistic).
enum class Statistic { Min, Median };
Statistic g_statistic = Statistic::Min;
const char* statistic_name() { return g_statistic == Statistic::Min ? "min" : "median"; }

/// Collects the counters of every repetition while printing as the console reporter. With
/// --benchmark_display_aggregates_only the repetitions are not shown to it: then it keeps the
/// "median", "min" and "max" aggregates (over repetitions) of each counter instead.
class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      for (const auto& [counter, value] : r.counters) {
        const Key key{r.run_name.function_name, counter};
        if (r.run_type == Run::RT_Iteration) {
          repetitions_[key].push_back(value.value);
        } else {
          aggregates_[{key, r.aggregate_name}] = value.value;
        }
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

  /// A time: the least (--statistic=min) or the median of a counter over the benchmark's
  /// repetitions; NaN if none was reported.
  double figure_of(const std::string& name, const std::string& counter, size_t* repetitions) const {
    auto it = repetitions_.find({name, counter});
    if (it != repetitions_.end()) {
      *repetitions = it->second.size();
      return g_statistic == Statistic::Min ? tc_bench::least(it->second) : median(it->second);
    }
    *repetitions = 0;  // unknown
    return aggregate(name, counter, statistic_name());
  }
  double figure_of(const std::string& name, size_t* repetitions) const {
    return figure_of(name, "median_ms", repetitions);
  }

  /// A ratio: the median of a counter over the repetitions, and the least and the most.
  Spread spread_of(const std::string& name, const std::string& counter) const {
    auto it = repetitions_.find({name, counter});
    if (it != repetitions_.end() && !it->second.empty()) {
      return {median(it->second), *std::min_element(it->second.begin(), it->second.end()),
              *std::max_element(it->second.begin(), it->second.end())};
    }
    return {aggregate(name, counter, "median"), aggregate(name, counter, "min"), aggregate(name, counter, "max")};
  }

 private:
  using Key = std::pair<std::string, std::string>;  ///< (benchmark, counter)
  double aggregate(const std::string& name, const std::string& counter, const std::string& which) const {
    auto it = aggregates_.find({{name, counter}, which});
    return it == aggregates_.end() ? NAN : it->second;
  }
  std::map<Key, std::vector<double>> repetitions_;       ///< one value per repetition
  std::map<std::pair<Key, std::string>, double> aggregates_;  ///< by aggregate name
};

// ---- results ---------------------------------------------------------------------------------

struct Cell {
  double median_ms = NAN;
  size_t repetitions = 0;
  Spread speedup;  ///< eager's block ÷ this mode's block in the same round (run_rounds)
  Spread rel;      ///< this mode's block ÷ `default`'s in the same round
  double first_call_ms = NAN;
  CompileInfo first_info;
  // Training rows: bytes held between the forward and the backward (what the step saved for
  // the backward, plus the loss) and the peak during the step, both above what was live before
  // it (with the gradients of the previous step released); -1 if not measured.
  int64_t held_bytes = -1, peak_bytes = -1;
};

/// A dynamic entry's first call at new sizes against its warm calls there (measure_new_sizes).
struct NewSize {
  size_t row = 0, mode = 0;
  std::string sizes;        ///< the sizes of dimension 0 called, "65..69"
  double first_ms = NAN;    ///< median over the sizes of the first call at each
  double warm_ms = NAN;     ///< median over the sizes of a warm call at each
  double ratio = NAN;       ///< median over the sizes of first / warm
  double eager_ms = NAN;    ///< median over the sizes of eager's call at each
};

struct Results {
  double m2_floor_ms = NAN;  // M2's floor (run_m2_floor), if run
  std::map<std::pair<size_t, size_t>, Cell> cells;
  std::vector<std::string> notes;
  int first_call_reps = 0;
  int new_sizes = 0;
  std::vector<NewSize> new_size_rows;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// A time in ms with 3 significant digits at least (0.00693, 0.612, 9.68, 92.8 -> 92.80).
std::string ms(double v) {
  if (std::isnan(v)) return "?";
  if (v < 0.01) return fmt("%.5f", v);
  if (v < 0.1) return fmt("%.4f", v);
  if (v < 10) return fmt("%.3f", v);
  return fmt("%.2f", v);
}

std::string speed(double x) { return std::isnan(x) ? "?" : fmt("%.2f", x) + "x"; }

bool is_compiled(const Mode& m) { return !m.backend.empty(); }

double eager_ms(const Results& res, size_t row) {
  auto it = res.cells.find({row, 0});
  return it == res.cells.end() ? NAN : it->second.median_ms;
}

// A note number for (row, mode) flags; notes are listed under the tables.
std::string add_note(Results& res, const std::string& text) {
  res.notes.push_back(text);
  return "[" + std::to_string(res.notes.size()) + "]";
}

std::string main_table(Results& res) {
  std::ostringstream os;
  os << "| model |";
  for (const Mode& m : modes()) os << " " << m.name << " |";
  os << "\n|---|";
  for (size_t i = 0; i < modes().size(); ++i) os << "---:|";
  os << "\n";
  for (size_t r = 0; r < rows().size(); ++r) {
    const Row& row = rows()[r];
    os << "| " << row.label << " |";
    for (size_t m = 0; m < modes().size(); ++m) {
      const Mode& mode = modes()[m];
      std::string cell;
      auto it = res.cells.find({r, m});
      if (!applies(row, mode)) {
        cell = "–";
      } else if (!available(mode)) {
        cell = "n/a";
      } else if (it == res.cells.end()) {
        cell = "not run";
      } else {
        Prepared& p = prepared(r, m);
        if (!p.error.empty()) {
          cell = "error " + add_note(res, row.id + "/" + mode.name + ": " + p.error);
        } else {
          cell = ms(it->second.median_ms);
          if (is_compiled(mode)) cell += " (" + speed(it->second.speedup.median) + ")";
          if (p.rel_error >= 0) {
            char err[32];
            std::snprintf(err, sizeof err, " err %.2g%%", 100 * p.rel_error);
            cell += err;
          }
          if (!p.mismatch.empty()) cell += " ≠" + add_note(res, row.id + "/" + mode.name + " differs from eager: " + p.mismatch);
          if (!p.info.eager_reason.empty())
            cell += " †" + add_note(res, row.id + "/" + mode.name + " fell back to eager: " + p.info.eager_reason);
        }
      }
      os << " " << cell << " |";
    }
    os << "\n";
  }
  return os.str();
}

/// Training rows: MiB held after the forward / peak MiB of one step, per mode, with the ratio of
/// the peak to eager's.
std::string memory_table(const Results& res) {
  std::ostringstream os;
  os << "| model |";
  for (const Mode& m : modes()) os << " " << m.name << " |";
  os << "\n|---|";
  for (size_t m = 0; m < modes().size(); ++m) os << "---:|";
  os << "\n";
  auto mib = [](int64_t b) { return fmt("%.2f", b / 1048576.0); };
  for (size_t r = 0; r < rows().size(); ++r) {
    if (!rows()[r].training) continue;
    auto eager = res.cells.find({r, 0});
    const int64_t eager_peak = eager == res.cells.end() ? -1 : eager->second.peak_bytes;
    os << "| " << rows()[r].label << " |";
    for (size_t m = 0; m < modes().size(); ++m) {
      auto it = res.cells.find({r, m});
      std::string cell = "–";
      if (it != res.cells.end() && it->second.peak_bytes >= 0) {
        const Cell& c = it->second;
        cell = mib(c.held_bytes) + " / " + mib(c.peak_bytes);
        if (m != 0 && eager_peak > 0) cell += " (" + fmt("%.2f", static_cast<double>(c.peak_bytes) / eager_peak) + "x)";
      } else if (it != res.cells.end()) {
        cell = "?";
      }
      os << " " << cell << " |";
    }
    os << "\n";
  }
  return os.str();
}

std::string first_call_table(const Results& res) {
  std::ostringstream os;
  os << "| model | eager per call |";
  for (const Mode& m : modes())
    if (is_compiled(m)) os << " " << m.name << " |";
  os << "\n|---|---:|";
  for (const Mode& m : modes())
    if (is_compiled(m)) os << "---:|";
  os << "\n";
  for (size_t r = 0; r < rows().size(); ++r) {
    os << "| " << rows()[r].label << " | " << ms(eager_ms(res, r)) << " |";
    for (size_t m = 0; m < modes().size(); ++m) {
      const Mode& mode = modes()[m];
      if (!is_compiled(mode)) continue;
      auto it = res.cells.find({r, m});
      std::string cell;
      if (!applies(rows()[r], mode)) {
        cell = "–";
      } else if (!available(mode)) {
        cell = "n/a";
      } else if (it == res.cells.end()) {
        cell = "not run";
      } else if (!prepared(r, m).error.empty()) {
        cell = "error";
      } else if (std::isnan(it->second.first_call_ms)) {
        cell = "failed";
      } else {
        const Cell& c = it->second;
        cell = ms(c.first_call_ms);
        if (!c.first_info.eager_reason.empty()) {
          cell += " (eager fallback)";
        } else if (c.first_info.graphs != 1 || c.first_info.breaks != 0) {
          cell += " (" + std::to_string(c.first_info.graphs) + " graphs, " + std::to_string(c.first_info.breaks) +
                  " break" + (c.first_info.breaks == 1 ? "" : "s") + ")";
        }
      }
      os << " " << cell << " |";
    }
    os << "\n";
  }
  return os.str();
}

/// The cell (r, m) if it was timed (selected, and compiled without error), else nullptr.
const Cell* timed_cell(const Results& res, size_t r, size_t m) {
  auto it = res.cells.find({r, m});
  return it == res.cells.end() || !prepared(r, m).error.empty() ? nullptr : &it->second;
}

double cell_ms(const Results& res, size_t r, size_t m) {
  const Cell* c = timed_cell(res, r, m);
  return c ? c->median_ms : NAN;
}

/// The speedup of (r, m) over eager, timed in the same rounds; NaN if not timed.
double cell_speedup(const Results& res, size_t r, size_t m) {
  const Cell* c = timed_cell(res, r, m);
  return c ? c->speedup.median : NAN;
}

/// The time of (r, m) relative to `default`'s, timed in the same rounds; NaNs if not timed.
Spread cell_rel(const Results& res, size_t r, size_t m) {
  const Cell* c = timed_cell(res, r, m);
  return c ? c->rel : Spread{};
}

/// "1.023 (1.011 – 1.040)": a ratio over the repetitions with the least and the most, or "?".
std::string spread_text(const Spread& s) {
  if (std::isnan(s.median)) return "?";
  return fmt("%.3f", s.median) + " (" + fmt("%.3f", s.low) + " – " + fmt("%.3f", s.high) + ")";
}

/// 1 ÷ a spread (its least and most swapped).
Spread inverse(const Spread& s) { return {1 / s.median, 1 / s.high, 1 / s.low}; }

std::string targets_table(const Results& res) {
  std::ostringstream os;
  os << "| id | anchor eager | anchor TorchScript | target | target speedup | eager (this run) | default (this run) "
        "| default speedup | best compiled mode | met (ms) | met (speedup) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n";
  const size_t def = mode_index("default");
  auto verdict = [](double v, bool ok) { return std::isnan(v) ? "?" : ok ? "met" : "missed"; };
  for (const Target& t : targets()) {
    const size_t r = row_index(t.id);
    const double need = t.eager_ms / t.target_ms;
    const double e = eager_ms(res, r);
    const double d = cell_ms(res, r, def), dx = cell_speedup(res, r, def);
    std::string best = "?";
    double best_x = NAN;
    for (size_t m = 0; m < modes().size(); ++m) {
      const double x = is_compiled(modes()[m]) ? cell_speedup(res, r, m) : NAN;
      if (!std::isnan(x) && (std::isnan(best_x) || x > best_x)) {
        best_x = x;
        best = modes()[m].name + " " + ms(cell_ms(res, r, m)) + " (" + speed(x) + ")";
      }
    }
    os << "| " << t.id << " | " << ms(t.eager_ms) << " | " << (t.torchscript_ms < 0 ? "–" : ms(t.torchscript_ms))
       << " | ≤ " << ms(t.target_ms) << (t.note.empty() ? "" : " (" + t.note + ")") << " | ≥ " << speed(need) << " | "
       << ms(e) << " | " << ms(d) << " | " << speed(dx) << " | " << best << " | " << verdict(d, d <= t.target_ms)
       << " | " << verdict(dx, dx >= need) << " |\n";
  }
  auto first_call = [&](size_t r, size_t m) {
    auto it = res.cells.find({r, m});
    return it == res.cells.end() ? NAN : it->second.first_call_ms;
  };
  // First-call target: under 1 s for M1-M5 with the oneDNN backend.
  const size_t onednn = mode_index("onednn");
  os << "\nFirst call (trace + compile + one run) with the `onednn` backend, target < 1 s for M1–M5:\n\n"
        "| id | onednn first call | met |\n|---|---:|---|\n";
  for (const char* id : {"M1", "M2", "M3", "M4", "M5"}) {
    const double v = first_call(row_index(id), onednn);
    if (!available(modes()[onednn])) {
      os << "| " << id << " | n/a (backend not registered) | ? |\n";
    } else {
      os << "| " << id << " | " << ms(v) << " | " << verdict(v, v < kFirstCallTargetMs) << " |\n";
    }
  }
  // The first-call budget of `default`: twice an eager call plus 5 ms, for M1-M5.
  const size_t eager = mode_index("eager");
  os << "\nFirst call (trace + compile + one run) with `default` against its budget, 2 × an eager call + 5 ms, "
        "for M1–M5:\n\n| id | eager call | budget | default first call | met |\n|---|---:|---:|---:|---|\n";
  for (const char* id : {"M1", "M2", "M3", "M4", "M5"}) {
    const size_t r = row_index(id);
    const double e = cell_ms(res, r, eager), v = first_call(r, def), budget = 2 * e + 5;
    os << "| " << id << " | " << ms(e) << " | " << ms(budget) << " | " << ms(v) << " | "
       << verdict(std::isnan(budget) ? NAN : v, v <= budget) << " |\n";
  }
  return os.str();
}

std::string speedup_tsv(const Results& res) {
  // Only compiled modes with at least one figure, so that the chart has no empty series.
  std::vector<size_t> cols;
  for (size_t m = 0; m < modes().size(); ++m) {
    if (!is_compiled(modes()[m])) continue;
    for (size_t r = 0; r < rows().size(); ++r)
      if (!std::isnan(cell_speedup(res, r, m))) {
        cols.push_back(m);
        break;
      }
  }
  std::ostringstream os;
  os << "model";
  for (size_t m : cols) os << "\t" << modes()[m].name;
  os << "\n";
  for (size_t r = 0; r < rows().size(); ++r) {
    os << rows()[r].id;
    for (size_t m : cols) {
      const double v = cell_speedup(res, r, m);
      os << "\t" << (std::isnan(v) ? std::string("?") : fmt("%.4f", v));
    }
    os << "\n";
  }
  return os.str();
}

std::string backends_list() {
  std::string s;
  for (const auto& b : torchcompile::list_backends({})) s += (s.empty() ? "" : ", ") + b;
  return s;
}

// The single built-in backends: `default`'s parts and the interpreter.
const char* const kSingleBackends[] = {"eager-backend", "torchscript", "onednn", "fused"};

// `default` against the single built-in backend that beat it by most (the least time relative to
// `default`'s in the same rounds; a mode whose result differs from eager does not count).
std::string fastest_single_table(const Results& res) {
  std::ostringstream os;
  const size_t def = mode_index("default");
  for (size_t r = 0; r < rows().size(); ++r) {
    if (std::isnan(cell_ms(res, r, def))) continue;
    size_t best = modes().size();
    for (const char* name : kSingleBackends) {
      const size_t m = mode_index(name);
      const double v = cell_rel(res, r, m).median;
      if (std::isnan(v) || !prepared(r, m).mismatch.empty()) continue;
      if (best == modes().size() || v < cell_rel(res, r, best).median) best = m;
    }
    if (best == modes().size()) continue;
    const Spread ratio = inverse(cell_rel(res, r, best));
    os << "| " << rows()[r].id << " | " << modes()[best].name << " (" << speed(cell_speedup(res, r, best)) << ") | "
       << speed(cell_speedup(res, r, def)) << " | " << spread_text(ratio) << " | "
       << (ratio.median <= 1.05 ? "yes" : "**no**") << " |\n";
  }
  if (os.str().empty()) return "";
  return "| row | fastest single built-in (speedup) | default (speedup) | default ÷ it, same rounds (least – most) | "
         "within 5% |\n|---|---|---|---:|---|\n" +
         os.str();
}

// Dynamic vs static entries of the same backend, same run. A dimension host code reads stays
// static (M4's attention reads its sizes), and a training step records autograd: then both are
// the same static entry.
std::string dynamic_table(const Results& res) {
  std::ostringstream os;
  os << "| id | eager-backend static | dyn | dyn ÷ static | default static | dyn | dyn ÷ static (least – most) |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n";
  for (size_t r = 0; r < rows().size(); ++r) {
    const size_t eb = mode_index("eager-backend"), eb_dyn = mode_index("eager-backend dyn");
    const size_t def = mode_index("default"), def_dyn = mode_index("default dyn");
    const double eb_ratio = cell_speedup(res, r, eb) / cell_speedup(res, r, eb_dyn);
    os << "| " << rows()[r].id << " | " << ms(cell_ms(res, r, eb)) << " | " << ms(cell_ms(res, r, eb_dyn)) << " | "
       << (std::isnan(eb_ratio) ? "?" : fmt("%.3f", eb_ratio)) << " | " << ms(cell_ms(res, r, def)) << " | "
       << ms(cell_ms(res, r, def_dyn)) << " | " << spread_text(cell_rel(res, r, def_dyn)) << " |\n";
  }
  return os.str();
}

// For M1-M5 under each dynamic mode that ran: a fresh compile called at the traced size, then at
// `res.new_sizes` sizes of dimension 0 it has not seen (traced + 1, + 2, ...): the first call at
// each (what a new size costs: no backend compile for a symbolic graph, compile_per_shape's
// specialization for backends that compile per size) against the median of 3 warm calls at it.
void measure_new_sizes(Results& res) {
  for (const char* id : {"M1", "M2", "M3", "M4", "M5"}) {
    const size_t r = row_index(id);
    for (size_t m = 0; m < modes().size(); ++m) {
      const Mode& mode = modes()[m];
      if (!mode.dynamic || !executed().count({r, m}) || !prepared(r, m).error.empty()) continue;
      Instance& inst = instance(r);
      torch::NoGradGuard no_grad;
      NewSize row;
      row.row = r;
      row.mode = m;
      std::vector<double> firsts, warms, ratios, eagers;
      try {
        Runner fresh = inst.compile(mode.options());
        fresh.call();
        fresh.call();
        const int64_t traced = inst.traced_rows;
        for (int k = 1; k <= res.new_sizes; ++k) {
          const int64_t n = traced + k;
          auto call = fresh.at_rows(n);
          auto eager = inst.eager.at_rows(n);
          const double first = time_call_s(call) * 1e3;
          std::vector<double> w, e;
          for (int i = 0; i < 3; ++i) {
            w.push_back(time_call_s(call) * 1e3);
            e.push_back(time_call_s(eager) * 1e3);
          }
          firsts.push_back(first);
          warms.push_back(median(w));
          eagers.push_back(median(e));
          ratios.push_back(first / warms.back());
        }
        row.sizes = std::to_string(traced + 1) + ".." + std::to_string(traced + res.new_sizes);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_models: new sizes of %s/%s threw: %s\n", id, mode.name.c_str(), e.what());
        continue;
      }
      row.first_ms = median(firsts);
      row.warm_ms = median(warms);
      row.ratio = median(ratios);
      row.eager_ms = median(eagers);
      std::printf("new sizes %-4s %-18s first %10s ms, warm %10s ms, first/warm %s\n", id, mode.name.c_str(),
                  ms(row.first_ms).c_str(), ms(row.warm_ms).c_str(), speed(row.ratio).c_str());
      res.new_size_rows.push_back(row);
    }
  }
}

std::string new_size_table(const Results& res) {
  std::ostringstream os;
  os << "| row | mode | sizes of dim 0 | first call ms | warm call ms | first / warm | eager ms |\n"
        "|---|---|---|---:|---:|---:|---:|\n";
  for (const NewSize& n : res.new_size_rows)
    os << "| " << rows()[n.row].id << " | " << modes()[n.mode].name << " | " << n.sizes << " | " << ms(n.first_ms)
       << " | " << ms(n.warm_ms) << " | " << speed(n.ratio) << " | " << ms(n.eager_ms) << " |\n";
  return os.str();
}

std::string report(Results& res) {
  res.notes.clear();
  std::ostringstream os;
  os << "## Median ms per call (speedup over eager timed in the same rounds)\n\n";
  os << "All the modes of a row are timed together, in rounds: each round calls every mode for a block of about 5 ms "
        "(the order rotating), so that a phase of the host slows all the blocks of a round alike. Each figure: the "
        "median block of a repetition, "
     << (g_statistic == Statistic::Min ? "the least" : "the median") << " over the repetitions (`--statistic="
     << statistic_name() << "`"
     << (g_statistic == Statistic::Min
             ? ": interference on a shared host only slows a repetition, so the least is the machine's own rate for every mode"
             : "")
     << "). The speedup: eager's block ÷ the mode's block of the same round, the median over the rounds of a "
        "repetition, then over the repetitions.\n\n";
  os << main_table(res);
  os << "\nn/a: backend not registered in this build";
  for (const Mode& m : modes())
    if (m.precision != torchcompile::Precision::Float32 && !torchcompile::precision_unavailable(m.precision).empty())
      os << ", or (" << m.name << ") " << torchcompile::precision_unavailable(m.precision);
  os << "; –: mode not applicable (aot_eager: training rows only; int8 and bf16: inference rows only). "
        "≠: result differs from eager beyond rtol 1e-3, atol 1e-4 elementwise and beyond 1e-5 in norm (‖y − eager‖ / ‖eager‖); †: the runtime fell back to eager; error: "
        "compiling or the first call threw (numbers in brackets refer to the notes below).\n";
  if (!res.notes.empty()) {
    os << "\n";
    for (size_t i = 0; i < res.notes.size(); ++i) os << "[" << i + 1 << "] " << res.notes[i] << "\n";
  }
  // M2 against its floor, M8 in microseconds, for the fused backend and `default`.
  {
    const size_t m2 = row_index("M2"), m8 = row_index("M8");
    os << "\nM2 floor (one pass reading 16 MiB and writing 16 MiB, `copy_`): " << ms(res.m2_floor_ms) << " ms";
    for (const char* mode : {"fused", "default"}) {
      const double v = cell_ms(res, m2, mode_index(mode));
      if (!std::isnan(v) && !std::isnan(res.m2_floor_ms))
        os << "; M2 `" << mode << "` " << ms(v) << " ms = " << speed(v / res.m2_floor_ms) << " the floor";
    }
    os << ".\nM8 per call: eager " << ms(eager_ms(res, m8) * 1e3) << " µs";
    for (const char* mode : {"fused", "default"}) os << ", `" << mode << "` " << ms(cell_ms(res, m8, mode_index(mode)) * 1e3) << " µs";
    os << ".\n";
  }
  {
    const std::string table = fastest_single_table(res);
    if (!table.empty()) {
      os << "\n## `default` against the fastest single built-in backend\n\n"
            "For each row, the single built-in backend (";
      for (size_t i = 0; i < std::size(kSingleBackends); ++i) os << (i ? ", " : "") << kSingleBackends[i];
      os << ") that took the least time relative to `default` in the same rounds, with `default`'s time ÷ its "
            "time: the median over each repetition's median round, and in brackets the least and the most "
            "repetition.\n\n"
         << table;
    }
  }
  // TorchScript archives: torch::compile against the module as TorchScript would deploy it.
  {
    std::ostringstream ts;
    for (size_t r = 0; r < rows().size(); ++r) {
      if (rows()[r].id.rfind("TS-", 0) != 0) continue;
      const size_t frozen = mode_index("torchscript");
      ts << "| " << rows()[r].label << " | " << ms(eager_ms(res, r)) << " | " << ms(cell_ms(res, r, frozen));
      for (const char* mode : {"onednn", "default"}) {
        const size_t m = mode_index(mode);
        ts << " | " << ms(cell_ms(res, r, m)) << " (" << speed(cell_speedup(res, r, m) / cell_speedup(res, r, frozen)) << ")";
      }
      ts << " |\n";
    }
    if (!ts.str().empty())
      os << "\n## TorchScript archives: torch::compile over the archive frozen and optimized by TorchScript "
            "(`torch::jit::freeze` + `optimize_for_inference`), ms (speedup over frozen), same run\n\n"
            "| model | interpreter (eager) | frozen + optimized | onednn | default |\n|---|---:|---:|---:|---:|\n"
         << ts.str();
  }
  os << "\n## Dynamic shapes: a dynamic entry (`dynamic = true`) vs a static one, per call at the traced size\n\n"
        "Times in ms; the ratios from blocks of the same rounds (`eager-backend`: the ratio of the two speedups; "
        "`default`: the median over each repetition's median round, with the least and the most repetition).\n\n"
     << dynamic_table(res);
  if (res.first_call_reps > 0) {
    os << "\n## First call, ms (trace + backend compile + one run; median of " << res.first_call_reps
       << " fresh compiles in a warm process)\n\n";
    os << first_call_table(res);
  }
  if (!res.new_size_rows.empty()) {
    os << "\n## New sizes of a dynamic entry (`dynamic = true`): first call at a size not seen yet vs warm calls "
          "there (medians over "
       << res.new_sizes << " new sizes of dimension 0)\n\n"
       << new_size_table(res);
  }
  if (std::any_of(res.cells.begin(), res.cells.end(), [](const auto& kv) { return kv.second.peak_bytes >= 0; })) {
    os << "\n## Memory of one training step, MiB (held between forward and backward / peak; peak ÷ eager's peak)\n\n"
          "Counted by an allocator wrapping LibTorch's CPU allocator, above what was live before the step (the "
          "previous step's gradients released): \"held\" is what the forward left for the backward (saved "
          "activations, the loss), \"peak\" the most live during forward and backward, gradients included.\n\n";
    os << memory_table(res);
  }
  os << "\n## Targets beside this run\n\n";
  os << "\"met (ms)\" compares the `default` mode's figure with the absolute target; \"met (speedup)\" compares its "
        "speedup over eager in this run with the target's speedup over the anchor eager "
        "(anchor eager ÷ target), which is robust to machine-to-machine differences.\n\n";
  os << targets_table(res);
  os << "\n## Run settings (from the benchmark binary)\n\n";
  os << "- LibTorch " << TORCH_VERSION << ", torch::get_num_threads() = " << torch::get_num_threads() << "\n";
  size_t min_reps = SIZE_MAX, max_reps = 0;
  for (const auto& [key, c] : res.cells) {
    if (std::isnan(c.median_ms)) continue;
    min_reps = std::min(min_reps, c.repetitions);
    max_reps = std::max(max_reps, c.repetitions);
  }
  if (max_reps > 0)
    os << "- repetitions per benchmark: " << (min_reps == max_reps ? std::to_string(max_reps) : std::to_string(min_reps) + "–" + std::to_string(max_reps))
       << " per row, each of --benchmark_min_time × the row's modes (each: the median block of the mode's calls in "
          "rounds with the row's other modes; the figure is the "
       << (g_statistic == Statistic::Min ? "least" : "median") << " over repetitions, --statistic=" << statistic_name()
       << ")\n";
  os << "- registered backends: " << backends_list() << "\n";
  os << "- MALLOC_MMAP_THRESHOLD_=" << tc_bench::env_or("MALLOC_MMAP_THRESHOLD_", "(glibc default)")
     << ", MALLOC_TRIM_THRESHOLD_=" << tc_bench::env_or("MALLOC_TRIM_THRESHOLD_", "(glibc default)")
     << "\n- variables that select kernels: " << tc_bench::kernel_settings() << "\n";
  return os.str();
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) {
    std::fprintf(stderr, "bench_models: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

void measure_first_calls(Results& res) {
  for (auto& [key, cell] : res.cells) {
    const auto [r, m] = key;
    const Mode& mode = modes()[m];
    if (!is_compiled(mode) || !prepared(r, m).error.empty()) continue;
    Instance& inst = instance(r);
    c10::optional<torch::NoGradGuard> no_grad;
    if (!inst.training) no_grad.emplace();
    std::vector<double> times;
    try {
      for (int i = 0; i < res.first_call_reps; ++i) {
        Runner fresh = inst.compile(mode.options());
        times.push_back(time_call_s(fresh.call) * 1e3);
        cell.first_info = fresh.info();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_models: first call of %s/%s threw: %s\n", rows()[r].id.c_str(), mode.name.c_str(), e.what());
    }
    cell.first_call_ms = median(times);
    std::printf("first call %-10s %-14s %10s ms\n", rows()[r].id.c_str(), mode.name.c_str(), ms(cell.first_call_ms).c_str());
  }
}

// The memory of one training step per (row, mode) that ran, counted by an allocator installed
// for the rest of the process (after the timings: its bookkeeping would cost time).
void measure_memory(Results& res) {
  static torchcompile::compat::CountingAllocator counting(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  for (auto& [key, cell] : res.cells) {
    const auto [r, m] = key;
    Instance& inst = instance(r);
    if (!inst.training) continue;
    std::function<torch::Tensor()> step;
    if (!is_compiled(modes()[m])) {
      step = inst.eager.call;
    } else if (prepared(r, m).error.empty()) {
      step = prepared(r, m).runner.call;
    } else {
      continue;
    }
    step();  // warm: every buffer a step keeps (optimizer-free here) exists from now on
    for (auto& p : inst.params) p.mutable_grad() = torch::Tensor();
    const int64_t before = counting.live_bytes();
    counting.reset_peak();
    int64_t held = 0;
    g_after_forward = [&] { held = counting.live_bytes() - before; };
    step();
    g_after_forward = nullptr;
    cell.held_bytes = held;
    cell.peak_bytes = counting.peak_bytes() - before;
    std::printf("memory %-10s %-14s held %8.2f MiB, peak %8.2f MiB\n", rows()[r].id.c_str(), modes()[m].name.c_str(),
                held / 1048576.0, cell.peak_bytes / 1048576.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  tc_bench::set_up_context();
  // Google Benchmark's --benchmark_min_time (default 0.5 s), read before it consumes the flag: a
  // row's benchmark times all its modes, so it runs for this times their number.
  double min_time = 0.5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i], flag = "--benchmark_min_time=";
    if (a.rfind(flag, 0) == 0) min_time = std::atof(a.c_str() + flag.size());
  }
  benchmark::Initialize(&argc, argv);
  std::string results_md, results_tsv;
  Results res;
  res.first_call_reps = 3;
  res.new_sizes = 5;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const std::string& flag, std::string& out) {
      if (a.rfind(flag + "=", 0) != 0) return false;
      out = a.substr(flag.size() + 1);
      return true;
    };
    std::string v;
    if (value("--results_md", results_md) || value("--results_tsv", results_tsv)) continue;
    if (value("--first_call_reps", v)) {
      res.first_call_reps = std::max(0, std::atoi(v.c_str()));
      continue;
    }
    if (value("--new_sizes", v)) {
      res.new_sizes = std::max(0, std::atoi(v.c_str()));
      continue;
    }
    if (value("--statistic", v)) {
      if (v != "min" && v != "median") {
        std::fprintf(stderr, "bench_models: expected --statistic=min or --statistic=median, got --statistic=%s\n", v.c_str());
        return 1;
      }
      g_statistic = v == "min" ? Statistic::Min : Statistic::Median;
      continue;
    }
    argv[kept++] = argv[i];
  }
  argc = kept;
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  // Which cells to time: Google Benchmark's filter over <row>/<mode>, each selected one compiled
  // and checked (select_cell, one iteration, shown to no reporter).
  for (size_t r = 0; r < rows().size(); ++r) {
    for (size_t m = 0; m < modes().size(); ++m) {
      if (!applies(rows()[r], modes()[m]) || !available(modes()[m])) continue;
      const std::string name = rows()[r].id + "/" + modes()[m].name;
      benchmark::RegisterBenchmark(name.c_str(), select_cell, r, m)->Iterations(1)->Repetitions(1);
    }
  }
  Silent silent;
  benchmark::RunSpecifiedBenchmarks(&silent);
  benchmark::ClearRegisteredBenchmarks();

  // Each row's selected modes timed in rounds (run_rounds).
  std::vector<std::vector<size_t>> timed(rows().size());
  for (const auto& [r, m] : executed())
    if (prepared(r, m).error.empty()) timed[r].push_back(m);
  for (size_t r = 0; r < rows().size(); ++r) {
    if (timed[r].empty()) continue;
    benchmark::RegisterBenchmark((rows()[r].id + "/rounds").c_str(), run_rounds, r, timed[r])
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(min_time * static_cast<double>(timed[r].size()))
        ->ComputeStatistics("min", tc_bench::least)
        ->ComputeStatistics("max", [](const std::vector<double>& v) {
          return v.empty() ? NAN : *std::max_element(v.begin(), v.end());
        });
  }
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector, "^[^/]+/rounds/");
  benchmark::ClearRegisteredBenchmarks();
  for (const auto& [r, m] : executed()) {
    Cell& c = res.cells[{r, m}];
    // NaN if the mode failed to compile: prepared(r, m).error says why.
    const std::string name = rows()[r].id + "/rounds", mode = modes()[m].name;
    c.median_ms = collector.figure_of(name, "ms:" + mode, &c.repetitions);
    c.speedup = collector.spread_of(name, "x:" + mode);
    c.rel = collector.spread_of(name, "rel:" + mode);
  }

  // M2's floor and the GEMM table (the filter applies to their names).
  benchmark::RegisterBenchmark(kM2Floor, run_m2_floor)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->ComputeStatistics("min", tc_bench::least);
  bench_gemm::register_benchmarks();
  benchmark::RunSpecifiedBenchmarks(&collector);
  size_t floor_reps = 0;
  res.m2_floor_ms = collector.figure_of(kM2Floor, &floor_reps);
  if (res.first_call_reps > 0) {
    std::printf("\nFirst calls (%d fresh compiles each)\n", res.first_call_reps);
    measure_first_calls(res);
  }
  if (res.new_sizes > 0) {
    std::printf("\nNew sizes (%d each)\n", res.new_sizes);
    measure_new_sizes(res);
  }
  benchmark::Shutdown();
  measure_memory(res);
  std::string text = report(res);
  text += bench_gemm::table([&](const std::string& name) {
    size_t reps = 0;
    return collector.figure_of(name, &reps);
  });
  std::printf("\n%s", text.c_str());
  bool ok = true;
  if (!results_md.empty()) ok &= write_file(results_md, text);
  if (!results_tsv.empty()) ok &= write_file(results_tsv, speedup_tsv(res));
  return ok ? 0 : 1;
}
