// The interpreter runs hand-built graphs through the dispatcher.
#include "support/test_util.h"

#include <torchcompile/ir/graph_module.h>
#include <torchcompile/ir/interpreter.h>

#include <thread>

using namespace torchcompile::ir;

namespace {

TEST(Interpreter, RunsConstantsListsAndMultiOutputOps) {
  auto gm = std::make_shared<GraphModule>();
  Graph& g = gm->graph();
  auto x = torch::randn({4, 6});
  Value in = g.placeholder("x", TensorMeta::of(x));
  gm->set_attribute("w", torch::randn({6}), AttributeKind::Parameter);
  Value w = g.get_attr("w", TensorMeta::of(gm->attribute("w")));
  Node* mul = g.call_function(find_op("aten::mul.Tensor"), {in, w}, {TensorMeta::of(x)});
  // split returns Tensor[]: two values
  Node* split = g.call_function(find_op("aten::split.Tensor"), {mul->output(), c10::IValue(int64_t{2}), c10::IValue(int64_t{0})},
                                {TensorMeta::of(x.slice(0, 0, 2)), TensorMeta::of(x.slice(0, 2, 4))}, {2});
  Node* cat = g.call_function(find_op("aten::cat"),
                              {Argument(std::vector<std::optional<Value>>{split->output(1), split->output(0)}), c10::IValue(int64_t{0})},
                              {TensorMeta::of(x)});
  Node* mx = g.call_function(find_op("aten::max.dim"), {cat->output(), c10::IValue(int64_t{1})},
                             {TensorMeta::of(x.select(1, 0)), TensorMeta::of(x.select(1, 0).to(torch::kLong))});
  g.output({mx->output(0), mx->output(1)});
  auto outs = gm->forward({x});
  auto m = x * gm->attribute("w");
  auto expected = torch::cat({m.slice(0, 2, 4), m.slice(0, 0, 2)}, 0).max(1);
  EXPECT_TRUE(tc_test::tensors_equal(std::get<0>(expected), outs[0]));
  EXPECT_TRUE(tc_test::tensors_equal(std::get<1>(expected), outs[1]));
  // attributes are read at each call
  gm->attribute("w").fill_(0);
  EXPECT_EQ(gm->forward({x})[0].abs().sum().item<float>(), 0.f);
}

TEST(Interpreter, OptionalTensorArgumentsAcceptNone) {
  auto gm = std::make_shared<GraphModule>();
  Graph& g = gm->graph();
  auto x = torch::randn({3, 4});
  Value in = g.placeholder("x", TensorMeta::of(x));
  Node* ln = g.call_function(find_op("aten::layer_norm"),
                             {in, c10::IValue(std::vector<int64_t>{4}), c10::IValue(), c10::IValue()}, {TensorMeta::of(x)});
  g.output({ln->output()});
  EXPECT_TRUE(tc_test::tensors_close(torch::layer_norm(x, {4}), gm->forward({x})[0]));
}

TEST(Interpreter, RejectsWrongInputCountAndIsThreadSafe) {
  auto gm = std::make_shared<GraphModule>();
  Graph& g = gm->graph();
  auto x = torch::randn({8});
  Value in = g.placeholder("x", TensorMeta::of(x));
  Node* s = g.call_function(find_op("aten::sin"), {in}, {TensorMeta::of(x)});
  Node* e = g.call_function(find_op("aten::exp"), {s->output()}, {TensorMeta::of(x)});
  g.output({e->output()});
  EXPECT_THROW(gm->forward({}), c10::Error);
  Interpreter interp(*gm);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto in = torch::randn({8});
        if (!torch::equal(in.sin().exp(), interp.run({in})[0])) ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
