// Reduced precision (CompileOptions::precision, docs/precision.md): the pass that gives Linears
// int8 or bfloat16 kernels (src/compile/precision.cpp), the kernels themselves (the onednn
// backend's onednn_precision.cpp), and the accuracy contract: relative error of outputs against
// float32 on the benchmark models, argmax agreement on a trained classifier.
#include "support/test_util.h"

#include <torchcompile/support/isa.h>
#include <torchcompile/torchcompile.h>

#include <gmock/gmock.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "examples/models.h"

namespace {

using torchcompile::CompileOptions;
using torchcompile::Precision;

bool have_kernels() { return torchcompile::has_backend("onednn"); }

// ||y - ref|| / ||ref||
double rel_error(const torch::Tensor& y, const torch::Tensor& ref) {
  return (y - ref).norm().item<double>() / ref.norm().item<double>();
}

CompileOptions with(const std::string& backend, Precision p) {
  return CompileOptions(backend).with_precision(p);
}

// The largest int8 weight on this CPU (63 without VNNI: see onednn_precision.cpp).
int64_t int8_weight_max() {
  return c10::Dispatcher::singleton().findSchemaOrThrow("torchcompile::int8_weight_max", "").typed<int64_t()>().call();
}

// The same arithmetic as linear_int8_dynamic, in float32 with ATen: the input quantized per tensor
// (uint8, asymmetric), the weight per output channel (int8, symmetric), both dequantized.
torch::Tensor fake_quant_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const float mn = std::min(x.min().item<float>(), 0.f), mx = std::max(x.max().item<float>(), 0.f);
  float scale = 1.f;
  float zp = 0.f;
  if (mx - mn > 0) {
    scale = (mx - mn) / 255.f;
    zp = std::min(std::max(std::nearbyint(-mn / scale), 0.f), 255.f);
  }
  auto xq = torch::clamp(torch::round(x * (1.f / scale) + zp), 0, 255);
  auto xd = (xq - zp) * scale;
  const double qmax = static_cast<double>(int8_weight_max());
  auto ws = (w.abs().amax(1).clamp_min(1e-30) / qmax).unsqueeze(1);
  auto wd = torch::clamp(torch::round(w / ws), -qmax, qmax) * ws;
  return torch::linear(xd, wd, b);
}

// The precision operators called directly (an undefined bias: none).
torch::Tensor linear_int8_op(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchcompile::linear_int8_dynamic", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&)>();
  return op.call(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt);
}
torch::Tensor linear_bf16_op(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("torchcompile::linear_bf16", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, bool)>();
  return op.call(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt, /*emulate=*/false);
}

using torchcompile_examples::M4;
using torchcompile_examples::M5;

}  // namespace

// ---- the kernel against its arithmetic ----------------------------------------------------------

// Random shapes (rows 1..70, 2-D and 3-D, non-contiguous inputs, with and without bias): the int8
// kernel equals the same quantization done in float32 (int32 accumulation is exact; only the
// float32 reference's rounding and the last step's differ). Each shape is called twice: the first
// call at a number of rows runs oneDNN's matmul with run-time rows, the second a 1x1 convolution
// made for those rows (onednn_precision.cpp).
TEST(Precision, Int8KernelMatchesItsArithmeticOnRandomShapes) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t M = 1 + rng() % 70, K = 8 + rng() % 300, N = 1 + rng() % 200;
    torch::manual_seed(trial);
    torch::Tensor x = trial % 3 == 0 ? torch::randn({M, 2, K}).select(1, 1) : torch::randn({2, M, K}) * (1 + trial % 5);
    if (trial % 4 == 1) x = torch::relu(x);  // one-sided: the zero point matters
    auto w = torch::randn({N, K}) * 0.1;
    auto b = trial % 2 ? torch::randn({N}) : torch::Tensor();
    auto ref = fake_quant_linear(x, w, b);
    for (const char* call : {"first", "second"}) {
      auto y = linear_int8_op(x, w, b);
      ASSERT_EQ(y.sizes(), ref.sizes());
      EXPECT_LT(rel_error(y, ref), 1e-4) << call << " call, M " << M << " K " << K << " N " << N << " trial " << trial;
      EXPECT_LT(rel_error(y, torch::linear(x, w, b)), 0.05) << call << " call, trial " << trial;
    }
  }
}

// Every number of rows from 1 to 80, twice each, for one weight: the first 64 numbers called twice
// get int8 kernels of their own, later ones stay on the run-time-rows matmul; all give the
// arithmetic's result.
TEST(Precision, Int8ManyNumbersOfRows) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  auto w = torch::randn({29, 37}) * 0.1, b = torch::randn({29});  // a shape no other test uses
  for (int64_t M = 1; M <= 80; ++M) {
    auto x = torch::randn({M, 37});
    auto ref = fake_quant_linear(x, w, b);
    for (const char* call : {"first", "second"}) {
      auto y = linear_int8_op(x, w, b);
      EXPECT_LT(rel_error(y, ref), 1e-4) << call << " call, M " << M;
    }
  }
}

// bfloat16 on random shapes, twice each (the first call at a number of rows runs the matmul with
// run-time rows, the second one made for those rows): the same numbers as bfloat16 inputs and
// weights with a float32 GEMM, up to the summation order.
TEST(Precision, BFloat16KernelMatchesRoundedInputsOnRandomShapes) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  if (!torchcompile::precision_unavailable(Precision::BFloat16).empty()) GTEST_SKIP() << "no bfloat16 on this CPU";
  torch::NoGradGuard no_grad;
  std::mt19937 rng(4321);
  auto round = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t M = 1 + rng() % 70, K = 8 + rng() % 300, N = 1 + rng() % 200;
    torch::manual_seed(trial);
    torch::Tensor x = trial % 3 == 0 ? torch::randn({M, 2, K}).select(1, 1) : torch::randn({2, M, K});
    auto w = torch::randn({N, K}) * 0.1;
    auto b = trial % 2 ? torch::randn({N}) : torch::Tensor();
    auto ref = torch::linear(round(x), round(w), b);
    for (const char* call : {"first", "second"}) {
      auto y = linear_bf16_op(x, w, b);
      ASSERT_EQ(y.sizes(), ref.sizes());
      EXPECT_LT(rel_error(y, ref), 1e-5) << call << " call, M " << M << " K " << K << " N " << N << " trial " << trial;
    }
  }
}

// The input's range is found by one vectorized pass, split over the threads from 64 Ki elements:
// inputs small and large (tails of every length), the extreme values and one non-finite value
// (NaN, +inf, -inf) at random places. Finite inputs match the arithmetic; a non-finite value
// makes the call float32, as eager.
TEST(Precision, Int8InputRangeAndNonFiniteValuesAtRandomPlaces) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  std::mt19937 rng(99);
  struct TwoThreads {  // the pass splits over threads only when there are several
    int saved = at::get_num_threads();
    TwoThreads() { at::set_num_threads(2); }
    ~TwoThreads() { at::set_num_threads(saved); }
  } two_threads;
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (int trial = 0; trial < 36; ++trial) {
    const int64_t M = trial % 2 == 0 ? 300 + rng() % 200 : 1 + rng() % 40, K = 1 + rng() % 400;
    torch::manual_seed(trial);
    auto x = torch::randn({M, K});
    auto w = torch::randn({16, K}) * 0.1;
    // A place: the last element (in a tail), one in the second half (another thread's part), any.
    const int64_t n = M * K;
    auto place = [&](int kind) {
      return kind == 0 ? n - 1 : kind == 1 ? n / 2 + static_cast<int64_t>(rng() % (n - n / 2)) : static_cast<int64_t>(rng() % n);
    };
    const int64_t at = place(trial % 3);
    x.view(-1)[at] = trial % 2 ? 9.f : -9.f;  // the extreme value
    EXPECT_LT(rel_error(linear_int8_op(x, w, torch::Tensor()), fake_quant_linear(x, w, torch::Tensor())), 1e-4)
        << "M " << M << " K " << K << " extreme at " << at;
    x.view(-1)[place((trial / 3) % 3)] = specials[trial % 3];
    auto y = linear_int8_op(x, w, torch::Tensor()), ref = torch::linear(x, w);
    EXPECT_TRUE(torch::equal(torch::isnan(y), torch::isnan(ref))) << "M " << M << " K " << K;
    EXPECT_TRUE(torch::allclose(y.nan_to_num(0, 0, 0), ref.nan_to_num(0, 0, 0), 1e-5, 1e-5)) << "M " << M << " K " << K;
  }
}

TEST(Precision, NonFiniteInputsComputeInFloat32AsEager) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  auto lin = torch::nn::Linear(256, 128);
  auto compiled = torch::compile(lin, with("eager", Precision::Int8Dynamic));
  auto x = torch::randn({8, 256});
  compiled(x);
  x[3][7] = std::numeric_limits<float>::quiet_NaN();
  x[5][1] = std::numeric_limits<float>::infinity();
  auto y = compiled(x), ref = lin(x);
  EXPECT_TRUE(torch::equal(torch::isnan(y), torch::isnan(ref)));
  EXPECT_TRUE(torch::allclose(y.nan_to_num(0, 0, 0), ref.nan_to_num(0, 0, 0), 1e-5, 1e-5));
}

// ---- accuracy on the benchmark models, every backend -------------------------------------------

TEST(Precision, Int8OutputsWithinTwoPercentOnM1M4M5UnderEveryBackend) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torchcompile_examples::Mlp m1;
  M4 m4;
  m4->eval();
  M5 m5;
  const auto x1 = torch::randn({64, 784}), x4 = torch::randn({128, 8, 256}), x5 = torch::randn({8, 64, 512});
  for (const char* backend : {"eager", "aot_eager", "onednn", "fused", "default"}) {
    auto c1 = torch::compile(m1, with(backend, Precision::Int8Dynamic));
    auto c4 = torch::compile(m4, with(backend, Precision::Int8Dynamic));
    auto c5 = torch::compile(m5, with(backend, Precision::Int8Dynamic));
    const double e1 = rel_error(tc_test::second_call(c1, x1), m1(x1));
    const double e4 = rel_error(tc_test::second_call(c4, x4), m4(x4));
    const double e5 = rel_error(tc_test::second_call(c5, x5), m5(x5));
    EXPECT_LE(e1, 0.02) << backend;
    EXPECT_LE(e4, 0.02) << backend;
    EXPECT_LE(e5, 0.02) << backend;
    // Not float32 by accident: int8 changes the result.
    EXPECT_GT(e1, 1e-5) << backend;
    EXPECT_GT(e5, 1e-6) << backend;
  }
}

TEST(Precision, ExplainShowsThePrecisionOfEveryLinear) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  torchcompile_examples::Mlp m1;
  auto x = torch::randn({4, 784});
  auto e = torchcompile::explain(with("default", Precision::Int8Dynamic).with_keep_float32({"fc2"}), m1, x);
  const std::string s = e.str();
  // "precision int8-dynamic: linear fc1 ...", or "int8-dynamic (weights in [-63, 63]: no VNNI): ..."
  EXPECT_THAT(s, ::testing::ContainsRegex("precision int8-dynamic( \\(weights in \\[-63, 63\\]: no VNNI\\))?: "
                                          "linear fc1 \\[784 -> 512\\]"));
  EXPECT_NE(s.find("precision float32: linear fc2 [512 -> 512]: keep_float32"), std::string::npos) << s;
  EXPECT_NE(s.find("precision float32: linear fc3 [512 -> 10]: small GEMM"), std::string::npos) << s;
  // The backend receives the graph with the kernel in it.
  ASSERT_EQ(e.graphs.size(), 1u);
  EXPECT_NE(e.graphs[0].find("torchcompile::linear_int8_dynamic"), std::string::npos) << e.graphs[0];
}

TEST(Precision, KeepFloat32CoversAPathAndEverythingBelowIt) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  M4 m4;
  m4->eval();
  auto x = torch::randn({16, 2, 256});
  auto kept = torch::compile(m4, with("eager", Precision::Int8Dynamic).with_keep_float32({"layer"}));
  EXPECT_TRUE(torch::allclose(tc_test::second_call(kept, x), m4(x), 1e-4, 1e-5));
  auto prefix_only = torch::compile(m4, with("eager", Precision::Int8Dynamic).with_keep_float32({"lay"}));
  EXPECT_GT(rel_error(tc_test::second_call(prefix_only, x), m4(x)), 1e-5);  // "lay" is not a path of it
}

// ---- weights that change ------------------------------------------------------------------------

TEST(Precision, QuantizedWeightsFollowUpdatesOfTheFloatWeights) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::manual_seed(0);
  auto lin = torch::nn::Linear(256, 256);
  auto compiled = torch::compile(lin, with("default", Precision::Int8Dynamic));
  auto x = torch::randn({16, 256});
  auto check = [&](const char* what) {
    torch::NoGradGuard no_grad;
    EXPECT_LT(rel_error(compiled(x), lin(x)), 0.02) << what;
  };
  check("first");
  {
    torch::NoGradGuard no_grad;
    lin->weight.mul_(-3);  // bumps the version
  }
  check("after mul_");
  {
    torch::NoGradGuard no_grad;
    lin->weight.copy_(torch::randn({256, 256}) * 0.05);
  }
  check("after copy_");
  // A training step between two evaluations: the optimizer writes through p.data() (no version
  // bump) while the parameter has a gradient.
  torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    lin(x).pow(2).sum().backward();
    opt.step();
    check("after an SGD step");
  }
}

TEST(Precision, TrainingUnderAReducedPrecisionIsAnError) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  auto lin = torch::nn::Linear(64, 64);
  auto compiled = torch::compile(lin, with("default", Precision::Int8Dynamic));
  auto x = torch::randn({4, 64});
  try {
    compiled(x);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("precision int8-dynamic is for inference, but grad mode is on and "
                                               "the module has parameters that require grad"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("torch::NoGradGuard"));
  }
  c10::InferenceMode inference;
  EXPECT_LT(rel_error(compiled(x), lin(x)), 0.05);
}

// ---- bfloat16 -----------------------------------------------------------------------------------

TEST(Precision, BFloat16OnThisCpuOrItsDocumentedError) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  M5 m5;
  auto x = torch::randn({8, 64, 512});
  if (!torchcompile::precision_unavailable(Precision::BFloat16).empty()) {
    try {
      torch::compile(m5, with("default", Precision::BFloat16));
      FAIL() << "expected an error on a CPU without bfloat16";
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("precision bfloat16 needs a CPU with AVX512-BF16 or AMX-BF16"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("emulate_precision"));
    }
  } else {
    for (const char* backend : {"eager", "onednn", "default"}) {
      auto c = torch::compile(m5, with(backend, Precision::BFloat16));
      const double e = rel_error(tc_test::second_call(c, x), m5(x));
      EXPECT_LE(e, 0.01) << backend;
      EXPECT_GT(e, 1e-7) << backend;
    }
  }
  // Emulated: the same numbers as bfloat16 inputs and weights with a float32 GEMM. On a CPU with
  // bfloat16 the flag changes nothing (the GEMMs run natively): the same roundings of inputs and
  // weights, another summation order, which may flip the bfloat16 rounding of a hidden value.
  auto c = torch::compile(m5, with("eager", Precision::BFloat16).with_emulated_precision());
  auto round = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  auto h = torch::gelu(torch::linear(round(m5->norm(x)), round(m5->up->weight), m5->up->bias));
  auto ref = x + torch::linear(round(h), round(m5->down->weight), m5->down->bias);
  auto got = tc_test::second_call(c, x);
  if (!torchcompile::precision_unavailable(Precision::BFloat16).empty())
    EXPECT_TRUE(torch::allclose(got, ref, 1e-4, 1e-4)) << (got - ref).abs().max();
  else
    EXPECT_LT(rel_error(got, ref), 1e-5);
}

TEST(Precision, BFloat16WithoutTheInstructionsIsAnErrorUnlessEmulated) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  if (!torchcompile::support::cpu_has(torchcompile::support::Isa::Avx2)) GTEST_SKIP() << "no AVX2";
  // TORCHCOMPILE_ISA=avx2 makes any CPU answer as one without AVX512-BF16.
  tc_test::ScopedEnv isa("TORCHCOMPILE_ISA", "avx2");
  torch::NoGradGuard no_grad;
  auto lin = torch::nn::Linear(256, 256);
  try {
    torch::compile(lin, with("default", Precision::BFloat16));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("precision bfloat16 needs a CPU with AVX512-BF16 or AMX-BF16 "
                                               "instructions; this one has neither (TORCHCOMPILE_ISA=avx2)"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("slower than float32"));
  }
  auto c = torch::compile(lin, with("default", Precision::BFloat16).with_emulated_precision());
  auto x = torch::randn({16, 256});
  auto e = torchcompile::explain(with("eager", Precision::BFloat16).with_emulated_precision(), lin, x);
  EXPECT_NE(e.str().find("precision bfloat16 (emulated): linear"), std::string::npos) << e;
  EXPECT_LT(rel_error(tc_test::second_call(c, x), lin(x)), 0.01);
}

// ---- a trained classifier: argmax agreement -----------------------------------------------------

namespace {

// A 10-class Gaussian mixture in 64 dimensions (class means on a sphere, unit noise), generated
// here; an MLP trained on it in float32.
struct Mixture {
  torch::Tensor means;
  explicit Mixture(int64_t seed) {
    torch::manual_seed(seed);
    means = torch::randn({10, 64});
    means = means / means.norm(2, 1, true) * 3.0;
  }
  std::pair<torch::Tensor, torch::Tensor> sample(int64_t n) const {
    auto y = torch::randint(0, 10, {n}, torch::kLong);
    return {means.index_select(0, y) + torch::randn({n, 64}), y};
  }
};

struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl()
      : fc1(register_module("fc1", torch::nn::Linear(64, 512))),
        fc2(register_module("fc2", torch::nn::Linear(512, 512))),
        fc3(register_module("fc3", torch::nn::Linear(512, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Classifier);

}  // namespace

TEST(Precision, TrainedClassifierArgmaxAgreesWithFloat32) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  Mixture data(7);
  Classifier net;
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3));
  for (int step = 0; step < 300; ++step) {
    auto [x, y] = data.sample(128);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net(x), y).backward();
    opt.step();
  }
  torch::NoGradGuard no_grad;
  auto [x, y] = data.sample(4000);
  auto ref = net(x).argmax(1);
  const double accuracy = ref.eq(y).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(accuracy, 0.8) << "the float32 classifier did not learn";  // chance: 0.1
  std::vector<Precision> precisions = {Precision::Int8Dynamic};
  if (torchcompile::precision_unavailable(Precision::BFloat16).empty()) precisions.push_back(Precision::BFloat16);
  for (Precision p : precisions) {
    auto compiled = torch::compile(net, with("default", p).with_dynamic(false));
    auto out = compiled(x).argmax(1);
    const double agreement = out.eq(ref).to(torch::kDouble).mean().item<double>();
    EXPECT_GE(agreement, 0.99) << torchcompile::to_string(p) << " (float32 accuracy " << accuracy << ")";
    std::cout << "[ precision ] " << torchcompile::to_string(p) << ": argmax agreement " << agreement
              << " over 4000 samples (float32 accuracy " << accuracy << ")\n";
  }
}

// ---- concurrency --------------------------------------------------------------------------------

TEST(Precision, FourThreadsAtOnce) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::manual_seed(0);
  torchcompile_examples::Mlp m1;
  auto compiled = torch::compile(m1, with("default", Precision::Int8Dynamic));
  // Inputs of 1 to 33 rows (a dynamic entry) and their results from one thread; then four
  // threads at once must give the same.
  std::vector<torch::Tensor> xs, want;
  {
    c10::InferenceMode inference;
    for (int i = 0; i < 40; ++i) {
      xs.push_back(torch::randn({1 + (i * 7) % 33, 784}));
      want.push_back(compiled(xs.back()));
    }
    EXPECT_LT(rel_error(compiled(xs[3]), m1(xs[3])), 0.05);
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      c10::InferenceMode inference;
      for (int i = 0; i < 40; ++i) {
        const size_t k = (t * 11 + i) % xs.size();
        if (!torch::allclose(compiled(xs[k]), want[k], 1e-5, 1e-5)) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- the call that traces, float32 parts, packages -----------------------------------------------

TEST(Precision, TheCallThatTracesComputesInThePrecisionToo) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  M5 m5;
  auto x = torch::randn({4, 16, 512});
  for (const char* backend : {"eager", "default"}) {
    auto c = torch::compile(m5, with(backend, Precision::Int8Dynamic));
    // The MLP branch (the output minus the residual x): int8 differs from float32 there by ~1.6%.
    auto traced = c(x) - x;    // traces: recorded while the forward runs
    auto compiled = c(x) - x;  // the compiled graph
    auto float32 = m5(x) - x;
    // `eager` replays ATen's ops: the same numbers. `default`'s own LayerNorm and GELU differ from
    // ATen's in the last bits, which can move an input of the second Linear across a rounding
    // boundary of its quantization: one level, a few elements.
    EXPECT_LT(rel_error(traced, compiled), std::string(backend) == "eager" ? 1e-6 : 2e-3) << backend;
    EXPECT_GT(rel_error(traced, float32), 5e-3) << backend << ": the traced call computed in float32";
  }
}

// A forward whose second output never meets a quantized Linear: it is what float32 gives.
TEST(Precision, Float32PartsKeepTheirResults) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  auto big = torch::nn::Linear(256, 256).ptr();
  auto small = torch::nn::Linear(256, 8).ptr();
  auto norm = torch::nn::LayerNorm(torch::nn::LayerNormOptions({256})).ptr();
  auto fn = [=](torch::Tensor x) {
    auto quantized = torch::relu(big->forward(x));
    auto kept = torch::gelu(small->forward(norm->forward(x * 2))).softmax(-1) + x.narrow(1, 0, 8).sin();
    return std::vector<torch::Tensor>{quantized, kept};
  };
  auto x = torch::randn({32, 256});
  const auto want = fn(x);
  for (const char* backend : {"eager", "fused", "default"}) {
    auto f32 = torch::compile(fn, backend);
    auto q = torch::compile(fn, with(backend, Precision::Int8Dynamic));
    const auto got = tc_test::second_call(q, x), got32 = tc_test::second_call(f32, x);
    EXPECT_GT(rel_error(got[0], want[0]), 1e-5) << backend;  // quantized
    EXPECT_TRUE(torch::equal(got[1], got32[1])) << backend << ": the float32 part changed";
    EXPECT_TRUE(torch::allclose(got[1], want[1], 1e-5, 1e-6)) << backend;
  }
}

TEST(Precision, SavedPackagesKeepThePrecision) {
  if (!have_kernels()) GTEST_SKIP() << "no oneDNN in this build";
  const char* dir = std::getenv("TORCHCOMPILE_TEST_BINARY_DIR");
  if (!dir || !*dir) dir = "/tmp";  // run by hand or by the sanitizer scripts
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torchcompile_examples::Mlp m1;
  auto c = torch::compile(m1, with("default", Precision::Int8Dynamic));
  auto x = torch::randn({16, 784});
  const auto want = tc_test::second_call(c, x);
  const std::string path = std::string(dir) + "/precision_int8_mlp.tcpkg";
  torchcompile::save(c, path);
  torchcompile::LoadedModule loaded = torchcompile::load(path, "default");
  const auto texts = loaded.graph_texts();
  ASSERT_EQ(texts.size(), 1u);
  EXPECT_NE(texts[0].find("torchcompile::linear_int8_dynamic"), std::string::npos) << texts[0];
  EXPECT_TRUE(torch::allclose(loaded(x).toTensor(), want, 1e-5, 1e-5));
}
