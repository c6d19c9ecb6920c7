// The operator-property table: kinds of ATen operators, schema-derived properties checked over
// every registered operator, and the node-level refinements (eval dropout, batch-norm statistics).
#include "support/test_util.h"

#include <torchcompile/ir/graph.h>
#include <torchcompile/ir/op_properties.h>

#include <gtest/gtest.h>

using namespace torchcompile::ir;

namespace {

TensorMeta meta(std::vector<int64_t> sizes) { return TensorMeta::of(torch::zeros(sizes)); }

OpKind kind_of(const char* target) { return op_properties(find_op(target)).kind; }

}  // namespace

TEST(OpProperties, KindsOfCommonOperators) {
  const std::vector<std::pair<const char*, OpKind>> expected = {
      {"aten::add.Tensor", OpKind::Pointwise},       {"aten::add_.Tensor", OpKind::Pointwise},
      {"aten::relu", OpKind::Pointwise},             {"aten::gelu", OpKind::Pointwise},
      {"aten::where.self", OpKind::Pointwise},       {"aten::_to_copy", OpKind::Pointwise},
      {"aten::threshold_backward", OpKind::Pointwise}, {"aten::max.other", OpKind::Pointwise},
      {"aten::sum.dim_IntList", OpKind::Reduction},  {"aten::mean.dim", OpKind::Reduction},
      {"aten::amax", OpKind::Reduction},             {"aten::max.dim", OpKind::Reduction},
      {"aten::_softmax", OpKind::Normalization},     {"aten::native_layer_norm", OpKind::Normalization},
      {"aten::native_batch_norm_backward", OpKind::Normalization},
      {"aten::mm", OpKind::Gemm},                    {"aten::addmm", OpKind::Gemm},
      {"aten::linear", OpKind::Gemm},                {"aten::baddbmm", OpKind::Gemm},
      {"aten::convolution", OpKind::Convolution},    {"aten::conv2d", OpKind::Convolution},
      {"aten::max_pool2d", OpKind::Pooling},         {"aten::adaptive_avg_pool2d", OpKind::Pooling},
      {"aten::view", OpKind::View},                  {"aten::t", OpKind::View},
      {"aten::select.int", OpKind::View},            {"aten::expand", OpKind::View},
      {"aten::zeros", OpKind::Factory},              {"aten::full_like", OpKind::Factory},
      {"aten::size.int", OpKind::MetadataQuery},     {"aten::stride.int", OpKind::MetadataQuery},
      {"aten::index_select", OpKind::Other},         {"aten::cat", OpKind::Other},
      {"aten::cumsum", OpKind::Other},
  };
  for (const auto& [target, kind] : expected) EXPECT_EQ(to_string(kind_of(target)), to_string(kind)) << target;

  const OpProperties empty = op_properties(find_op("aten::empty.memory_format"));
  EXPECT_EQ(empty.kind, OpKind::Factory);
  EXPECT_TRUE(empty.uninitialized);
  EXPECT_FALSE(op_properties(find_op("aten::zeros")).uninitialized);
  EXPECT_TRUE(op_properties(find_op("aten::reshape")).whole_view);
  EXPECT_FALSE(op_properties(find_op("aten::select.int")).whole_view);
  EXPECT_TRUE(op_properties(find_op("aten::native_batch_norm")).updates_running_stats);
  EXPECT_TRUE(op_properties(find_op("aten::dropout")).identity_when_not_training);
  EXPECT_TRUE(op_properties(find_op("aten::add_.Tensor")).mutating);
  EXPECT_FALSE(op_properties(find_op("aten::add.Tensor")).mutating);
}

// Over every registered operator: the schema-derived properties agree with the schema, an
// in-place variant has its out-of-place operator's kind, and only ATen operators get a kind from
// the table (a custom operator named like an ATen one is not assumed to behave like it).
TEST(OpProperties, AgreeWithEverySchema) {
  auto& dispatcher = c10::Dispatcher::singleton();
  size_t checked = 0, inplace_pairs = 0;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    const c10::FunctionSchema& schema = op->schema();
    const OpProperties p = op_properties(*op);
    bool writes = false;
    for (const auto& a : schema.arguments()) writes |= a.alias_info() && a.alias_info()->isWrite();
    EXPECT_EQ(p.mutating, writes) << schema;
    const auto& r = schema.returns();
    const bool aliases = r.size() == 1 && r[0].alias_info() && !r[0].alias_info()->isWrite();
    EXPECT_EQ(p.view(), aliases) << schema;
    if (name.name.rfind("aten::", 0) != 0) {
      if (!aliases) EXPECT_EQ(p.kind, OpKind::Other) << schema;
      continue;
    }
    ++checked;
    // `relu_` and `relu`, `add_.Tensor` and `add.Tensor`: same kind.
    const std::string& full = name.name;
    if (full.size() > 7 && full.back() == '_' && full[full.size() - 2] != '_' && writes) {
      auto out_of_place = dispatcher.findOp({full.substr(0, full.size() - 1), name.overload_name});
      if (out_of_place && out_of_place->hasSchema() && !op_properties(*out_of_place).view()) {
        ++inplace_pairs;
        EXPECT_EQ(to_string(p.kind), to_string(op_properties(*out_of_place).kind)) << schema;
      }
    }
  }
  EXPECT_GT(checked, 1000u);
  EXPECT_GT(inplace_pairs, 100u);
}

TEST(OpProperties, NodesRefineByTheirConstantArguments) {
  Graph g;
  Value x = g.placeholder("x", meta({2, 4}));
  Value rm = g.get_attr("running_mean", meta({4}));
  Value rv = g.get_attr("running_var", meta({4}));
  auto dropout = [&](double p, bool train) {
    return g.call_function(find_op("aten::dropout"), {x, c10::IValue(p), c10::IValue(train)}, {meta({2, 4})});
  };
  Node* eval = dropout(0.5, false);
  Node* train = dropout(0.5, true);
  Node* p0 = dropout(0.0, true);
  EXPECT_TRUE(node_is_identity(*eval));
  EXPECT_FALSE(node_is_random(*eval));
  EXPECT_FALSE(node_is_identity(*train));
  EXPECT_TRUE(node_is_random(*train));
  EXPECT_TRUE(node_is_identity(*p0));

  auto batch_norm = [&](bool training) {
    return g.call_function(find_op("aten::batch_norm"),
                           {x, c10::IValue(), c10::IValue(), rm, rv, c10::IValue(training), c10::IValue(0.1),
                            c10::IValue(1e-5), c10::IValue(false)},
                           {meta({2, 4})});
  };
  EXPECT_EQ(written_arguments(*batch_norm(true)), (std::vector<size_t>{3, 4}));
  EXPECT_TRUE(written_arguments(*batch_norm(false)).empty());
  EXPECT_TRUE(batch_norm(true)->has_side_effects());

  Node* view = g.call_function(find_op("aten::view"), {x, c10::IValue(std::vector<int64_t>{8})}, {meta({8})});
  EXPECT_TRUE(is_view_node(view));
  EXPECT_FALSE(is_view_node(x.node));
  EXPECT_EQ(node_properties(*x.node).kind, OpKind::Other);
}
