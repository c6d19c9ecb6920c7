// The tracer records what the forward calls, at the level the C++ frontend calls it.
#include "support/test_util.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/compat.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/passes.h>

#include "capture/metadata_at.h"
#include "capture/segment_records.h"

#include <random>
#include <thread>

using torchcompile::capture::Tracer;
using torchcompile::ir::GraphModule;
using torchcompile::ir::NodeKind;
using tc_test::count_calls;
using tc_test::tensors_equal;

namespace {

// Trace `fn(inputs...)` and return the graph module (asserting the trace did not fail).
template <typename F>
std::unique_ptr<GraphModule> trace(F fn, std::vector<torch::Tensor> inputs, std::vector<torch::Tensor>* outs = nullptr) {
  Tracer t;
  for (size_t i = 0; i < inputs.size(); ++i) t.add_input(inputs[i], "in" + std::to_string(i));
  std::vector<torch::Tensor> result;
  {
    Tracer::Activation active(t);
    result = fn(inputs);
  }
  EXPECT_FALSE(t.failed()) << t.failure()->reason;
  if (outs) *outs = result;
  return t.finish(result);
}

std::vector<std::string> call_targets(const GraphModule& gm) {
  std::vector<std::string> r;
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == NodeKind::CallFunction) r.push_back(n->target());
  return r;
}

TEST(Tracer, KeyIsFreeAndAboveAutograd) {
  // The tracing key must be a functionality key above Autograd, so the graph holds the ops the
  // forward called (not their autograd decompositions) and replay builds autograd graphs.
  using c10::DispatchKey;
  EXPECT_GT(static_cast<int>(torchcompile::compat::kTracingKey), static_cast<int>(DispatchKey::AutogradOther));
  EXPECT_GT(static_cast<int>(torchcompile::compat::kTracingKey), static_cast<int>(DispatchKey::AutocastCPU));
  torchcompile::capture::register_tracing_fallback();
  torchcompile::capture::register_tracing_fallback();  // idempotent
}

TEST(Tracer, RecordsTopLevelOpsOnlyAndComputesRealResults) {
  std::vector<torch::Tensor> outs;
  auto x = torch::randn({4, 5});
  auto gm = trace([](auto in) { return std::vector<torch::Tensor>{torch::softmax(in[0].cos() + 1, 1)}; }, {x}, &outs);
  EXPECT_THAT(call_targets(*gm), ::testing::ElementsAre("aten::cos", "aten::add.Scalar", "aten::softmax.int"));
  EXPECT_TRUE(tensors_equal(torch::softmax(x.cos() + 1, 1), outs[0]));
  EXPECT_TRUE(tensors_equal(outs[0], gm->forward({x})[0]));
}

TEST(Tracer, InPlaceAndViewOpsAreRecordedFaithfully) {
  auto fn = [](std::vector<torch::Tensor> in) {
    auto v = in[0].view({-1});
    v.add_(1);
    in[0].mul_(2);
    return std::vector<torch::Tensor>{in[0].sum(0)};
  };
  auto x = torch::randn({2, 3});
  auto x_traced = x.clone();
  auto gm = trace(fn, {x_traced});
  EXPECT_THAT(call_targets(*gm), ::testing::ElementsAre("aten::view", "aten::add_.Scalar", "aten::mul_.Scalar", "aten::sum.dim_IntList"));
  auto x_replay = x.clone();
  auto out = gm->forward({x_replay})[0];
  EXPECT_TRUE(tensors_equal((x + 1) * 2, x_replay)) << "replay mutates the input as eager does";
  EXPECT_TRUE(tensors_equal(((x + 1) * 2).sum(0), out));
  torchcompile::ir::lint(gm->graph());
}

TEST(Tracer, MultiOutputTensorListOptionalAndFactoryOps) {
  auto fn = [](std::vector<torch::Tensor> in) {
    auto [vals, idx] = in[0].max(1);
    auto parts = in[0].split(2, 0);  // Tensor[] output
    auto z = torch::zeros({3}, torch::kFloat64);  // factory op: no tensor inputs
    auto ln = torch::layer_norm(in[0], {3}, c10::nullopt, in[1]);  // optional tensors, one None
    auto cat = torch::cat({parts[1], parts[0]}, 0);  // Tensor[] argument
    return std::vector<torch::Tensor>{vals, idx, z, ln, cat};
  };
  auto x = torch::randn({4, 3}), b = torch::randn({3});
  std::vector<torch::Tensor> outs;
  auto gm = trace(fn, {x, b}, &outs);
  auto targets = call_targets(*gm);
  EXPECT_THAT(targets, ::testing::Contains("aten::max.dim"));
  EXPECT_THAT(targets, ::testing::Contains("aten::split.Tensor"));
  EXPECT_THAT(targets, ::testing::Contains("aten::zeros"));
  EXPECT_THAT(targets, ::testing::Contains("aten::layer_norm"));
  EXPECT_THAT(targets, ::testing::Contains("aten::cat"));
  auto replay = gm->forward({x, b});
  ASSERT_EQ(replay.size(), outs.size());
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(tensors_equal(outs[i], replay[i])) << "output " << i;
}

TEST(Tracer, ParametersBecomeGetAttrAndOtherTensorsConstants) {
  auto w = torch::randn({3}), other = torch::randn({3});
  Tracer t;
  auto x = torch::randn({3});
  t.add_input(x, "x");
  t.add_attribute("layer.weight", w, torchcompile::ir::AttributeKind::Parameter);
  torch::Tensor y;
  {
    Tracer::Activation a(t);
    y = x * w + other;
  }
  auto gm = t.finish({y});
  ASSERT_TRUE(gm->has_attribute("layer.weight"));
  EXPECT_EQ(gm->graph().find_node("layer_weight")->module_path(), "layer");
  EXPECT_TRUE(gm->attribute("layer.weight").is_same(w)) << "parameters are shared, not copied";
  EXPECT_EQ(gm->attribute_kind("_tensor_constant0"), torchcompile::ir::AttributeKind::Constant);
  w.mul_(10);  // read live
  EXPECT_TRUE(tensors_equal(x * w + other, gm->forward({x})[0]));
}

TEST(Tracer, DataDependentHostReadEndsASegment) {
  Tracer t;
  auto x = torch::randn({3});
  t.add_input(x, "x");
  torch::Tensor y;
  {
    Tracer::Activation a(t);
    auto s = x.abs().sum();
    (void)x.exp();  // dead at the break: not carried to the next segment
    y = s.item<float>() > 0 ? x * s : x;
    (void)x.size(0);  // metadata reads are not breaks
  }
  ASSERT_FALSE(t.failed());
  auto segments = torchcompile::capture::finish_segments(t, {y});
  ASSERT_EQ(segments.size(), 2u);
  ASSERT_TRUE(segments[0].branch.has_value());
  EXPECT_EQ(torchcompile::ir::op_target_name(segments[0].branch->op), "aten::item");
  EXPECT_EQ(segments[0].branch->key.at(0).toDouble(), x.abs().sum().item<double>());
  // The first segment hands the live sum to the second through a slot; exp died.
  EXPECT_EQ(segments[0].output_slots.size(), 1u);
  // Dead code is left to the compile pipeline's dead-code elimination.
  EXPECT_THAT(call_targets(*segments[0].gm), ::testing::ElementsAre("aten::abs", "aten::sum", "aten::exp"));
  torchcompile::ir::eliminate_dead_code(segments[0].gm->graph());
  EXPECT_THAT(call_targets(*segments[0].gm), ::testing::ElementsAre("aten::abs", "aten::sum"));
  EXPECT_THAT(call_targets(*segments[1].gm), ::testing::ElementsAre("aten::mul.Tensor"));
  EXPECT_EQ(segments[1].input_slots, (std::vector<uint32_t>{0, segments[0].output_slots[0]}));
  EXPECT_FALSE(segments[1].branch.has_value());
}

TEST(Tracer, MetadataQueriesDoNotFail) {
  auto gm = trace([](auto in) {
    auto n = in[0].size(0) + in[0].dim() + in[0].numel();
    (void)in[0].is_same_size(in[0]);
    return std::vector<torch::Tensor>{in[0] * static_cast<double>(n)};
  }, {torch::randn({2, 2})});
  EXPECT_EQ(count_calls(gm->graph()), 1u);
}

TEST(Tracer, OtherThreadsAreNotTraced) {
  Tracer t;
  auto x = torch::randn({3});
  t.add_input(x, "x");
  torch::Tensor y;
  {
    Tracer::Activation a(t);
    std::thread other([] { (void)(torch::ones({2}) * 5).sum(); });
    other.join();
    y = x.neg();
  }
  auto gm = t.finish({y});
  EXPECT_THAT(call_targets(*gm), ::testing::ElementsAre("aten::neg"));
}

TEST(Tracer, DataSharedOutsideTheDispatcherFailsTheTrace) {
  Tracer t;
  auto x = torch::randn({3});
  t.add_input(x, "x");
  {
    Tracer::Activation a(t);
    auto alias = torch::from_blob(x.data_ptr<float>(), {3});  // not produced by an op
    (void)(alias + 1);
  }
  ASSERT_TRUE(t.failed());
  EXPECT_THAT(t.failure()->reason, ::testing::HasSubstr("sharing memory"));
}

TEST(Tracer, MemoryOfAResultReachedOutsideTheDispatcherFailsTheTrace) {
  Tracer t;
  auto x = torch::randn({3});
  t.add_input(x, "x");
  {
    Tracer::Activation a(t);
    auto y = x * 2;
    auto alias = torch::from_blob(y.data_ptr<float>(), {3});  // the tracing call's values
    (void)(alias + 1);
  }
  ASSERT_TRUE(t.failed());
}

TEST(Tracer, AShallowCopyOfAResultIsThatResult) {
  // torch:: factories copy the TensorImpl of a result something else still references
  // (make_variable); the copy is the same value, not a constant.
  auto x = torch::randn({3});
  auto gm = trace([](auto in) {
    auto y = in[0] * 2;
    auto copy = torch::autograd::make_variable(y);  // a new TensorImpl over y's memory
    return std::vector<torch::Tensor>{copy + 1};
  }, {x});
  EXPECT_THAT(call_targets(*gm), ::testing::ElementsAre("aten::mul.Scalar", "aten::add.Scalar"));
  auto x2 = torch::randn({3});
  EXPECT_TRUE(tc_test::tensors_equal(x2 * 2 + 1, torchcompile::ir::Interpreter(*gm).run({x2}).at(0)));
}

TEST(Tracer, FactoryResultsFilledByHostCodeBecomeConstants) {
  // at::tensor(std::vector) and accessor loops write an `empty` result outside the dispatcher;
  // replaying `empty` would lose the values.
  auto gm = trace([](auto in) {
    auto a = torch::tensor(std::vector<float>{1.f, 2.f, 3.f});
    auto b = torch::empty({3});
    auto acc = b.accessor<float, 1>();
    for (int i = 0; i < 3; ++i) acc[i] = 10.f * i;
    auto c = torch::zeros({3});
    c.add_(in[0]);  // written by an op: stays a factory op
    return std::vector<torch::Tensor>{a + b + c};
  }, {torch::randn({3})});
  EXPECT_EQ(count_calls(gm->graph(), "aten::clone"), 2u) << torchcompile::ir::to_text(gm->graph());
  EXPECT_EQ(count_calls(gm->graph(), "aten::zeros"), 1u);
  auto x2 = torch::randn({3});
  auto expected = torch::tensor({1.f, 12.f, 23.f}) + x2;
  for (int call = 0; call < 2; ++call)
    EXPECT_TRUE(tc_test::tensors_equal(expected, torchcompile::ir::Interpreter(*gm).run({x2}).at(0)));
}

TEST(Tracer, DeadCodeIsLeftToThePipelineWhichKeepsRandomness) {
  auto gm = trace([](auto in) {
    (void)in[0].exp();                  // dead and pure: removed
    (void)torch::dropout(in[0], 0.5, true);  // dead but draws random numbers: kept
    return std::vector<torch::Tensor>{in[0].sin()};
  }, {torch::randn({8})});
  EXPECT_THAT(call_targets(*gm), ::testing::ElementsAre("aten::exp", "aten::dropout", "aten::sin"));
  torchcompile::ir::eliminate_dead_code(gm->graph());
  EXPECT_THAT(call_targets(*gm), ::testing::ElementsAre("aten::dropout", "aten::sin"));
}

}  // namespace

// convolution_on_meta (what shape-only traces and compile_per_shape give a convolution, which has
// no meta kernel in LibTorch 1.13, instead of running it on zeros of the real sizes): for random
// 1-3-D convolutions, transposed or not, with strides, padding (integers, "valid", "same"),
// dilation and groups, batched or not, through each op that reaches it, the result's sizes,
// strides and dtype are those of the real op on zeros; where the formula does not apply it
// gives nullopt.
TEST(Capture, ConvolutionResultsOnMetaTensorsAreTheRealOnes) {
  std::mt19937 rng(71);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto meta = [](const at::Tensor& t) {
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  };
  int computed = 0;
  for (int round = 0; round < 400; ++round) {
    const int spatial = pick(1, 3);
    const bool transposed = pick(0, 2) == 0;
    const int groups = pick(0, 2) == 0 ? pick(1, 3) : 1;
    const int64_t cin = groups * pick(1, 3), cout = groups * pick(1, 3);
    const bool batched = pick(0, 3) != 0;
    std::vector<int64_t> xs, ws;
    if (batched) xs.push_back(pick(1, 3));
    xs.push_back(cin);
    ws = transposed ? std::vector<int64_t>{cin, cout / groups} : std::vector<int64_t>{cout, cin / groups};
    std::vector<int64_t> stride, padding, dilation, output_padding;
    for (int d = 0; d < spatial; ++d) {
      xs.push_back(pick(1, 9));
      ws.push_back(pick(1, 3));
      stride.push_back(pick(1, 3));
      padding.push_back(pick(0, 2));
      dilation.push_back(pick(1, 2));
      output_padding.push_back(pick(0, static_cast<int>(std::max(stride.back(), dilation.back()) - 1)));
    }
    const at::Tensor x = at::zeros(xs), w = at::zeros(ws);
    const at::Tensor b = pick(0, 1) ? at::zeros({cout}) : at::Tensor();
    const int form = pick(0, 2);  // 0: convolution, 1: convN d / conv_transposeN d, 2: padding string
    std::string name;
    std::vector<c10::IValue> args;
    if (!batched && form == 0) continue;  // aten::convolution takes batched inputs only
    const std::string n = std::to_string(spatial) + "d";
    std::string overload;
    if (form == 0) {
      name = "aten::convolution";
      args = {x, w, b, stride, padding, dilation, transposed, output_padding, int64_t(groups)};
    } else if (transposed) {
      name = "aten::conv_transpose" + n;
      overload = "input";
      args = {x, w, b, stride, padding, output_padding, int64_t(groups), dilation};
    } else if (form == 1) {
      name = "aten::conv" + n;
      args = {x, w, b, stride, padding, dilation, int64_t(groups)};
    } else {
      name = "aten::conv" + n;
      overload = "padding";
      const bool same = pick(0, 1);
      if (same) stride.assign(spatial, 1);
      args = {x, w, b, stride, std::string(same ? "same" : "valid"), dilation, int64_t(groups)};
    }
    auto found = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!found && overload == "input") found = c10::Dispatcher::singleton().findSchema({name, ""});  // conv_transpose1d
    ASSERT_TRUE(found.has_value()) << name << "." << overload;
    const c10::OperatorHandle& op = *found;
    std::optional<at::Tensor> expected;
    std::string thrown;
    try {
      torch::jit::Stack stack(args.begin(), args.end());
      op.callBoxed(&stack);
      expected = stack.back().toTensor();
    } catch (const std::exception& e) {  // c10::Error, or oneDNN's own error from ATen's kernel
      thrown = e.what();
    }
    std::vector<c10::IValue> on_meta;
    for (const c10::IValue& a : args) on_meta.push_back(a.isTensor() && a.toTensor().defined() ? meta(a.toTensor()) : a);
    const std::optional<at::Tensor> got = torchcompile::capture::convolution_on_meta(op, on_meta);
    const std::string what = name + " " + c10::str(at::IntArrayRef(xs)) + " * " + c10::str(at::IntArrayRef(ws)) +
                             " stride " + c10::str(at::IntArrayRef(stride)) + " padding " + c10::str(at::IntArrayRef(padding)) +
                             " dilation " + c10::str(at::IntArrayRef(dilation)) + " groups " + std::to_string(groups);
    if (!got) continue;
    ++computed;
    ASSERT_TRUE(expected.has_value()) << what << ": the op throws (" << thrown << "), the formula gave "
                                      << got->sizes();
    EXPECT_TRUE(got->is_meta()) << what;
    EXPECT_EQ(got->sizes(), expected->sizes()) << what;
    EXPECT_EQ(got->strides(), expected->strides()) << what;
    EXPECT_EQ(got->scalar_type(), expected->scalar_type()) << what;
  }
  EXPECT_GT(computed, 150);
}

namespace {

// Meta copies of the tensors in `args` (same sizes and strides).
std::vector<c10::IValue> on_meta_device(const std::vector<c10::IValue>& args) {
  std::vector<c10::IValue> out;
  for (const c10::IValue& a : args) {
    if (!a.isTensor() || !a.toTensor().defined()) {
      out.push_back(a);
      continue;
    }
    const at::Tensor& t = a.toTensor();
    out.push_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta)));
  }
  return out;
}

// What a `*_on_meta` function gave (`got`) for `op` on meta copies of `args`: nullopt where the
// case `declines`, else results with the sizes, strides and dtypes of the op's real results on
// `args`. Counts the cases.
void expect_meta_results(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                         const std::optional<std::vector<at::Tensor>>& got, bool declines, const std::string& what,
                         int& computed, int& declined) {
  if (declines) {
    EXPECT_FALSE(got.has_value()) << what;
    ++declined;
    return;
  }
  ASSERT_TRUE(got.has_value()) << what;
  ++computed;
  torch::jit::Stack stack(args.begin(), args.end());
  op.callBoxed(&stack);
  ASSERT_EQ(got->size(), stack.size()) << what;
  for (size_t i = 0; i < stack.size(); ++i) {
    const at::Tensor& expected = stack[i].toTensor();
    const at::Tensor& result = (*got)[i];
    EXPECT_TRUE(result.is_meta()) << what << ", result " << i;
    EXPECT_EQ(result.sizes(), expected.sizes()) << what << ", result " << i;
    EXPECT_EQ(result.strides(), expected.strides()) << what << ", result " << i;
    EXPECT_EQ(result.scalar_type(), expected.scalar_type()) << what << ", result " << i;
  }
}

}  // namespace

// embedding_on_meta (what shape-only traces and the size fit give an Embedding, whose op has no
// meta kernel in LibTorch 1.13, instead of running it on zeros of the real sizes): for random
// weights and indices (0-3-D, int64 or int32, contiguous or not) the result has the sizes,
// strides and dtype of the real op's; for a weight that is not 2-D or float indices, nullopt.
TEST(Capture, EmbeddingResultOnMetaTensorsIsTheRealOne) {
  std::mt19937 rng(73);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto op = c10::Dispatcher::singleton().findSchema({"aten::embedding", ""});
  ASSERT_TRUE(op.has_value());
  int computed = 0, declined = 0;
  for (int round = 0; round < 200; ++round) {
    const at::ScalarType wtype = pick(0, 2) == 0 ? at::kDouble : at::kFloat;
    const int misfit = pick(0, 7);  // 0: a 3-D weight, 1: float indices
    const at::Tensor weight =
        misfit == 0 ? at::zeros({pick(1, 9), pick(1, 5), 2}, at::TensorOptions().dtype(wtype))
                    : at::zeros({pick(1, 9), pick(1, 7)}, at::TensorOptions().dtype(wtype));
    std::vector<int64_t> is;
    for (int d = pick(0, 3); d > 0; --d) is.push_back(pick(1, 5));
    at::Tensor indices = at::zeros(is, at::TensorOptions().dtype(pick(0, 1) ? at::kLong : at::kInt));
    if (indices.dim() >= 2 && pick(0, 1)) indices = indices.transpose(0, 1);
    if (misfit == 1) indices = indices.to(at::kFloat);
    const std::vector<c10::IValue> args = {weight, indices, int64_t(pick(-1, 0)), false, false};
    std::optional<std::vector<at::Tensor>> got;
    if (auto r = torchcompile::capture::embedding_on_meta(*op, on_meta_device(args))) got = std::vector<at::Tensor>{*r};
    const std::string what = c10::str("weight ", weight.sizes(), " indices ", indices.sizes(), " ", indices.scalar_type());
    expect_meta_results(*op, args, got, misfit <= 1, what, computed, declined);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(computed, 100);
  EXPECT_GT(declined, 20);
}

// layer_norm_on_meta (what shape-only traces give LayerNorm, whose `native_layer_norm` has no
// meta kernel, instead of running it on zeros of the real sizes): for random inputs (1-4-D, float
// or double, one to all trailing dimensions normalized, with and without weight and bias) the
// results of `native_layer_norm` (three) and `layer_norm` (one) have the sizes, strides and dtypes of the real op's on zeros; for a normalized
// shape or weight that does not fit the input, it gives nullopt (the op decides).
TEST(Capture, LayerNormResultsOnMetaTensorsAreTheRealOnes) {
  std::mt19937 rng(72);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto native_op = c10::Dispatcher::singleton().findSchema({"aten::native_layer_norm", ""});
  auto composite_op = c10::Dispatcher::singleton().findSchema({"aten::layer_norm", ""});
  ASSERT_TRUE(native_op.has_value() && composite_op.has_value());
  int computed = 0, declined = 0;
  for (int round = 0; round < 300; ++round) {
    const bool native = round % 2 == 0;
    const c10::OperatorHandle& op = native ? *native_op : *composite_op;
    const int dims = pick(1, 4);
    std::vector<int64_t> xs;
    for (int d = 0; d < dims; ++d) xs.push_back(pick(1, 6));
    const at::ScalarType dtype = pick(0, 3) == 0 ? at::kDouble : at::kFloat;
    const int kept = pick(1, dims);
    std::vector<int64_t> normalized(xs.end() - kept, xs.end());
    const bool misfit = pick(0, 7) == 0;
    if (misfit) normalized.back() += 1;
    const bool affine = pick(0, 1);
    const at::Tensor x = at::zeros(xs, at::TensorOptions().dtype(dtype));
    const at::Tensor w = affine ? at::zeros(normalized, x.options()) : at::Tensor();
    const at::Tensor b = affine && pick(0, 1) ? at::zeros(normalized, x.options()) : at::Tensor();
    std::vector<c10::IValue> args = {x, normalized, w, b, 1e-5};
    if (!native) args.push_back(true);  // cudnn_enable
    const auto got = torchcompile::capture::layer_norm_on_meta(op, on_meta_device(args));
    const std::string what = c10::str(native ? "native_layer_norm " : "layer_norm ", at::IntArrayRef(xs),
                                      " normalized ", at::IntArrayRef(normalized), " ", dtype, affine ? " affine" : "");
    if (got) EXPECT_EQ(got->size(), native ? 3u : 1u) << what;
    expect_meta_results(op, args, got, misfit, what, computed, declined);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(computed, 100);
  EXPECT_GT(declined, 5);
}

// metadata_at_points (one copy, one interpreter for several input sizes): each point's metadata
// is what tracing the forward at those sizes records, node by node (a matmul, LayerNorm without
// a meta kernel in LibTorch 1.13, a view whose sizes are the traced constants, a reduction), and
// what metadata_at gives for that point alone.
TEST(Capture, MetadataAtSeveralPointsIsEachPointsTrace) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  torch::nn::Linear lin(8, 12);
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({12}));
  auto fn = [&](std::vector<torch::Tensor> in) {
    torch::Tensor h = norm->forward(lin->forward(in[0])).relu();
    return std::vector<torch::Tensor>{h.sum(-1, true) * h, h.transpose(0, 1).contiguous()};
  };
  auto gm = trace(fn, {torch::randn({5, 8})});
  std::vector<std::vector<torch::Tensor>> inputs = {{torch::randn({3, 8})}, {torch::randn({9, 8})}, {torch::randn({1, 8})}};
  std::vector<std::vector<torchcompile::ir::TensorMeta>> points;
  for (const auto& in : inputs) points.push_back({torchcompile::ir::TensorMeta::of(in[0])});
  const auto all = torchcompile::capture::metadata_at_points(*gm, points);
  ASSERT_EQ(all.size(), points.size());
  for (size_t p = 0; p < points.size(); ++p) {
    SCOPED_TRACE("point " + std::to_string(p));
    auto traced = trace(fn, inputs[p]);
    const auto alone = torchcompile::capture::metadata_at(*gm, points[p]);
    size_t compared = 0;
    for (const auto& n : traced->graph().nodes()) {
      if (n->kind() != NodeKind::CallFunction) continue;
      auto it = all[p].find(n->name());
      ASSERT_NE(it, all[p].end()) << n->name();
      ASSERT_EQ(it->second.size(), n->output_meta().size()) << n->name();
      for (size_t o = 0; o < it->second.size(); ++o) {
        EXPECT_EQ(it->second[o].sizes, n->output_meta()[o].sizes) << n->name();
        EXPECT_EQ(it->second[o].strides, n->output_meta()[o].strides) << n->name();
        EXPECT_EQ(it->second[o].dtype, n->output_meta()[o].dtype) << n->name();
        EXPECT_EQ(alone.at(n->name())[o].sizes, it->second[o].sizes) << n->name();
      }
      ++compared;
    }
    EXPECT_GE(compared, 6u);
  }
}

// PyTorch's fast-path encoder layer (`aten::_transformer_encoder_layer_fwd`, what scripted
// nn.TransformerEncoderLayer calls in eval mode) is traced as the operators it runs: random
// layers (post- and pre-norm, relu and gelu, key padding masks, attention masks, none, sizes),
// compiled by `eager` and `default`, statically and with size symbols, give the operator's own
// result on every call, and the graph holds its linear layers instead of the operator.
TEST(Tracer, FastPathEncoderLayersAreTracedAsTheirOperators) {
  torch::NoGradGuard no_grad;
  std::mt19937 rng(20261128);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  for (int trial = 0; trial < 24; ++trial) {
    torch::manual_seed(trial);
    const int64_t H = std::vector<int64_t>{1, 2, 4}[pick(3)], E = H * (8 + 8 * pick(3)), F = 2 * E + 16 * pick(2);
    const bool gelu = pick(2), norm_first = pick(2);
    // 0: attention mask (T, T), which LibTorch 1.13's kernel rejects unless T is the batch size
    // (left to the operator, which must throw in the trace as it does eagerly); 1: key padding
    // mask (B, T); 2: none.
    const int mask_kind = pick(3);
    const double eps = pick(2) ? 1e-5 : 1e-6;
    std::vector<at::Tensor> w = {torch::randn({3 * E, E}) * 0.2, torch::randn({3 * E}) * 0.1, torch::randn({E, E}) * 0.2,
                                 torch::randn({E}) * 0.1,       torch::rand({E}) + 0.5,       torch::randn({E}) * 0.1,
                                 torch::rand({E}) + 0.5,        torch::randn({E}) * 0.1,      torch::randn({F, E}) * 0.2,
                                 torch::randn({F}) * 0.1,       torch::randn({E, F}) * 0.2,   torch::randn({E}) * 0.1};
    auto layer = [=](const at::Tensor& x, const at::Tensor& mask) {
      c10::optional<at::Tensor> m;
      c10::optional<int64_t> type;
      if (mask_kind != 2) m = mask, type = mask_kind;
      return at::_transformer_encoder_layer_fwd(x, E, H, w[0], w[1], w[2], w[3], gelu, norm_first, eps, w[4], w[5], w[6],
                                                w[7], w[8], w[9], w[10], w[11], m, type);
    };
    auto inputs = [&](int64_t B, int64_t T) {
      at::Tensor x = torch::randn({B, T, E});
      at::Tensor mask = mask_kind == 0 ? torch::ones({T, T}, torch::kBool).triu(1)  // causal
                                       : torch::arange(T).unsqueeze(0).ge(torch::randint(0, T + 1, {B, 1}));  // 0: all padding
      return std::pair{x, mask};
    };
    const std::string what = "E " + std::to_string(E) + " H " + std::to_string(H) + " F " + std::to_string(F) +
                             (gelu ? " gelu" : " relu") + (norm_first ? " norm_first" : "") + " mask " +
                             std::to_string(mask_kind);
    for (const char* backend : {"eager", "default"}) {
      for (bool dynamic : {false, true}) {
        tc_test::CompileCounter cc;  // `eager`: the graphs replayed as they are, and kept to look at
        torchcompile::CompileOptions options = std::string(backend) == "eager"
                                                   ? torchcompile::CompileOptions(cc.backend())
                                                   : torchcompile::CompileOptions("default");
        auto fast = torch::compile(layer, options.with_dynamic(dynamic));
        for (auto [B, T] : {std::pair<int64_t, int64_t>{2, 7}, {2, 7}, {3, 5}, {1, 9}, {3, 5}}) {
          auto [x, mask] = inputs(B, T);
          at::Tensor expected;
          const std::string eager_error = tc_test::error_of([&] { expected = layer(x, mask); });
          if (!eager_error.empty()) {  // the compiled call throws too
            EXPECT_FALSE(tc_test::error_of([&] { fast(x, mask); }).empty()) << what << ": eager throws " << eager_error;
            continue;
          }
          const at::Tensor got = fast(x, mask);
          EXPECT_TRUE(tc_test::tensors_close(expected, got, 1e-4, 1e-5))
              << what << " " << backend << (dynamic ? " dynamic" : "") << " at B " << B << " T " << T;
        }
        if (std::string(backend) == "eager" && mask_kind != 0) {
          ASSERT_FALSE(cc.graphs().empty()) << what;
          for (const std::string& g : cc.graphs()) {
            EXPECT_EQ(g.find("_transformer_encoder_layer_fwd"), std::string::npos) << what << "\n" << g;
            EXPECT_NE(g.find("aten::linear"), std::string::npos) << what << "\n" << g;
          }
        }
      }
    }
  }
}
