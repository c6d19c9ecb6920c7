// The compiled optimizer step (compile_optimizer, src/compile/optimizer.cpp): against LibTorch's
// own SGD, Adam and AdamW steps, element by element, on every ISA this CPU has.
#include "support/test_util.h"

#include <torchcompile/compat.h>
#include <torchcompile/support/isa.h>
#include <torchcompile/torchcompile.h>

#include <gmock/gmock.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torchcompile::support::Isa;

// Distance in units in the last place between two floats (0 for two NaNs, huge for a NaN and a
// number).
int64_t ulps(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : std::numeric_limits<int64_t>::max();
  if (a == b) return 0;
  auto key = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? static_cast<int64_t>(std::numeric_limits<int32_t>::min()) - i : static_cast<int64_t>(i);
  };
  return std::llabs(key(a) - key(b));
}

struct Diff {
  int64_t max_ulps = 0;
  int64_t inexact = 0, total = 0;
  void add(const torch::Tensor& expected, const torch::Tensor& actual) {
    ASSERT_EQ(expected.sizes(), actual.sizes());
    torch::Tensor e = expected.detach().to(torch::kFloat).contiguous(), a = actual.detach().to(torch::kFloat).contiguous();
    const float *ep = e.data_ptr<float>(), *ap = a.data_ptr<float>();
    for (int64_t i = 0; i < e.numel(); ++i) {
      const int64_t d = ulps(ep[i], ap[i]);
      max_ulps = std::max(max_ulps, d);
      inexact += d != 0;
    }
    total += e.numel();
  }
};

enum class Kind { Sgd, Adam, AdamW };
const char* name(Kind k) { return k == Kind::Sgd ? "SGD" : k == Kind::Adam ? "Adam" : "AdamW"; }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Kind kind, std::vector<torch::optim::OptimizerParamGroup> groups,
                                                        std::mt19937& rng, std::string& described) {
  auto uni = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  std::ostringstream d;
  if (kind == Kind::Sgd) {
    torch::optim::SGDOptions o(uni(1e-3, 0.5));
    if (coin()) o.momentum(uni(0.1, 0.99));
    if (coin()) o.weight_decay(uni(1e-4, 0.1));
    if (o.momentum() != 0 && coin()) o.nesterov(true);
    else if (coin()) o.dampening(uni(0.0, 0.5));
    d << "SGD lr " << o.lr() << " momentum " << o.momentum() << " dampening " << o.dampening() << " wd "
      << o.weight_decay() << (o.nesterov() ? " nesterov" : "");
    described = d.str();
    for (auto& g : groups) g.set_options(std::make_unique<torch::optim::SGDOptions>(o));
    static_cast<torch::optim::SGDOptions&>(groups.back().options()).lr(o.lr() / 3);
    return std::make_unique<torch::optim::SGD>(groups, o);
  }
  auto fill = [&](auto o) {
    o.lr(uni(1e-4, 0.1));
    o.betas({uni(0.5, 0.95), uni(0.9, 0.9999)});
    o.eps(coin() ? 1e-8 : uni(1e-6, 1e-2));
    o.weight_decay(coin() ? 0.0 : uni(1e-4, 0.1));
    o.amsgrad(coin());
    d << name(kind) << " lr " << o.lr() << " betas " << std::get<0>(o.betas()) << ", " << std::get<1>(o.betas())
      << " eps " << o.eps() << " wd " << o.weight_decay() << (o.amsgrad() ? " amsgrad" : "");
    described = d.str();
    return o;
  };
  if (kind == Kind::Adam) {
    auto o = fill(torch::optim::AdamOptions());
    for (auto& g : groups) g.set_options(std::make_unique<torch::optim::AdamOptions>(o));
    static_cast<torch::optim::AdamOptions&>(groups.back().options()).lr(o.lr() / 3);
    return std::make_unique<torch::optim::Adam>(groups, o);
  }
  auto o = fill(torch::optim::AdamWOptions());
  for (auto& g : groups) g.set_options(std::make_unique<torch::optim::AdamWOptions>(o));
  static_cast<torch::optim::AdamWOptions&>(groups.back().options()).lr(o.lr() / 3);
  return std::make_unique<torch::optim::AdamW>(groups, o);
}

// The state entry of `p` found through the optimizer's key, as LibTorch finds it.
std::vector<torch::Tensor> state_of(torch::optim::Optimizer& opt, Kind kind, const torch::Tensor& p) {
  auto& map = opt.state();
  auto it = map.find(torchcompile::compat::optimizer_state_key<std::decay_t<decltype(map)>>(p.unsafeGetTensorImpl()));
  if (it == map.end()) return {};
  std::vector<torch::Tensor> out;
  if (kind == Kind::Sgd) {
    out = {static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer()};
  } else if (kind == Kind::Adam) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*it->second);
    out = {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()};
  } else {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    out = {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()};
  }
  return out;
}

// The ISAs this CPU runs, best first.
std::vector<const char*> isas() {
  std::vector<const char*> out;
  for (auto [isa, n] : {std::pair{Isa::Avx512, "avx512"}, std::pair{Isa::Avx2, "avx2"}, std::pair{Isa::Sse2, "scalar"}})
    if (torchcompile::support::cpu_has(isa)) out.push_back(n);
  return out;
}

// Random optimizers (kind, options, two parameter groups) over parameters of assorted sizes
// (vector tails, parallel chunks), one of them float64 and one non-contiguous (LibTorch's
// operations), one without a gradient; gradients with a NaN and an infinity now and then. Each
// step of the compiled optimizer starts from the state of LibTorch's and must give its
// parameters and state within 1 ULP (all but a few elements bit-equal).
TEST(CompiledOptimizer, RandomStepsMatchLibTorchOnEveryIsa) {
  for (const char* isa : isas()) {
    tc_test::ScopedEnv env("TORCHCOMPILE_ISA", isa);
    std::mt19937 rng(71);
    Diff fast_diff;
    for (int trial = 0; trial < 24; ++trial) {
      const Kind kind = static_cast<Kind>(trial % 3);
      torch::manual_seed(trial);
      std::vector<torch::Tensor> ref, mine;
      auto add = [&](torch::Tensor t) {
        ref.push_back(t.clone().requires_grad_(true));
        mine.push_back(t.clone().requires_grad_(true));
      };
      for (int64_t n : {1, 7, 33, 1000, 70001}) add(torch::randn({n}));
      add(torch::randn({40, 30}));
      add(torch::randn({5, 3}, torch::kDouble));
      ref.push_back(torch::randn({6, 9}).t().requires_grad_(true));  // non-contiguous leaves
      mine.push_back(ref.back().detach().clone().t().contiguous().t().requires_grad_(true));
      add(torch::randn({4}));  // never gets a gradient
      std::string described;
      std::mt19937 rng_copy = rng;
      auto split = [](std::vector<torch::Tensor> ps) {
        std::vector<torch::Tensor> a(ps.begin(), ps.begin() + 4), b(ps.begin() + 4, ps.end());
        return std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(a),
                                                               torch::optim::OptimizerParamGroup(b)};
      };
      auto ref_opt = make_optimizer(kind, split(ref), rng, described);
      auto my_opt = make_optimizer(kind, split(mine), rng_copy, described);
      auto compiled = torchcompile::compile_optimizer(*my_opt);
      EXPECT_STREQ(compiled.kind(), name(kind));
      SCOPED_TRACE(std::string("ISA ") + isa + ", trial " + std::to_string(trial) + ": " + described);
      for (int step = 0; step < 4; ++step) {
        for (size_t i = 0; i + 1 < ref.size(); ++i) {
          torch::Tensor g = torch::randn(ref[i].sizes(), ref[i].options().requires_grad(false)) * (step + 1);
          if ((trial + step) % 5 == 4 && g.numel() > 3) {
            g.view(-1)[1] = std::numeric_limits<float>::quiet_NaN();
            g.view(-1)[2] = std::numeric_limits<float>::infinity();
          }
          ref[i].mutable_grad() = g;
          mine[i].mutable_grad() = g.clone();
        }
        ref_opt->step();
        compiled.step();
        for (size_t i = 0; i < ref.size(); ++i) {
          SCOPED_TRACE("step " + std::to_string(step) + ", parameter " + std::to_string(i));
          Diff d;
          d.add(ref[i], mine[i]);
          auto rs = state_of(*ref_opt, kind, ref[i]), ms = state_of(*my_opt, kind, mine[i]);
          ASSERT_EQ(rs.size(), ms.size());
          for (size_t k = 0; k < rs.size(); ++k) {
            ASSERT_EQ(rs[k].defined(), ms[k].defined());
            if (rs[k].defined()) d.add(rs[k], ms[k]);
          }
          EXPECT_LE(d.max_ulps, 1);
          if (ref[i].scalar_type() == torch::kFloat && ref[i].is_contiguous()) {
            fast_diff.max_ulps = std::max(fast_diff.max_ulps, d.max_ulps);
            fast_diff.inexact += d.inexact;
            fast_diff.total += d.total;
          }
          // The next step starts from LibTorch's values.
          torch::NoGradGuard no_grad;
          mine[i].copy_(ref[i]);
          for (size_t k = 0; k < rs.size(); ++k)
            if (rs[k].defined()) ms[k].copy_(rs[k]);
        }
      }
      EXPECT_FALSE(state_of(*my_opt, kind, mine.back()).size() && state_of(*my_opt, kind, mine.back())[0].defined())
          << "a parameter without a gradient got state";
    }
    // Bit-equal but for a handful of elements (LibTorch's own scalar tails may round once more).
    EXPECT_LE(fast_diff.inexact, fast_diff.total / 1000) << isa << ": " << fast_diff.inexact << " of " << fast_diff.total;
    std::cout << "[ isa " << isa << " ] " << fast_diff.total - fast_diff.inexact << " of " << fast_diff.total
              << " values bit-equal to LibTorch's step, the rest within " << fast_diff.max_ulps << " ULP\n";
  }
}

// compiled.step() and opt.step() mixed on one optimizer, then the optimizer saved and loaded into
// a fresh one that goes on with compiled steps: the same parameters as LibTorch's steps alone.
TEST(CompiledOptimizer, MixesWithLibTorchStepsAndSavesItsState) {
  for (Kind kind : {Kind::Sgd, Kind::Adam, Kind::AdamW}) {
    SCOPED_TRACE(name(kind));
    torch::manual_seed(5);
    torch::nn::Linear ref(64, 32), mine(64, 32);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < ref->parameters().size(); ++i) mine->parameters()[i].copy_(ref->parameters()[i]);
    }
    auto make = [kind](torch::nn::Linear& m) -> std::unique_ptr<torch::optim::Optimizer> {
      if (kind == Kind::Sgd) return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      if (kind == Kind::Adam) return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
      return std::make_unique<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(1e-2));
    };
    auto ref_opt = make(ref), my_opt = make(mine);
    auto compiled = torchcompile::compile_optimizer(*my_opt);
    auto step = [](torch::nn::Linear& m, torch::optim::Optimizer& opt, const std::function<void()>& do_step, int s) {
      torch::manual_seed(100 + s);
      opt.zero_grad();
      m->forward(torch::randn({8, 64})).pow(2).mean().backward();
      do_step();
    };
    for (int s = 0; s < 6; ++s) {
      step(ref, *ref_opt, [&] { ref_opt->step(); }, s);
      step(mine, *my_opt, [&] {
        if (s % 2) {
          my_opt->step();
        } else {
          compiled.step();
        }
      }, s);
    }
    std::stringstream saved;
    torch::save(*my_opt, saved);
    auto loaded = make(mine);
    torch::load(*loaded, saved);
    auto compiled_loaded = torchcompile::compile_optimizer(*loaded);
    for (int s = 6; s < 10; ++s) {
      step(ref, *ref_opt, [&] { ref_opt->step(); }, s);
      step(mine, *loaded, [&] { compiled_loaded.step(); }, s);
    }
    for (size_t i = 0; i < ref->parameters().size(); ++i)
      EXPECT_TRUE(tc_test::tensors_close(ref->parameters()[i], mine->parameters()[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST(CompiledOptimizer, OtherOptimizersAreAnError) {
  torch::nn::Linear m(4, 4);
  torch::optim::RMSprop rms(m->parameters(), torch::optim::RMSpropOptions(0.01));
  try {
    torchcompile::compile_optimizer(rms);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("compile_optimizer: expected a torch::optim::SGD, Adam or AdamW, got "
                                               "torch::optim::RMSprop"));
  }
}

// A compiled module and a compiled optimizer train as eager LibTorch does (M1's MLP, SGD with
// momentum and AdamW, `default`).
TEST(CompiledOptimizer, TrainsACompiledModelAsEagerDoes) {
  for (Kind kind : {Kind::Sgd, Kind::AdamW}) {
    SCOPED_TRACE(name(kind));
    torch::manual_seed(9);
    torch::nn::Sequential ref(torch::nn::Linear(784, 128), torch::nn::ReLU(), torch::nn::Linear(128, 10));
    torch::nn::Sequential mine(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(ref->clone()));
    auto make = [kind](torch::nn::Sequential& m) -> std::unique_ptr<torch::optim::Optimizer> {
      if (kind == Kind::Sgd) return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      return std::make_unique<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(1e-3));
    };
    auto ref_opt = make(ref), my_opt = make(mine);
    auto compiled_step = torchcompile::compile_optimizer(*my_opt);
    auto compiled = torch::compile(mine, "default");
    torch::Tensor x = torch::randn({64, 784});
    torch::Tensor y = torch::randint(0, 10, {64}, torch::kLong);
    for (int s = 0; s < 5; ++s) {
      ref_opt->zero_grad();
      torch::nn::functional::cross_entropy(ref->forward(x), y).backward();
      ref_opt->step();
      my_opt->zero_grad();
      torch::nn::functional::cross_entropy(compiled(x), y).backward();
      compiled_step.step();
    }
    for (size_t i = 0; i < ref->parameters().size(); ++i)
      EXPECT_TRUE(tc_test::tensors_close(ref->parameters()[i], mine->parameters()[i], 1e-4, 1e-5)) << "parameter " << i;
  }
}

}  // namespace
