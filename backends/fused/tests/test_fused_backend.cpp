// The `fused` backend against eager LibTorch: every operator family it lowers (with NaN, ±inf and
// ±0 among the inputs), randomized programs of pointwise operators with broadcast inputs on each
// ISA the CPU runs (TORCHCOMPILE_ISA), partitions around operators it does not lower, `default`'s
// composition with onednn, AOT backward graphs, allocations, and no compiler at run time.
#include "support/test_util.h"

#include <torchcompile/compile/partitioner.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/support/logging.h>

#include <torchcompile/compat.h>

#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>

#include <atomic>
#include <functional>
#include <random>

using tc_test::ScopedEnv;
using tc_test::tensors_close;
using tc_test::tensors_close_or_as_accurate;

namespace {

constexpr double kRtol = 1e-4, kAtol = 1e-5;

// The ISAs this CPU runs, by TORCHCOMPILE_ISA name.
std::vector<std::string> isas() {
  std::vector<std::string> out{"scalar"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back("avx2");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    out.push_back("avx512");
  return out;
}

// Inputs with the special values in them: NaN, ±inf, ±0, large and tiny magnitudes.
torch::Tensor with_specials(torch::Tensor x) {
  auto flat = x.view({-1});
  const float specials[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f, 1e30f, -1e30f, 1e-30f, 88.f, -104.f, 3.f, -3.f};
  for (int64_t i = 0; i < flat.numel() && i < 12; ++i) flat[i * 7 % flat.numel()] = specials[i];
  return x;
}

using tc_test::partition_of;
using tc_test::second_call;

using UnaryFn = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

struct OpCase {
  const char* name;
  UnaryFn fn;
};

// One case per lowered operator (and per constant form); `x` and `y` have the same shape.
std::vector<OpCase> op_cases() {
  using T = const torch::Tensor&;
  namespace F = torch::nn::functional;
  return {
      {"add", [](T x, T y) { return x + y; }},
      {"add_alpha", [](T x, T y) { return torch::add(x, y, 0.5); }},
      {"add_scalar", [](T x, T) { return x + 0.25; }},
      {"sub", [](T x, T y) { return x - y; }},
      {"sub_alpha", [](T x, T y) { return torch::sub(x, y, 2); }},
      {"sub_scalar", [](T x, T) { return x - 3; }},
      {"rsub", [](T x, T y) { return torch::rsub(x, y); }},
      {"rsub_scalar", [](T x, T) { return torch::rsub(x, 1.5, 2.0); }},
      {"mul", [](T x, T y) { return x * y; }},
      {"mul_scalar", [](T x, T) { return x * 1.5; }},
      {"div", [](T x, T y) { return x / y; }},
      {"div_scalar", [](T x, T) { return x / 3.0; }},
      {"maximum", [](T x, T y) { return torch::maximum(x, y); }},
      {"minimum", [](T x, T y) { return torch::minimum(x, y); }},
      {"neg", [](T x, T) { return -x; }},
      {"abs", [](T x, T) { return x.abs(); }},
      {"relu", [](T x, T) { return torch::relu(x); }},
      {"sigmoid", [](T x, T) { return torch::sigmoid(x); }},
      {"tanh", [](T x, T) { return torch::tanh(x); }},
      {"exp", [](T x, T) { return torch::exp(x); }},
      {"expm1", [](T x, T) { return torch::expm1(x); }},
      {"log", [](T x, T) { return torch::log(x); }},
      {"log1p", [](T x, T) { return torch::log1p(x); }},
      {"sqrt", [](T x, T) { return torch::sqrt(x); }},
      {"rsqrt", [](T x, T) { return torch::rsqrt(x); }},
      {"reciprocal", [](T x, T) { return torch::reciprocal(x); }},
      {"sin", [](T x, T) { return torch::sin(x); }},
      {"cos", [](T x, T) { return torch::cos(x); }},
      {"erf", [](T x, T) { return torch::erf(x); }},
      {"gelu", [](T x, T) { return F::gelu(x); }},
      {"gelu_tanh", [](T x, T) { return F::gelu(x, F::GELUFuncOptions().approximate("tanh")); }},
      {"silu", [](T x, T) { return F::silu(x); }},
      {"hardsigmoid", [](T x, T) { return torch::hardsigmoid(x); }},
      {"hardswish", [](T x, T) { return torch::hardswish(x); }},
      {"leaky_relu", [](T x, T) { return F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(0.2)); }},
      {"hardtanh", [](T x, T) { return F::hardtanh(x); }},
      {"relu6", [](T x, T) { return F::relu6(x); }},
      {"clamp", [](T x, T) { return torch::clamp(x, -0.5, 0.75); }},
      {"clamp_min", [](T x, T) { return torch::clamp_min(x, 0.1); }},
      {"clamp_max", [](T x, T) { return torch::clamp_max(x, 0.1); }},
      {"pow2", [](T x, T) { return torch::pow(x, 2); }},
      {"pow3", [](T x, T) { return torch::pow(x, 3); }},
      {"pow_half", [](T x, T) { return torch::pow(x, 0.5); }},
      {"pow_minus1", [](T x, T) { return torch::pow(x, -1); }},
      {"threshold_backward", [](T x, T y) { return torch::threshold_backward(x, y, 0.0); }},
      {"sigmoid_backward", [](T x, T y) { return torch::sigmoid_backward(x, y); }},
      {"tanh_backward", [](T x, T y) { return torch::tanh_backward(x, y); }},
      {"gelu_backward", [](T x, T y) { return torch::gelu_backward(x, y); }},
      {"where", [](T x, T y) { return torch::where(x > y, x, y); }},
      {"where_scalar_other", [](T x, T y) { return torch::where(y < 0, x, 0.5); }},
      {"where_scalar_self", [](T x, T y) { return torch::where(x >= y, -2.0, y); }},
      {"masked_fill", [](T x, T y) { return x.masked_fill(y <= 0.1, -1e9); }},
      {"mul_mask", [](T x, T y) { return x * (y != 0.25) + (x == 3.0); }},
      {"logical", [](T x, T y) { return torch::where(torch::logical_or(torch::logical_and(x > 0, y > 0),
                                                                    torch::logical_not(x < y)), y, x); }},
  };
}

class FusedOps : public ::testing::TestWithParam<std::string> {
 protected:
  torch::NoGradGuard no_grad_;
};

// Each operator alone and after a multiply (so that the group has an intermediate), over a tile
// tail (1000 elements is no multiple of 16 or 8) with special values: compiled by `fused`, equal to
// eager within the tolerance, NaN where eager has NaN.
TEST_P(FusedOps, EachOperatorMatchesEager) {
  ScopedEnv isa("TORCHCOMPILE_ISA", GetParam());
  torch::manual_seed(1);
  for (const auto& c : op_cases()) {
    SCOPED_TRACE(c.name);
    auto x = with_specials(torch::randn({10, 100}) * 3);
    auto y = torch::randn({10, 100});
    auto fn = c.fn;
    auto chained = [fn](torch::Tensor a, torch::Tensor b) { return fn(a * 0.5f, b) + 1; };
    for (auto f : {UnaryFn(fn), UnaryFn(chained)}) {
      auto e = torchcompile::explain("fused", [f](torch::Tensor a, torch::Tensor b) { return f(a, b); }, x, y);
      ASSERT_EQ(e.compiled.size(), 1u);
      EXPECT_EQ(e.compiled[0].backend, "fused") << e;
      EXPECT_NE(partition_of(e).find("fused: "), std::string::npos) << e;
      auto compiled = torch::compile([f](torch::Tensor a, torch::Tensor b) { return f(a, b); }, "fused");
      EXPECT_TRUE(tensors_close(f(x, y), second_call(compiled, x, y), kRtol, kAtol));
    }
  }
}

// Comparisons and logical operators whose bool results leave the program, bool tensors among the
// inputs (in place, broadcast, transposed), and NaN (which compares false and not equal).
TEST_P(FusedOps, MasksMatchEager) {
  ScopedEnv isa("TORCHCOMPILE_ISA", GetParam());
  torch::manual_seed(2);
  using T = const torch::Tensor&;
  struct Case {
    const char* name;
    std::function<std::vector<torch::Tensor>(T, T, T)> fn;
  };
  const std::vector<Case> cases = {
      {"lt le gt ge eq ne", [](T x, T y, T) { return std::vector<torch::Tensor>{x < y, x <= y, x > 0.5, x >= y, x == y, x != 0}; }},
      {"logical", [](T x, T y, T m) {
         return std::vector<torch::Tensor>{torch::logical_and(x > y, m), torch::logical_or(x < 0, m),
                                           torch::logical_not(torch::logical_and(x > 0, m))};
       }},
      {"bool inputs in arithmetic", [](T x, T, T m) { return std::vector<torch::Tensor>{x * m + m, x.masked_fill(m, 1.5)}; }},
      {"mask and value out", [](T x, T y, T m) {
         auto k = (x + y) > 0;
         return std::vector<torch::Tensor>{k, x.masked_fill(k, 0.0) * 2, torch::logical_and(k, m)};
       }},
  };
  for (const auto& c : cases) {
    for (int variant = 0; variant < 3; ++variant) {
      auto x = with_specials(torch::randn({30, 70}));
      auto y = torch::randn({30, 70});
      y.view({-1})[5] = x.view({-1})[5];  // an equal pair
      torch::Tensor m = torch::rand({30, 70}) > 0.5;
      if (variant == 1) m = torch::rand({70}) > 0.5;          // broadcast
      if (variant == 2) m = (torch::rand({70, 30}) > 0.5).t();  // transposed
      auto compiled = torch::compile(c.fn, "fused");
      auto e = torchcompile::explain("fused", c.fn, x, y, m);
      // (Every output has the iteration shape and eager's contiguous layout: the first operand of
      // each operator is a contiguous tensor of that shape.)
      EXPECT_NE(partition_of(e).find("fused: "), std::string::npos) << c.name << "\n" << e;
      const auto want = c.fn(x, y, m);
      const auto got = second_call(compiled, x, y, m);
      ASSERT_EQ(want.size(), got.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_TRUE(tensors_close(want[i], got[i], kRtol, kAtol)) << c.name << " output " << i << " variant " << variant;
    }
  }
}

// Row operations: softmax and log-softmax over the last dimension, layer_norm over the trailing
// dimensions with and without weight and bias, reductions over blocks of adjacent dimensions, with
// special values in some rows.
TEST_P(FusedOps, RowOperationsMatchEager) {
  ScopedEnv isa("TORCHCOMPILE_ISA", GetParam());
  torch::manual_seed(3);
  namespace F = torch::nn::functional;
  auto ln_w = torch::randn({37}), ln_b = torch::randn({37});
  std::vector<std::pair<const char*, std::function<torch::Tensor(const torch::Tensor&)>>> cases = {
      {"softmax", [](const torch::Tensor& x) { return torch::softmax(x, -1); }},
      {"log_softmax", [](const torch::Tensor& x) { return torch::log_softmax(x, 2); }},
      {"layer_norm", [](const torch::Tensor& x) { return F::layer_norm(x, F::LayerNormFuncOptions({37})); }},
      {"layer_norm_affine",
       [=](const torch::Tensor& x) { return F::layer_norm(x, F::LayerNormFuncOptions({37}).weight(ln_w).bias(ln_b)); }},
      {"layer_norm_2d", [](const torch::Tensor& x) { return F::layer_norm(x, F::LayerNormFuncOptions({5, 37}).eps(1e-3)); }},
      {"sum_last", [](const torch::Tensor& x) { return x.sum(-1); }},
      {"sum_first_keepdim", [](const torch::Tensor& x) { return x.sum(0, /*keepdim=*/true); }},
      {"sum_middle", [](const torch::Tensor& x) { return x.sum(1); }},
      {"sum_trailing", [](const torch::Tensor& x) { return x.sum({1, 2}); }},
      {"sum_all", [](const torch::Tensor& x) { return x.sum(); }},
      {"mean_last_keepdim", [](const torch::Tensor& x) { return x.mean(-1, /*keepdim=*/true); }},
      {"mean_leading", [](const torch::Tensor& x) { return x.mean(std::vector<int64_t>{0, 1}); }},
      {"amax_last", [](const torch::Tensor& x) { return x.amax(-1); }},
      {"amax_first", [](const torch::Tensor& x) { return x.amax(0); }},
      {"amin_middle", [](const torch::Tensor& x) { return x.amin(1, /*keepdim=*/true); }},
      {"var_last", [](const torch::Tensor& x) { return x.var(-1); }},
      {"std_middle_biased_keepdim", [](const torch::Tensor& x) { return x.std(1, /*unbiased=*/false, true); }},
      {"var_first", [](const torch::Tensor& x) { return x.var(0); }},
      {"var_all", [](const torch::Tensor& x) { return x.var(); }},
  };
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    for (int64_t rows : {1, 3, 400}) {  // 400 * 5 * 37 elements: parallel over rows
      auto x = torch::randn({rows, 5, 37}) * 4;
      if (rows == 3) x[1][2][7] = NAN, x[2][0][0] = -INFINITY, x[2][4][3] = 1e20f;
      auto fn = [f](torch::Tensor x) { return f(x); };
      auto e = torchcompile::explain("fused", fn, x);
      EXPECT_NE(partition_of(e).find("fused: "), std::string::npos) << e;
      EXPECT_EQ(e.compiled[0].backend, "fused") << e;
      auto compiled = torch::compile(fn, "fused");
      EXPECT_TRUE(tensors_close(f(x), second_call(compiled, x), kRtol, kAtol)) << rows;
    }
  }
  // Around a pointwise run: two programs.
  auto fn = [](torch::Tensor x) { return torch::softmax(x * 0.125, -1) * 2 + 1; };
  auto x = torch::randn({16, 128});
  auto e = torchcompile::explain("fused", fn, x);
  EXPECT_NE(partition_of(e).find("fused: softmax (rows of 128"), std::string::npos) << e;
  EXPECT_NE(partition_of(e).find("fused: mul+add"), std::string::npos) << e;
  auto compiled = torch::compile(fn, "fused");
  EXPECT_TRUE(tensors_close(fn(x), second_call(compiled, x), kRtol, kAtol));
}

// The gradients of softmax and log-softmax (AOT backward graphs hold them) as row programs.
TEST_P(FusedOps, SoftmaxBackwardMatchesEager) {
  ScopedEnv isa("TORCHCOMPILE_ISA", GetParam());
  torch::manual_seed(4);
  for (bool log : {false, true}) {
    for (int64_t rows : {3, 700}) {
      for (int64_t cols : {1, 37, 128}) {
        auto x = torch::randn({rows, cols}) * 3;
        auto y = log ? torch::log_softmax(x, -1) : torch::softmax(x, -1);
        auto g = torch::randn({rows, cols});
        auto fn = [log](torch::Tensor g, torch::Tensor y) {
          return log ? at::_log_softmax_backward_data(g, y, -1, at::kFloat)
                     : at::_softmax_backward_data(g, y, -1, at::kFloat);
        };
        auto e = torchcompile::explain("fused", fn, g, y);
        EXPECT_NE(partition_of(e).find(log ? "fused: log_softmax_backward" : "fused: softmax_backward"),
                  std::string::npos)
            << e;
        auto compiled = torch::compile(fn, "fused");
        EXPECT_TRUE(tensors_close(fn(g, y), second_call(compiled, g, y), kRtol, kAtol)) << log << " " << rows << "x" << cols;
      }
    }
  }
}

// native_layer_norm (with each row's mean and rstd) and native_layer_norm_backward with every
// output mask, as AOT graphs hold them, with and without weight and bias, against eager.
TEST_P(FusedOps, NativeLayerNormAndItsGradientMatchEager) {
  ScopedEnv isa("TORCHCOMPILE_ISA", GetParam());
  torch::manual_seed(5);
  for (bool affine : {false, true}) {
    for (int64_t rows : {3, 900}) {  // 900 x 2 x 37: several blocks of rows, in parallel
      const std::vector<int64_t> shape{2, 37};
      auto x = torch::randn({rows, 2, 37}) * 2 + 0.5;
      auto w = affine ? c10::optional<torch::Tensor>(torch::randn(shape)) : c10::nullopt;
      auto b = affine ? c10::optional<torch::Tensor>(torch::randn(shape)) : c10::nullopt;
      auto fwd = [shape, w, b](torch::Tensor x) {
        auto [y, mean, rstd] = at::native_layer_norm(x, shape, w, b, 1e-5);
        return std::vector<torch::Tensor>{y, mean, rstd};
      };
      auto e = torchcompile::explain("fused", fwd, x);
      EXPECT_NE(partition_of(e).find("fused: native_layer_norm"), std::string::npos) << e;
      auto cf = torch::compile(fwd, "fused");
      auto want = fwd(x), got = second_call(cf, x);
      for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(tensors_close(want[i], got[i], kRtol, kAtol)) << "forward " << i;

      auto g = torch::randn({rows, 2, 37});
      const auto mean = want[1], rstd = want[2];
      for (int m = 1; m < 8; ++m) {
        std::array<bool, 3> mask{(m & 1) != 0, affine && (m & 2) != 0, affine && (m & 4) != 0};
        if (!mask[0] && !mask[1] && !mask[2]) continue;
        auto bwd = [shape, w, b, mask](torch::Tensor g, torch::Tensor x, torch::Tensor mean, torch::Tensor rstd) {
          auto [dx, dw, db] = at::native_layer_norm_backward(g, x, shape, mean, rstd, w, b, mask);
          std::vector<torch::Tensor> out;
          for (const auto& t : {dx, dw, db})
            if (t.defined()) out.push_back(t);
          return out;
        };
        auto eb = torchcompile::explain("fused", bwd, g, x, mean, rstd);
        EXPECT_NE(partition_of(eb).find("fused: layer_norm_backward"), std::string::npos) << eb;
        auto cb = torch::compile(bwd, "fused");
        auto wb = bwd(g, x, mean, rstd), gb = second_call(cb, g, x, mean, rstd);
        ASSERT_EQ(wb.size(), gb.size());
        for (size_t i = 0; i < wb.size(); ++i)
          EXPECT_TRUE(tensors_close(wb[i], gb[i], kRtol, 1e-4)) << "mask " << m << " gradient " << i << " rows " << rows;
      }
    }
  }
}

// ---- randomized programs ------------------------------------------------------------------------

// A random program over a pool of values: x (the iteration shape), b (a shape that broadcasts to
// it), then each step applies one operator to values of the pool and appends the result.
struct Step {
  int op;
  int a, b;
  float s;
};
struct Program {
  std::vector<int64_t> shape, bshape;
  std::vector<Step> steps;
  std::vector<int> outputs;
};

constexpr int kNumOps = 16;

torch::Tensor apply_step(const Step& st, const std::vector<torch::Tensor>& pool) {
  const auto& a = pool[st.a];
  const auto& b = pool[st.b];
  namespace F = torch::nn::functional;
  switch (st.op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / (b.abs() + 1);
    case 4: return a * st.s;
    case 5: return a + st.s;
    case 6: return torch::tanh(a);
    case 7: return torch::sigmoid(a);
    case 8: return F::gelu(a);
    case 9: return torch::relu(a);
    case 10: return torch::sin(a);
    case 11: return torch::exp(a.clamp(-20, 20));
    case 12: return torch::log1p(a.abs());
    case 13: return torch::maximum(a, b);
    case 14: return F::silu(a);
    default: return torch::sqrt(a.abs() + st.s * st.s);
  }
}

// Two outputs (the same value twice for a program with one).
std::tuple<torch::Tensor, torch::Tensor> run(const Program& p, torch::Tensor x, torch::Tensor b) {
  std::vector<torch::Tensor> pool{x, b};
  for (const auto& st : p.steps) pool.push_back(apply_step(st, pool));
  return {pool[p.outputs.front()], pool[p.outputs.back()]};
}

Program random_program(std::mt19937& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  Program p;
  const int rank = 1 + pick(3);
  for (int d = 0; d < rank; ++d) p.shape.push_back(1 + pick(d == rank - 1 ? 70 : 9));
  if (pick(8) == 0) p.shape[0] = 300 + pick(200);  // large enough for several tiles and threads
  // b: the full shape, its last dimension, a column, or a 0-dim tensor.
  switch (pick(4)) {
    case 0: p.bshape = p.shape; break;
    case 1: p.bshape = {p.shape.back()}; break;
    case 2:
      p.bshape = p.shape;
      p.bshape.back() = 1;
      break;
    default: p.bshape = {}; break;
  }
  const int n = 2 + pick(10);
  for (int i = 0; i < n; ++i) {
    const int pool = 2 + i;
    // the first operand never `b` alone (its result would not have the iteration shape)
    Step st{pick(kNumOps), pick(pool), pick(pool), static_cast<float>(pick(9)) * 0.25f - 1.f};
    if (st.a == 1) st.a = 0;
    p.steps.push_back(st);
  }
  const int values = 2 + n;
  p.outputs.push_back(values - 1);
  if (pick(2)) p.outputs.push_back(2 + pick(n));
  return p;
}

TEST_P(FusedOps, RandomProgramsMatchEager) {
  ScopedEnv isa("TORCHCOMPILE_ISA", GetParam());
  const char* env_seed = std::getenv("TORCHCOMPILE_FUZZ_SEED");
  const uint32_t seed = env_seed ? static_cast<uint32_t>(std::atoi(env_seed)) : 7;
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  for (int i = 0; i < 120; ++i) {
    Program p = random_program(rng);
    auto x = torch::randn(p.shape) * 2;
    auto b = torch::randn(p.bshape);
    if (i % 5 == 0) x = with_specials(x);
    auto fn = [p](torch::Tensor x, torch::Tensor b) { return run(p, x, b); };
    // Every operator of these programs is one the backend lowers: one program runs it all.
    auto e = torchcompile::explain("fused", fn, x, b);
    ASSERT_EQ(e.compiled.size(), 1u);
    ASSERT_EQ(e.compiled[0].backend, "fused") << e;
    ASSERT_EQ(partition_of(e).find("interpreter"), std::string::npos) << e;
    auto compiled = torch::compile(fn, "fused");
    // Against eager, or, where a composition is ill-conditioned (sin of exp, sqrt of gelu's tail),
    // at least as accurate as eager against the float64 program.
    auto matches = [&](torch::Tensor x, torch::Tensor b, const std::tuple<torch::Tensor, torch::Tensor>& got) {
      auto [e0, e1] = fn(x, b);
      auto [r0, r1] = fn(x.to(torch::kDouble), b.to(torch::kDouble));
      auto [n0, n1] = fn(tc_test::nudged_by_one_ulp(x, seed), tc_test::nudged_by_one_ulp(b, seed + 1));
      auto m0 = tensors_close_or_as_accurate(e0, std::get<0>(got), r0, n0, kRtol, kAtol);
      return m0 ? tensors_close_or_as_accurate(e1, std::get<1>(got), r1, n1, kRtol, kAtol) : m0;
    };
    auto first = matches(x, b, second_call(compiled, x, b));
    ASSERT_TRUE(first) << "seed " << seed << ", program " << i << "\n" << torchcompile::explain("fused", fn, x, b);
    // A replay with new values (same shapes) too.
    auto x2 = torch::randn(p.shape), b2 = torch::randn(p.bshape);
    ASSERT_TRUE(matches(x2, b2, compiled(x2, b2))) << "seed " << seed << ", replay " << i;
  }
}

// Two arithmetic operations become one instruction (one pass over the tile), rounded as ATen's two
// operations: the results are bitwise those of eager (a fused multiply-add would differ).
TEST_P(FusedOps, MergedArithmeticRoundsAsEager) {
  ScopedEnv isa("TORCHCOMPILE_ISA", GetParam());
  torch::manual_seed(3);
  using T = const torch::Tensor&;
  struct Case {
    const char* name;
    std::function<torch::Tensor(T, T, T)> fn;
    const char* instructions;
  };
  const std::vector<Case> cases = {
      {"scale and shift", [](T a, T, T) { return a * 1.7 + 0.3; }, "(1 instructions"},
      {"a * b - c", [](T a, T b, T c) { return a * b - c; }, "(1 instructions"},
      {"c - a * b", [](T a, T b, T c) { return c - a * b; }, "(1 instructions"},
      {"(a + b) * c", [](T a, T b, T c) { return (a + b) * c; }, "(1 instructions"},
      {"c / (a - b)", [](T a, T b, T c) { return c / (a - b); }, "(1 instructions"},
      {"a * b + c * a", [](T a, T b, T c) { return a * b + c * a; }, "(2 instructions"},
      {"(a * b) used twice", [](T a, T b, T c) { auto t = a * b; return t * t + c; }, "(2 instructions"},
      {"M2's tail", [](T a, T b, T c) { return torch::sigmoid(a * 1.5 + 0.25) * b - torch::tanh(c); },
       "(4 instructions"},
  };
  for (const auto& c : cases) {
    auto a = torch::randn({37, 129}), b = torch::randn({37, 129}), cc = torch::randn({129});
    auto e = torchcompile::explain("fused", c.fn, a, b, cc);
    EXPECT_NE(partition_of(e).find(c.instructions), std::string::npos) << c.name << "\n" << e;
    auto compiled = torch::compile(c.fn, "fused");
    auto got = second_call(compiled, a, b, cc);
    auto want = c.fn(a, b, cc);
    if (std::string(c.name) == "M2's tail") {
      EXPECT_TRUE(tensors_close(want, got, kRtol, kAtol)) << c.name;
    } else {
      EXPECT_TRUE(torch::equal(want, got)) << c.name << ": max difference " << (want - got).abs().max().item<float>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, FusedOps, ::testing::ValuesIn(isas()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---- partitions ---------------------------------------------------------------------------------

TEST(FusedBackend, PartitionsAroundOperatorsItDoesNotLower) {
  torch::NoGradGuard no_grad;
  auto fn = [](torch::Tensor x, torch::Tensor w) {
    auto h = torch::tanh(x * 2 + 1);
    auto m = torch::mm(h, w);      // not pointwise: the interpreter
    return torch::sigmoid(m) * m;  // a second group
  };
  auto x = torch::randn({16, 32}), w = torch::randn({32, 8});
  auto e = torchcompile::explain("fused", fn, x, w);
  const std::string part = partition_of(e);
  EXPECT_NE(part.find("fused: mul+add+tanh"), std::string::npos) << e;
  EXPECT_NE(part.find("fused: sigmoid+mul"), std::string::npos) << e;
  EXPECT_NE(part.find("interpreter: 1 operator(s)"), std::string::npos) << e;
  auto compiled = torch::compile(fn, "fused");
  EXPECT_TRUE(tensors_close(fn(x, w), second_call(compiled, x, w), kRtol, kAtol));
}

TEST(FusedBackend, DeclinesWhatItCannotFuseWithAReason) {
  torch::NoGradGuard no_grad;
  auto e = torchcompile::explain("fused", [](torch::Tensor x) { return torch::cumsum(x, 0); }, torch::randn({4, 4}));
  ASSERT_EQ(e.compiled.size(), 1u);
  EXPECT_EQ(e.compiled[0].backend, "interpreter");
  EXPECT_NE(e.str().find("no operator of the graph is one that fused compiles"), std::string::npos) << e;
  // Integer tensors stay with ATen (float32 only).
  auto ei = torchcompile::explain("fused", [](torch::Tensor x) { return x * 2 + 1; }, torch::arange(6));
  EXPECT_EQ(ei.compiled[0].backend, "interpreter") << ei;
}

TEST(FusedBackend, DeclinesUnderAutograd) {
  auto x = torch::randn({8}, torch::requires_grad());
  auto e = torchcompile::explain("fused", [](torch::Tensor x) { return torch::tanh(x) * 2; }, x);
  EXPECT_EQ(e.compiled[0].backend, "interpreter");
  EXPECT_NE(e.str().find("grad mode is enabled"), std::string::npos) << e;
  auto compiled = torch::compile([](torch::Tensor x) { return torch::tanh(x) * 2; }, "fused");
  auto y = compiled(x);
  y.sum().backward();
  EXPECT_TRUE(tensors_close((1 - torch::tanh(x).pow(2)) * 2, x.grad()));
}

// Inputs read in place or gathered: a transposed (non-contiguous) input and a broadcast one.
TEST(FusedBackend, StridedAndBroadcastInputs) {
  torch::NoGradGuard no_grad;
  auto fn = [](torch::Tensor a, torch::Tensor b, torch::Tensor c) { return torch::tanh(a.t() * 0 + a.t()) + b * c; };
  auto a = torch::randn({70, 50}), b = torch::randn({50, 1}), c = torch::randn({70});
  auto compiled = torch::compile(fn, "fused");
  EXPECT_TRUE(tensors_close(fn(a, b, c), second_call(compiled, a, b, c), kRtol, kAtol));
}

// A group allocates only its outputs: one tensor for a chain of seven operators (eager: seven).
// contiguous() and clone() of a transposed, sliced or chunked tensor are copies the backend makes
// (gathering through the strides); contiguous() of a contiguous tensor is an alias eager code may
// write through, and a clone that keeps non-contiguous strides has a layout the programs do not
// write: both stay with the interpreter.
TEST(FusedBackend, CopiesIntoContiguousMemory) {
  torch::NoGradGuard no_grad;
  using T = const torch::Tensor&;
  struct Case {
    const char* name;
    std::function<torch::Tensor(T)> fn;
    bool fused_copy;
  };
  const std::vector<Case> cases = {
      {"t().contiguous()", [](T x) { return x.t().contiguous(); }, true},
      {"chunk().contiguous()", [](T x) { return x.chunk(3, -1)[1].contiguous() * 2; }, true},
      {"transpose + view, as attention",
       [](T x) { return x.view({x.size(0), 4, 15}).transpose(0, 1).contiguous().view({4, -1}); }, true},
      {"slice.clone(contiguous)", [](T x) { return x.slice(1, 3, 20, 2).clone(at::MemoryFormat::Contiguous) + 1; }, true},
      {"contiguous of contiguous", [](T x) { return x.contiguous() * 3; }, false},
      {"clone keeping strides", [](T x) { return x.t().clone(); }, false},
  };
  for (const auto& c : cases) {
    for (int64_t rows : {6, 3000}) {  // one tile, and many across threads
      auto x = torch::randn({rows, 60});
      auto e = torchcompile::explain("fused", c.fn, x);
      const std::string parts = partition_of(e) + e.compiled.at(0).backend;
      EXPECT_EQ(parts.find("contiguous") != std::string::npos || parts.find("clone") != std::string::npos,
                c.fused_copy)
          << c.name << "\n" << e;
      auto compiled = torch::compile(c.fn, "fused");
      auto got = second_call(compiled, x);
      auto want = c.fn(x);
      EXPECT_TRUE(torch::equal(want, got)) << c.name;
      EXPECT_EQ(want.strides(), got.strides()) << c.name;
    }
  }
}

TEST(FusedBackend, AGroupAllocatesOnlyItsOutputs) {
  torch::NoGradGuard no_grad;
  static torchcompile::compat::CountingAllocator counting(c10::GetCPUAllocator());
  auto fn = [](torch::Tensor x) { return torch::sigmoid(torch::gelu(x * 1.5 + 0.25)) * x - torch::tanh(x); };
  auto x = torch::randn({256, 256});
  auto compiled = torch::compile(fn, "fused");
  compiled(x);  // trace and compile
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  counting.reset();
  auto y = compiled(x);
  const int fused_allocations = counting.count();
  counting.reset();
  auto expected = fn(x);
  const int eager_allocations = counting.count();
  c10::SetCPUAllocator(counting.base(), /*priority=*/101);
  EXPECT_EQ(fused_allocations, 1);
  EXPECT_GE(eager_allocations, 7);  // one per operator (and the scalars ATen wraps into tensors)
  EXPECT_TRUE(tensors_close(expected, y, kRtol, kAtol));
}

// No process and no compiler at run time: compiling and running work with PATH emptied.
TEST(FusedBackend, NeedsNoCompilerAtRunTime) {
  torch::NoGradGuard no_grad;
  ScopedEnv path("PATH", "");
  auto fn = [](torch::Tensor x) { return torch::sigmoid(torch::gelu(x * 1.5 + 0.25)) * x - torch::tanh(x); };
  auto x = torch::randn({64, 64});
  auto e = torchcompile::explain("fused", fn, x);
  EXPECT_EQ(e.compiled[0].backend, "fused") << e;
  auto compiled = torch::compile(fn, "fused");
  EXPECT_TRUE(tensors_close(fn(x), second_call(compiled, x), kRtol, kAtol));
}

TEST(FusedBackend, UnknownIsaIsAnError) {
  torch::NoGradGuard no_grad;
  ScopedEnv isa("TORCHCOMPILE_ISA", "avx9000");
  // The backend fails with the message; the call runs eagerly (with a warning), as for any
  // backend error.
  auto e = torchcompile::explain("fused", [](torch::Tensor x) { return torch::tanh(x); }, torch::randn({4}));
  EXPECT_NE(e.str().find("TORCHCOMPILE_ISA: expected one of avx512, avx2, scalar (or sse2), got 'avx9000'"),
            std::string::npos)
      << e;
}

// ---- AOT: the backward graph's pointwise operators -----------------------------------------------

// A graph with size symbols made of pointwise operators is one tile program for every size: new
// sizes build nothing (compile_per_shape would log each), and the results are eager's, with
// inputs broadcast along symbolic and constant dimensions.
TEST(FusedBackend, OneProgramServesEverySizeOfAGraphWithSymbols) {
  torch::NoGradGuard no_grad;
  auto bias = torch::randn({8});
  auto fn = [&](torch::Tensor x, torch::Tensor scale) {
    auto y = torch::sigmoid(x * scale + bias);  // [B, T, 8] * [B, 1, 1] + [8]
    return std::vector<torch::Tensor>{y, y.tanh() - x};
  };
  auto compiled = torch::compile(fn, torchcompile::CompileOptions("fused").with_dynamic(true));
  torchcompile::logging::set_logs("dynamic");
  ::testing::internal::CaptureStderr();
  std::vector<std::string> failures;
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {7, 2}, {4, 9}, {3, 5}, {12, 40}, {2, 3}}) {
    auto x = torch::randn({b, t, 8}), scale = torch::randn({b, 1, 1});
    auto expected = fn(x, scale);
    auto got = compiled(x, scale);
    for (size_t i = 0; i < 2; ++i)
      if (!tensors_close(expected[i], got[i], kRtol, kAtol)) failures.push_back(std::to_string(b) + "x" + std::to_string(t));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::reset_logs();
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_EQ(log.find("compile_per_shape: new sizes"), std::string::npos) << log;
  const auto entries = compiled.state().entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0]->symbolic_graph());
  EXPECT_EQ(entries[0]->num_specializations(), 1u);
  // A wrong size at run time is an error, not a wrong result.
  EXPECT_THROW(compiled(torch::randn({3, 5, 8}), torch::randn({4, 1, 1})), c10::Error);
}

// Row operations in a graph with size symbols: each is one row program for every size (the rows,
// a softmax's row length and a reduction's blocks read from the inputs at each call), beside the
// graph's tile programs. Random sizes of a batch and a sequence, each forward against eager; no new
// size builds anything (compile_per_shape would log it), and the explain names the programs.
TEST(FusedBackend, RowProgramsServeEverySizeOfAGraphWithSymbols) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  auto w = torch::randn({16}), b = torch::randn({16});
  using Fn = std::function<torch::Tensor(const torch::Tensor&)>;
  const std::vector<std::pair<std::string, Fn>> forwards = {
      {"softmax over a constant", [](const torch::Tensor& x) { return torch::softmax(x * 2, -1) + 1; }},
      {"softmax over a symbol",
       [](const torch::Tensor& x) { return torch::softmax(x.matmul(x.transpose(1, 2)) * 0.25, -1) - 0.5; }},
      {"log_softmax", [](const torch::Tensor& x) { return torch::log_softmax(x.sigmoid(), -1) * 3; }},
      {"layer_norm", [&](const torch::Tensor& x) { return torch::layer_norm(x + 1, {16}, w, b, 1e-5) * 2; }},
      {"sum over a symbol", [](const torch::Tensor& x) { return x.exp().sum({1}, true) + x; }},
      {"mean over a symbol", [](const torch::Tensor& x) { return x.tanh().mean({1}) * 2; }},
      {"amax", [](const torch::Tensor& x) { return x.abs().amax({-1}) - 1; }},
      {"var over a symbol", [](const torch::Tensor& x) { return (x * 3).var(std::vector<int64_t>{1}, /*unbiased=*/true, true) + x; }},
      {"std over two symbols", [](const torch::Tensor& x) { return (x - 1).std(std::vector<int64_t>{0, 1}, /*unbiased=*/false) * 2; }},
  };
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> size(2, 40);
  for (const auto& [name, fn] : forwards) {
    auto compiled = torch::compile(fn, torchcompile::CompileOptions("fused").with_dynamic(true));
    torchcompile::logging::set_logs("dynamic");
    ::testing::internal::CaptureStderr();
    std::string failure;
    for (int call = 0; call < 8; ++call) {
      auto x = torch::randn({size(rng), size(rng), 16});
      auto got = compiled(x);
      if (!tensors_close(fn(x), got, kRtol, kAtol) && failure.empty()) failure = c10::str(x.sizes());
    }
    const std::string log = ::testing::internal::GetCapturedStderr();
    torchcompile::logging::reset_logs();
    EXPECT_TRUE(failure.empty()) << name << " at " << failure;
    EXPECT_EQ(log.find("compile_per_shape: new sizes"), std::string::npos) << name << "\n" << log;
    const auto entries = compiled.state().entries();
    ASSERT_EQ(entries.size(), 1u) << name;
    EXPECT_TRUE(entries[0]->symbolic_graph()) << name;
  }
  // The explain of one names its row program as one for every size.
  auto e = torchcompile::explain(torchcompile::CompileOptions("fused").with_dynamic(true), forwards[1].second,
                                 torch::randn({3, 7, 16}));
  EXPECT_NE(partition_of(e).find("fused: softmax (rows of any length, every size"), std::string::npos) << e;
}

// Training with size symbols: the forward's and backward's row operations (native_layer_norm and
// its gradient, softmax and its gradient) at random batch sizes give eager's results and
// gradients.
TEST(FusedBackend, RowProgramsWithSymbolsTrainLikeEager) {
  torch::manual_seed(5);
  auto net = torch::nn::Sequential(torch::nn::Linear(12, 32), torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})),
                                   torch::nn::Tanh(), torch::nn::Linear(32, 8), torch::nn::Softmax(-1));
  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
  auto compiled = torch::compile(net.ptr(), torchcompile::CompileOptions("aot_fused").with_dynamic(true));
  std::mt19937 rng(2);
  std::uniform_int_distribution<int64_t> batch(2, 30);
  for (int call = 0; call < 8; ++call) {
    auto x = torch::randn({batch(rng), 12});
    reference->zero_grad();
    net->zero_grad();
    auto ye = reference->forward(x), yc = compiled(x);
    ASSERT_TRUE(tensors_close(ye, yc, kRtol, kAtol)) << "batch " << x.size(0);
    (ye * ye.cos()).sum().backward();
    (yc * yc.cos()).sum().backward();
    auto pe = reference->parameters(), pc = net->parameters();
    for (size_t k = 0; k < pe.size(); ++k)
      EXPECT_TRUE(tensors_close(pe[k].grad(), pc[k].grad(), kRtol, kAtol)) << "batch " << x.size(0) << ", parameter " << k;
  }
}

// A scalar argument computed from a size (`x * x.size(0)` here; the `div(%expand, %s0)` of a
// mean's gradient in AOT's backward graphs) is a size expression: one program for every size
// would bake in the example's value, so such a graph gets programs per size.
TEST(FusedBackend, ScalarArgumentsThatAreSizeExpressionsAreNotBakedIn) {
  torch::NoGradGuard no_grad;
  auto fn = [](torch::Tensor x) { return (x * x.size(0)).sigmoid() + 1; };
  auto compiled = torch::compile(fn, torchcompile::CompileOptions("fused").with_dynamic(true));
  for (int64_t b : {3, 5, 7, 9, 4, 11, 5}) {
    auto x = torch::randn({b, 8}) * 0.1;
    EXPECT_TRUE(tensors_close(fn(x), compiled(x), kRtol, kAtol)) << "batch " << b;
  }
}

TEST(FusedBackend, AotBackwardGraphsMatchEager) {
  torch::manual_seed(0);
  auto net = torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::GELU(), torch::nn::Linear(32, 32),
                                   torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})), torch::nn::Tanh(),
                                   torch::nn::Linear(32, 4), torch::nn::Sigmoid(), torch::nn::Softmax(-1));
  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
  // The forward and backward graphs' pointwise operators run in fused programs.
  {
    auto probe = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
    auto e = torchcompile::explain("aot_fused", probe, torch::randn({8, 16}));
    ASSERT_EQ(e.compiled.size(), 1u);
    EXPECT_EQ(e.compiled[0].backend, "aot_fused") << e;
    for (const char* part : {"fused: gelu (", "fused: tanh (", "fused: sigmoid (", "fused: gelu_backward",
                             "fused: tanh_backward", "fused: sigmoid_backward", "fused: native_layer_norm",
                             "fused: layer_norm_backward", "fused: softmax (", "fused: softmax_backward"})
      EXPECT_NE(partition_of(e).find(part), std::string::npos) << part << "\n" << e;
  }
  auto compiled = torch::compile(net.ptr(), "aot_fused");
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({8, 16});
    reference->zero_grad();
    net->zero_grad();
    auto ye = reference->forward(x);
    auto yc = compiled(x);
    EXPECT_TRUE(tensors_close(ye, yc, kRtol, kAtol));
    (ye * ye).sum().backward();
    (yc * yc).sum().backward();
    auto pe = reference->parameters(), pc = net->parameters();
    for (size_t k = 0; k < pe.size(); ++k) EXPECT_TRUE(tensors_close(pe[k].grad(), pc[k].grad(), kRtol, kAtol)) << k;
  }
}

}  // namespace
