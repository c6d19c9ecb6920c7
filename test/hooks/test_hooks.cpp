// Module hooks, eager vs compiled: firing order and counts, what hooks see, replacement of
// inputs, outputs and gradients, inlining of traceable hooks, opaque call_module nodes, leaf
// modules, module paths, and the hook guard.
#include "support/test_util.h"

#include <gmock/gmock.h>

#include <torchcompile/support/logging.h>

#include <map>

namespace tc = torchcompile;
using tc::Tensors;
using tc_test::CompileCounter;
using tc_test::error_of;
using tc_test::tensors_close;
using ::testing::HasSubstr;

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return tc::call(fc2, torch::relu(tc::call(fc1, x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    block = register_module("block", Block());
    head = register_module("head", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return tc::call(head, tc::call(block, x)).tanh(); }
  Block block{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

// Two nets with the same weights: one runs eagerly, one is compiled; hooks are registered on
// both in the same way.
struct Pair {
  Net eager;
  Net compiled_net;
  Pair() {
    torch::manual_seed(0);
    eager = Net();
    compiled_net = Net();
    torch::NoGradGuard no_grad;
    auto src = eager->parameters();
    auto dst = compiled_net->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
};

// Records what each hook saw: an event per firing and the tensors.
struct Recorder {
  std::vector<std::string> events;
  std::vector<at::Tensor> seen;

  void add_all(Net net, const std::string& tag, bool traceable = false) {
    auto opts = tc::HookOptions().traceable(traceable);
    for (const auto& [name, m] : std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
             {"net", net.ptr()}, {"block", net->block.ptr()}, {"fc1", net->block->fc1.ptr()},
             {"fc2", net->block->fc2.ptr()}, {"head", net->head.ptr()}}) {
      tc::register_forward_pre_hook(
          m,
          [this, name = name, tag](torch::nn::Module&, const Tensors& in) {
            events.push_back(tag + name + ".pre");
            seen.push_back(in.at(0).detach().clone());
          },
          opts);
      tc::register_forward_hook(
          m,
          [this, name = name, tag](torch::nn::Module&, const Tensors& in, const Tensors& out) {
            events.push_back(tag + name + ".fwd");
            seen.push_back(out.at(0).detach().clone());
          },
          opts);
    }
  }
};

std::vector<std::string> strip_tags(std::vector<std::string> v) {
  for (auto& s : v) s = s.substr(s.find(':') + 1);
  return v;
}

TEST(Hooks, ForwardHooksFireInTheSameOrderWithTheSameTensorsEagerAndCompiled) {
  Pair p;
  Recorder eager_rec, compiled_rec;
  eager_rec.add_all(p.eager, "e:");
  compiled_rec.add_all(p.compiled_net, "c:");
  auto fast = tc::compile(p.compiled_net, "eager");
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({5, 8});
    auto expected = tc::call(p.eager, x);
    auto actual = fast(x);
    EXPECT_TRUE(tensors_close(expected, actual));
  }
  ASSERT_EQ(eager_rec.events.size(), 10u * 10u);
  EXPECT_EQ(strip_tags(eager_rec.events), strip_tags(compiled_rec.events));
  EXPECT_EQ(std::vector<std::string>(eager_rec.events.begin(), eager_rec.events.begin() + 10),
            (std::vector<std::string>{"e:net.pre", "e:block.pre", "e:fc1.pre", "e:fc1.fwd", "e:fc2.pre", "e:fc2.fwd",
                                      "e:block.fwd", "e:head.pre", "e:head.fwd", "e:net.fwd"}));
  ASSERT_EQ(eager_rec.seen.size(), compiled_rec.seen.size());
  for (size_t i = 0; i < eager_rec.seen.size(); ++i) EXPECT_TRUE(tensors_close(eager_rec.seen[i], compiled_rec.seen[i]));
  EXPECT_EQ(fast.state().num_entries(), 1u);
}

TEST(Hooks, TraceableHooksAreInlinedIntoOneGraphAndFireOnEveryCall) {
  Pair p;
  CompileCounter cc;
  // Traceable hooks that transform tensors: scale fc1's input, shift head's output.
  auto add = [](Net net) {
    tc::register_forward_pre_hook(
        net->block->fc1, [](torch::nn::Module&, const Tensors& in) { return Tensors{in[0] * 2}; },
        tc::HookOptions().traceable());
    tc::register_forward_hook(
        net->head, [](torch::nn::Module&, const Tensors&, const Tensors& out) { return Tensors{out[0] + 1}; },
        tc::HookOptions().traceable());
  };
  add(p.eager);
  add(p.compiled_net);
  auto fast = tc::compile(p.compiled_net, cc.backend());
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({3, 8});
    EXPECT_TRUE(tensors_close(tc::call(p.eager, x), fast(x)));
  }
  EXPECT_EQ(cc.frames(), 1);
  auto gm = fast.state().entries().front()->graph_module();
  size_t modules = 0;
  bool mul_in_fc1 = false, add_in_head = false;
  for (const auto& n : gm->graph().nodes()) {
    if (n->kind() == tc::ir::NodeKind::CallModule) ++modules;
    if (n->target().rfind("aten::mul", 0) == 0 && n->module_path() == "block.fc1") mul_in_fc1 = true;
    if (n->target().rfind("aten::add", 0) == 0 && n->module_path() == "head") add_in_head = true;
  }
  EXPECT_EQ(modules, 0u) << cc.graphs().front();
  EXPECT_TRUE(mul_in_fc1) << cc.graphs().front();
  EXPECT_TRUE(add_in_head) << cc.graphs().front();
}

TEST(Hooks, OpsCarryTheirModulePath) {
  Net net;
  CompileCounter cc;
  auto fast = tc::compile(net, cc.backend());
  fast(torch::randn({2, 8}));
  auto gm = fast.state().entries().front()->graph_module();
  std::map<std::string, std::string> path_of;
  for (const auto& n : gm->graph().nodes())
    if (n->kind() == tc::ir::NodeKind::CallFunction) path_of[n->target()] += n->module_path() + ";";
  EXPECT_THAT(path_of["aten::relu"], HasSubstr("block;"));
  EXPECT_THAT(path_of["aten::tanh"], HasSubstr(";"));
  EXPECT_EQ(path_of["aten::tanh"], ";");  // the root's own op
  std::string linear_paths = path_of["aten::addmm"] + path_of["aten::linear"] + path_of["aten::matmul"];
  EXPECT_THAT(linear_paths, HasSubstr("block.fc1"));
  EXPECT_THAT(linear_paths, HasSubstr("block.fc2"));
  EXPECT_THAT(linear_paths, HasSubstr("head"));
}

TEST(Hooks, NonTraceableHookMakesAnOpaqueCallModuleNodeThatRunsItsHookEveryCall) {
  Pair p;
  CompileCounter cc;
  int fired = 0;
  tc::register_forward_hook(p.compiled_net->block->fc2, [&](torch::nn::Module&, const Tensors&, const Tensors&) {
    ++fired;
  });
  auto fast = tc::compile(p.compiled_net, cc.backend());
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({4, 8});
    EXPECT_TRUE(tensors_close(p.eager->forward(x), fast(x)));
  }
  EXPECT_EQ(fired, 10);
  auto gm = fast.state().entries().front()->graph_module();
  std::vector<std::string> modules;
  for (const auto& n : gm->graph().nodes())
    if (n->kind() == tc::ir::NodeKind::CallModule) modules.push_back(n->target());
  EXPECT_EQ(modules, std::vector<std::string>{"block.fc2"});
  // fc2's own forward is compiled as a graph of its own (the second graph the backend saw).
  EXPECT_EQ(cc.frames(), 2);
}

TEST(Hooks, ReplacedInputsAndOutputsTakeEffectEagerAndCompiled) {
  Pair p;
  auto add = [](Net net) {
    tc::register_forward_pre_hook(net->block, [](torch::nn::Module&, const Tensors& in) {
      return std::optional<Tensors>(Tensors{in[0].flip(0)});
    });
    tc::register_forward_hook(net->block->fc1, [](torch::nn::Module&, const Tensors&, const Tensors& out) {
      return std::optional<Tensors>(Tensors{out[0] * -1});
    });
  };
  auto x = torch::randn({6, 8});
  auto plain = p.eager->forward(x);
  add(p.eager);
  add(p.compiled_net);
  auto fast = tc::compile(p.compiled_net, "eager");
  for (int i = 0; i < 3; ++i) {
    auto expected = tc::call(p.eager, x);
    auto actual = fast(x);
    EXPECT_TRUE(tensors_close(expected, actual));
    EXPECT_FALSE(torch::allclose(plain, actual));
  }
}

TEST(Hooks, ActivationCaptureWorksOnEveryCompiledCall) {
  Pair p;
  std::map<std::string, at::Tensor> eager_feats, compiled_feats;
  auto capture = [](Net net, std::map<std::string, at::Tensor>& feats) {
    for (const auto& item : net->named_modules("", /*include_self=*/false)) {
      if (item.value()->children().size() != 0) continue;
      tc::register_forward_hook(item.value(), [&feats, name = item.key()](torch::nn::Module&, const Tensors&,
                                                                        const Tensors& out) { feats[name] = out[0]; });
    }
  };
  capture(p.eager, eager_feats);
  capture(p.compiled_net, compiled_feats);
  auto fast = tc::compile(p.compiled_net, "eager");
  for (int i = 0; i < 5; ++i) {
    eager_feats.clear();
    compiled_feats.clear();
    auto x = torch::randn({2, 8});
    tc::call(p.eager, x);
    fast(x);
    ASSERT_EQ(compiled_feats.size(), 3u) << "call " << i;
    for (const auto& [name, t] : eager_feats) EXPECT_TRUE(tensors_close(t, compiled_feats.at(name))) << name;
  }
}

TEST(Hooks, RemovingAHookAfterCompilationRecompilesWithTheReason) {
  Net net;
  int fired = 0;
  auto h = tc::register_forward_hook(net->head, [&](torch::nn::Module&, const Tensors&, const Tensors& out) {
    ++fired;
    return std::optional<Tensors>(Tensors{out[0] * 0});
  });
  auto fast = tc::compile(net, "eager");
  auto x = torch::randn({2, 8});
  EXPECT_TRUE(fast(x).eq(0).all().item<bool>());
  EXPECT_EQ(fired, 1);
  h.remove();
  EXPECT_FALSE(h.active());
  torchcompile::logging::set_logs("recompiles");
  ::testing::internal::CaptureStderr();
  auto y = fast(x);
  std::string log = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::reset_logs();
  EXPECT_TRUE(tensors_close(net->forward(x), y));
  EXPECT_EQ(fired, 1);
  const std::string reason = fast.state().last_recompile_reason();
  EXPECT_THAT(reason, HasSubstr("hooks of module 'head' changed since compilation"));
  EXPECT_THAT(reason, HasSubstr("forward hooks 1 -> 0"));
  EXPECT_THAT(log, HasSubstr("hooks of module 'head' changed"));
  // The stale entry is dropped, not kept: hook versions only grow.
  EXPECT_EQ(fast.state().num_entries(), 1u);
}

TEST(Hooks, AddingAHookAfterCompilationIsNoticedAndUnrelatedHooksDoNotRecompile) {
  Net net;
  Net other;
  CompileCounter cc;
  auto fast = tc::compile(net, cc.backend());
  auto x = torch::randn({2, 8});
  fast(x);
  // A hook on a module this compiled net never calls moves the global epoch only.
  auto h_other = tc::register_forward_hook(other->head, [](torch::nn::Module&, const Tensors&, const Tensors&) {});
  fast(x);
  EXPECT_EQ(cc.frames(), 1);
  int fired = 0;
  tc::register_forward_pre_hook(net->block->fc1, [&](torch::nn::Module&, const Tensors&) { ++fired; });
  fast(x);
  fast(x);
  EXPECT_EQ(fired, 2);
  EXPECT_THAT(fast.state().last_recompile_reason(), HasSubstr("hooks of module 'block.fc1' changed"));
  h_other.remove();
  fast(x);
  EXPECT_EQ(fired, 3);
  EXPECT_EQ(fast.state().num_entries(), 1u);
}

TEST(Hooks, RootHooksFireAroundTheCompiledGraph) {
  Net net;
  std::vector<std::string> events;
  tc::register_forward_pre_hook(net, [&](torch::nn::Module&, const Tensors& in) {
    events.push_back("pre");
    return std::optional<Tensors>(Tensors{in[0] + 1});
  });
  tc::register_forward_hook(net, [&](torch::nn::Module&, const Tensors&, const Tensors&) { events.push_back("fwd"); });
  CompileCounter cc;
  auto fast = tc::compile(net, cc.backend());
  auto x = torch::randn({2, 8});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(tensors_close(net->forward(x + 1), fast(x)));
  EXPECT_EQ(events, (std::vector<std::string>{"pre", "fwd", "pre", "fwd", "pre", "fwd"}));
  EXPECT_EQ(cc.frames(), 1);
}

// ---- backward hooks --------------------------------------------------------------------------

struct GradLog {
  std::vector<at::Tensor> grad_outputs, grad_inputs, pre_grad_outputs;
  std::vector<std::string> events;
};

void add_backward_hooks(Net net, GradLog& log, bool scale) {
  tc::register_full_backward_pre_hook(net->block->fc2, [&log](torch::nn::Module&, const Tensors& gout) {
    log.pre_grad_outputs.push_back(gout.at(0).clone());
    log.events.push_back("fc2.backward_pre");
  });
  tc::register_full_backward_hook(net->block->fc1, [&log](torch::nn::Module&, const Tensors&, const Tensors&) {
    log.events.push_back("fc1.backward");
  });
  tc::register_full_backward_hook(
      net->block->fc2, [&log, scale](torch::nn::Module&, const Tensors& gin, const Tensors& gout) {
        log.grad_inputs.push_back(gin.at(0).clone());
        log.grad_outputs.push_back(gout.at(0).clone());
        log.events.push_back("fc2.backward");
        return scale ? std::optional<Tensors>(Tensors{gin.at(0) * 0.5}) : std::nullopt;
      });
}

TEST(Hooks, BackwardHooksSeeAndReplaceGradientsEagerAndCompiled) {
  for (bool scale : {false, true}) {
    Pair p;
    GradLog eager_log, compiled_log;
    add_backward_hooks(p.eager, eager_log, scale);
    add_backward_hooks(p.compiled_net, compiled_log, scale);
    auto fast = tc::compile(p.compiled_net, "eager");
    for (int i = 0; i < 10; ++i) {
      auto x = torch::randn({4, 8});
      auto xe = x.clone().requires_grad_(), xc = x.clone().requires_grad_();
      p.eager->zero_grad();
      p.compiled_net->zero_grad();
      tc::call(p.eager, xe).sum().backward();
      fast(xc).sum().backward();
      EXPECT_TRUE(tensors_close(xe.grad(), xc.grad()));
      auto pe = p.eager->named_parameters(), pc = p.compiled_net->named_parameters();
      for (const auto& item : pe) EXPECT_TRUE(tensors_close(item.value().grad(), pc[item.key()].grad())) << item.key();
    }
    ASSERT_EQ(eager_log.grad_inputs.size(), 10u);
    ASSERT_EQ(compiled_log.grad_inputs.size(), 10u);
    EXPECT_EQ(eager_log.events, compiled_log.events);
    EXPECT_EQ(std::vector<std::string>(compiled_log.events.begin(), compiled_log.events.begin() + 3),
              (std::vector<std::string>{"fc2.backward_pre", "fc2.backward", "fc1.backward"}));
    for (size_t i = 0; i < 10; ++i) {
      EXPECT_TRUE(tensors_close(eager_log.grad_inputs[i], compiled_log.grad_inputs[i]));
      EXPECT_TRUE(tensors_close(eager_log.grad_outputs[i], compiled_log.grad_outputs[i]));
      EXPECT_TRUE(tensors_close(eager_log.pre_grad_outputs[i], compiled_log.pre_grad_outputs[i]));
    }
  }
}

TEST(Hooks, ReplacingGradInputScalesUpstreamGradients) {
  Pair p;
  auto x = torch::randn({4, 8});
  p.eager->zero_grad();
  p.eager->forward(x).sum().backward();
  auto reference = p.eager->block->fc1->weight.grad().clone();
  GradLog log;
  add_backward_hooks(p.compiled_net, log, /*scale=*/true);
  auto fast = tc::compile(p.compiled_net, "eager");
  p.compiled_net->zero_grad();
  fast(x).sum().backward();
  EXPECT_TRUE(tensors_close(reference * 0.5, p.compiled_net->block->fc1->weight.grad()));
}

TEST(Hooks, BackwardHookWithoutInputGradGetsUndefinedGradInput) {
  torch::nn::Linear lin(3, 2);
  std::vector<bool> defined;
  tc::register_full_backward_hook(lin, [&](torch::nn::Module&, const Tensors& gin, const Tensors& gout) {
    defined.push_back(gin.at(0).defined());
    defined.push_back(gout.at(0).defined());
  });
  tc::call(lin, torch::randn({1, 3})).sum().backward();
  tc::call(lin, torch::randn({1, 3}, torch::requires_grad())).sum().backward();
  EXPECT_EQ(defined, (std::vector<bool>{false, true, true, true}));
}

// ---- leaf modules, graph breaks, errors --------------------------------------------------------

TEST(Hooks, LeafModuleIsOneCallModuleNodeRunEagerlyAndItsHooksFire) {
  Pair p;
  tc::mark_leaf(p.compiled_net->block);
  EXPECT_TRUE(tc::is_leaf(*p.compiled_net->block));
  int fired = 0;
  tc::register_forward_hook(p.compiled_net->block->fc1, [&](torch::nn::Module&, const Tensors&, const Tensors&) {
    ++fired;
  });
  CompileCounter cc;
  auto fast = tc::compile(p.compiled_net, cc.backend());
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({2, 8});
    EXPECT_TRUE(tensors_close(p.eager->forward(x), fast(x)));
  }
  EXPECT_EQ(fired, 4);
  EXPECT_EQ(cc.frames(), 1);  // the leaf runs eagerly: no graph of its own
  auto gm = fast.state().entries().front()->graph_module();
  std::vector<std::string> modules;
  for (const auto& n : gm->graph().nodes())
    if (n->kind() == tc::ir::NodeKind::CallModule) modules.push_back(n->target());
  EXPECT_EQ(modules, std::vector<std::string>{"block"});
}

struct BranchyImpl : torch::nn::Module {
  BranchyImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x) {
    auto y = tc::call(fc, x);
    if ((y.sum() > 0).item<bool>()) return y.relu();
    return y.sigmoid();
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Branchy);

// The hook fires once per compiled call. A call that reaches a new branch value runs the C++
// forward again from the start (after undoing what the compiled segments changed), so there the
// hook of a module before the break fires a second time, as host code in the forward runs again.
TEST(Hooks, OpaqueModuleBeforeAGraphBreakFiresOncePerCompiledCall) {
  Branchy net;
  {
    // fc is the identity, so the sign of the input picks the branch.
    torch::NoGradGuard g;
    net->fc->weight.copy_(torch::eye(4));
    net->fc->bias.zero_();
  }
  int fired = 0;
  tc::register_forward_hook(net->fc, [&](torch::nn::Module&, const Tensors&, const Tensors&) { ++fired; });
  auto fast = tc::compile(net, "eager");
  torch::manual_seed(3);
  for (int i = 0; i < 12; ++i) {
    auto x = torch::rand({2, 4}) * (i % 2 ? 1 : -1);
    int before = fired;
    auto expected = net->forward(x);  // eager: fires the hook once
    EXPECT_TRUE(tensors_close(expected, fast(x)));
    // Once eager, once compiled; call 1 is the first negative input: a new branch value.
    EXPECT_EQ(fired - before, i == 1 ? 3 : 2) << "call " << i;
  }
  EXPECT_GE(fast.state().entries().front()->num_graphs(), 3u);
}

TEST(Hooks, FullgraphRefusesAHookThatSplitsTheGraph) {
  Net net;
  tc::register_forward_hook(net->head, [](torch::nn::Module&, const Tensors&, const Tensors&) {});
  auto fast = tc::compile(net, tc::CompileOptions("eager").with_fullgraph());
  EXPECT_THAT(error_of([&] { fast(torch::randn({1, 8})); }),
              HasSubstr("fullgraph=true): module 'head' has hooks that cannot be inlined"));
}

TEST(Hooks, HandlesPrependAlwaysCallAndErrors) {
  torch::nn::Linear lin(2, 2);
  std::vector<std::string> order;
  auto a = tc::register_forward_pre_hook(lin, [&](torch::nn::Module&, const Tensors&) { order.push_back("a"); });
  auto b = tc::register_forward_pre_hook(lin, [&](torch::nn::Module&, const Tensors&) { order.push_back("b"); });
  tc::register_forward_pre_hook(lin, [&](torch::nn::Module&, const Tensors&) { order.push_back("first"); },
                                tc::HookOptions().prepend());
  tc::call(lin, torch::randn({1, 2}));
  EXPECT_EQ(order, (std::vector<std::string>{"first", "a", "b"}));
  a.remove();
  a.remove();  // idempotent
  EXPECT_FALSE(a.active());
  EXPECT_TRUE(b.active());
  order.clear();
  tc::call(lin, torch::randn({1, 2}));
  EXPECT_EQ(order, (std::vector<std::string>{"first", "b"}));

  // always_call: fires when the forward throws, then the error propagates.
  int always = 0, normal = 0;
  tc::register_forward_hook(lin, [&](torch::nn::Module&, const Tensors&, const Tensors& out) { ++normal; });
  tc::register_forward_hook(
      lin, [&](torch::nn::Module&, const Tensors&, const Tensors& out) { always += out.empty() ? 1 : 100; },
      tc::HookOptions().always_call());
  EXPECT_THAT(error_of([&] { tc::call(lin, torch::randn({1, 5})); }), HasSubstr("shapes cannot be multiplied"));
  EXPECT_EQ(always, 1);
  EXPECT_EQ(normal, 0);

  // A pre-hook must return as many tensors as it was given.
  torch::nn::Linear lin2(2, 2);
  tc::register_forward_pre_hook(lin2, [](torch::nn::Module&, const Tensors& in) { return Tensors{in[0], in[0]}; });
  EXPECT_THAT(error_of([&] { tc::call(lin2, torch::randn({1, 2})); }),
              HasSubstr("forward pre-hook of Linear returned 2 tensors; it must return as many as it was given (1)"));
  EXPECT_THAT(error_of([&] {
                tc::register_full_backward_hook(
                    lin2, [](torch::nn::Module&, const Tensors&, const Tensors&) {}, tc::HookOptions().traceable());
              }),
              HasSubstr("only forward pre-hooks and forward hooks can be traceable"));
}

TEST(Hooks, ModulesNotOwnedBySharedPtrAreRefused) {
  torch::nn::LinearImpl on_stack(2, 2);
  EXPECT_THAT(error_of([&] {
                tc::register_forward_hook(on_stack, [](torch::nn::Module&, const Tensors&, const Tensors&) {});
              }),
              HasSubstr("must be owned by a std::shared_ptr"));
}

TEST(Hooks, HooksDieWithTheirModule) {
  std::weak_ptr<torch::nn::Module> weak;
  int fired = 0;
  {
    torch::nn::Linear lin(2, 2);
    weak = lin.ptr();
    tc::register_forward_hook(lin, [&](torch::nn::Module&, const Tensors&, const Tensors&) { ++fired; });
    tc::call(lin, torch::randn({1, 2}));
  }
  EXPECT_TRUE(weak.expired());
  // A new module, possibly at the same address, has no hooks.
  for (int i = 0; i < 8; ++i) {
    torch::nn::Linear lin(2, 2);
    tc::call(lin, torch::randn({1, 2}));
  }
  EXPECT_EQ(fired, 1);
}

}  // namespace
