// Graph identity: GraphKey, structural_hash, structurally_equal.
#include "support/test_util.h"

#include <torchcompile/ir/graph_module.h>
#include <torchcompile/ir/structure.h>

#include <random>

using namespace torchcompile::ir;

namespace {

struct Recipe {
  std::vector<int> ops;       // 0: add.Scalar, 1: mul.Tensor (with the previous value), 2: relu, 3: sum.dim
  std::vector<double> consts;
  std::vector<int> partners;  // which earlier value mul reads
};

Recipe random_recipe(std::mt19937& rng) {
  Recipe r;
  const int n = 1 + static_cast<int>(rng() % 8);
  for (int i = 0; i < n; ++i) {
    r.ops.push_back(static_cast<int>(rng() % 3));
    r.consts.push_back(static_cast<double>(rng() % 5) / 2.0);
    r.partners.push_back(static_cast<int>(rng() % (i + 1)));
  }
  return r;
}

// Builds the graph of `r` on a (4, 3) input; `suffix` renames every node.
std::unique_ptr<Graph> build(const Recipe& r, const std::string& suffix = "", bool transposed_input = false) {
  auto g = std::make_unique<Graph>();
  auto x = transposed_input ? torch::randn({3, 4}).t() : torch::randn({4, 3});
  std::vector<Value> values{g->placeholder("x" + suffix, TensorMeta::of(x))};
  const TensorMeta meta = TensorMeta::of(torch::randn({4, 3}));
  for (size_t i = 0; i < r.ops.size(); ++i) {
    Node* n = nullptr;
    switch (r.ops[i]) {
      case 0:
        n = g->call_function(find_op("aten::add.Scalar"), {values.back(), c10::IValue(r.consts[i]), c10::IValue(int64_t{1})},
                             {meta});
        break;
      case 1:
        n = g->call_function(find_op("aten::mul.Tensor"), {values.back(), values[r.partners[i]]}, {meta});
        break;
      default:
        n = g->call_function(find_op("aten::relu"), {values.back()}, {meta});
        break;
    }
    values.push_back(n->output());
  }
  g->output({values.back()});
  return g;
}

}  // namespace

TEST(GraphKey, EqualForTheSameComputationWhateverTheNames) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 100; ++trial) {
    const Recipe r = random_recipe(rng);
    auto a = build(r), b = build(r, "_renamed");
    EXPECT_TRUE(structurally_equal(*a, *b)) << "trial " << trial;
    EXPECT_EQ(structural_hash(*a), structural_hash(*b));
  }
}

TEST(GraphKey, DiffersWhenAnOperatorAConstantAnInputOrALayoutDiffers) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const Recipe r = random_recipe(rng);
    const GraphKey base(*build(r));
    // Each single change gives another key.
    Recipe op = r;
    op.ops[0] = (op.ops[0] + 1) % 3;
    EXPECT_NE(base, GraphKey(*build(op))) << "operator, trial " << trial;
    Recipe constant = r;
    constant.ops[0] = 0;
    Recipe constant2 = constant;
    constant2.consts[0] += 0.25;
    EXPECT_NE(GraphKey(*build(constant)), GraphKey(*build(constant2))) << "constant, trial " << trial;
    EXPECT_NE(base, GraphKey(*build(r, "", /*transposed_input=*/true))) << "input strides, trial " << trial;
    Recipe wiring = r;
    wiring.ops.push_back(1);
    wiring.consts.push_back(0);
    wiring.partners.push_back(0);
    Recipe wiring2 = wiring;
    wiring2.partners.back() = static_cast<int>(wiring.ops.size()) - 1;  // the previous value instead of x
    EXPECT_NE(GraphKey(*build(wiring)), GraphKey(*build(wiring2))) << "argument wiring, trial " << trial;
  }
}

TEST(GraphKey, AttributeNamesAndOutputsCount) {
  auto make = [](const std::string& attr, bool two_outputs) {
    GraphModule gm;
    Graph& g = gm.graph();
    auto x = torch::randn({3});
    Value in = g.placeholder("x", TensorMeta::of(x));
    Value w = g.get_attr(attr, TensorMeta::of(x));
    Node* add = g.call_function(find_op("aten::add.Tensor"), {in, w, c10::IValue(int64_t{1})}, {TensorMeta::of(x)});
    if (two_outputs) g.output({add->output(), in});
    else g.output({add->output()});
    return GraphKey(g);
  };
  EXPECT_EQ(make("fc.weight", false), make("fc.weight", false));
  EXPECT_NE(make("fc.weight", false), make("fc.bias", false));
  EXPECT_NE(make("fc.weight", false), make("fc.weight", true));
}
