// One test per guard kind: a change that must recompile does, with the expected reason, and
// changes that must not (a new tensor with the same metadata, a parameter updated in place by
// an optimizer step) do not. A few tests build a GuardSet directly (runtime/guards.h) for
// checks that are awkward to reach through a traced forward.
#include "support/test_util.h"

#include <gmock/gmock.h>

#include "runtime/guards.h"

#include <torchcompile/compat.h>

using tc_test::CompileCounter;
using tc_test::tensors_close;
using ::testing::HasSubstr;
using torchcompile::runtime::CallArgs;
using torchcompile::runtime::GuardSet;

namespace {

// ---- RAII for global state (tests must restore it even when they fail) ----------------------

struct DefaultDtypeGuard {
  caffe2::TypeMeta saved = c10::get_default_dtype();
  explicit DefaultDtypeGuard(caffe2::TypeMeta t) { torch::set_default_dtype(t); }
  ~DefaultDtypeGuard() { torch::set_default_dtype(saved); }
};

struct DeterministicGuard {
  bool saved = at::globalContext().deterministicAlgorithms();
  bool saved_warn_only = at::globalContext().deterministicAlgorithmsWarnOnly();
  explicit DeterministicGuard(bool on) { at::globalContext().setDeterministicAlgorithms(on, false); }
  ~DeterministicGuard() { at::globalContext().setDeterministicAlgorithms(saved, saved_warn_only); }
};

struct AutocastCpuGuard {
  bool saved = torchcompile::compat::autocast_cpu_enabled();
  c10::ScalarType saved_dtype = torchcompile::compat::autocast_cpu_dtype();
  explicit AutocastCpuGuard(bool on) { torchcompile::compat::set_autocast_cpu_enabled(on); }
  ~AutocastCpuGuard() {
    torchcompile::compat::set_autocast_cpu_enabled(saved);
    torchcompile::compat::set_autocast_cpu_dtype(saved_dtype);
    at::autocast::clear_cache();
  }
};

// LibTorch 1.13 only allows BFloat16 as the CPU autocast dtype; 2.x also Half.
bool try_set_autocast_cpu_dtype(c10::ScalarType t) {
  try {
    torchcompile::compat::set_autocast_cpu_dtype(t);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// ---- modules --------------------------------------------------------------------------------

// y = x * w + b with w, b registered parameters that can be replaced in the registry (a module
// may write its own protected `parameters_`; register_parameter refuses an existing name).
struct AffineImpl : torch::nn::Module {
  torch::Tensor w, b;
  explicit AffineImpl(int64_t n) {
    w = register_parameter("w", torch::randn({n}));
    b = register_parameter("b", torch::randn({n}));
  }
  void replace_w(torch::Tensor t) { w = parameters_["w"] = std::move(t); }
  torch::Tensor forward(torch::Tensor x) { return x * w + b; }
};
TORCH_MODULE(Affine);

// Doubles its input in training mode: the training flag changes the result.
struct TrainDoubleImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return is_training() ? x * 2 : x; }
};
TORCH_MODULE(TrainDouble);

struct BlockImpl : torch::nn::Module {
  Affine aff{nullptr};
  TrainDouble twice{nullptr};
  BlockImpl() {
    aff = register_module("aff", Affine(8));
    twice = register_module("twice", TrainDouble());
  }
  torch::Tensor forward(torch::Tensor x) { return twice->forward(aff->forward(x)); }
};
TORCH_MODULE(Block);

struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  Block block{nullptr};
  Net() {
    fc = register_module("fc", torch::nn::Linear(8, 8));
    block = register_module("block", Block());
  }
  torch::Tensor forward(torch::Tensor x) { return block->forward(fc->forward(x)).relu(); }
};

struct WithBuffer : torch::nn::Module {
  torch::Tensor scale;
  WithBuffer() { scale = register_buffer("scale", torch::full({4}, 3.0)); }
  torch::Tensor forward(torch::Tensor x) { return x * scale; }
};

CallArgs args_of(std::initializer_list<at::Tensor> ts) {
  CallArgs a;
  for (const auto& t : ts) a.add(t);
  return a;
}

// Why the oldest entry of `fast` rejects `args` (last_recompile_reason() reports the most
// recently used entry's reason).
template <typename Compiled>
std::string first_entry_reason(const Compiled& fast, const CallArgs& args) {
  return fast.state().entries().back()->guards().failure_reason(args);
}

torchcompile::CompileOptions opts(const CompileCounter& cc) {
  return torchcompile::CompileOptions(cc.backend()).with_input_names({"x"});
}

// ---- inputs ------------------------------------------------------------------------------------

TEST(Guards, NewTensorsWithTheSameMetadataDoNotRecompile) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a, torch::Tensor b) { return a * b; }, cc.backend());
  for (int i = 0; i < 5; ++i) {
    auto a = torch::randn({3, 4}), b = torch::randn({3, 4});
    EXPECT_TRUE(tensors_close(a * b, fast(a, b)));
  }
  // A view with the same sizes and strides is the same signature too.
  auto big = torch::randn({6, 4});
  auto view = big.narrow(0, 2, 3);
  EXPECT_TRUE(tensors_close(view * view, fast(view, view.clone())));
  EXPECT_EQ(cc.frames(), 1);
}

TEST(Guards, DimensionalityAndRequiresGradReasons) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a) { return a + 1; }, opts(cc));
  fast(torch::randn({2, 3}));
  fast(torch::randn({2, 3, 1}));
  EXPECT_EQ(fast.state().last_recompile_reason(), "tensor 'x' dimensionality mismatch: expected 2, got 3");
  fast(torch::randn({2, 3}, torch::requires_grad()));
  EXPECT_EQ(fast.state().last_recompile_reason(), "tensor 'x' requires_grad mismatch: expected false, got true");
  EXPECT_EQ(cc.frames(), 3);
}

TEST(Guards, InferenceModeIsGuarded) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a) { return a.sin(); }, opts(cc));
  auto x = torch::randn({4});
  fast(x);
  {
    c10::InferenceMode inference;
    auto y = fast(x);
    EXPECT_TRUE(tensors_close(x.sin(), y));
  }
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().last_recompile_reason(), "inference mode mismatch: expected false, got true");
}

// ---- global state ------------------------------------------------------------------------------

TEST(Guards, DefaultDtypeChangeRecompiles) {
  CompileCounter cc;
  // torch::ones() inside the forward follows the default dtype: Float + Double(1-d) -> Double.
  auto fast = torch::compile([](torch::Tensor a) { return a + torch::ones({3}); }, opts(cc));
  auto x = torch::randn({3});
  EXPECT_EQ(fast(x).scalar_type(), torch::kFloat);
  {
    DefaultDtypeGuard dbl(caffe2::TypeMeta::Make<double>());
    auto y = fast(x);
    EXPECT_EQ(y.scalar_type(), torch::kDouble);
    EXPECT_TRUE(tensors_close(x.to(torch::kDouble) + 1, y));
    EXPECT_EQ(cc.frames(), 2);
    EXPECT_EQ(fast.state().last_recompile_reason(), "default dtype mismatch: expected Float, got Double");
  }
  EXPECT_EQ(c10::get_default_dtype(), caffe2::TypeMeta::Make<float>());
  EXPECT_EQ(fast(x).scalar_type(), torch::kFloat);
  EXPECT_EQ(cc.frames(), 2) << "back to Float: the first entry is reused";
}

TEST(Guards, DeterministicAlgorithmsFlagRecompiles) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a) { return a * 2; }, opts(cc));
  auto x = torch::randn({5});
  fast(x);
  {
    DeterministicGuard on(true);
    EXPECT_TRUE(tensors_close(x * 2, fast(x)));
    EXPECT_EQ(cc.frames(), 2);
    EXPECT_EQ(fast.state().last_recompile_reason(), "deterministic algorithms mismatch: expected false, got true");
  }
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  fast(x);
  EXPECT_EQ(cc.frames(), 2);
}

TEST(Guards, CpuAutocastRecompiles) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a, torch::Tensor b) { return torch::mm(a, b); }, cc.backend());
  auto a = torch::randn({4, 4}), b = torch::randn({4, 4});
  fast(a, b);
  {
    AutocastCpuGuard autocast(true);
    ASSERT_TRUE(try_set_autocast_cpu_dtype(torch::kBFloat16));
    auto eager = torch::mm(a, b);
    auto y = fast(a, b);
    EXPECT_EQ(cc.frames(), 2);
    EXPECT_EQ(fast.state().last_recompile_reason(), "autocast (CPU) mismatch: expected disabled, got enabled");
    EXPECT_EQ(y.scalar_type(), eager.scalar_type());
    EXPECT_TRUE(tensors_close(eager, y));
    fast(a, b);
    EXPECT_EQ(cc.frames(), 2);
    // While enabled, its dtype matters too (LibTorch 2.x; 1.13 only has BFloat16 on CPU).
    if (try_set_autocast_cpu_dtype(torch::kHalf)) {
      at::autocast::clear_cache();
      fast(a, b);
      EXPECT_EQ(cc.frames(), 3);
      EXPECT_EQ(fast.state().last_recompile_reason(), "autocast (CPU) dtype mismatch: expected BFloat16, got Half");
    }
  }
  EXPECT_FALSE(torchcompile::compat::autocast_cpu_enabled());
  const int frames = cc.frames();
  fast(a, b);
  EXPECT_EQ(cc.frames(), frames) << "autocast off again: the first entry is reused";
}

TEST(Guards, AutocastDtypeIsNotGuardedWhileAutocastIsOff) {
  CompileCounter cc;
  auto fast = torch::compile([](torch::Tensor a) { return a + 1; }, cc.backend());
  auto x = torch::randn({3});
  fast(x);
  {
    AutocastCpuGuard off(false);
    if (!try_set_autocast_cpu_dtype(torch::kHalf)) GTEST_SKIP() << "LibTorch 1.13: CPU autocast is BFloat16 only";
    fast(x);
  }
  EXPECT_EQ(cc.frames(), 1);
}

// ---- modules: parameters and buffers -------------------------------------------------------------

TEST(Guards, InPlaceParameterUpdatesDoNotRecompile) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  auto fast = torch::compile(net, opts(cc));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto x = torch::randn({3, 8});
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    auto loss = fast(x).pow(2).sum();
    loss.backward();
    sgd.step();
  }
  {
    torch::NoGradGuard no_grad;
    net->fc->weight.mul_(0.5);
    net->block->aff->b.add_(1);
  }
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_EQ(cc.frames(), 1) << fast.state().last_recompile_reason();
}

TEST(Guards, ParameterReplacedInTheRegistryRecompiles) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  auto fast = torch::compile(net, opts(cc));
  auto x = torch::randn({3, 8});
  fast(x);
  net->block->aff->replace_w(torch::full({8}, 2.0, torch::requires_grad()));
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().last_recompile_reason(), "parameter 'block.aff.w' was replaced (identity changed)");
  fast(x);
  EXPECT_EQ(cc.frames(), 2);
}

TEST(Guards, ParameterShapeChangedThroughSetDataRecompiles) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  auto fast = torch::compile(net, opts(cc));
  auto x = torch::randn({3, 8});
  fast(x);
  {
    // set_data keeps the TensorImpl (identity) and changes its metadata: Linear(8, 8) -> (8, 5)
    // cannot be used by Block(8), so widen the input side instead: weight (8, 5), x (3, 5).
    auto params = net->named_parameters();
    params["fc.weight"].set_data(torch::randn({8, 5}));
  }
  auto x5 = torch::randn({3, 5});
  EXPECT_TRUE(tensors_close(net->forward(x5), fast(x5)));
  EXPECT_EQ(cc.frames(), 2);
  // The input's guard fails first (it is checked before the parameters); with the old input
  // shape, the parameter's own guard is the reason.
  EXPECT_EQ(fast.state().last_recompile_reason(), "tensor 'x' size mismatch at index 1: expected 8, got 5");
  net->named_parameters()["fc.weight"].set_data(torch::randn({8, 8}));
  fast(x);  // the first entry again
  net->named_parameters()["fc.weight"].set_data(torch::randn({8, 6}));
  EXPECT_THROW(fast(x), c10::Error);  // (3, 8) x (6, 8)^T: eager throws too, but only after the guard misses
  EXPECT_EQ(fast.state().last_recompile_reason(), "parameter 'fc.weight' size mismatch at index 1: expected 8, got 6");
}

TEST(Guards, ParameterSizeMismatchReasonAtIndexZero) {
  CompileCounter cc;
  auto lin = torch::nn::Linear(8, 4);
  auto fast = torch::compile(lin, opts(cc));
  auto x = torch::randn({2, 8});
  fast(x);
  lin->named_parameters()["weight"].set_data(torch::randn({5, 8}));
  lin->named_parameters()["bias"].set_data(torch::randn({5}));
  auto y = fast(x);
  EXPECT_EQ(y.size(1), 5);
  EXPECT_TRUE(tensors_close(lin->forward(x), y));
  EXPECT_EQ(fast.state().last_recompile_reason(), "parameter 'weight' size mismatch at index 0: expected 4, got 5");
}

TEST(Guards, ParameterRequiresGradRecompiles) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  auto fast = torch::compile(net, opts(cc));
  auto x = torch::randn({3, 8});
  auto y0 = fast(x);
  EXPECT_TRUE(y0.requires_grad());
  net->fc->weight.requires_grad_(false);  // freeze a layer
  fast(x);
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().last_recompile_reason(), "parameter 'fc.weight' requires_grad mismatch: expected true, got false");
}

TEST(Guards, ModuleToDoubleRecompilesOnDtype) {
  CompileCounter cc;
  auto m = std::make_shared<WithBuffer>();
  auto fast = torch::compile(m, opts(cc));
  fast(torch::randn({4}));
  m->to(torch::kDouble);
  auto xd = torch::randn({4}, torch::kDouble);
  auto y = fast(xd);
  EXPECT_EQ(y.scalar_type(), torch::kDouble);
  EXPECT_TRUE(tensors_close(xd * 3, y));
  EXPECT_EQ(cc.frames(), 2);
  // The input is checked first; with a Float input the buffer's own guard is the reason.
  EXPECT_EQ(fast.state().last_recompile_reason(), "tensor 'x' dtype mismatch: expected Float, got Double");
  // A Float input with the Double buffer: the first entry's own reason is the buffer.
  fast(torch::randn({4}));
  EXPECT_EQ(cc.frames(), 3);
  EXPECT_EQ(first_entry_reason(fast, args_of({torch::randn({4})})),
            "buffer 'scale' dtype mismatch: expected Float, got Double");
}

TEST(Guards, BatchNormToDoubleNamesTheFirstParameter) {
  CompileCounter cc;
  auto bn = torch::nn::BatchNorm1d(4);
  bn->eval();
  auto fast = torch::compile(bn, cc.backend());
  auto x = torch::randn({2, 4}, torch::kDouble);
  bn->to(torch::kDouble);
  fast(x);
  EXPECT_EQ(first_entry_reason(fast, args_of({x})), "");
  bn->to(torch::kFloat);  // set_data on each parameter and buffer: identities kept
  // (Calling with the Double input would now fail in eager BatchNorm too; ask the guards.)
  EXPECT_EQ(first_entry_reason(fast, args_of({x})), "parameter 'weight' dtype mismatch: expected Double, got Float");
  auto xf = x.to(torch::kFloat);
  EXPECT_TRUE(tensors_close(bn->forward(xf), fast(xf)));
  EXPECT_EQ(cc.frames(), 2);
}

TEST(Guards, RegisteringANewBufferRecompiles) {
  CompileCounter cc;
  auto m = std::make_shared<WithBuffer>();
  auto fast = torch::compile(m, opts(cc));
  auto x = torch::randn({4});
  fast(x);
  m->register_buffer("extra", torch::zeros({1}));
  fast(x);
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().last_recompile_reason(), "module '<root>' buffer count mismatch: expected 1, got 2");
}

// ---- modules: structure and training flags ----------------------------------------------------

TEST(Guards, ReplacedSubmoduleRecompiles) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  auto fast = torch::compile(net, opts(cc));
  auto x = torch::randn({3, 8});
  fast(x);
  net->fc = net->replace_module("fc", torch::nn::Linear(8, 8));
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().last_recompile_reason(), "submodule 'fc' was replaced (identity changed)");

  net->block->twice = net->block->replace_module("twice", TrainDouble());
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_EQ(cc.frames(), 3);
  EXPECT_EQ(fast.state().last_recompile_reason(), "submodule 'block.twice' was replaced (identity changed)");
}

TEST(Guards, UnregisteredAndReregisteredSubmoduleRecompiles) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  auto fast = torch::compile(net, opts(cc));
  auto x = torch::randn({3, 8});
  fast(x);
  net->unregister_module("fc");
  fast(x);  // the forward still uses the member: it runs, but the structure changed
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().last_recompile_reason(), "module '<root>' submodule count mismatch: expected 2, got 1");
  net->fc = net->register_module("fc", torch::nn::Linear(8, 8));  // now after "block"
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_EQ(cc.frames(), 3);
  EXPECT_EQ(fast.state().last_recompile_reason(), "module '<root>' submodule count mismatch: expected 1, got 2");
  EXPECT_EQ(first_entry_reason(fast, args_of({x})), "module '<root>' submodule 0 changed: expected 'fc', got 'block'");
}

TEST(Guards, NestedTrainEvalRecompiles) {
  CompileCounter cc;
  auto net = std::make_shared<Net>();
  auto fast = torch::compile(net, opts(cc));
  auto x = torch::randn({3, 8});
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  net->block->twice->eval();  // only the nested submodule
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_EQ(cc.frames(), 2);
  EXPECT_EQ(fast.state().last_recompile_reason(), "module 'block.twice' training flag mismatch: expected true, got false");
  net->block->twice->train();
  EXPECT_TRUE(tensors_close(net->forward(x), fast(x)));
  EXPECT_EQ(cc.frames(), 2);
}

TEST(Guards, SharedSubmoduleIsGuardedOnce) {
  struct Shared : torch::nn::Module {
    Affine a{nullptr};
    Shared() {
      a = register_module("first", Affine(4));
      register_module("second", a);
    }
    torch::Tensor forward(torch::Tensor x) { return a->forward(a->forward(x)); }
  };
  CompileCounter cc;
  auto m = std::make_shared<Shared>();
  auto fast = torch::compile(m, opts(cc));
  auto x = torch::randn({4});
  EXPECT_TRUE(tensors_close(m->forward(x), fast(x)));
  fast(x);
  EXPECT_EQ(cc.frames(), 1);
  const auto& guards = fast.state().entries().front()->guards();
  EXPECT_EQ(guards.num_modules(), 2u);
  EXPECT_EQ(guards.num_attributes(), 2u);
}

// ---- GuardSet directly ----------------------------------------------------------------------------

TEST(GuardSetDirect, CheckAndFailureReasonAgree) {
  auto x = torch::randn({4, 6});
  auto g = GuardSet::build(args_of({x, x.t()}), nullptr, {"a", "b"});
  EXPECT_TRUE(g->check(args_of({torch::randn({4, 6}), torch::randn({6, 4})})) == false)
      << "b's strides differ from a transposed view's";
  auto y = torch::randn({4, 6});
  EXPECT_TRUE(g->check(args_of({y, torch::randn({4, 6}).t()})));
  EXPECT_EQ(g->failure_reason(args_of({y, torch::randn({4, 6}).t()})), "");
  EXPECT_EQ(g->failure_reason(args_of({torch::randn({4, 6}), torch::randn({6, 4})})),
            "tensor 'b' stride mismatch at index 0: expected 1, got 4");
  EXPECT_EQ(g->failure_reason(args_of({y})), "argument count mismatch: expected 2, got 1");
}

TEST(GuardSetDirect, LayoutChangeIsNamed) {
  auto x = torch::randn({3, 3});
  auto g = GuardSet::build(args_of({x}), nullptr, {"x"});
  auto sparse = torch::randn({3, 3}).to_sparse();
  EXPECT_FALSE(g->check(args_of({sparse})));
  EXPECT_EQ(g->failure_reason(args_of({sparse})), "tensor 'x' layout mismatch: expected Strided, got Sparse");
}

TEST(GuardSetDirect, ConjugateViewIsNotTheSameSignature) {
  auto z = torch::randn({3}, torch::kComplexFloat);
  auto g = GuardSet::build(args_of({z}), nullptr, {"z"});
  EXPECT_TRUE(g->check(args_of({torch::randn({3}, torch::kComplexFloat)})));
  EXPECT_FALSE(g->check(args_of({z.conj()})));  // a lazy conjugate: same metadata, Conjugate bit
  EXPECT_THAT(g->failure_reason(args_of({z.conj()})), HasSubstr("tensor 'z' dispatch key set mismatch"));
}

TEST(GuardSetDirect, UndefinedTensorArgument) {
  CallArgs a;
  a.add(at::Tensor());
  auto g = GuardSet::build(a, nullptr, {"x"});
  EXPECT_TRUE(g->check(a));
  EXPECT_EQ(g->failure_reason(args_of({torch::randn({1})})), "tensor 'x' definedness mismatch");
}

TEST(GuardSetDirect, DescribeListsEveryKind) {
  auto net = std::make_shared<Net>();
  auto g = GuardSet::build(args_of({torch::randn({3, 8})}), net, {"x"});
  std::string all;
  for (const auto& line : g->describe()) all += line + "\n";
  EXPECT_THAT(all, HasSubstr("tensor 'x': Float, cpu, Strided, sizes [3, 8], strides [8, 1], requires_grad false\n"));
  EXPECT_THAT(all, HasSubstr("grad mode enabled\n"));
  EXPECT_THAT(all, HasSubstr("inference mode disabled\n"));
  EXPECT_THAT(all, HasSubstr("default dtype Float\n"));
  EXPECT_THAT(all, HasSubstr("deterministic algorithms disabled\n"));
  EXPECT_THAT(all, HasSubstr("autocast (CPU) disabled\n"));
  EXPECT_THAT(all, HasSubstr("module '<root>' training=true\n"));
  EXPECT_THAT(all, HasSubstr("module '<root>' submodules [fc, block] (identity)\n"));
  EXPECT_THAT(all, HasSubstr("module 'block.twice' training=true\n"));
  EXPECT_THAT(all, HasSubstr("parameter 'fc.weight': Float, cpu, sizes [8, 8], requires_grad true, identity 0x"));
  EXPECT_THAT(all, HasSubstr("parameter 'block.aff.b': Float, cpu, sizes [8], requires_grad true"));
  EXPECT_EQ(g->num_modules(), 5u);     // root, fc, block, block.aff, block.twice
  EXPECT_EQ(g->num_attributes(), 4u);  // fc.weight, fc.bias, block.aff.w, block.aff.b
}

TEST(GuardSetDirect, HoldsReplacedParametersSoTheirAddressCannotBeReused) {
  auto aff = Affine(4);
  auto g = GuardSet::build(args_of({torch::randn({4})}), aff.ptr(), {"x"});
  const c10::TensorImpl* old_impl = aff->w.unsafeGetTensorImpl();
  aff->replace_w(torch::randn({4}));
  // Even if the allocator hands the freed address out again, the guard still holds the old
  // TensorImpl, so the new parameter cannot have the old address.
  for (int i = 0; i < 10; ++i) {
    auto t = torch::randn({4});
    EXPECT_NE(t.unsafeGetTensorImpl(), old_impl);
  }
  EXPECT_EQ(g->failure_reason(args_of({torch::randn({4})})), "parameter 'w' was replaced (identity changed)");
}

}  // namespace
