// Packages (frontend/package.h): compiled C++ modules and TorchScript archives saved with
// torchcompile::save, loaded with torchcompile::load and compared with eager LibTorch; calls the
// package has no graph for; weights replaced after load; bad files.
#include "support/test_util.h"

#include "examples/models.h"

#include <torch/script.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

namespace {

using torch::jit::IValue;
using torchcompile::LoadedModule;
using tc_test::error_of;
using tc_test::tensors_close;

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TORCHCOMPILE_TEST_BINARY_DIR");
  return std::string(dir ? dir : "/tmp") + "/package_test_" + name + ".tcpkg";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const char* kBackends[] = {"eager", "default", "onednn", "fused"};

// A module whose forward branches on data: a graph break with two continuations.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() : fc(register_module("fc", torch::nn::Linear(16, 8))) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = fc(x);
    if (h.sum().item<float>() > 0) return torch::relu(h) * 2;
    return torch::tanh(h) - 1;
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Branchy);

// Inputs taking each branch of `b` (its bias is zeroed, so that negating an input negates the sum).
std::pair<at::Tensor, at::Tensor> branch_inputs(Branchy& b) {
  torch::NoGradGuard no_grad;
  b->fc->bias.zero_();
  at::Tensor x = torch::randn({4, 16});
  if (b->fc(x).sum().item<float>() < 0) x = -x;
  return {x, -x};
}

// Several arguments and a structured result: an optional tensor, a scalar, a list of tensors,
// and a tuple with a vector in it.
struct StructuredImpl : torch::nn::Module {
  StructuredImpl() : fc(register_module("fc", torch::nn::Linear(8, 8))) {}
  std::tuple<torch::Tensor, std::vector<torch::Tensor>> forward(torch::Tensor x, c10::optional<torch::Tensor> bias,
                                                                double scale, std::vector<torch::Tensor> extra) {
    torch::Tensor y = fc(x) * scale;
    if (bias) y = y + *bias;
    std::vector<torch::Tensor> outs;
    for (const auto& e : extra) outs.push_back(y + e);
    return {y.relu(), outs};
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Structured);

// Reads sizes into a view and an arange: with dynamic shapes, a graph with size expressions.
struct ViewsImpl : torch::nn::Module {
  ViewsImpl() : fc(register_module("fc", torch::nn::Linear(12, 6))) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = fc(x.view({x.size(0), x.size(1), 12}));
    torch::Tensor pos = torch::arange(x.size(1), x.options()).view({1, -1, 1});
    return (h + pos).reshape({x.size(0) * x.size(1), 6});
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Views);

// A forward whose host code decides on a size: with dynamic shapes, a tree per size.
struct SizeBranchImpl : torch::nn::Module {
  SizeBranchImpl() : fc(register_module("fc", torch::nn::Linear(10, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    if (x.size(0) > 4) return fc(x).relu();
    return fc(x).sigmoid();
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(SizeBranch);

// The loaded module's result for `args` equals `expected` (a tensor, or a tuple/list of them).
void expect_result(const IValue& got, const IValue& expected, const std::string& where) {
  ASSERT_EQ(got.tagKind(), expected.tagKind()) << where;
  if (expected.isTensor()) {
    EXPECT_TRUE(tensors_close(expected.toTensor(), got.toTensor(), 1e-4, 1e-5)) << where;
  } else if (expected.isTuple()) {
    const auto &g = got.toTupleRef().elements(), &e = expected.toTupleRef().elements();
    ASSERT_EQ(g.size(), e.size()) << where;
    for (size_t i = 0; i < e.size(); ++i) expect_result(g[i], e[i], where + "[" + std::to_string(i) + "]");
  } else if (expected.isList()) {
    const auto g = got.toList(), e = expected.toList();
    ASSERT_EQ(g.size(), e.size()) << where;
    for (size_t i = 0; i < e.size(); ++i) expect_result(g.get(i), e.get(i), where + "[" + std::to_string(i) + "]");
  } else {
    EXPECT_TRUE(got == expected) << where;
  }
}

std::string counting(const std::string& inner, std::shared_ptr<std::atomic<int>>& calls) {
  return tc_test::counting_backend_named("package_count", inner, calls);
}

// ---- C++ modules ------------------------------------------------------------------------------

TEST(Package, SavedModulesGiveEagerResultsWithEveryBackend) {
  torch::manual_seed(0);
  torchcompile_examples::Mlp mlp;
  torchcompile_examples::ConvNet conv(8, 16);
  conv->eval();
  Branchy branchy;
  for (const char* backend : kBackends) {
    SCOPED_TRACE(backend);
    {
      auto fast = torch::compile(mlp, backend);
      std::vector<at::Tensor> xs = {torch::randn({4, 784}), torch::randn({9, 784})};
      for (const auto& x : xs) fast(x);
      const std::string path = temp_path(std::string("mlp_") + backend);
      torchcompile::save(fast, path);
      LoadedModule m = torchcompile::load(path, backend);
      EXPECT_EQ(m.num_entries(), 2u);
      for (const auto& x : xs) expect_result(m(x), mlp(x), "mlp");
      expect_result(m.forward({xs[0]}), mlp(xs[0]), "mlp forward");
    }
    {
      auto fast = torch::compile(conv, backend);
      at::Tensor x = torch::randn({2, 3, 16, 16});
      fast(x);
      const std::string path = temp_path(std::string("conv_") + backend);
      torchcompile::save(fast, path);
      LoadedModule m = torchcompile::load(path, backend);
      torch::NoGradGuard no_grad;
      expect_result(m(x), conv(x), "conv");
    }
    {
      auto fast = torch::compile(branchy, backend);
      // Inputs that take both branches before saving.
      std::vector<at::Tensor> xs;
      for (int i = 0; i < 6; ++i) {
        const auto [pos, neg] = branch_inputs(branchy);
        xs.push_back(pos), xs.push_back(neg);
      }
      for (const auto& x : xs) fast(x);
      ASSERT_EQ(fast.state().entries().front()->num_graphs(), 3u);
      const std::string path = temp_path(std::string("branchy_") + backend);
      torchcompile::save(fast, path);
      LoadedModule m = torchcompile::load(path, backend);
      for (const auto& x : xs) expect_result(m(x), branchy(x), "branchy");
    }
  }
}

TEST(Package, ArgumentsAndResultsKeepTheirStructure) {
  torch::manual_seed(1);
  Structured model;
  auto fast = torch::compile(model, "default");
  at::Tensor x = torch::randn({3, 8}), b = torch::randn({8});
  std::vector<at::Tensor> extra = {torch::randn({3, 8}), torch::randn({1, 8})};
  fast(x, c10::optional<at::Tensor>(b), 0.5, extra);
  fast(x, c10::optional<at::Tensor>(), 2.0, std::vector<at::Tensor>{});
  const std::string path = temp_path("structured");
  torchcompile::save(fast, path);
  LoadedModule m = torchcompile::load(path, "default");
  auto expected = [&](c10::optional<at::Tensor> bias, double scale, std::vector<at::Tensor> e) {
    auto [y, outs] = model(x, bias, scale, e);
    return IValue(c10::ivalue::Tuple::create({y, IValue(outs)}));
  };
  expect_result(m.forward({x, b, 0.5, extra}), expected(b, 0.5, extra), "with bias");
  expect_result(m.forward({x, IValue(), 2.0, std::vector<at::Tensor>{}}), expected(c10::nullopt, 2.0, {}), "without");
  // A scalar never captured is another signature.
  const std::string err = error_of([&] { m.forward({x, b, 0.25, extra}); });
  EXPECT_NE(err.find("no graph in the package accepts this call"), std::string::npos) << err;
  EXPECT_NE(err.find("argument 2 mismatch: expected 0.5, got 0.25"), std::string::npos) << err;
}

// A randomized differential test: modules compiled with dynamic = true are saved after calls at
// a few sizes and loaded. Where no host code reads a symbolic size (the graph is the same at
// every size) every size gives eager's result, captured or not; where host code reads one (a
// tree per size) the captured sizes do, and another gives the documented error.
TEST(Package, SymbolicEntriesServeSizesNeverSeenWhenSaved) {
  torch::manual_seed(2);
  std::mt19937 rng(7);
  torchcompile_examples::Mlp mlp;
  Views views;
  SizeBranch size_branch;
  torchcompile_examples::ConvNet conv(8, 16);
  conv->eval();
  for (const char* inner : {"eager", "default", "onednn"}) {
    SCOPED_TRACE(inner);
    std::shared_ptr<std::atomic<int>> calls;
    const std::string backend = counting(inner, calls);
    torchcompile::CompileOptions options(backend);
    options.dynamic = true;
    {
      auto fast = torch::compile(mlp, options);
      fast(torch::randn({4, 784}));
      fast(torch::randn({6, 784}));
      torchcompile::save(fast, temp_path("mlp_dyn"));
      *calls = 0;
      LoadedModule m = torchcompile::load(temp_path("mlp_dyn"), backend);
      const int at_load = *calls;
      EXPECT_GE(at_load, 1);
      for (int i = 0; i < 8; ++i) {
        const int64_t n = std::uniform_int_distribution<int64_t>(2, 40)(rng);
        at::Tensor x = torch::randn({n, 784});
        expect_result(m(x), mlp(x), "mlp batch " + std::to_string(n));
      }
      if (std::string(inner) != "onednn") EXPECT_EQ(*calls, at_load) << "a symbolic graph compiles once, at load";
    }
    {
      // Traced as it is served, without autograd recording (which would hide the views'
      // size reads: a tree per size).
      torch::NoGradGuard no_grad;
      auto fast = torch::compile(conv, options);
      fast(torch::randn({2, 3, 12, 12}));
      fast(torch::randn({3, 3, 12, 12}));
      torchcompile::save(fast, temp_path("conv_dyn"));
      LoadedModule m = torchcompile::load(temp_path("conv_dyn"), backend);
      for (int i = 0; i < 4; ++i) {
        const int64_t n = std::uniform_int_distribution<int64_t>(2, 9)(rng);
        at::Tensor x = torch::randn({n, 3, 12, 12});
        expect_result(m(x), conv(x), "conv batch " + std::to_string(n));
      }
    }
    {
      // Host code reads the sizes (view, arange, reshape): each size is traced on its own, so
      // the package serves the sizes traced before saving, and names them for another.
      torch::NoGradGuard no_grad;
      auto fast = torch::compile(views, options);
      std::vector<std::pair<int64_t, int64_t>> seen = {{3, 5}, {2, 7}, {4, 4}, {5, 2}};
      for (auto [b, t] : seen) fast(torch::randn({b, t, 3, 4}));
      torchcompile::save(fast, temp_path("views_dyn"));
      LoadedModule m = torchcompile::load(temp_path("views_dyn"), backend);
      for (auto [b, t] : seen) {
        at::Tensor x = torch::randn({b, t, 3, 4});
        expect_result(m(x), views(x), "views " + std::to_string(b) + "x" + std::to_string(t));
      }
      const std::string err = error_of([&] { m(torch::randn({9, 9, 3, 4})); });
      EXPECT_NE(err.find("traced one size at a time because host code read"), std::string::npos) << err;
    }
    {
      auto fast = torch::compile(size_branch, options);
      std::vector<int64_t> seen = {3, 6, 8};
      for (int64_t n : seen) fast(torch::randn({n, 10}));
      torchcompile::save(fast, temp_path("size_branch"));
      LoadedModule m = torchcompile::load(temp_path("size_branch"), backend);
      for (int64_t n : seen) {
        at::Tensor x = torch::randn({n, 10});
        expect_result(m(x), size_branch(x), "size branch " + std::to_string(n));
      }
      // The host code decided per size; a size never traced needs that code.
      const std::string err = error_of([&] { m(torch::randn({5, 10})); });
      EXPECT_NE(err.find("no graph in the package accepts this call"), std::string::npos) << err;
      EXPECT_NE(err.find("call the compiled module with such inputs before torchcompile::save"), std::string::npos) << err;
    }
  }
}

TEST(Package, CallsNeedingTheModulesCodeThrowTheDocumentedError) {
  torch::manual_seed(3);
  torchcompile_examples::Mlp mlp;
  auto fast = torch::compile(mlp, "default");
  fast(torch::randn({4, 784}));
  torchcompile::save(fast, temp_path("mlp_static"));
  LoadedModule m = torchcompile::load(temp_path("mlp_static"), "default");
  std::string err = error_of([&] { m(torch::randn({5, 784})); });
  EXPECT_NE(err.find("no graph in the package accepts this call"), std::string::npos) << err;
  EXPECT_NE(err.find("tensor 'arg0' size mismatch at index 0: expected 4, got 5"), std::string::npos) << err;
  EXPECT_NE(err.find("dynamic = true"), std::string::npos) << err;
  {
    // Inference tensors and normal ones alike, whatever the mode.
    at::Tensor x = torch::randn({4, 784});
    c10::InferenceMode inference;
    expect_result(m(x), mlp(x), "a normal tensor in inference mode");
    expect_result(m(x.clone()), mlp(x), "an inference tensor");
  }
  err = error_of([&] { m(torch::randn({4, 784}, torch::requires_grad())); });
  EXPECT_NE(err.find("requires grad; a loaded package runs inference"), std::string::npos) << err;
  err = error_of([&] { m(torch::randn({4, 784}), torch::randn({4})); });
  EXPECT_NE(err.find("argument count mismatch"), std::string::npos) << err;

  // A branch value never seen before saving.
  Branchy branchy;
  auto fb = torch::compile(branchy, "default");
  const auto [positive, negative] = branch_inputs(branchy);
  ASSERT_GT(branchy->fc(positive).sum().item<float>(), 0);
  fb(positive);
  torchcompile::save(fb, temp_path("branchy_one"));
  LoadedModule mb = torchcompile::load(temp_path("branchy_one"), "default");
  expect_result(mb(positive), branchy(positive), "taken branch");
  ASSERT_LT(branchy->fc(negative).sum().item<float>(), 0);
  err = error_of([&] { mb(negative); });
  EXPECT_NE(err.find("the graph break on aten::item read -"), std::string::npos) << err;
  EXPECT_NE(err.find("a value never seen before the package was saved (seen: "), std::string::npos) << err;

  // Nothing captured yet.
  auto fresh = torch::compile(mlp, "default");
  err = error_of([&] { torchcompile::save(fresh, temp_path("nothing")); });
  EXPECT_NE(err.find("the compiled object was never called"), std::string::npos) << err;
}

TEST(Package, WeightsCanBeReplacedAfterLoad) {
  torch::manual_seed(4);
  for (const char* backend : {"default", "onednn", "fused"}) {
    SCOPED_TRACE(backend);
    torchcompile_examples::ConvNet conv(8, 16);
    conv->eval();
    auto fast = torch::compile(conv, backend);
    at::Tensor x = torch::randn({2, 3, 12, 12});
    fast(x);
    torchcompile::save(fast, temp_path("conv_weights"));
    LoadedModule m = torchcompile::load(temp_path("conv_weights"), backend);
    torch::NoGradGuard no_grad;
    expect_result(m(x), conv(x), "before");
    // New weights (another training run's): the loaded graphs use them.
    torchcompile_examples::ConvNet other(8, 16);
    other->eval();
    for (auto& b : other->buffers())
      if (b.is_floating_point()) b.uniform_(0.5, 1.5);
    std::map<std::string, at::Tensor> weights;
    for (const auto& p : other->named_parameters()) weights[p.key()] = p.value();
    for (const auto& b : other->named_buffers()) weights[b.key()] = b.value();
    std::map<std::string, at::Tensor> mine = m.state_dict();
    std::map<std::string, at::Tensor> given;
    for (const auto& [name, t] : mine) {
      ASSERT_TRUE(weights.count(name)) << name;
      given[name] = weights[name];
    }
    m.load_state_dict(given);
    expect_result(m(x), other(x), "after");
    std::string err = error_of([&] { m.load_state_dict({{"fc.weight", torch::randn({3, 3})}}, /*strict=*/false); });
    EXPECT_NE(err.find("weight 'fc.weight' expected Float [10, 16], got Float [3, 3]"), std::string::npos) << err;
    err = error_of([&] { m.load_state_dict({{"nope", torch::randn({3})}}, false); });
    EXPECT_NE(err.find("the package has no weight 'nope'"), std::string::npos) << err;
    err = error_of([&] { m.load_state_dict({{"fc.weight", weights["fc.weight"]}}); });
    EXPECT_NE(err.find("is missing (strict = false"), std::string::npos) << err;
  }
}

// Four threads call one loaded module (a graph break whose compiled values are read again from
// ATen's run the first time, a symbolic entry) while a fifth replaces its weights with the
// same values: every result is eager's (the tsan label runs this test too).
TEST(Package, FourThreadsAtOnce) {
  torch::manual_seed(6);
  torch::NoGradGuard no_grad;
  Branchy branchy;
  auto fast = torch::compile(branchy, "default");
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 4; ++i) {
    const auto [pos, neg] = branch_inputs(branchy);
    xs.push_back(pos), xs.push_back(neg);
  }
  for (const auto& x : xs) fast(x);  // traced: the keys are ATen's values
  torchcompile::save(fast, temp_path("threads"));
  LoadedModule m = torchcompile::load(temp_path("threads"), "default");
  std::vector<at::Tensor> expected;
  for (const auto& x : xs) expected.push_back(branchy(x));
  const std::map<std::string, at::Tensor> weights = m.state_dict();
  std::map<std::string, at::Tensor> same;
  for (const auto& [name, t] : weights) same[name] = t.clone();
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const size_t k = static_cast<size_t>(t + i) % xs.size();
        try {
          if (!at::allclose(m(xs[k]).toTensor(), expected[k], 1e-4, 1e-5)) ++mismatches;
        } catch (const std::exception&) {
          ++errors;
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 10; ++i) m.load_state_dict(same);
  });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(errors.load(), 0);
}

// The weights section is a torch.save file: LibTorch's reader (and Python's torch.load, see the
// CTest package_weights_torch_load) reads it.
TEST(Package, WeightsSectionIsATorchSaveFile) {
  torchcompile_examples::Mlp mlp;
  auto fast = torch::compile(mlp, "eager");
  fast(torch::randn({2, 784}));
  torchcompile::save(fast, temp_path("mlp_weights"));
  const std::string bytes = read_file(temp_path("mlp_weights"));
  const size_t at = bytes.find("\nsection weights ");
  ASSERT_NE(at, std::string::npos);
  const size_t nl = bytes.find('\n', at + 1);
  std::istringstream header(bytes.substr(at + 1, nl - at - 1));
  std::string word, name;
  size_t length = 0;
  header >> word >> name >> length;
  const std::string data = bytes.substr(nl + 1, length);
  IValue dict = torch::jit::pickle_load(std::vector<char>(data.begin(), data.end()));
  ASSERT_TRUE(dict.isGenericDict());
  for (const auto& p : mlp->named_parameters()) {
    IValue t = dict.toGenericDict().at(p.key());
    EXPECT_TRUE(tc_test::tensors_equal(p.value().detach(), t.toTensor())) << p.key();
  }
}

// ---- TorchScript archives ---------------------------------------------------------------------

std::string archive(const std::string& name) { return std::string(TORCHCOMPILE_TORCHSCRIPT_MODELS) + "/" + name + ".pt"; }

TEST(Package, TorchScriptArchivesSavedAndLoaded) {
  torch::manual_seed(5);
  struct Case {
    std::string name;
    std::vector<std::vector<IValue>> calls;
  };
  std::vector<Case> cases = {
      {"cnn", {{torch::randn({2, 3, 32, 32})}}},
      {"encoder",
       {{torch::randint(0, 1000, {3, 10}), torch::rand({3, 10}) > 0.7},
        {torch::randint(0, 1000, {2, 10}), torch::zeros({2, 10}, torch::kBool)}}},
      {"lstm", {{torch::randn({6, 4, 32})}}},
      {"branchy_mlp", {{torch::randn({8, 16}) + 2}, {torch::randn({8, 16}) - 2}}},
      {"submethod", {{torch::randn({8, 16}), 2.0}}},
      {"traced_mlp", {{torch::randn({32, 64})}}},
  };
  for (const char* backend : {"eager", "default"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name + " " + backend);
      torch::jit::Module module = torch::jit::load(archive(c.name));
      module.eval();
      auto fast = torch::compile(module, backend);
      for (const auto& args : c.calls) fast.forward(args);
      const std::string path = temp_path("ts_" + c.name);
      torchcompile::save(fast, path);
      LoadedModule m = torchcompile::load(path, backend);
      for (const auto& args : c.calls) expect_result(m.forward(args), module.forward(args), c.name);
    }
  }
  // Keyword arguments and defaults, as the method's schema takes them.
  torch::jit::Module module = torch::jit::load(archive("submethod"));
  auto fast = torch::compile(module, "default");
  at::Tensor x = torch::randn({8, 16});
  fast.forward({x}, {{"scale", IValue(3.0)}});
  torchcompile::save(fast, temp_path("ts_kwargs"));
  LoadedModule m = torchcompile::load(temp_path("ts_kwargs"), "default");
  expect_result(m.forward({x}, {{"scale", IValue(3.0)}}), module.forward({x}, {{"scale", IValue(3.0)}}), "kwargs");
}

// ---- a second process --------------------------------------------------------------------------

// Packages and the calls to check (torch::pickle_save: arguments, keyword arguments, eager's
// result, or the error expected) written for package_loader.
class CaseWriter {
 public:
  explicit CaseWriter(std::string dir) : dir_(std::move(dir)) {}
  template <typename C>
  void save(const C& compiled, const std::string& name) {
    torchcompile::save(compiled, dir_ + "/" + name + ".tcpkg");
    name_ = name;
    cases_ = c10::impl::GenericList(c10::AnyType::get());
  }
  void call(std::vector<IValue> args, IValue expected, std::unordered_map<std::string, IValue> kwargs = {}) {
    add(std::move(args), std::move(kwargs), std::move(expected), "");
  }
  void error(std::vector<IValue> args, const std::string& message) { add(std::move(args), {}, IValue(), message); }
  void finish() {
    const std::vector<char> bytes = torch::jit::pickle_save(cases_);
    write_file(dir_ + "/" + name_ + ".cases", std::string(bytes.begin(), bytes.end()));
  }

 private:
  void add(std::vector<IValue> args, std::unordered_map<std::string, IValue> kwargs, IValue expected, std::string error) {
    c10::impl::GenericList a(c10::AnyType::get());
    for (auto& x : args) a.push_back(std::move(x));
    c10::impl::GenericDict kw(c10::StringType::get(), c10::AnyType::get());
    for (auto& [k, v] : kwargs) kw.insert(k, v);
    cases_.push_back(c10::ivalue::Tuple::create({a, kw, std::move(expected), std::move(error)}));
  }
  std::string dir_, name_;
  c10::impl::GenericList cases_{c10::AnyType::get()};
};

// The packages of a second process: written here, loaded by package_loader, a program without
// any model code. The directory stays for the LibTorch 2 check (scripts/check-libtorch2.sh runs
// the loader built against LibTorch 2.6 on these files, written by this build).
TEST(Package, SecondProcessLoadsWithoutTheModelsCode) {
  const char* bin = std::getenv("TORCHCOMPILE_TEST_BINARY_DIR");
  const std::string dir = std::string(bin ? bin : "/tmp") + "/packages";
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  CaseWriter w(dir);
  torch::manual_seed(11);
  torch::NoGradGuard no_grad;  // traced as served
  const std::string uncaptured = "no graph in the package accepts this call";
  {
    torchcompile_examples::Mlp mlp;
    auto fast = torch::compile(mlp, "default");
    at::Tensor a = torch::randn({4, 784}), b = torch::randn({9, 784});
    fast(a), fast(b);
    w.save(fast, "mlp_static");
    w.call({a}, mlp(a));
    w.call({b}, mlp(b));
    w.error({torch::randn({5, 784}, torch::kDouble)}, uncaptured);  // (the second size made the batch a symbol)
    w.finish();
  }
  {
    torchcompile_examples::Mlp mlp;
    torchcompile::CompileOptions options("default");
    options.dynamic = true;
    auto fast = torch::compile(mlp, options);
    fast(torch::randn({4, 784})), fast(torch::randn({6, 784}));
    w.save(fast, "mlp_dynamic");
    for (int64_t n : {4, 6, 13, 31, 2}) {  // sizes never seen when saved among them
      at::Tensor x = torch::randn({n, 784});
      w.call({x}, mlp(x));
    }
    w.finish();
  }
  {
    Branchy branchy;
    auto fast = torch::compile(branchy, "default");
    const auto [pos, neg] = branch_inputs(branchy);
    fast(pos);
    w.save(fast, "branchy_one_branch");
    w.call({pos}, branchy(pos));
    w.error({neg}, "a value never seen before the package was saved");
    w.finish();
    fast(neg);
    w.save(fast, "branchy_both");
    w.call({pos}, branchy(pos));
    w.call({neg}, branchy(neg));
    w.finish();
  }
  {
    Structured model;
    auto fast = torch::compile(model, "default");
    at::Tensor x = torch::randn({3, 8}), bias = torch::randn({8});
    std::vector<at::Tensor> extra = {torch::randn({3, 8})};
    fast(x, c10::optional<at::Tensor>(bias), 0.5, extra);
    w.save(fast, "structured");
    auto [y, outs] = model(x, bias, 0.5, extra);
    w.call({x, bias, 0.5, extra}, c10::ivalue::Tuple::create({y, IValue(outs)}));
    w.finish();
  }
  {
    torchcompile_examples::ConvNet conv(8, 16);
    conv->eval();
    torchcompile::CompileOptions options("default");
    options.dynamic = true;
    auto fast = torch::compile(conv, options);
    fast(torch::randn({2, 3, 16, 16})), fast(torch::randn({3, 3, 16, 16}));
    w.save(fast, "conv_dynamic");
    for (int64_t n : {2, 3, 5, 8}) {
      at::Tensor x = torch::randn({n, 3, 16, 16});
      w.call({x}, conv(x));
    }
    w.finish();
  }
  // TorchScript archives.
  {
    torch::jit::Module m = torch::jit::load(archive("encoder"));
    m.eval();
    auto fast = torch::compile(m, "default");
    std::vector<std::vector<IValue>> calls = {{torch::randint(0, 1000, {3, 10}), torch::rand({3, 10}) > 0.7},
                                              {torch::randint(0, 1000, {2, 10}), torch::rand({2, 10}) > 0.5}};
    for (auto& c : calls) fast.forward(c);
    w.save(fast, "ts_encoder");
    for (auto& c : calls) w.call(c, m.forward(c));
    w.error({torch::randint(0, 1000, {4, 12}), torch::rand({4, 12}) > 0.5}, uncaptured);
    w.finish();
  }
  {
    // TorchScript's adaptive_avg_pool2d reads the input's sizes on the host: each size is traced
    // on its own, so the package serves those traced, and names them for another.
    torch::jit::Module m = torch::jit::load(archive("cnn"));
    m.eval();
    torchcompile::CompileOptions options("default");
    options.dynamic = true;
    auto fast = torch::compile(m, options);
    for (int64_t n : {2, 3, 5}) fast(torch::randn({n, 3, 32, 32}));
    w.save(fast, "ts_cnn_dynamic");
    for (int64_t n : {2, 3, 5}) {
      at::Tensor x = torch::randn({n, 3, 32, 32});
      w.call({x}, m.forward({x}));
    }
    w.error({torch::randn({4, 3, 32, 32})}, "traced one size at a time because host code read");
    w.finish();
  }
  {
    // A traced MLP reads no size: one graph with a symbol serves every batch.
    torch::jit::Module m = torch::jit::load(archive("traced_mlp"));
    m.eval();
    torchcompile::CompileOptions options("default");
    options.dynamic = true;
    auto fast = torch::compile(m, options);
    fast(torch::randn({32, 64})), fast(torch::randn({8, 64}));
    w.save(fast, "ts_traced_mlp_dynamic");
    for (int64_t n : {32, 8, 5, 77}) {
      at::Tensor x = torch::randn({n, 64});
      w.call({x}, m.forward({x}));
    }
    w.finish();
  }
  for (const char* name : {"lstm", "branchy_mlp", "traced_mlp"}) {
    torch::jit::Module m = torch::jit::load(archive(name));
    m.eval();
    auto fast = torch::compile(m, "default");
    std::vector<at::Tensor> xs;
    if (std::string(name) == "lstm") xs = {torch::randn({6, 4, 32}), torch::randn({3, 4, 32})};
    if (std::string(name) == "branchy_mlp") xs = {torch::randn({8, 16}) + 2, torch::randn({8, 16}) - 2};
    if (std::string(name) == "traced_mlp") xs = {torch::randn({32, 64})};
    for (const auto& x : xs) fast(x);
    w.save(fast, std::string("ts_") + name);
    for (const auto& x : xs) w.call({x}, m.forward({x}));
    w.finish();
  }
  {
    torch::jit::Module m = torch::jit::load(archive("submethod"));
    auto fast = torch::compile(m, "default");
    at::Tensor x = torch::randn({8, 16});
    fast.forward({x}, {{"scale", IValue(3.0)}});
    w.save(fast, "ts_submethod");
    w.call({x}, m.forward({x}, {{"scale", IValue(3.0)}}), {{"scale", IValue(3.0)}});
    w.finish();
  }
  const std::string command = std::string(TORCHCOMPILE_PACKAGE_LOADER) + " '" + dir + "' default eager onednn";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// ---- bad files --------------------------------------------------------------------------------

// A package whose section `name` was edited: checksums recomputed, so that the parsers see the edit.
std::string with_section(const std::string& bytes, const std::string& section,
                         const std::function<std::string(std::string)>& edit);
std::string with_manifest(const std::string& bytes, const std::function<std::string(std::string)>& edit) {
  return with_section(bytes, "manifest", edit);
}
// The names of a package's sections, in order.
std::vector<std::string> section_names(const std::string& bytes);

TEST(Package, BadFilesGiveClearErrors) {
  torchcompile_examples::Mlp mlp;
  auto fast = torch::compile(mlp, "eager");
  fast(torch::randn({2, 784}));
  const std::string path = temp_path("good");
  torchcompile::save(fast, path);
  const std::string good = read_file(path);
  auto load_error = [&](const std::string& bytes) {
    const std::string bad = temp_path("bad");
    write_file(bad, bytes);
    return error_of([&] { torchcompile::load(bad, "eager"); });
  };
  std::string err = error_of([&] { torchcompile::load(temp_path("does_not_exist"), "eager"); });
  EXPECT_NE(err.find("does_not_exist.tcpkg')"), std::string::npos) << err;
  EXPECT_NE(err.find("cannot open the file"), std::string::npos) << err;
  err = load_error(good.substr(0, good.size() / 2));
  EXPECT_NE(err.find("package_test_bad.tcpkg"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated or corrupted"), std::string::npos) << err;
  std::string flipped = good;
  flipped[good.size() / 3] ^= 0x20;
  err = load_error(flipped);
  EXPECT_NE(err.find("fails its checksum"), std::string::npos) << err;
  err = load_error(read_file(archive("cnn")));
  EXPECT_NE(err.find("not a torchcompile package"), std::string::npos) << err;
  EXPECT_NE(err.find("torch::jit::load"), std::string::npos) << err;
  std::string v2 = good;
  v2.replace(0, good.find('\n'), "TORCHCOMPILE-PACKAGE 2");
  err = load_error(v2);
  EXPECT_NE(err.find("package format 2; this torchcompile reads format 1 (written by a newer torchcompile"),
            std::string::npos)
      << err;
  // An operator this LibTorch does not have, in a graph and at a graph break.
  err = load_error(with_manifest(good, [](std::string m) { return m; }));
  EXPECT_EQ(err, "") << "an unchanged manifest loads";
  err = load_error(with_section(good, "graph.0", [](std::string g) {
    const size_t at = g.find("target=aten::");
    const size_t end = g.find_first_of(",]", at);
    return g.replace(at, end - at, "target=aten::no_such_operator");
  }));
  EXPECT_NE(err.find("graph 0 cannot be read by this LibTorch (written by LibTorch "), std::string::npos) << err;
  EXPECT_NE(err.find("aten::no_such_operator"), std::string::npos) << err;
  Branchy branchy;
  auto fb = torch::compile(branchy, "eager");
  fb(torch::randn({4, 16}));
  torchcompile::save(fb, path);
  err = load_error(with_manifest(read_file(path), [](std::string m) {
    const size_t at = m.find("\"aten::item\"");
    return at == std::string::npos ? m : m.replace(at, std::strlen("\"aten::item\""), "\"aten::item_sparse\"");
  }));
  EXPECT_NE(err.find("the operator aten::item_sparse, which this LibTorch does not have (written by LibTorch "),
            std::string::npos)
      << err;
}

// Calls `f(name, data)` for each section of a well-formed package.
void each_section(const std::string& bytes, const std::function<void(const std::string&, std::string&)>& f) {
  size_t pos = bytes.find('\n') + 1;
  for (;;) {
    const size_t nl = bytes.find('\n', pos);
    const std::string line = bytes.substr(pos, nl - pos);
    pos = nl + 1;
    if (line == "end") break;
    std::istringstream ls(line);
    std::string word, name;
    size_t length = 0;
    ls >> word >> name >> length;
    std::string data = bytes.substr(pos, length);
    pos += length + 1;
    f(name, data);
  }
}

std::vector<std::string> section_names(const std::string& bytes) {
  std::vector<std::string> names;
  each_section(bytes, [&](const std::string& name, std::string&) { names.push_back(name); });
  return names;
}

std::string with_section(const std::string& bytes, const std::string& section,
                         const std::function<std::string(std::string)>& edit) {
  // Rewrite the container with the edited section (sections in order, checksums recomputed).
  std::string out = bytes.substr(0, bytes.find('\n') + 1);
  each_section(bytes, [&](const std::string& name, std::string& data) {
    if (name == section) data = edit(data);
    uint64_t h = 1469598103934665603ull;
    for (char c : data) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    char sum[24];
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(h));
    out += "section " + name + " " + std::to_string(data.size()) + " " + sum + "\n" + data + "\n";
  });
  return out + "end\n";
}

// ---- the loader, fuzzed -------------------------------------------------------------------------

// Mutated packages (random byte flips, truncations, insertions; and edits of the manifest and
// graph sections with their checksums recomputed, so that the parsers themselves see damaged
// text): each load is an error naming the file, or a load whose calls return or throw; nothing
// crashes (the asan label runs this test too). A mutation that leaves the checksums as they
// were must always be an error. The weights section is LibTorch's own format, read by its
// unpickler: it is mutated only under its checksum. TORCHCOMPILE_PACKAGE_FUZZ_CASES (10,000 by
// default) and TORCHCOMPILE_PACKAGE_FUZZ_SEED choose the cases.
TEST(PackageFuzz, MutatedPackagesAreClearErrorsOrLoads) {
  const char* cases_env = std::getenv("TORCHCOMPILE_PACKAGE_FUZZ_CASES");
  const char* seed_env = std::getenv("TORCHCOMPILE_PACKAGE_FUZZ_SEED");
  const int cases = cases_env ? std::atoi(cases_env) : 10000;
  const uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 10) : 20261128;
  std::mt19937_64 rng(seed);
  torch::manual_seed(12);
  torch::NoGradGuard no_grad;

  // Three real packages: a graph break with both branches, a symbolic MLP, a TorchScript method.
  struct Base {
    std::string bytes;
    std::vector<IValue> args;
  };
  std::vector<Base> bases;
  {
    Branchy branchy;
    auto fast = torch::compile(branchy, "eager");
    const auto [pos, neg] = branch_inputs(branchy);
    fast(pos), fast(neg);
    torchcompile::save(fast, temp_path("fuzz_base"));
    bases.push_back({read_file(temp_path("fuzz_base")), {pos}});
  }
  {
    auto mlp = torch::nn::Sequential(torch::nn::Linear(16, 8), torch::nn::ReLU(), torch::nn::Linear(8, 4));
    torchcompile::CompileOptions options("eager");
    options.dynamic = true;
    auto fast = torch::compile(mlp, options);
    fast(torch::randn({3, 16})), fast(torch::randn({5, 16}));
    torchcompile::save(fast, temp_path("fuzz_base"));
    bases.push_back({read_file(temp_path("fuzz_base")), {torch::randn({7, 16})}});
  }
  {
    torch::jit::Module m = torch::jit::load(archive("branchy_mlp"));
    auto fast = torch::compile(m, "eager");
    at::Tensor x = torch::randn({8, 16}) + 2;
    fast(x);
    torchcompile::save(fast, temp_path("fuzz_base"));
    bases.push_back({read_file(temp_path("fuzz_base")), {x}});
  }
  for (const Base& b : bases) {  // each base loads and runs
    write_file(temp_path("fuzz"), b.bytes);
    ASSERT_EQ(error_of([&] { torchcompile::load(temp_path("fuzz"), "eager").forward(b.args); }), "");
  }

  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  auto mutate_text = [&](std::string t) {
    switch (pick(6)) {
      case 0:  // flip bytes
        for (size_t k = 0, n = 1 + pick(4); k < n && !t.empty(); ++k) t[pick(t.size())] = static_cast<char>(rng());
        break;
      case 1: {  // replace a token
        std::vector<std::pair<size_t, size_t>> tokens;
        for (size_t i = 0; i < t.size();) {
          while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
          const size_t start = i;
          while (i < t.size() && !std::isspace(static_cast<unsigned char>(t[i]))) ++i;
          if (i > start) tokens.emplace_back(start, i - start);
        }
        if (tokens.empty()) break;
        const auto [start, len] = tokens[pick(tokens.size())];
        static const char* replacements[] = {"0", "1", "-1", "2", "7", "64", "65", "4294967296", "9223372036854775807",
                                             "-9223372036854775808", "\"\"", "\"", "none", "tensor", "list", "segment",
                                             "branch", "end", "dynamic", "0x7ff8000000000000", "Float", "Long"};
        const auto other = tokens[pick(tokens.size())];
        std::string r = pick(3) == 0 ? t.substr(other.first, other.second)
                                     : replacements[pick(sizeof replacements / sizeof *replacements)];
        t.replace(start, len, r);
        break;
      }
      case 2: {  // delete a line
        const size_t a = t.rfind('\n', pick(t.size()));
        const size_t from = a == std::string::npos ? 0 : a + 1, to = t.find('\n', from);
        t.erase(from, to == std::string::npos ? std::string::npos : to - from + 1);
        break;
      }
      case 3: {  // duplicate a line
        const size_t a = t.rfind('\n', pick(t.size()));
        const size_t from = a == std::string::npos ? 0 : a + 1, to = t.find('\n', from);
        const std::string line = t.substr(from, to == std::string::npos ? std::string::npos : to - from + 1);
        t.insert(from, line);
        break;
      }
      case 4:  // truncate
        t.resize(pick(t.size() + 1));
        break;
      default: {  // swap two digits' worth: change one number by a little
        for (size_t tries = 0; tries < 64; ++tries) {
          const size_t i = pick(t.size());
          if (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
            t[i] = static_cast<char>('0' + (t[i] - '0' + 1 + pick(9)) % 10);
            break;
          }
        }
      }
    }
    return t;
  };

  size_t errors = 0, loads = 0, calls_ok = 0, calls_failed = 0;
  const std::string path = temp_path("fuzz");
  for (int i = 0; i < cases; ++i) {
    const Base& base = bases[static_cast<size_t>(i) % bases.size()];
    std::string bytes = base.bytes;
    const bool raw = pick(2) == 0;
    if (raw) {
      switch (pick(4)) {
        case 0:
          for (size_t k = 0, n = 1 + pick(8); k < n; ++k) bytes[pick(bytes.size())] ^= static_cast<char>(1 + pick(255));
          break;
        case 1: bytes.resize(pick(bytes.size())); break;
        case 2: bytes.insert(pick(bytes.size() + 1), std::string(1 + pick(16), static_cast<char>(rng()))); break;
        default: bytes.erase(pick(bytes.size()), 1 + pick(16)); break;
      }
    } else {
      std::vector<std::string> names = section_names(bytes);
      names.erase(std::remove(names.begin(), names.end(), "weights"), names.end());
      const std::string section = pick(10) < 7 ? "manifest" : names[pick(names.size())];
      bytes = with_section(bytes, section, mutate_text);
    }
    write_file(path, bytes);
    std::optional<LoadedModule> m;
    try {
      m.emplace(torchcompile::load(path, "eager"));
    } catch (const c10::Error& e) {
      ++errors;
      const std::string msg = e.what_without_backtrace();
      ASSERT_NE(msg.find(path), std::string::npos) << "case " << i << ": an error that does not name the file: " << msg;
      continue;
    }
    ASSERT_FALSE(raw) << "case " << i << ": a damaged file loaded (its checksums should have failed)";
    ++loads;
    try {
      m->forward(base.args);
      ++calls_ok;
    } catch (const std::exception&) {
      ++calls_failed;
    }
  }
  std::cout << "package fuzz (seed " << seed << "): " << cases << " mutated packages: " << errors << " errors, " << loads
            << " loads (" << calls_ok << " calls returned, " << calls_failed << " threw)" << std::endl;
  EXPECT_EQ(errors + loads, static_cast<size_t>(cases));
}

}  // namespace
