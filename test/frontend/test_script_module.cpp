// Compiled TorchScript modules (frontend/script_module.h): archives scripted and saved by
// Python's torch (scripts/make_torchscript_models.py, made at build time) and modules scripted in
// C++, compiled with built-in backends and compared with torch::jit::Module's own forward.
#include "support/test_util.h"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <thread>

namespace {

using torch::jit::IValue;

std::string archive(const std::string& name) { return std::string(TORCHCOMPILE_TORCHSCRIPT_MODELS) + "/" + name + ".pt"; }

std::string counting(const std::string& inner, std::shared_ptr<std::atomic<int>>& calls) {
  return tc_test::counting_backend_named("script_count", inner, calls);
}

// `actual` is `expected`: the same structure, tensors close (rtol 1e-4, atol 1e-5), other values equal.
void expect_same(const IValue& actual, const IValue& expected, const std::string& where) {
  ASSERT_EQ(actual.tagKind(), expected.tagKind()) << where;
  if (expected.isTensor()) {
    const at::Tensor &a = actual.toTensor(), &e = expected.toTensor();
    ASSERT_EQ(a.defined(), e.defined()) << where;
    if (!e.defined()) return;
    ASSERT_EQ(a.sizes(), e.sizes()) << where;
    ASSERT_EQ(a.scalar_type(), e.scalar_type()) << where;
    EXPECT_TRUE(at::allclose(a, e, 1e-4, 1e-5, /*equal_nan=*/true))
        << where << ": max difference " << (a.to(at::kDouble) - e.to(at::kDouble)).abs().max().item<double>();
  } else if (expected.isTuple()) {
    const auto &a = actual.toTupleRef().elements(), &e = expected.toTupleRef().elements();
    ASSERT_EQ(a.size(), e.size()) << where;
    for (size_t i = 0; i < e.size(); ++i) expect_same(a[i], e[i], where + "[" + std::to_string(i) + "]");
  } else if (expected.isList()) {
    const auto a = actual.toList(), e = expected.toList();
    ASSERT_EQ(a.size(), e.size()) << where;
    for (size_t i = 0; i < e.size(); ++i) expect_same(a.get(i), e.get(i), where + "[" + std::to_string(i) + "]");
  } else if (expected.isGenericDict()) {
    const auto a = actual.toGenericDict(), e = expected.toGenericDict();
    ASSERT_EQ(a.size(), e.size()) << where;
    for (auto i = e.begin(); i != e.end(); ++i) {
      ASSERT_TRUE(a.contains(i->key())) << where;
      expect_same(a.at(i->key()), i->value(), where + "[" + i->key().tagKind() + "]");
    }
  } else {
    EXPECT_TRUE(actual == expected) << where << ": " << actual << " vs " << expected;
  }
}

// Random inputs for an archive; `variant` changes sizes where the model allows it.
std::vector<IValue> inputs_for(const std::string& name, int variant) {
  if (name == "cnn") return {torch::randn({2 + variant % 2, 3, 32, 32})};
  if (name == "encoder") {
    const int64_t B = 3, T = 10 + 2 * (variant % 2);
    auto tokens = torch::randint(0, 1000, {B, T});
    auto lengths = torch::randint(1, T + 1, {B, 1});
    auto mask = torch::arange(T).unsqueeze(0).ge(lengths);  // true = padding
    return {tokens, mask};
  }
  if (name == "lstm") return {torch::randn({5 + variant % 3, 4, 32})};
  if (name == "branchy_mlp") return {torch::randn({8, 16}) * 3 + (variant % 2 ? 1.0 : -1.0)};
  if (name == "submethod") return {torch::randn({8, 16})};
  if (name == "traced_mlp") return {torch::randn({32, 64})};
  ADD_FAILURE() << "no inputs for " << name;
  return {};
}

const std::vector<std::string> kArchives = {"cnn", "encoder", "lstm", "branchy_mlp", "submethod", "traced_mlp"};

}  // namespace

// Every archive, under every built-in backend, in inference: the compiled forward gives the
// module's own result on every call (new data, new sizes, both sides of a data-dependent branch),
// and the backend was called.
TEST(ScriptModule, ArchivesFromPythonGiveTheirForwardsResult) {
  torch::NoGradGuard no_grad;
  for (const std::string backend : {"eager", "aot_eager", "onednn", "fused", "default"}) {
    for (const std::string& name : kArchives) {
      SCOPED_TRACE(name + " under " + backend);
      torch::manual_seed(1);
      torch::jit::Module m = torch::jit::load(archive(name));
      m.eval();
      std::shared_ptr<std::atomic<int>> calls;
      auto fast = torch::compile(m, counting(backend, calls));
      for (int variant = 0; variant < 4; ++variant) {
        std::vector<IValue> in = inputs_for(name, variant);
        expect_same(fast.forward(in), m.forward(in), "call " + std::to_string(variant));
      }
      EXPECT_GE(calls->load(), 1) << "the backend compiled nothing";
      for (const auto& e : fast.state().entries()) EXPECT_FALSE(e->runs_eagerly()) << e->eager_reason();
    }
  }
}

// The graphs of a scripted forward: the interpreter's ATen calls, the parameters as attributes.
TEST(ScriptModule, ParametersAndBuffersAreAttributesOfTheGraph) {
  torch::NoGradGuard no_grad;
  torch::jit::Module m = torch::jit::load(archive("cnn"));
  m.eval();
  tc_test::CompileCounter cc;
  auto fast = torch::compile(m, cc.backend());
  auto x = torch::randn({2, 3, 32, 32});
  expect_same(fast(x), m.forward({x}), "call");
  ASSERT_EQ(cc.frames(), 1);
  const std::string& g = cc.graphs()[0];
  EXPECT_NE(g.find("get_attr[target=stem.0.weight]"), std::string::npos) << g;
  EXPECT_NE(g.find("get_attr[target=layers.1.down.1.running_mean]"), std::string::npos) << g;
  EXPECT_NE(g.find("aten::conv2d"), std::string::npos) << g;
  EXPECT_EQ(g.find("_tensor_constant"), std::string::npos) << g;
  // explain takes a TorchScript module as it takes a C++ one.
  const torchcompile::ExplainOutput e = torchcompile::explain("eager", m, x);
  EXPECT_EQ(e.graph_count, 1u);
  EXPECT_EQ(e.graph_break_count, 0u);
  EXPECT_TRUE(e.eager_reason.empty()) << e.eager_reason;
}

// In-place updates of the parameters are seen by the compiled graph; a parameter replaced
// through setattr is seen by the guards; train() and eval() are guarded.
TEST(ScriptModule, FollowsParameterUpdatesReplacementsAndTrainingMode) {
  torch::NoGradGuard no_grad;
  for (const std::string backend : {"eager", "default"}) {
    SCOPED_TRACE(backend);
    torch::manual_seed(2);
    torch::jit::Module m = torch::jit::load(archive("cnn"));
    torch::jit::Module ref = torch::jit::load(archive("cnn"));  // the same weights
    m.eval();
    ref.eval();
    auto fast = torch::compile(m, backend);
    auto x = torch::randn({2, 3, 32, 32});
    expect_same(fast(x), ref.forward({x}), "first");
    for (auto p : m.parameters()) p.mul_(0.9);
    for (auto p : ref.parameters()) p.mul_(0.9);
    expect_same(fast(x), ref.forward({x}), "after an in-place update");
    auto fc = m.attr("fc").toModule();
    auto w = torch::randn_like(fc.attr("weight").toTensor());
    fc.setattr("weight", w.clone());
    ref.attr("fc").toModule().setattr("weight", w.clone());
    expect_same(fast(x), ref.forward({x}), "after setattr of a parameter");
    // Training mode: BatchNorm uses the batch's statistics and updates its running ones.
    m.train();
    ref.train();
    expect_same(fast(x), ref.forward({x}), "train()");
    auto x2 = torch::randn({2, 3, 32, 32});
    expect_same(fast(x2), ref.forward({x2}), "train(), second call");
    auto mbs = m.named_buffers();
    auto rbs = ref.named_buffers();
    auto rb = rbs.begin();
    for (auto mb = mbs.begin(); mb != mbs.end(); ++mb, ++rb) expect_same(IValue((*mb).value), IValue((*rb).value), (*mb).name);
    m.eval();
    ref.eval();
    expect_same(fast(x2), ref.forward({x2}), "eval() again");
    // One submodule alone back in training mode.
    m.attr("layers").toModule().train();
    ref.attr("layers").toModule().train();
    expect_same(fast(x), ref.forward({x}), "layers in training mode");
  }
}

// Training through a compiled TorchScript module whose parameters require grad: the loss, the
// gradients and the parameters after SGD steps are eager's.
TEST(ScriptModule, TrainingStepsMatchEager) {
  // The reference runs the scripted graph as written: TorchScript's profiling executor would
  // otherwise compile its backward with the TensorExpr fuser (through LLVM in Debian's LibTorch
  // 2.6), which takes minutes on this kind of machine. (The compiled module's traced runs turn
  // TorchScript's optimizations off the same way.)
  torch::jit::GraphOptimizerEnabledGuard as_written(false);
  for (const std::string backend : {"aot_eager", "default"}) {
    for (const std::string name : {"traced_mlp", "cnn"}) {
      SCOPED_TRACE(name + " under " + backend);
      torch::manual_seed(3);
      torch::jit::Module m = torch::jit::load(archive(name));
      torch::jit::Module ref = torch::jit::load(archive(name));  // the same weights
      m.train();
      ref.train();
      auto fast = torch::compile(m, backend);
      for (int step = 0; step < 3; ++step) {
        std::vector<IValue> in = inputs_for(name, 0);
        at::Tensor out = fast.forward(in).toTensor();
        at::Tensor expected = ref.forward(in).toTensor();
        expect_same(out, expected, "step " + std::to_string(step));
        out.square().mean().backward();
        expected.square().mean().backward();
        torch::NoGradGuard no_grad;
        auto ps = m.named_parameters();
        auto rs = ref.named_parameters();
        auto r = rs.begin();
        for (auto p = ps.begin(); p != ps.end(); ++p, ++r) {
          ASSERT_TRUE((*p).value.grad().defined()) << (*p).name;
          expect_same((*p).value.grad(), (*r).value.grad(), "grad of " + (*p).name);
          (*p).value.sub_(0.1 * (*p).value.grad());
          (*r).value.sub_(0.1 * (*r).value.grad());
          (*p).value.mutable_grad().zero_();
          (*r).value.mutable_grad().zero_();
        }
      }
      for (const auto& e : fast.state().entries()) EXPECT_FALSE(e->runs_eagerly()) << e->eager_reason();
    }
  }
}

// compile_method: another exported method by name; keyword arguments and defaults.
TEST(ScriptModule, MethodsByNameAndKeywordArguments) {
  torch::NoGradGuard no_grad;
  torch::jit::Module m = torch::jit::load(archive("submethod"));
  m.eval();
  std::shared_ptr<std::atomic<int>> calls;
  auto encode = torchcompile::compile_method(m, "encode", counting("default", calls));
  EXPECT_EQ(encode.method_name(), "encode");
  auto fast = torch::compile(m, "default");
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({8, 16});
    expect_same(encode(x), m.get_method("encode")({x}), "encode");
    expect_same(fast(x), m.forward({x}), "forward with the default scale");
    expect_same(fast.forward({x}, {{"scale", 2.5}}), m.forward({x}, {{"scale", 2.5}}), "forward with scale=2.5");
    expect_same(fast(x, 0.5), m.forward({x, 0.5}), "forward with scale 0.5");
  }
  EXPECT_GE(calls->load(), 1);
  EXPECT_EQ(fast.state().num_entries(), 3u);  // scale 1.0, 2.5 and 0.5: scalars are specialized
  const std::string error = tc_test::error_of([&] { torchcompile::compile_method(m, "decode", "default"); });
  EXPECT_NE(error.find("has no method 'decode'"), std::string::npos) << error;
  const std::string wrong = tc_test::error_of([&] { fast(torch::randn({8, 16}), "text"); });
  EXPECT_FALSE(wrong.empty());
}

namespace {

// A module scripted in C++: arguments and results of every kind the frontend takes.
torch::jit::Module kinds_module() {
  torch::jit::Module m("Kinds");
  m.register_parameter("w", torch::randn({4, 4}), false);
  m.register_attribute("scale", c10::FloatType::get(), 2.0);
  m.register_attribute("offsets", c10::ListType::ofInts(), c10::List<int64_t>({1, 2}));
  m.define(R"(
    def forward(self, x, xs: List[Tensor], d: Dict[str, Tensor], opt: Optional[Tensor], n: int, s: str,
                t: Tuple[Tensor, float]):
        y = x @ self.w * self.scale + float(self.offsets[0])
        for i in range(len(xs)):
            y = y + xs[i] * float(i + 1)
        if opt is not None:
            y = y - opt
        out: Dict[str, Tensor] = {}
        for k in d.keys():
            out[k + s] = d[k] * n + y
        return out, [y, t[0] * t[1]], (None, n + 1, s), y.sum(0)
  )");
  return m;
}

std::vector<IValue> kinds_inputs(int64_t xs_len, bool with_opt, int64_t n, const std::string& s) {
  std::vector<at::Tensor> xs;
  for (int64_t i = 0; i < xs_len; ++i) xs.push_back(torch::randn({3, 4}));
  c10::Dict<std::string, at::Tensor> d;
  d.insert("a", torch::randn({3, 4}));
  d.insert("b", torch::randn({3, 4}));
  return {torch::randn({3, 4}), c10::List<at::Tensor>(xs), d,
          with_opt ? IValue(torch::randn({3, 4})) : IValue(), n, s,
          c10::ivalue::Tuple::create({torch::randn({3, 4}), 0.5})};
}

}  // namespace

TEST(ScriptModule, ArgumentsAndResultsOfEveryKind) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  torch::jit::Module m = kinds_module();
  tc_test::CompileCounter cc;
  auto fast = torch::compile(m, cc.backend());
  struct Case {
    int64_t xs_len;
    bool opt;
    int64_t n;
    const char* s;
  };
  for (const Case& c : {Case{2, true, 3, "_x"}, Case{2, true, 3, "_x"}, Case{3, true, 3, "_x"}, Case{2, false, 3, "_x"},
                        Case{2, true, 4, "_x"}, Case{2, true, 3, "_yy"}, Case{2, true, 3, "_x"}}) {
    std::vector<IValue> in = kinds_inputs(c.xs_len, c.opt, c.n, c.s);
    expect_same(fast.forward(in), m.forward(in),
                std::to_string(c.xs_len) + " " + std::to_string(c.opt) + " " + std::to_string(c.n) + " " + c.s);
  }
  // Another list length, an absent optional, another int and another string: a new entry each.
  EXPECT_EQ(fast.state().num_entries(), 5u);
  EXPECT_GE(cc.frames(), 5);
}

// Attributes: a scalar or list attribute changed after compiling is seen (the entries are
// dropped); a method that changes an attribute itself runs eagerly, with the reason.
TEST(ScriptModule, AttributeChangesAreSeenAndMethodsThatChangeThemRunEagerly) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  torch::jit::Module m = kinds_module();
  auto fast = torch::compile(m, "default");
  std::vector<IValue> in = kinds_inputs(2, true, 3, "_x");
  expect_same(fast.forward(in), m.forward(in), "first");
  expect_same(fast.forward(in), m.forward(in), "second");
  m.setattr("scale", 3.0);
  expect_same(fast.forward(in), m.forward(in), "scale 3.0");
  m.attr("offsets").toList().set(0, 7);  // the module's own list, changed in place
  expect_same(fast.forward(in), m.forward(in), "offsets[0] = 7");
  m.setattr("offsets", c10::List<int64_t>({-1}));
  expect_same(fast.forward(in), m.forward(in), "offsets = [-1]");

  // A large list (a vocabulary) is followed by identity and length: a new list is seen.
  torch::jit::Module vocab("Vocab");
  std::vector<std::string> words(100, "w");
  vocab.register_attribute("words", c10::ListType::ofStrings(), c10::List<std::string>(words));
  vocab.define(R"(
    def forward(self, x):
        return x * float(len(self.words))
  )");
  auto with_vocab = torch::compile(vocab, "default");
  auto v = torch::randn({3});
  expect_same(with_vocab(v), vocab.forward({v}), "100 words");
  expect_same(with_vocab(v), vocab.forward({v}), "100 words, again");
  words.push_back("x");
  vocab.setattr("words", c10::List<std::string>(words));
  expect_same(with_vocab(v), vocab.forward({v}), "101 words");
  vocab.attr("words").toList().push_back("y");  // grown in place
  expect_same(with_vocab(v), vocab.forward({v}), "102 words");

  torch::jit::Module counter("Counter");
  counter.register_attribute("calls", c10::IntType::get(), 0);
  counter.register_buffer("last", torch::zeros({2}));
  counter.define(R"(
    def forward(self, x):
        self.calls += 1
        return x * self.calls
  )");
  auto counted = torch::compile(counter, "default");
  for (int i = 1; i <= 3; ++i) {
    auto x = torch::randn({2});
    expect_same(counted(x), IValue(x * i), "call " + std::to_string(i));
  }
  EXPECT_EQ(counter.attr("calls").toInt(), 3);
  auto entries = counted.state().entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0]->runs_eagerly());
  EXPECT_NE(entries[0]->eager_reason().find("changes attribute 'calls'"), std::string::npos) << entries[0]->eager_reason();
}

// A result the graph's outputs cannot rebuild (a dict keyed by tensors: keys are identities)
// runs the method eagerly, with the reason, and gives its result.
TEST(ScriptModule, ResultsThatAreNotDataRunEagerly) {
  torch::NoGradGuard no_grad;
  torch::jit::Module m("Keyed");
  m.define(R"(
    def forward(self, x):
        d: Dict[Tensor, Tensor] = {}
        d[x] = x * 2
        return d
  )");
  auto fast = torch::compile(m, "default");
  for (int i = 0; i < 2; ++i) {
    auto x = torch::randn({3});
    IValue out = fast(x);
    ASSERT_TRUE(out.isGenericDict());
    auto d = out.toGenericDict();
    ASSERT_EQ(d.size(), 1u);
    EXPECT_TRUE(d.begin()->key().toTensor().is_same(x));
    EXPECT_TRUE(at::allclose(d.begin()->value().toTensor(), x * 2));
  }
  auto entries = fast.state().entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0]->runs_eagerly());
  EXPECT_NE(entries[0]->eager_reason().find("dict keyed by tensors"), std::string::npos) << entries[0]->eager_reason();
}

// Data-dependent control flow in TorchScript is a graph break, as item() in C++: both sides of
// the branch are compiled and each call takes the right one.
TEST(ScriptModule, ScriptedBranchesOnDataAreGraphBreaks) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  torch::jit::Module m = torch::jit::load(archive("branchy_mlp"));
  m.eval();
  auto fast = torch::compile(m, "default");
  for (int i = 0; i < 8; ++i) {
    std::vector<IValue> in = inputs_for("branchy_mlp", i);
    expect_same(fast.forward(in), m.forward(in), "call " + std::to_string(i));
  }
  auto entries = fast.state().entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0]->num_breaks(), 1u);
  EXPECT_EQ(entries[0]->num_graphs(), 3u);  // before the branch, and each side
}

// A scripted loop over time steps reads the sequence length on the host: under dynamic shapes
// each new length gives eager's result.
TEST(ScriptModule, ScriptedLoopsOverVaryingLengths) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  torch::jit::Module m = torch::jit::load(archive("lstm"));
  m.eval();
  for (bool dynamic : {false, true}) {
    auto fast = torch::compile(m, torchcompile::CompileOptions("default").with_dynamic(dynamic));
    for (int64_t T : {5, 9, 6, 9, 12, 5}) {
      auto x = torch::randn({T, 4 - (T % 2), 32});
      expect_same(fast(x), m.forward({x}), "length " + std::to_string(T));
    }
  }
}

// Four threads call one compiled module at once while its parameters stay put: every result is
// the module's own.
TEST(ScriptModule, FourThreadsAtOnce) {
  torch::NoGradGuard no_grad;
  torch::jit::Module m = torch::jit::load(archive("traced_mlp"));
  m.eval();
  auto fast = torch::compile(m, "default");
  std::vector<at::Tensor> xs, expected;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(torch::randn({8 + 8 * i, 64}));
    expected.push_back(m.forward({xs.back()}).toTensor());
  }
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      torch::NoGradGuard inner;
      for (int k = 0; k < 20; ++k) {
        const int i = (t + k) % 4;
        at::Tensor out = fast(xs[i]).toTensor();
        if (!at::allclose(out, expected[i], 1e-4, 1e-5)) failures[t] = "differs at call " + std::to_string(k);
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
}
