// A differential fuzzer for graph breaks: random forwards (seeded, reproducible) mixing host
// reads (`item`, `is_nonzero`, `equal`, data read through `data_ptr` and accessors) and ops whose
// result sizes depend on the data (`masked_select`, `nonzero`) at random points with factory tensors, in-place ops on
// inputs, on factory tensors and through views, ops that return their argument, dropout and
// BatchNorm in training and eval, loops with a break per iteration and several outputs. Each is
// compiled with `eager`, `aot_eager` and `default` and called many times with changing branch
// values next to an eager copy of the module; every output, the inputs (which the forward may
// update in place), every buffer and the random generator's state must match eager's. The second
// tensor input is, call by call, a tensor of its own, the first input itself, or a view of it.
//
//   TORCHCOMPILE_FUZZ_PROGRAMS   programs per backend (default 1000)
//   TORCHCOMPILE_FUZZ_SEED       first seed (default 1); program k uses seed + k
//   TORCHCOMPILE_FUZZ_CALLS      calls per program (default 10)
//
// A failure prints the backend, seed and program; rerun just it with
// TORCHCOMPILE_FUZZ_SEED=<seed> TORCHCOMPILE_FUZZ_PROGRAMS=1 test_runtime --gtest_filter='Fuzz*'.
#include "support/test_util.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <random>
#include <sstream>

using tc_test::tensors_close;
using tc_test::tensors_equal;

namespace {

constexpr int kRegs = 5;   // tensor registers, each (4, 3) float
constexpr int kReads = 4;  // branch values per call: n has 4 int64 elements in [0, 3)
// int8 against float32 (docs/precision.md): each int8 Linear a call runs adds at most 4% of an
// output's norm (+ 1e-3). Looser than the 2% the benchmark models meet: an output here is 12
// values, 3 of a Linear's 128 columns, of inputs that repeat 12 values 43 times.
constexpr double kLinearBound = 0.04;

enum class Op {
  Unary,        // r[d] = f(r[a])
  Binary,       // r[d] = r[a] (+|*|-) r[b]
  Factory,      // r[d] = zeros / ones / full / empty+fill_ / arange / tensor literal
  InPlace,      // r[d].add_/mul_/relu_/copy_(...)
  ViewInPlace,  // r[d].narrow(...).add_(...) / r[d].select(...).mul_(...)
  Alias,        // r[d] = r[a].contiguous() / .to(kFloat) / view / in-place result
  Param,        // r[d] = r[a] * weight
  Buffer,       // counter.add_(r[a].mean())
  Dropout,      // r[d] = dropout(r[a]) (returns r[a] itself in eval mode)
  BatchNorm,    // r[d] = bn(r[a])
  Random,       // r[d] = r[a] + rand_like / bernoulli
  DataSizes,    // results sized by the data: a masked_select count read on the host, a masked
                // sum, rows chosen by nonzero
  ReadBranch,   // v = read(n[i]) ; if (v) r[d] = ... else r[d] = ...
  ReadNumber,   // r[d] = r[d] * (n[i].item() + 1)   or r[d].add_(n[i].item())
  ReadData,     // a break on computed data: if ((r[a].sum() > 0.25).item<bool>()) ...
  ReadPointer,  // computed data read through a pointer: an accessor element, positives counted
                // from data_ptr, an int64 accessor
  Loop,         // for j in [0, L): body (with a read of n[(i + j) % 4] per iteration)
  Linear,       // r[d] = Linear(128, 128)(r[a] repeated to 128 columns), its first 3 columns (only
                // in programs for a reduced precision: the GEMM is large enough to be quantized)
};

struct Instr {
  Op op;
  int d = 0, a = 0, b = 0, k = 0, i = 0;
  std::vector<Instr> body;  // Loop
};

struct Program {
  std::vector<Instr> code;
  std::vector<int> outputs;  // registers returned (may repeat); -1: the input x itself
  bool training = false;
  bool grad = false;
  bool linear = false;      // has Linear instructions
  int linears_run = 0;      // Linear instructions a call runs (loop bodies counted per iteration)
  bool reads_data = false;  // branches on or sizes by computed data (ReadData, ReadPointer, DataSizes)
  bool normalizes_linear = false;  // a BatchNorm runs after a Linear (normalizes over the batch in training)
  std::string text;
};

const char* op_name(Op op) {
  switch (op) {
    case Op::Unary: return "unary";
    case Op::Binary: return "binary";
    case Op::Factory: return "factory";
    case Op::InPlace: return "inplace";
    case Op::ViewInPlace: return "view_inplace";
    case Op::Alias: return "alias";
    case Op::Param: return "param";
    case Op::Buffer: return "buffer";
    case Op::Dropout: return "dropout";
    case Op::BatchNorm: return "batchnorm";
    case Op::Random: return "random";
    case Op::DataSizes: return "data_sizes";
    case Op::ReadBranch: return "read_branch";
    case Op::ReadNumber: return "read_number";
    case Op::ReadData: return "read_data";
    case Op::ReadPointer: return "read_pointer";
    case Op::Loop: return "loop";
    case Op::Linear: return "linear";
  }
  return "?";
}

void describe(const std::vector<Instr>& code, std::ostream& os, int depth) {
  for (const Instr& in : code) {
    os << std::string(2 * depth, ' ') << op_name(in.op) << " d=" << in.d << " a=" << in.a << " b=" << in.b
       << " k=" << in.k << " i=" << in.i << "\n";
    if (in.op == Op::Loop) describe(in.body, os, depth + 1);
  }
}

class Generator {
 public:
  /// `linear`: programs with Linear instructions, in inference (no grad).
  explicit Generator(uint64_t seed, bool linear = false) : rng_(seed), linear_(linear) {}

  Program program() {
    Program p;
    p.training = pick(2) == 0;
    p.grad = pick(2) == 0 && !linear_;
    const int n = 3 + pick(10);
    for (int s = 0; s < n; ++s) p.code.push_back(instr(/*in_loop=*/false));
    // In execution order: `p.linear` says a Linear ran before; in a loop whose body has one, every
    // iteration after the first follows it.
    std::function<void(const std::vector<Instr>&, int, bool)> scan = [&](const std::vector<Instr>& code, int times,
                                                                         bool loop_has_linear) {
      for (const Instr& in : code) {
        p.linear = p.linear || in.op == Op::Linear;
        if (in.op == Op::Linear) p.linears_run += times;
        p.reads_data = p.reads_data || in.op == Op::ReadData || in.op == Op::ReadPointer || in.op == Op::DataSizes;
        p.normalizes_linear = p.normalizes_linear || (in.op == Op::BatchNorm && (p.linear || loop_has_linear));
        const bool body_linear =
            std::any_of(in.body.begin(), in.body.end(), [](const Instr& b) { return b.op == Op::Linear; });
        scan(in.body, times * (in.op == Op::Loop ? in.k : 1), body_linear);
      }
    };
    scan(p.code, 1, false);
    const int outs = 1 + pick(3);
    for (int s = 0; s < outs; ++s) p.outputs.push_back(pick(kRegs + 1) - 1);
    std::ostringstream os;
    os << "training=" << p.training << " grad=" << p.grad << " outputs=";
    for (int o : p.outputs) os << o << " ";
    os << "\n";
    describe(p.code, os, 1);
    p.text = os.str();
    return p;
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  Instr instr(bool in_loop) {
    Instr in;
    const int kinds = in_loop ? 16 : 17;  // no nested loops
    in.op = static_cast<Op>(pick(kinds));
    // Reads are frequent: weight them up.
    if (pick(4) == 0) in.op = static_cast<Op>(static_cast<int>(Op::ReadBranch) + pick(4));
    if (linear_ && pick(4) == 0) in.op = Op::Linear;
    in.d = pick(kRegs);
    in.a = pick(kRegs);
    in.b = pick(kRegs);
    in.k = pick(8);
    in.i = pick(kReads);
    if (in.op == Op::Loop) {
      in.k = 2 + pick(3);
      const int len = 1 + pick(4);
      for (int s = 0; s < len; ++s) in.body.push_back(instr(/*in_loop=*/true));
      in.body.push_back(Instr{Op::ReadNumber, pick(kRegs), 0, 0, pick(2), 0, {}});
    }
    return in;
  }

  std::mt19937_64 rng_;
  bool linear_ = false;
};

// The largest int8 weight of the int8 kernels on this CPU (63 without VNNI).
double int8_weight_max() {
  return static_cast<double>(
      c10::Dispatcher::singleton().findSchemaOrThrow("torchcompile::int8_weight_max", "").typed<int64_t()>().call());
}

// linear_int8_dynamic's arithmetic in float32: the input quantized per tensor (uint8, asymmetric),
// the weight per output channel (int8, symmetric), both dequantized.
torch::Tensor fake_quant_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const float mn = std::min(x.min().item<float>(), 0.f), mx = std::max(x.max().item<float>(), 0.f);
  float scale = 1.f, zp = 0.f;
  if (mx - mn > 0) {
    scale = (mx - mn) / 255.f;
    zp = std::min(std::max(std::nearbyint(-mn / scale), 0.f), 255.f);
  }
  auto xd = (torch::clamp(torch::round(x * (1.f / scale) + zp), 0, 255) - zp) * scale;
  const double qmax = int8_weight_max();
  auto ws = (w.abs().amax(1).clamp_min(1e-30) / qmax).unsqueeze(1);
  return torch::linear(xd, torch::clamp(torch::round(w / ws), -qmax, qmax) * ws, b);
}

// The forward interpreting a program. Registers 0 and 4 start as the inputs x and y themselves
// (in-place ops on them update the caller's tensors), the others as functions of x.
struct FuzzNet : torch::nn::Module {
  explicit FuzzNet(Program p) : program(std::move(p)) {
    weight = register_parameter("weight", torch::linspace(0.5, 1.5, 3));
    counter = register_buffer("counter", torch::zeros({3}));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
    drop = register_module("drop", torch::nn::Dropout(0.3));
    if (program.linear) {  // the same weights in every copy of the net
      proj = register_module("proj", torch::nn::Linear(128, 128));
      torch::NoGradGuard no_grad;
      proj->weight.copy_(torch::sin(torch::arange(128 * 128).to(torch::kFloat).view({128, 128}) * 0.37) * 0.1);
      proj->bias.copy_(torch::cos(torch::arange(128).to(torch::kFloat)) * 0.1);
    }
  }

  std::vector<torch::Tensor> forward(torch::Tensor x, torch::Tensor n, torch::Tensor y) {
    torch::Tensor r[kRegs];
    r[0] = x;
    r[1] = x * 0.5 + 1;
    r[2] = x.sin();
    r[3] = torch::ones({4, 3});
    r[4] = y;
    run(program.code, r, n, 0);
    std::vector<torch::Tensor> outs;
    for (int o : program.outputs) outs.push_back(o < 0 ? x : r[o]);
    return outs;
  }

  void run(const std::vector<Instr>& code, torch::Tensor* r, const torch::Tensor& n, int offset) {
    for (const Instr& in : code) step(in, r, n, offset);
  }

  void step(const Instr& in, torch::Tensor* r, const torch::Tensor& n, int offset) {
    torch::Tensor& d = r[in.d];
    const torch::Tensor &a = r[in.a], &b = r[in.b];
    const int i = (in.i + offset) % kReads;
    switch (in.op) {
      case Op::Unary: {
        static torch::Tensor (*const fns[])(const torch::Tensor&) = {
            [](const torch::Tensor& t) { return t.relu(); }, [](const torch::Tensor& t) { return t.tanh(); },
            [](const torch::Tensor& t) { return t * -0.5; }, [](const torch::Tensor& t) { return t.exp().clamp_max(4); },
            [](const torch::Tensor& t) { return t.abs() + 0.25; }, [](const torch::Tensor& t) { return t.sigmoid(); }};
        d = fns[in.k % 6](a);
        break;
      }
      case Op::Binary:
        d = in.k % 3 == 0 ? a + b : in.k % 3 == 1 ? a * b : a - b;
        break;
      case Op::Factory:
        switch (in.k) {
          case 0: d = torch::zeros({4, 3}); break;
          case 1: d = torch::ones({4, 3}); break;
          case 2: d = torch::full({4, 3}, 2.5); break;
          case 3: d = torch::empty({4, 3}).fill_(1.5); break;
          case 4: d = torch::arange(12).to(torch::kFloat).view({4, 3}); break;
          case 5: d = torch::tensor({1.0f, -2.0f, 3.0f}).expand({4, 3}).contiguous(); break;
          case 6: d = torch::tensor(std::vector<float>{0.5f, 1.0f, -1.5f}).repeat({4, 1}); break;
          default: {  // filled by host code, outside the dispatcher
            d = torch::empty({4, 3});
            auto acc = d.accessor<float, 2>();
            for (int64_t r0 = 0; r0 < 4; ++r0)
              for (int64_t c = 0; c < 3; ++c) acc[r0][c] = static_cast<float>(r0 - c);
            break;
          }
        }
        break;
      case Op::InPlace:
        switch (in.k % 4) {
          case 0: d.add_(a); break;
          case 1: d.mul_(1.5); break;
          case 2: d.relu_(); break;
          default: d.copy_(a * 2); break;
        }
        break;
      case Op::ViewInPlace:
        if (in.k % 2 == 0) {
          d.narrow(0, 1, 2).add_(a.narrow(0, 0, 2));
        } else {
          d.select(1, in.k % 3).mul_(-2);
        }
        break;
      case Op::Alias:
        switch (in.k % 4) {
          case 0: d = a.contiguous(); break;
          case 1: d = a.to(torch::kFloat); break;
          case 2: d = a.view({4, 3}); break;
          default: d = a.add_(0.125); break;
        }
        break;
      case Op::Param:
        d = a * weight;
        break;
      case Op::Buffer:
        if (!torch::GradMode::is_enabled() || !a.requires_grad()) {
          counter.add_(a.mean(0));
        } else {
          counter.add_(a.detach().mean(0));
        }
        break;
      case Op::Dropout:
        d = drop->forward(a);
        break;
      case Op::BatchNorm:
        d = bn->forward(a);
        break;
      case Op::Random:
        d = in.k % 2 == 0 ? a + torch::rand_like(a) : a * torch::bernoulli(torch::full({4, 3}, 0.5));
        break;
      case Op::DataSizes:
        if (in.k % 3 == 0) {
          const int64_t count = a.masked_select(a > 0).size(0);
          d = a * static_cast<double>(count + 1);
        } else if (in.k % 3 == 1) {
          d = a + b.masked_select(a > 0.5).sum();
        } else {
          d = a.index_fill(0, torch::nonzero(b.select(1, 0) > 0).select(1, 0), 0.5);
        }
        break;
      case Op::ReadBranch: {
        bool taken;
        if (in.k % 3 == 0) {
          taken = n[i].item<int64_t>() > 0;
        } else if (in.k % 3 == 1) {
          taken = (n[i] > 1).is_nonzero();
        } else {
          taken = torch::equal(n[i], n[(i + 1) % kReads]);
        }
        d = taken ? d + 1 : d * 0.5;
        break;
      }
      case Op::ReadNumber: {
        const int64_t v = n[i].item<int64_t>();
        if (in.k % 2 == 0) {
          d = d * static_cast<double>(v + 1);
        } else {
          d.add_(static_cast<double>(v));
        }
        break;
      }
      case Op::ReadData:
        // The threshold is not 0: a sum that is 0 up to rounding (of a BatchNorm output, of x - x)
        // would take either branch depending on the order of the additions, which backends with
        // their own reductions (fused) are free to choose, as Inductor is.
        if ((a.sum() > 0.25).item<bool>()) {
          d = d + a;
        } else {
          d = d.neg();
        }
        break;
      case Op::ReadPointer: {
        // With grad mode on, data is read through detach(): reads of the data of tensors that
        // require grad, and while autograd records of views it tracks and of inputs sharing
        // memory with another input, are not seen (docs/graph-breaks-and-explain.md). Thresholds
        // away from 0, as for ReadData.
        const torch::Tensor t = torch::GradMode::is_enabled() ? a.detach() : a;
        if (in.k % 3 == 0) {
          d = t.accessor<float, 2>()[in.i % 4][in.k % 3] > 0.3f ? d + a : d * 0.5;
        } else if (in.k % 3 == 1) {
          const torch::Tensor c = t.contiguous();
          std::vector<float> host(static_cast<size_t>(c.numel()));
          std::memcpy(host.data(), c.data_ptr<float>(), host.size() * sizeof(float));
          int positives = 0;
          for (float v : host) positives += v > 0.3f;
          d = d * static_cast<double>(positives + 1) * 0.25;
        } else {
          const torch::Tensor counts = (t > 0.3).sum(0);  // int64 [3]
          d = d + static_cast<double>(counts.accessor<int64_t, 1>()[in.i % 3]);
        }
        break;
      }
      case Op::Linear: {
        const torch::Tensor h = a.repeat({1, 43}).narrow(1, 0, 128);
        d = (fake_quant ? fake_quant_linear(h, proj->weight, proj->bias) : proj->forward(h)).narrow(1, in.k % 3, 3);
        break;
      }
      case Op::Loop:
        for (int j = 0; j < in.k; ++j) run(in.body, r, n, offset + j);
        break;
    }
  }

  Program program;
  bool fake_quant = false;  // Linear with int8-dynamic's arithmetic (the oracle of int8 programs)
  torch::nn::Linear proj{nullptr};
  torch::Tensor weight, counter;
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

class Fuzz : public ::testing::TestWithParam<std::string> {};

const char* const kInvalid = "invalid";

// Runs one program; returns "" or what differed (kInvalid: eager itself throws).
// `int8`: programs with Linears (Generator's `linear`), compiled with Precision::Int8Dynamic; the
// oracle is eager with int8-dynamic's arithmetic done in float32 (FuzzNet::fake_quant), and for
// programs whose control flow does not read computed data (which quantization may legitimately
// flip), eager float32 too, within the documented bound. A call that runs eagerly (a graph break
// past cache_size_limit: the state is put back and the C++ forward runs as written) computes in
// float32: when an entry of the compiled object runs eagerly and the int8 oracle disagrees, the
// call must equal, bit for bit, a float32 eager call from the state it began with, and the oracle
// continues from the compiled net's state.
int eager_calls = 0;  // int8 calls that ran eagerly (float32), over a run_fuzz

// One run of a call: its results, the inputs x and y after it, the random generator's next draw,
// and the net (its buffers).
struct CallRun {
  const std::vector<torch::Tensor>& outputs;
  const torch::Tensor &x, &y, &next;
  FuzzNet& net;
};

// The first difference between two runs of a call ("" if none): results, inputs and buffers
// compared with `same`, the generator's draw bit for bit.
template <class Same>
std::string call_differences(const CallRun& e, const CallRun& a, Same same) {
  std::ostringstream why;
  if (e.outputs.size() != a.outputs.size()) why << "output count " << a.outputs.size() << " vs " << e.outputs.size();
  for (size_t o = 0; why.str().empty() && o < e.outputs.size(); ++o)
    if (auto r = same(e.outputs[o], a.outputs[o]); !r) why << "output " << o << ": " << r.message();
  if (why.str().empty())
    if (auto r = same(e.x, a.x); !r) why << "input x after the call: " << r.message();
  if (why.str().empty())
    if (auto r = same(e.y, a.y); !r) why << "input y after the call: " << r.message();
  if (why.str().empty())
    if (auto r = tensors_equal(e.next, a.next); !r) why << "random generator state: " << r.message();
  auto expected_buffers = e.net.named_buffers();
  for (const auto& b : a.net.named_buffers())
    if (why.str().empty())
      if (auto r = same(expected_buffers[b.key()], b.value()); !r)
        why << "buffer " << b.key() << ": " << r.message() << "\nexpected:\n" << expected_buffers[b.key()]
            << "\ncompiled:\n" << b.value();
  return why.str();
}

void copy_state(FuzzNet& to, FuzzNet& from) {
  torch::NoGradGuard no_grad;
  auto params = from.named_parameters(), buffers = from.named_buffers();
  for (auto& p : to.named_parameters()) p.value().copy_(params[p.key()]);
  for (auto& b : to.named_buffers()) b.value().copy_(buffers[b.key()]);
}

std::string check_program(const std::string& backend, uint64_t seed, int calls, bool int8 = false) {
  Generator gen(seed, int8);
  Program p = gen.program();
  auto eager_net = std::make_shared<FuzzNet>(p);
  auto compiled_net = std::make_shared<FuzzNet>(p);
  std::shared_ptr<FuzzNet> float_net;
  eager_net->train(p.training);
  compiled_net->train(p.training);
  if (int8) {
    eager_net->fake_quant = true;
    // Against float32 only where the bound carries to the outputs: not where control flow reads
    // computed data (quantization may legitimately flip it), nor through a training-mode BatchNorm
    // after a Linear (it divides by the batch's spread: the Linear's error relative to
    // ‖y - mean(y)‖, which can be many times its error relative to ‖y‖; docs/precision.md).
    if (!p.reads_data && !(p.training && p.normalizes_linear)) {
      float_net = std::make_shared<FuzzNet>(p);
      float_net->train(p.training);
    }
  }
  std::optional<torch::NoGradGuard> no_grad;
  if (!p.grad) no_grad.emplace();
  auto fast = torch::compile(compiled_net, torchcompile::CompileOptions(backend).with_precision(
                                               int8 ? torchcompile::Precision::Int8Dynamic : torchcompile::Precision::Float32));
  const bool exact = backend == "eager" && !int8;
  // Backends with kernels of their own (fused's reductions and math, onednn's GEMMs) differ from
  // ATen in the last bits, which sums of values that are 0 up to rounding (the mean of a BatchNorm
  // output, accumulated into a buffer call after call) show at the 1e-6 level: the parity suite's
  // tolerance for such backends.
  const bool own_kernels = backend == "fused" || backend == "default";
  // int8: the oracle quantizes as the kernel does, but a last-bit difference upstream (a GEMM's
  // order of summation, a backend's own kernels) can move a value of a later Linear's input across
  // a rounding boundary: one quantization level, which changes an output by about the input's
  // scale times a weight (here up to ~5e-3).
  const double rtol = own_kernels || int8 ? 1e-4 : 1e-5, atol = int8 ? 1e-2 : own_kernels ? 1e-5 : 1e-6;
  std::mt19937_64 values(seed * 7919 + 1);
  for (int call = 0; call < calls; ++call) {
    // Branch values: new ones early, repeats later (known continuations).
    auto n = torch::empty({kReads}, torch::kLong);
    for (int k = 0; k < kReads; ++k) n[k] = static_cast<int64_t>(values() % 3);
    torch::manual_seed(seed + call);
    auto x = torch::randn({4, 3});
    auto x_eager = x.clone(), x_compiled = x.clone(), x_float = x.clone();
    // y: separate (half the calls), x itself, or a view of x.
    const int y_kind = static_cast<int>(values() % 4);
    auto y = torch::randn({4, 3});
    auto y_of = [&](const torch::Tensor& xs) {
      return y_kind < 2 ? y.clone() : y_kind == 2 ? xs : xs.view({4, 3});
    };
    auto y_eager = y_of(x_eager), y_compiled = y_of(x_compiled), y_float = y_of(x_float);
    std::vector<torch::Tensor> float_out;

    torch::manual_seed(1000 + call);
    std::vector<torch::Tensor> expected;
    try {
      if (float_net) {
        torch::manual_seed(1000 + call);
        float_out = float_net->forward(x_float, n, y_float);
        torch::manual_seed(1000 + call);
      }
      expected = eager_net->forward(x_eager, n, y_eager);
    } catch (const std::exception&) {
      return kInvalid;  // the program itself is not valid LibTorch (e.g. an overlapping in-place add)
    }
    auto eager_next = torch::rand({2});
    // int8: the compiled net's state and inputs as the call begins (for a call that runs eagerly).
    std::shared_ptr<FuzzNet> before;
    torch::Tensor x_before, y_before;
    if (int8) {
      before = std::make_shared<FuzzNet>(p);
      before->train(p.training);
      copy_state(*before, *compiled_net);
      x_before = x_compiled.clone();
      y_before = y_of(x_before);
    }
    torch::manual_seed(1000 + call);
    std::vector<torch::Tensor> actual;
    try {
      actual = fast(x_compiled, n, y_compiled);
    } catch (const std::exception& e) {
      return "call " + std::to_string(call) + " threw: " + e.what();
    }
    auto compiled_next = torch::rand({2});

    auto same = [&](const torch::Tensor& e, const torch::Tensor& a) {
      return exact ? tensors_equal(e, a) : tensors_close(e, a, rtol, atol);
    };
    std::ostringstream why;
    why << call_differences({expected, x_eager, y_eager, eager_next, *eager_net},
                            {actual, x_compiled, y_compiled, compiled_next, *compiled_net}, same);
    const double bound = kLinearBound * std::max(1, p.linears_run);
    for (size_t o = 0; why.str().empty() && o < float_out.size() && o < actual.size(); ++o) {
      const double err = (actual[o] - float_out[o]).norm().item<double>(), ref = float_out[o].norm().item<double>();
      if (!(err <= bound * ref + 1e-3))
        why << "output " << o << " differs from float32 by " << err << " (norm " << ref << ", bound " << bound << ")";
    }
    if (!why.str().empty() && int8) {
      bool some_entry_eager = false;
      for (const auto& e : fast.state().entries()) some_entry_eager = some_entry_eager || e->runs_eagerly();
      if (some_entry_eager) {
        torch::manual_seed(1000 + call);
        std::vector<torch::Tensor> float_expected = before->forward(x_before, n, y_before);
        auto float_next = torch::rand({2});
        const std::string eager_why = call_differences({float_expected, x_before, y_before, float_next, *before},
                                                       {actual, x_compiled, y_compiled, compiled_next, *compiled_net},
                                                       [](const torch::Tensor& e, const torch::Tensor& a) {
                                                         return tensors_equal(e, a);
                                                       });
        if (eager_why.empty()) {
          ++eager_calls;
          copy_state(*eager_net, *compiled_net);
          why.str("");
        } else {
          why << "\nand an entry runs eagerly, but the call is not float32 eager either: " << eager_why;
        }
      }
    }
    if (!why.str().empty()) {
      std::ostringstream values_read;
      for (int k = 0; k < kReads; ++k) values_read << (k ? "," : "") << n[k].item<int64_t>();
      return "call " + std::to_string(call) + " n=" + values_read.str() + " y=" +
             (y_kind < 2 ? "separate" : y_kind == 2 ? "x" : "x.view") + ": " + why.str();
    }
  }
  return "";
}

void run_fuzz(const std::string& backend, bool int8, int default_programs) {
  const int programs = env_int("TORCHCOMPILE_FUZZ_PROGRAMS", default_programs);
  const int seed = env_int("TORCHCOMPILE_FUZZ_SEED", 1);
  const int calls = env_int("TORCHCOMPILE_FUZZ_CALLS", 10);
  int failures = 0, invalid = 0;
  eager_calls = 0;
  const bool quiet = std::getenv("TORCHCOMPILE_LOGS") == nullptr;
  if (quiet) ::testing::internal::CaptureStderr();  // the cache-limit warnings of number-keyed breaks
  for (int k = 0; k < programs && failures < 3; ++k) {
    const uint64_t s = static_cast<uint64_t>(seed) + k;
    std::string why = check_program(backend, s, calls, int8);
    if (why.empty()) continue;
    if (why == kInvalid) {
      ++invalid;
      continue;
    }
    ++failures;
    ADD_FAILURE() << "backend " << backend << (int8 ? " (int8-dynamic)" : "") << ", TORCHCOMPILE_FUZZ_SEED=" << s
                  << ": " << why << "\nprogram:\n" << Generator(s, int8).program().text;
  }
  if (quiet) ::testing::internal::GetCapturedStderr();
  if (int8) std::cout << "[ info     ] " << eager_calls << " int8 calls ran eagerly (float32, checked bit for bit)\n";
  EXPECT_LT(invalid, programs / 10 + 1) << "too many generated programs are not valid LibTorch";
}

TEST_P(Fuzz, RandomForwardsWithGraphBreaksMatchEager) { run_fuzz(GetParam(), false, 1000); }

// The same programs with Linears, under Precision::Int8Dynamic (needs the onednn backend's kernels).
class FuzzInt8 : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzInt8, RandomForwardsWithGraphBreaksMatchTheInt8Oracle) {
  if (!torchcompile::precision_unavailable(torchcompile::Precision::Int8Dynamic).empty())
    GTEST_SKIP() << torchcompile::precision_unavailable(torchcompile::Precision::Int8Dynamic);
  run_fuzz(GetParam(), true, 300);
}

INSTANTIATE_TEST_SUITE_P(Backends, FuzzInt8, ::testing::Values("eager", "default"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Backends, Fuzz, ::testing::Values("eager", "aot_eager", "fused", "default"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
