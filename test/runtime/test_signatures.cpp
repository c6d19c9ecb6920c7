// Forward signatures real models use: tuple and pair arguments (an LSTM's (h, c) state),
// nested, with optional and vector elements; structs returned through torchcompile::Fields or
// TORCHCOMPILE_FIELDS; optional results; mutable and move-only lambdas; and tuple arguments
// through the module call boundary (torchcompile::call with hooks). Every case compares the
// compiled results (and, under aot_eager, the gradients) with eager LibTorch.
#include "support/test_util.h"

#include <functional>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

using tc_test::tensors_close;

namespace {

const char* const kBackends[] = {"eager", "aot_eager"};

// ---- LSTM state: forward(x, (h, c)) -> (h', (h', c')) ------------------------------------------

using State = std::tuple<torch::Tensor, torch::Tensor>;

// torch::nn::LSTMCell's computation, written out (gates = W_ih x + b_ih + W_hh h + b_hh).
struct LstmCellImpl : torch::nn::Cloneable<LstmCellImpl> {
  int64_t in, hidden;
  torch::nn::Linear ih{nullptr}, hh{nullptr};
  LstmCellImpl(int64_t in, int64_t hidden) : in(in), hidden(hidden) { reset(); }
  void reset() override {
    ih = register_module("ih", torch::nn::Linear(in, 4 * hidden));
    hh = register_module("hh", torch::nn::Linear(hidden, 4 * hidden));
  }
  std::tuple<torch::Tensor, State> forward(torch::Tensor x, State hx) {
    auto [h, c] = hx;
    auto gates = ih->forward(x) + hh->forward(h);
    auto chunks = gates.chunk(4, 1);
    auto i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
    auto c2 = f * c + i * g;
    auto h2 = o * c2.tanh();
    return {h2, State{h2, c2}};
  }
};
TORCH_MODULE(LstmCell);

void expect_state_close(const State& e, const State& a) {
  EXPECT_TRUE(tensors_close(std::get<0>(e), std::get<0>(a)));
  EXPECT_TRUE(tensors_close(std::get<1>(e), std::get<1>(a)));
}

TEST(Signatures, LstmStateTupleArgumentAndNestedTupleResult) {
  torch::manual_seed(0);
  LstmCell cell(5, 3);
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    auto fast = torch::compile(cell, backend);
    // Unrolled over a sequence: the state returned by one step is the next step's argument.
    State se{torch::zeros({2, 3}), torch::zeros({2, 3})}, sc = se;
    for (int t = 0; t < 4; ++t) {
      auto x = torch::randn({2, 5});
      auto [ye, se2] = cell->forward(x, se);
      auto [yc, sc2] = fast(x, sc);
      EXPECT_TRUE(tensors_close(ye, yc));
      expect_state_close(se2, sc2);
      se = se2;
      sc = sc2;
    }
    // fast->forward and a tuple of references (std::tie) as the argument; the caller's tensors
    // are left alone.
    auto x = torch::randn({2, 5});
    auto h = torch::randn({2, 3}), c = torch::randn({2, 3});
    auto [ye, se2] = cell->forward(x, State{h, c});
    auto [yc, sc2] = fast->forward(x, std::tie(h, c));
    EXPECT_TRUE(tensors_close(ye, yc));
    expect_state_close(se2, sc2);
    EXPECT_TRUE(h.defined() && c.defined());
    EXPECT_LE(fast.state().entries().size(), 2u);
  }
}

TEST(Signatures, LstmStateTrainsUnderAotEager) {
  torch::manual_seed(1);
  LstmCell cell(4, 6);
  auto reference = std::dynamic_pointer_cast<LstmCellImpl>(cell->clone());
  ASSERT_TRUE(reference);
  auto fast = torch::compile(cell, "aot_eager");
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({3, 4}, torch::requires_grad());
    auto h = torch::randn({3, 6}, torch::requires_grad()), c = torch::randn({3, 6}, torch::requires_grad());
    auto x2 = x.detach().clone().requires_grad_(), h2 = h.detach().clone().requires_grad_(),
         c2 = c.detach().clone().requires_grad_();
    for (auto& p : cell->parameters()) p.mutable_grad() = torch::Tensor();
    for (auto& p : reference->parameters()) p.mutable_grad() = torch::Tensor();

    auto [ye, se] = reference->forward(x, State{h, c});
    auto [yc, sc] = fast(x2, State{h2, c2});
    EXPECT_TRUE(tensors_close(ye, yc));
    expect_state_close(se, sc);
    (ye.pow(2).sum() + std::get<1>(se).sum() * 0.5).backward();
    (yc.pow(2).sum() + std::get<1>(sc).sum() * 0.5).backward();
    EXPECT_TRUE(tensors_close(x.grad(), x2.grad()));
    EXPECT_TRUE(tensors_close(h.grad(), h2.grad()));
    EXPECT_TRUE(tensors_close(c.grad(), c2.grad()));
    auto pe = reference->named_parameters(), pc = cell->named_parameters();
    for (const auto& item : pe) {
      SCOPED_TRACE(item.key());
      ASSERT_TRUE(pc[item.key()].grad().defined());
      EXPECT_TRUE(tensors_close(item.value().grad(), pc[item.key()].grad()));
    }
  }
}

// ---- pairs, nested tuples, optional and vector elements --------------------------------------

TEST(Signatures, PairArgumentAndPairResult) {
  auto fn = [](std::pair<torch::Tensor, torch::Tensor> p, torch::Tensor x) {
    return std::make_pair(p.first * x + p.second, (p.first - p.second).relu());
  };
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    auto fast = torch::compile(fn, backend);
    for (int i = 0; i < 3; ++i) {
      auto p = std::make_pair(torch::randn({4}), torch::randn({4}));
      auto x = torch::randn({4});
      auto e = fn(p, x);
      auto c = fast(p, x);
      EXPECT_TRUE(tensors_close(e.first, c.first));
      EXPECT_TRUE(tensors_close(e.second, c.second));
    }
    EXPECT_EQ(fast.state().entries().size(), 1u);
  }
}

using Nested = std::tuple<torch::Tensor, std::tuple<torch::Tensor, double>, std::pair<int64_t, torch::Tensor>>;

TEST(Signatures, NestedTupleArgumentWithScalars) {
  auto fn = [](Nested n) {
    auto& [a, inner, p] = n;
    return std::get<0>(inner) * std::get<1>(inner) + a * static_cast<double>(p.first) - p.second;
  };
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    auto fast = torch::compile(fn, backend);
    for (int i = 0; i < 3; ++i) {
      Nested n{torch::randn({3}), {torch::randn({3}), 1.5}, {2, torch::randn({3})}};
      EXPECT_TRUE(tensors_close(fn(n), fast(n)));
    }
    // Scalars inside a tuple are specialized like top-level ones.
    Nested n{torch::randn({3}), {torch::randn({3}), -0.25}, {7, torch::randn({3})}};
    EXPECT_TRUE(tensors_close(fn(n), fast(n)));
    EXPECT_EQ(fast.state().entries().size(), 2u);
  }
}

enum class Activation { Relu, Tanh };

TEST(Signatures, EnumArgumentsAreSpecializedByValue) {
  auto fn = [](torch::Tensor x, std::pair<Activation, double> act) {
    return (act.first == Activation::Relu ? x.relu() : x.tanh()) * act.second;
  };
  auto fast = torch::compile(fn, "eager");
  for (int i = 0; i < 2; ++i) {
    for (Activation a : {Activation::Relu, Activation::Tanh}) {
      auto x = torch::randn({6});
      EXPECT_TRUE(tensors_close(fn(x, {a, 0.5}), fast(x, std::make_pair(a, 0.5))));
    }
  }
  EXPECT_EQ(fast.state().entries().size(), 2u);
}

TEST(Signatures, OptionalTensorArgumentPresentAndAbsent) {
  auto fn = [](torch::Tensor x, c10::optional<torch::Tensor> bias,
               std::tuple<torch::Tensor, c10::optional<torch::Tensor>> t) {
    auto y = x * std::get<0>(t);
    if (bias) y = y + *bias;
    if (std::get<1>(t)) y = y - std::get<1>(t)->sin();
    return y;
  };
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    auto fast = torch::compile(fn, backend);
    for (int i = 0; i < 2; ++i) {
      auto x = torch::randn({2, 3}), b = torch::randn({3}), s = torch::randn({2, 3}), o = torch::randn({2, 3});
      using T = std::tuple<torch::Tensor, c10::optional<torch::Tensor>>;
      EXPECT_TRUE(tensors_close(fn(x, b, T{s, o}), fast(x, b, T{s, o})));
      EXPECT_TRUE(tensors_close(fn(x, c10::nullopt, T{s, o}), fast(x, c10::nullopt, T{s, o})));
      EXPECT_TRUE(tensors_close(fn(x, b, T{s, c10::nullopt}), fast(x, b, T{s, c10::nullopt})));
      EXPECT_TRUE(tensors_close(fn(x, c10::nullopt, T{s, c10::nullopt}), fast(x, c10::nullopt, T{s, c10::nullopt})));
    }
    EXPECT_EQ(fast.state().entries().size(), 4u) << "presence is part of the signature";
  }
}

TEST(Signatures, VectorArgumentsTopLevelAndInsideATuple) {
  auto fn = [](std::vector<torch::Tensor> xs, std::tuple<std::vector<torch::Tensor>, torch::Tensor> t) {
    auto y = torch::stack(xs).sum(0);
    for (const auto& z : std::get<0>(t)) y = y * z;
    return std::vector<torch::Tensor>{y + std::get<1>(t), y.exp()};
  };
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    auto fast = torch::compile(fn, backend);
    for (int n = 1; n <= 3; ++n) {
      for (int i = 0; i < 2; ++i) {
        std::vector<torch::Tensor> xs, zs;
        for (int k = 0; k < n; ++k) xs.push_back(torch::randn({4}));
        for (int k = 0; k < 4 - n; ++k) zs.push_back(torch::randn({4}));
        auto b = torch::randn({4});
        auto t = std::make_tuple(zs, b);
        auto e = fn(xs, t);
        auto c = fast(xs, t);
        ASSERT_EQ(c.size(), 2u);
        EXPECT_TRUE(tensors_close(e[0], c[0]));
        EXPECT_TRUE(tensors_close(e[1], c[1]));
      }
    }
    EXPECT_EQ(fast.state().entries().size(), 3u) << "list lengths are part of the signature";
  }
}

// ---- optional results ----------------------------------------------------------------------

TEST(Signatures, OptionalTensorResult) {
  auto fn = [](torch::Tensor x, bool with_aux) {
    c10::optional<torch::Tensor> aux;
    if (with_aux) aux = x.abs().sqrt();
    return std::make_tuple(x * 2, aux);
  };
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    auto fast = torch::compile(fn, backend);
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({5});
      for (bool with_aux : {true, false}) {
        auto [ye, ae] = fn(x, with_aux);
        auto [yc, ac] = fast(x, with_aux);
        EXPECT_TRUE(tensors_close(ye, yc));
        ASSERT_EQ(ae.has_value(), ac.has_value());
        if (ae) EXPECT_TRUE(tensors_close(*ae, *ac));
      }
    }
  }
}

}  // namespace

// ---- structs as results --------------------------------------------------------------------

namespace vae {

// Registered with a torchcompile::Fields specialization (below, at global scope).
struct VAEOutput {
  torch::Tensor recon, mu, log_var;
};

// Registered with TORCHCOMPILE_FIELDS in its own namespace; fields of any returnable type,
// including a nested registered struct, a tuple, a vector and an optional.
struct Stats {
  torch::Tensor kl;
  std::vector<torch::Tensor> per_layer;
};
TORCHCOMPILE_FIELDS(Stats, kl, per_layer);

struct Detailed {
  VAEOutput out;
  Stats stats;
  std::tuple<torch::Tensor, torch::Tensor> z_and_eps;
  c10::optional<torch::Tensor> extra;
};
TORCHCOMPILE_FIELDS(Detailed, out, stats, z_and_eps, extra);

}  // namespace vae

template <>
struct torchcompile::Fields<vae::VAEOutput> {
  static auto get(vae::VAEOutput& o) { return std::tie(o.recon, o.mu, o.log_var); }
};

namespace {

struct VaeImpl : torch::nn::Cloneable<VaeImpl> {
  torch::nn::Linear enc{nullptr}, mu{nullptr}, log_var{nullptr}, dec{nullptr};
  VaeImpl() { reset(); }
  void reset() override {
    enc = register_module("enc", torch::nn::Linear(8, 6));
    mu = register_module("mu", torch::nn::Linear(6, 2));
    log_var = register_module("log_var", torch::nn::Linear(6, 2));
    dec = register_module("dec", torch::nn::Linear(2, 8));
  }
  // The noise is an argument so that eager and compiled calls see the same draw.
  vae::VAEOutput forward(torch::Tensor x, torch::Tensor eps) {
    auto h = enc->forward(x).relu();
    vae::VAEOutput o;
    o.mu = mu->forward(h);
    o.log_var = log_var->forward(h);
    o.recon = dec->forward(o.mu + eps * (0.5 * o.log_var).exp()).sigmoid();
    return o;
  }
  vae::Detailed detailed(torch::Tensor x, torch::Tensor eps, bool with_extra) {
    vae::Detailed d;
    d.out = forward(x, eps);
    auto z = d.out.mu + eps * (0.5 * d.out.log_var).exp();
    d.stats.kl = -0.5 * (1 + d.out.log_var - d.out.mu.pow(2) - d.out.log_var.exp()).sum();
    d.stats.per_layer = {enc->weight.abs().mean(), dec->weight.abs().mean(), z.mean()};
    d.z_and_eps = {z, eps};
    if (with_extra) d.extra = d.out.recon.mean(1);
    return d;
  }
};
TORCH_MODULE(Vae);

void expect_vae_close(const vae::VAEOutput& e, const vae::VAEOutput& c) {
  EXPECT_TRUE(tensors_close(e.recon, c.recon));
  EXPECT_TRUE(tensors_close(e.mu, c.mu));
  EXPECT_TRUE(tensors_close(e.log_var, c.log_var));
}

TEST(Signatures, StructResultThroughFieldsSpecialization) {
  torch::manual_seed(2);
  Vae vae_net;
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    auto fast = torch::compile(vae_net, backend);
    for (int i = 0; i < 3; ++i) {
      auto x = torch::rand({4, 8}), eps = torch::randn({4, 2});
      vae::VAEOutput e = vae_net->forward(x, eps);
      vae::VAEOutput c = fast(x, eps);
      expect_vae_close(e, c);
    }
    EXPECT_EQ(fast.state().entries().size(), 1u);
  }
}

TEST(Signatures, StructResultTrainsUnderAotEager) {
  torch::manual_seed(3);
  Vae vae_net;
  auto reference = std::dynamic_pointer_cast<VaeImpl>(vae_net->clone());
  auto fast = torch::compile(vae_net, "aot_eager");
  for (int step = 0; step < 2; ++step) {
    auto x = torch::rand({4, 8}), eps = torch::randn({4, 2});
    for (auto& p : vae_net->parameters()) p.mutable_grad() = torch::Tensor();
    for (auto& p : reference->parameters()) p.mutable_grad() = torch::Tensor();
    auto loss = [&](const vae::VAEOutput& o) {
      return torch::binary_cross_entropy(o.recon, x, {}, at::Reduction::Sum) -
             0.5 * (1 + o.log_var - o.mu.pow(2) - o.log_var.exp()).sum();
    };
    auto e = reference->forward(x, eps);
    auto c = fast(x, eps);
    expect_vae_close(e, c);
    loss(e).backward();
    loss(c).backward();
    auto pe = reference->named_parameters(), pc = vae_net->named_parameters();
    for (const auto& item : pe) {
      SCOPED_TRACE(item.key());
      EXPECT_TRUE(tensors_close(item.value().grad(), pc[item.key()].grad()));
    }
  }
}

TEST(Signatures, NestedStructResultThroughTheMacro) {
  torch::manual_seed(4);
  Vae vae_net;
  auto detailed = [m = vae_net.ptr()](torch::Tensor x, torch::Tensor eps, bool with_extra) {
    return m->detailed(x, eps, with_extra);
  };
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    auto fast = torch::compile(detailed, backend);
    for (int i = 0; i < 2; ++i) {
      for (bool with_extra : {false, true}) {
        auto x = torch::rand({3, 8}), eps = torch::randn({3, 2});
        vae::Detailed e = detailed(x, eps, with_extra);
        vae::Detailed c = fast(x, eps, with_extra);
        expect_vae_close(e.out, c.out);
        EXPECT_TRUE(tensors_close(e.stats.kl, c.stats.kl));
        ASSERT_EQ(c.stats.per_layer.size(), 3u);
        for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(tensors_close(e.stats.per_layer[k], c.stats.per_layer[k]));
        EXPECT_TRUE(tensors_close(std::get<0>(e.z_and_eps), std::get<0>(c.z_and_eps)));
        EXPECT_TRUE(tensors_close(std::get<1>(e.z_and_eps), std::get<1>(c.z_and_eps)));
        ASSERT_EQ(c.extra.has_value(), with_extra);
        if (with_extra) EXPECT_TRUE(tensors_close(*e.extra, *c.extra));
      }
    }
  }
}

// A registered struct is also accepted as an argument (its fields flattened in order).
TEST(Signatures, RegisteredStructArgument) {
  auto fn = [](vae::VAEOutput o, vae::Stats s) { return o.recon * s.kl + o.mu.sum() - s.per_layer.at(1); };
  auto fast = torch::compile(fn, "eager");
  for (int i = 0; i < 3; ++i) {
    vae::VAEOutput o{torch::randn({2}), torch::randn({2}), torch::randn({2})};
    vae::Stats s{torch::randn({2}), {torch::randn({2}), torch::randn({2})}};
    EXPECT_TRUE(tensors_close(fn(o, s), fast(o, s)));
  }
  EXPECT_EQ(fast.state().entries().size(), 1u);
}

// ---- mutable and move-only lambdas ---------------------------------------------------------

TEST(Signatures, MutableLambdaKeepsItsStateAcrossCalls) {
  int seen = 0;
  auto fast = torch::compile(
      [n = 0, &seen](torch::Tensor x) mutable {
        seen = ++n;  // runs when the forward is traced (each new shape), as documented
        return x * 2;
      },
      torchcompile::CompileOptions("eager").with_dynamic(false));  // static: a trace per shape
  for (int size = 1; size <= 3; ++size) {
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({size});
      EXPECT_TRUE(tensors_close(x * 2, fast(x)));
    }
  }
  // One lambda object, called on each of the three traces: its counter went 1, 2, 3 (a copy per
  // call would have left it at 1).
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(fast.state().entries().size(), 3u);

  // The same under aot_eager and with verify, which runs the forward again next to each call.
  int verified = 0;
  auto checked = torch::compile(
      [n = 0, &verified](torch::Tensor x) mutable {
        verified = ++n;
        return x.sin();
      },
      torchcompile::CompileOptions("aot_eager").with_verify());
  auto x = torch::randn({4});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(tensors_close(x.sin(), checked(x)));
  EXPECT_GE(verified, 3);
  EXPECT_EQ(checked.state().verify_failure(), "");
}

TEST(Signatures, MoveOnlyLambda) {
  auto calls = std::make_shared<int>(0);
  auto fast = torch::compile(
      [state = std::make_unique<int>(10), calls](torch::Tensor x) mutable {
        ++*state;
        *calls = *state;
        return x + 1;
      },
      "eager");
  auto x = torch::randn({3});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(tensors_close(x + 1, fast(x)));
  EXPECT_TRUE(tensors_close(torch::ones({2}) * 2, fast(torch::ones({2}))));
  EXPECT_EQ(*calls, 12);  // two traces of the one lambda object
}

// ---- tuple arguments through the module call boundary (hooks) ------------------------------

struct StackedImpl : torch::nn::Module {
  LstmCell first{nullptr}, second{nullptr};
  torch::nn::Linear head{nullptr};
  StackedImpl() {
    first = register_module("first", LstmCell(4, 5));
    second = register_module("second", LstmCell(5, 5));
    head = register_module("head", torch::nn::Linear(5, 2));
  }
  torch::Tensor forward(torch::Tensor x, torch::Tensor h, torch::Tensor c) {
    auto [y1, s1] = torchcompile::call(first, x, std::make_tuple(h, c));
    auto [h1, c1] = s1;
    // A tuple of references: the module call boundary copies it and must not clear h1 and c1.
    auto [y2, s2] = torchcompile::call(second, y1, std::tie(h1, c1));
    return torchcompile::call(head, y2 + h1 + c1 + std::get<1>(s2));
  }
};
TORCH_MODULE(Stacked);

TEST(Signatures, TupleArgumentsThroughTorchcompileCallWithHooks) {
  torch::manual_seed(5);
  for (const char* backend : kBackends) {
    for (bool traceable : {false, true}) {
      SCOPED_TRACE(std::string(backend) + (traceable ? " traceable" : " opaque"));
      Stacked net;
      std::vector<size_t> in_counts, out_counts;
      // A pre-hook scaling the cell state (the third flattened tensor: x, h, c) and a forward
      // hook recording the flattened sizes and scaling the returned output.
      auto pre = torchcompile::register_forward_pre_hook(
          net->first,
          [&](torch::nn::Module&, const torchcompile::Tensors& in) -> std::optional<torchcompile::Tensors> {
            if (!traceable) in_counts.push_back(in.size());
            return torchcompile::Tensors{in.at(0), in.at(1), in.at(2) * 0.5};
          },
          torchcompile::HookOptions().traceable(traceable));
      auto post = torchcompile::register_forward_hook(
          net->first,
          [&](torch::nn::Module&, const torchcompile::Tensors&,
              const torchcompile::Tensors& out) -> std::optional<torchcompile::Tensors> {
            if (!traceable) out_counts.push_back(out.size());
            return torchcompile::Tensors{out.at(0) * 2, out.at(1), out.at(2)};
          },
          torchcompile::HookOptions().traceable(traceable));
      auto fast = torch::compile(net, backend);
      for (int i = 0; i < 3; ++i) {
        auto x = torch::randn({2, 4}), h = torch::randn({2, 5}), c = torch::randn({2, 5});
        auto e = net->forward(x, h, c);  // eager: the boundary fires the hooks too
        auto a = fast(x, h, c);
        EXPECT_TRUE(tensors_close(e, a));
      }
      if (!traceable) {
        // The hooks saw (x, h, c) and (y, h', c') on every call, eager and compiled.
        EXPECT_EQ(in_counts, std::vector<size_t>(6, 3));
        EXPECT_EQ(out_counts, std::vector<size_t>(6, 3));
      }
      pre.remove();
      post.remove();
    }
  }
}

TEST(Signatures, TupleArgumentOfACompiledRootWithHooks) {
  torch::manual_seed(6);
  LstmCell cell(3, 4);
  int fired = 0;
  // A non-traceable hook on the compiled root runs around its compiled graph on every call.
  auto handle = torchcompile::register_forward_hook(
      cell, [&](torch::nn::Module&, const torchcompile::Tensors& in, const torchcompile::Tensors& out) {
        EXPECT_EQ(in.size(), 3u);
        EXPECT_EQ(out.size(), 3u);
        ++fired;
      });
  auto fast = torch::compile(cell, "eager");
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({2, 3});
    State s{torch::randn({2, 4}), torch::randn({2, 4})};
    auto [ye, se] = cell->forward(x, s);
    auto [yc, sc] = fast(x, s);
    EXPECT_TRUE(tensors_close(ye, yc));
    expect_state_close(se, sc);
  }
  EXPECT_EQ(fired, 3);
  handle.remove();
}

}  // namespace
