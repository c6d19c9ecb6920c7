// The torchscript backend: results against eager LibTorch, the graph TorchScript actually ran,
// live parameters, in-place ops, and the interpreter fallback for what it cannot express.
#include "support/test_util.h"

#include <torch/version.h>

#include "torchscript_backend.h"
#include "torchscript_graph.h"

#include <torch/csrc/jit/runtime/graph_executor.h>

namespace {

namespace ts = torchcompile::backends::torchscript;
using torchcompile::ir::NodeKind;
using torchcompile::ir::TensorMeta;

const char* const kWarning = "torchscript backend: cannot express the graph";

torchcompile::CompileOptions ts_options() { return torchcompile::CompileOptions("torchscript").with_fullgraph(); }

// Runs `f` and returns what it printed to stderr (where LibTorch's warnings go).
template <typename F>
std::string stderr_of(F&& f) {
  ::testing::internal::CaptureStderr();
  f();
  return ::testing::internal::GetCapturedStderr();
}

// The graph the last GraphExecutor run on this thread executed, as text ("" if none).
std::string last_torchscript_graph() {
  auto g = torch::jit::lastExecutedOptimizedGraph();
  return g ? g->toString() : "";
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

// A backend that converts each graph itself (so a graph the torchscript backend would have to
// run with the interpreter fails the test), checks that every call_function node became a
// TorchScript node with exactly its operator overload, then compiles it with the backend.
torchcompile::Backend checking_backend(std::shared_ptr<int> graphs) {
  return [graphs](torchcompile::GraphModule& gm, const std::vector<at::Tensor>& inputs) {
    ts::Program p = ts::convert(gm);
    auto full_name = [](const c10::FunctionSchema& s) { return s.name() + "." + s.overload_name(); };
    std::vector<std::string> expected, converted;
    for (const auto& n : gm.graph().nodes())
      if (n->kind() == NodeKind::CallFunction) expected.push_back(full_name(n->schema()));
    for (torch::jit::Node* n : p.graph->nodes())
      if (!n->kind().is_prim()) converted.push_back(full_name(n->schema()));
    EXPECT_EQ(expected, converted);
    ++*graphs;
    return torchcompile::backends::torchscript_backend(gm, inputs);
  };
}

TEST(TorchScriptBackend, IsRegisteredAndListed) {
  EXPECT_TRUE(torchcompile::has_backend("torchscript"));
  auto names = torchcompile::list_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "torchscript"), names.end());
}

TEST(TorchScriptBackend, MlpMatchesEagerAndRunsLinearInTorchScript) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
  auto fast = torch::compile(net, ts_options());
  const std::string err = stderr_of([&] {
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({8, 16});
      EXPECT_TRUE(tc_test::tensors_close(net->forward(x), fast(x)));
    }
  });
  EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr(kWarning)));
  const std::string graph = last_torchscript_graph();
  EXPECT_EQ(count_of(graph, "aten::linear"), 2u) << graph;
  EXPECT_EQ(count_of(graph, "aten::relu"), 1u) << graph;
  // Parameters are graph inputs, never constants.
  EXPECT_THAT(graph, ::testing::Not(::testing::HasSubstr("value=<Tensor>"))) << graph;
}

TEST(TorchScriptBackend, EveryOpKeepsItsExactOverload) {
  auto graphs = std::make_shared<int>(0);
  auto fn = [](torch::Tensor a, torch::Tensor b) {
    auto s = a.add(b, 2.0).sub(1).mul(b).div(a.abs() + 1, "floor");  // add.Tensor, sub.Scalar, div.Tensor_mode
    auto m = torch::max(s, 1);                                        // max.dim: two outputs
    auto parts = s.chunk(2, 1);                                       // a Tensor[] return
    auto idx = torch::tensor({0, 2}, torch::kLong);
    return std::vector<torch::Tensor>{std::get<0>(m) + std::get<1>(m).to(torch::kFloat), parts[1], s.index({idx}),
                                      s.sum({0}, /*keepdim=*/true, torch::kDouble), torch::clamp(s, -1.0)};
  };
  auto fast = torch::compile(fn, torchcompile::CompileOptions(checking_backend(graphs)).with_fullgraph());
  const std::string err = stderr_of([&] {
    for (int k = 0; k < 2; ++k) {
      auto a = torch::randn({4, 6}), b = torch::randn({4, 6});
      auto expected = fn(a, b);
      auto got = fast(a, b);
      ASSERT_EQ(expected.size(), got.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(tc_test::tensors_close(expected[i], got[i])) << i;
    }
  });
  EXPECT_EQ(*graphs, 1);
  EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr(kWarning)));
}

TEST(TorchScriptBackend, ConvBatchNormReluMaxPoolInEval) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)),
                            torch::nn::BatchNorm2d(8), torch::nn::ReLU(), torch::nn::MaxPool2d(2));
  // Non-trivial running statistics, then eval.
  net->train();
  for (int i = 0; i < 3; ++i) net->forward(torch::randn({4, 3, 8, 8}));
  net->eval();
  auto fast = torch::compile(net, ts_options());
  auto bn = net[1]->as<torch::nn::BatchNorm2d>();
  auto mean_before = bn->running_mean.clone();
  const std::string err = stderr_of([&] {
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({2, 3, 8, 8});
      EXPECT_TRUE(tc_test::tensors_close(net->forward(x), fast(x)));
    }
    torch::NoGradGuard no_grad;  // the inference graph (another cache entry)
    for (int i = 0; i < 2; ++i) {
      auto x = torch::randn({2, 3, 8, 8});
      EXPECT_TRUE(tc_test::tensors_close(net->forward(x), fast(x)));
    }
  });
  EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr(kWarning)));
  EXPECT_TRUE(tc_test::tensors_equal(mean_before, bn->running_mean));
  const std::string graph = last_torchscript_graph();
  EXPECT_THAT(graph, ::testing::HasSubstr("aten::conv2d")) << graph;
  EXPECT_THAT(graph, ::testing::HasSubstr("aten::max_pool2d")) << graph;
}

TEST(TorchScriptBackend, BatchNormTrainingUpdatesBuffersAsEager) {
  torch::manual_seed(0);
  torch::nn::BatchNorm1d eager_bn(5), compiled_bn(5);
  auto fast = torch::compile(compiled_bn, ts_options());
  const std::string err = stderr_of([&] {
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({6, 5}) * (i + 1);
      EXPECT_TRUE(tc_test::tensors_close(eager_bn->forward(x), fast(x)));
      EXPECT_TRUE(tc_test::tensors_close(eager_bn->running_mean, compiled_bn->running_mean)) << "call " << i;
      EXPECT_TRUE(tc_test::tensors_close(eager_bn->running_var, compiled_bn->running_var)) << "call " << i;
      EXPECT_TRUE(tc_test::tensors_equal(eager_bn->num_batches_tracked, compiled_bn->num_batches_tracked));
    }
  });
  EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr(kWarning)));
  EXPECT_THAT(last_torchscript_graph(), ::testing::HasSubstr("aten::batch_norm"));
}

TEST(TorchScriptBackend, LayerNormGelu) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(10, 12), torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})),
                            torch::nn::GELU());
  auto fast = torch::compile(net, ts_options());
  const std::string err = stderr_of([&] {
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({3, 7, 10});
      EXPECT_TRUE(tc_test::tensors_close(net->forward(x), fast(x)));
    }
  });
  EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr(kWarning)));
  const std::string graph = last_torchscript_graph();
  EXPECT_THAT(graph, ::testing::HasSubstr("aten::layer_norm")) << graph;
  EXPECT_THAT(graph, ::testing::HasSubstr("aten::gelu")) << graph;
}

TEST(TorchScriptBackend, InPlaceOpsKeepTheirSemantics) {
  // add_ on an intermediate that is also read afterwards and returned.
  auto fn = [](torch::Tensor x) {
    auto y = x * 2;
    auto view = y.view({-1});
    y.add_(1);
    y.relu_();
    return std::vector<torch::Tensor>{y + x, view * 1, y};
  };
  auto fast = torch::compile(fn, ts_options());
  const std::string err = stderr_of([&] {
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({3, 4});
      auto expected = fn(x);
      auto got = fast(x);
      ASSERT_EQ(got.size(), 3u);
      for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(tc_test::tensors_close(expected[k], got[k])) << k;
    }
  });
  EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr(kWarning)));
  // The add_ stays in place (FuseAddRelu may merge it with the relu_ into _add_relu_).
  EXPECT_THAT(last_torchscript_graph(), ::testing::ContainsRegex("aten::(_add_relu_|add_)\\("));

  // An in-place op on an input mutates the caller's tensor exactly once per call.
  auto mutate = [](torch::Tensor x) { return x.add_(1).mul(2); };
  auto fast_mutate = torch::compile(mutate, ts_options());
  auto x = torch::randn({5});
  auto x_eager = x.clone();
  for (int i = 0; i < 3; ++i) {
    auto expected = mutate(x_eager);
    auto got = fast_mutate(x);
    EXPECT_TRUE(tc_test::tensors_close(expected, got));
    EXPECT_TRUE(tc_test::tensors_close(x_eager, x)) << "call " << i;
  }
}

TEST(TorchScriptBackend, SeveralOutputsAndTensorLists) {
  auto fn = [](torch::Tensor a, torch::Tensor b) {
    auto c = torch::cat({a, b.sin(), a * b}, 0);
    auto d = torch::stack({a, b}, 1);
    return std::vector<torch::Tensor>{c, d.sum(1), torch::cat({c, c}, 1), a.cos()};
  };
  auto fast = torch::compile(fn, ts_options());
  const std::string err = stderr_of([&] {
    for (int i = 0; i < 3; ++i) {
      auto a = torch::randn({2, 3}), b = torch::randn({2, 3});
      auto expected = fn(a, b);
      auto got = fast(a, b);
      ASSERT_EQ(got.size(), expected.size());
      for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(tc_test::tensors_close(expected[k], got[k])) << k;
    }
  });
  EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr(kWarning)));
  const std::string graph = last_torchscript_graph();
  EXPECT_THAT(graph, ::testing::HasSubstr("prim::ListConstruct")) << graph;
  EXPECT_THAT(graph, ::testing::HasSubstr("aten::cat")) << graph;
}

TEST(TorchScriptBackend, ParametersAreReadLiveAndGradientsMatch) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  auto fast = torch::compile(net, ts_options());
  auto x = torch::randn({4, 6});
  ::testing::internal::CaptureStderr();
  auto first = fast(x).detach();
  EXPECT_TRUE(tc_test::tensors_close(net->forward(x), first));

  // Gradients through the compiled graph are eager's.
  fast(x).pow(2).sum().backward();
  std::vector<torch::Tensor> compiled_grads;
  for (auto& p : net->parameters()) compiled_grads.push_back(p.grad().clone());
  net->zero_grad();
  net->forward(x).pow(2).sum().backward();
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(tc_test::tensors_close(params[i].grad(), compiled_grads[i])) << i;

  // An optimizer step updates the parameters in place: the next compiled call sees it.
  torch::optim::SGD(net->parameters(), 0.5).step();
  auto after_step = fast(x).detach();
  EXPECT_TRUE(tc_test::tensors_close(net->forward(x), after_step));
  EXPECT_FALSE(torch::allclose(first, after_step));

  // So does an in-place edit of one weight.
  {
    torch::NoGradGuard no_grad;
    net[0]->as<torch::nn::Linear>()->weight.mul_(-1);
  }
  auto after_edit = fast(x).detach();
  EXPECT_TRUE(tc_test::tensors_close(net->forward(x), after_edit));
  EXPECT_FALSE(torch::allclose(after_step, after_edit));
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), ::testing::Not(::testing::HasSubstr(kWarning)));
  EXPECT_EQ(count_of(last_torchscript_graph(), "aten::linear"), 2u);
}

TEST(TorchScriptBackend, PassesRemoveDeadAndDuplicateWork) {
  auto fn = [](torch::Tensor x) {
    auto a = x.sin();
    auto b = x.sin();          // same as a: CSE
    auto ones = torch::ones({4});  // no input dependence: folded into a constant
    return (a + b) * ones;
  };
  auto fast = torch::compile(fn, ts_options());
  // The first call traces (and runs eagerly); the later ones run the TorchScript graph.
  for (int i = 0; i < 2; ++i) {
    auto x = torch::randn({4});
    EXPECT_TRUE(tc_test::tensors_close(fn(x), fast(x)));
  }
  const std::string graph = last_torchscript_graph();
  EXPECT_EQ(count_of(graph, "aten::sin"), 1u) << graph;
  EXPECT_EQ(count_of(graph, "aten::ones"), 0u) << graph;
}

TEST(TorchScriptBackend, FactoryOutputsAreNewTensorsEachCall) {
  // A folded constant must not reach an output: each call returns its own tensor, as eager.
  auto fn = [](torch::Tensor x) { return std::vector<torch::Tensor>{x + 1, torch::zeros({3})}; };
  auto fast = torch::compile(fn, ts_options());
  auto x = torch::randn({3});
  fast(x);  // traces
  auto first = fast(x);
  first[1].add_(5);
  auto second = fast(x);
  EXPECT_TRUE(tc_test::tensors_close(x + 1, second[0]));
  EXPECT_TRUE(tc_test::tensors_equal(torch::zeros({3}), second[1]));
  EXPECT_NE(first[1].data_ptr(), second[1].data_ptr());
}

TEST(TorchScriptBackend, ZeroDimFactoryKeepsTypePromotion) {
  // A 0-dim double tensor promotes an int tensor to double; folded into a constant, TorchScript
  // would turn it into a Scalar (giving float). It must stay a tensor.
  auto fn = [](torch::Tensor x) { return x.mul(torch::full({}, 2.5, torch::kDouble)); };
  auto fast = torch::compile(fn, ts_options());
  auto x = torch::arange(6, torch::kInt);
  for (int i = 0; i < 2; ++i) {
    auto got = fast(x);
    EXPECT_EQ(got.scalar_type(), torch::kDouble);
    EXPECT_TRUE(tc_test::tensors_equal(fn(x), got));
  }
}

TEST(TorchScriptBackend, AddReluFusionInInferenceOnly) {
  auto fn = [](torch::Tensor a, torch::Tensor b) {
    auto shared = a + b * 2;  // used twice: must stay a separate add
    return std::vector<torch::Tensor>{torch::relu(a + b), shared.relu(), shared * 2};
  };
  auto fast = torch::compile(fn, ts_options());
  auto a = torch::randn({16}), b = torch::randn({16});
  {
    torch::NoGradGuard no_grad;
    fast(a, b);  // traces
    auto expected = fn(a, b);
    auto got = fast(a, b);
    for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(tc_test::tensors_close(expected[k], got[k])) << k;
    const std::string graph = last_torchscript_graph();
    EXPECT_EQ(count_of(graph, "aten::_add_relu"), 1u) << graph;
  }
  // With gradients the fused op (which has no derivative) is not used.
  auto ag = a.clone().requires_grad_(), bg = b.clone().requires_grad_();
  fast(ag, bg);  // traces
  auto got = fast(ag, bg);
  EXPECT_THAT(last_torchscript_graph(), ::testing::Not(::testing::HasSubstr("aten::_add_relu")));
  (got[0].sum() + got[1].sum()).backward();
  auto ae = a.clone().requires_grad_(), be = b.clone().requires_grad_();
  auto expected = fn(ae, be);
  (expected[0].sum() + expected[1].sum()).backward();
  EXPECT_TRUE(tc_test::tensors_close(ae.grad(), ag.grad()));
  EXPECT_TRUE(tc_test::tensors_close(be.grad(), bg.grad()));
}

TEST(TorchScriptBackend, CallModuleFallsBackToTheInterpreterWithOneWarning) {
  // x -> cos -> call_module "scale" (an opaque C++ callable) -> output.
  auto x = torch::randn({5});
  torchcompile::GraphModule gm;
  auto& g = gm.graph();
  auto in = g.placeholder("x", TensorMeta::of(x));
  auto* cos = g.call_function(torchcompile::ir::find_op("aten::cos"), {in}, {TensorMeta::of(x)});
  auto* mod = g.call_module("scale", {cos->output()}, {TensorMeta::of(x)});
  g.output({mod->output()});
  gm.set_submodule("scale", [](const std::vector<at::Tensor>& t) { return std::vector<at::Tensor>{t.at(0) * 3}; });

  torchcompile::CompiledFn fn;
  const std::string err = stderr_of([&] { fn = torchcompile::backends::torchscript_backend(gm, {x}); });
  EXPECT_THAT(err, ::testing::HasSubstr(kWarning));
  EXPECT_THAT(err, ::testing::HasSubstr("call_module"));
  EXPECT_THAT(err, ::testing::HasSubstr("(scale)"));
  ASSERT_TRUE(fn);
  const std::string run_err = stderr_of([&] {
    for (int i = 0; i < 2; ++i) {
      auto out = fn({x});
      ASSERT_EQ(out.size(), 1u);
      EXPECT_TRUE(tc_test::tensors_close(x.cos() * 3, out[0]));
    }
  });
  EXPECT_EQ(run_err, "");  // warned once, at compile time
}

TEST(TorchScriptBackend, GeneratorArgumentDrawsWhatEagerDraws) {
  // LibTorch 1.13's TorchScript has no constant for a torch::Generator: the graph runs with
  // the interpreter, with one warning naming the operator. LibTorch 2.x has one, so the graph
  // converts without a warning. Either way it draws exactly what eager draws.
  auto gen = at::detail::createCPUGenerator(/*seed_val=*/0);
  auto fn = [gen](torch::Tensor x) { return x * 2 + at::normal(0.0, 1.0, x.sizes(), gen); };
  auto fast = torch::compile(fn, ts_options());
  auto x = torch::randn({6});
  const std::string err = stderr_of([&] { fast(x); });
#if TORCH_VERSION_MAJOR < 2
  EXPECT_THAT(err, ::testing::HasSubstr(kWarning));
  EXPECT_THAT(err, ::testing::HasSubstr("aten::normal"));
  EXPECT_EQ(count_of(err, kWarning), 1u);
#else
  EXPECT_EQ(count_of(err, kWarning), 0u) << err;
#endif
  for (int i = 0; i < 2; ++i) {
    gen.set_current_seed(42);
    auto expected = fn(x);
    gen.set_current_seed(42);
    std::string run_err = stderr_of([&] { EXPECT_TRUE(tc_test::tensors_equal(expected, fast(x))); });
    EXPECT_EQ(run_err, "");
  }
}

}  // namespace
