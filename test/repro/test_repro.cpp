// Repro directories (TORCHCOMPILE_REPRO_AFTER=backend) and the minifier, with a plugin of
// deliberately broken backends built by the test suite (faulty_backends.cpp).
#include "support/test_util.h"

#include "repro/gated_block.h"

#include <torchcompile/backends/registry.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/repro/repro.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <random>

using tc_test::ScopedEnv;
using tc_test::tensors_close;
using tc_test::tensors_equal;

namespace {

namespace fs = std::filesystem;
namespace repro = torchcompile::repro;

void load_faulty_plugin() {
  if (!torchcompile::has_backend("gelu_throws")) torchcompile::load_backend_library(TORCHCOMPILE_FAULTY_PLUGIN);
}

// A fresh directory for one test's repros.
class ReproDir {
 public:
  ReproDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("torchcompile_repro_test_" + std::to_string(::getpid()) + "_" +
                                         info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
  }
  ~ReproDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  // The repro directories written so far.
  std::vector<std::string> repros() const {
    std::vector<std::string> out;
    if (!fs::exists(path_)) return out;
    for (const auto& e : fs::directory_iterator(path_))
      if (e.is_directory()) out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

at::Generator cpu_generator() { return at::detail::getDefaultCPUGenerator(); }

bool has_call(const torchcompile::ir::Graph& g, const std::string& prefix) {
  for (const auto& n : g.nodes())
    if (n->kind() == torchcompile::ir::NodeKind::CallFunction && n->target().rfind(prefix, 0) == 0) return true;
  return false;
}

TEST(Repro, CompileErrorLevel1WritesARepro) {
  load_faulty_plugin();
  ReproDir dir;
  ScopedEnv after("TORCHCOMPILE_REPRO_AFTER", "backend"), level("TORCHCOMPILE_REPRO_LEVEL", "1"),
      where("TORCHCOMPILE_REPRO_DIR", dir.str());
  torch::manual_seed(0);
  auto block = std::make_shared<GatedBlock>();
  torch::Tensor x = torch::randn({4, 32});
  torch::Tensor expected = block->forward(x);
  auto fast = torch::compile(block, "gelu_throws");
  torch::Tensor y = fast->forward(x);  // the program goes on: the failing graph runs eagerly
  EXPECT_TRUE(tensors_close(expected, y));
  auto repros = dir.repros();
  ASSERT_EQ(repros.size(), 1u);
  for (const char* f : {"graph.txt", "tensors.pt", "repro.txt", "error.txt", "README", "repro.cpp", "CMakeLists.txt"})
    EXPECT_TRUE(fs::exists(fs::path(repros[0]) / f)) << f;

  repro::Repro r = repro::load(repros[0]);
  EXPECT_EQ(r.backend, "gelu_throws");
  EXPECT_EQ(fs::canonical(r.plugin), fs::canonical(TORCHCOMPILE_FAULTY_PLUGIN));
  EXPECT_EQ(r.failure, repro::Failure::CompileError);
  EXPECT_NE(r.error.find("cannot lower aten::gelu"), std::string::npos) << r.error;
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_TRUE(tensors_equal(x, r.inputs[0]));
  // The repro's graph computes the forward (the interpreter as the oracle).
  EXPECT_TRUE(tensors_close(expected, r.gm->forward({x}).at(0)));
  repro::Outcome o = repro::replay(r);
  EXPECT_EQ(o.failure, repro::Failure::CompileError);
  EXPECT_TRUE(repro::same_failure(r, o)) << o.describe();

  std::ostringstream log;
  repro::Repro small = repro::minify(r, {false, &log});
  EXPECT_LE(repro::count_calls(small.gm->graph()), 3u) << small.gm->graph() << log.str();
  EXPECT_TRUE(has_call(small.gm->graph(), "aten::gelu")) << small.gm->graph();
  EXPECT_TRUE(repro::same_failure(r, repro::replay(small)));
  // The minimized repro survives its own directory.
  repro::save(small, dir.str() + "/small");
  repro::Repro again = repro::load(dir.str() + "/small");
  EXPECT_EQ(torchcompile::ir::to_text(again.gm->graph()), torchcompile::ir::to_text(small.gm->graph()));
  EXPECT_TRUE(repro::same_failure(r, repro::replay(again)));
}

TEST(Repro, AccuracyLevel4WritesAndMinifies) {
  load_faulty_plugin();
  ReproDir dir;
  ScopedEnv after("TORCHCOMPILE_REPRO_AFTER", "backend"), level("TORCHCOMPILE_REPRO_LEVEL", "4"),
      where("TORCHCOMPILE_REPRO_DIR", dir.str());
  torch::manual_seed(1);
  auto block = std::make_shared<GatedBlock>();
  torch::Tensor x = torch::randn({4, 32});
  torch::Tensor expected = block->forward(x);
  auto fast = torch::compile(block, "sigmoid_wrong");
  EXPECT_TRUE(tensors_close(expected, fast->forward(x)));  // the call that traces runs the forward
  // From the next call on the compiled graph runs: accuracy mode reports, and the call returns
  // what the compiled graph computed, as without it.
  EXPECT_FALSE(tensors_close(expected, fast->forward(x)));
  fast->forward(x);
  auto repros = dir.repros();
  ASSERT_EQ(repros.size(), 1u) << "one repro per failing graph";
  EXPECT_TRUE(fs::exists(fs::path(repros[0]) / "minified" / "graph.txt")) << "level 4 minifies";

  repro::Repro r = repro::load(repros[0]);
  EXPECT_EQ(r.failure, repro::Failure::Accuracy);
  EXPECT_NE(r.error.find("output 0"), std::string::npos) << r.error;
  EXPECT_TRUE(repro::same_failure(r, repro::replay(r)));
  repro::Repro small = repro::load(repros[0] + "/minified");
  EXPECT_LE(repro::count_calls(small.gm->graph()), 3u) << small.gm->graph();
  EXPECT_TRUE(has_call(small.gm->graph(), "aten::sigmoid")) << small.gm->graph();
  EXPECT_EQ(repro::replay(small).failure, repro::Failure::Accuracy);

  // A correct backend at level 4 writes nothing.
  ReproDir quiet;
  ScopedEnv where2("TORCHCOMPILE_REPRO_DIR", quiet.str());
  auto good = torch::compile(block, "aot_eager");
  EXPECT_TRUE(tensors_close(expected, good->forward(x)));
  EXPECT_TRUE(quiet.repros().empty());
}

TEST(Repro, RunErrorLevel2) {
  load_faulty_plugin();
  ReproDir dir;
  ScopedEnv after("TORCHCOMPILE_REPRO_AFTER", "backend"), where("TORCHCOMPILE_REPRO_DIR", dir.str());
  torch::manual_seed(2);
  auto block = std::make_shared<GatedBlock>();
  torch::Tensor x = torch::randn({4, 32});
  auto fast = torch::compile(block, "tanh_run_throws");
  fast->forward(x);  // traces: the forward runs as it is
  std::string error = tc_test::error_of([&] { fast->forward(x); });
  EXPECT_NE(error.find("tanh kernel crashed"), std::string::npos) << error;
  auto repros = dir.repros();
  ASSERT_EQ(repros.size(), 1u);
  repro::Repro r = repro::load(repros[0]);
  EXPECT_EQ(r.failure, repro::Failure::RunError);
  EXPECT_TRUE(tensors_equal(x, r.inputs.at(0)));
  EXPECT_TRUE(repro::same_failure(r, repro::replay(r)));
  EXPECT_FALSE(fs::exists(fs::path(repros[0]) / "minified")) << "level 2 does not minify";
  repro::Repro small = repro::minify(r);
  EXPECT_LE(repro::count_calls(small.gm->graph()), 3u) << small.gm->graph();
  EXPECT_TRUE(has_call(small.gm->graph(), "aten::tanh")) << small.gm->graph();

  // Level 1 does not watch calls.
  ReproDir none;
  ScopedEnv level("TORCHCOMPILE_REPRO_LEVEL", "1"), where2("TORCHCOMPILE_REPRO_DIR", none.str());
  auto fast1 = torch::compile(block, "tanh_run_throws");
  fast1->forward(x);
  EXPECT_NE(tc_test::error_of([&] { fast1->forward(x); }), "");
  EXPECT_TRUE(none.repros().empty());
}

TEST(Repro, Level3MinifiesCompileErrors) {
  load_faulty_plugin();
  ReproDir dir;
  ScopedEnv after("TORCHCOMPILE_REPRO_AFTER", "backend"), level("TORCHCOMPILE_REPRO_LEVEL", "3"),
      where("TORCHCOMPILE_REPRO_DIR", dir.str());
  auto block = std::make_shared<GatedBlock>();
  auto fast = torch::compile(block, "gelu_throws");
  fast->forward(torch::randn({2, 32}));
  auto repros = dir.repros();
  ASSERT_EQ(repros.size(), 1u);
  repro::Repro small = repro::load(repros[0] + "/minified");
  EXPECT_LE(repro::count_calls(small.gm->graph()), 3u);
  EXPECT_TRUE(fs::exists(fs::path(repros[0]) / "minified" / "repro.cpp"));
}

TEST(Repro, UnsetWritesNothing) {
  load_faulty_plugin();
  ReproDir dir;
  ScopedEnv after("TORCHCOMPILE_REPRO_AFTER", nullptr), where("TORCHCOMPILE_REPRO_DIR", dir.str());
  auto block = std::make_shared<GatedBlock>();
  torch::Tensor x = torch::randn({2, 32});
  for (const char* backend : {"gelu_throws", "sigmoid_wrong"}) {
    auto fast = torch::compile(block, backend);
    fast->forward(x);
    fast->forward(x);
  }
  auto throws = torch::compile(block, "tanh_run_throws");
  throws->forward(x);
  EXPECT_NE(tc_test::error_of([&] { throws->forward(x); }), "");
  EXPECT_FALSE(fs::exists(dir.str()));
  // An unsupported setting warns and writes nothing.
  ScopedEnv other("TORCHCOMPILE_REPRO_AFTER", "aot");
  torch::compile(block, "gelu_throws")->forward(x);
  EXPECT_FALSE(fs::exists(dir.str()));
}

TEST(Repro, ReplayOfAMissingBackendSaysWhich) {
  ReproDir dir;
  repro::Repro r;
  r.gm = std::shared_ptr<torchcompile::GraphModule>(tc_test::cos_graph(torch::randn({3})));
  r.inputs = {torch::randn({3})};
  r.backend = "no_such_backend";
  r.failure = repro::Failure::CompileError;
  repro::save(r, dir.str());
  repro::Repro back = repro::load(dir.str());
  std::string error = tc_test::error_of([&] { repro::replay(back); });
  EXPECT_NE(error.find("no_such_backend"), std::string::npos) << error;
  EXPECT_NE(tc_test::error_of([&] { repro::load(dir.str() + "/nothing"); }).find("not a directory"), std::string::npos);
}

// Random forwards with random ops (dropout in training mode, bernoulli) and in-place updates of
// intermediates and of the input, compiled by a wrong backend at level 4: every repro written
// replays deterministically (the same outputs and the same report on every replay), records the
// inputs as they were before the call's in-place updates, and its graph run with the recorded
// generator state gives eager's result.
struct RandomProgram : torch::nn::Module {
  std::vector<int> ops;
  torch::nn::Linear fc{nullptr};
  explicit RandomProgram(uint64_t seed) {
    std::mt19937_64 rng(seed);
    fc = register_module("fc", torch::nn::Linear(16, 16));
    const int n = 4 + static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) ops.push_back(static_cast<int>(rng() % 9));
    ops.push_back(8);  // a sigmoid: the backend's defect
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = x;
    for (int op : ops) {
      switch (op) {
        case 0: h = torch::dropout(h, 0.3, /*train=*/true); break;
        case 1: h = h.add_(1.5); break;
        case 2: x.mul_(0.5); h = h + x; break;  // an in-place update of the input
        case 3: h = fc(h); break;
        case 4: h = h * torch::bernoulli(torch::full_like(h, 0.6)); break;
        case 5: h = torch::relu(h).mul_(2); break;
        case 6: h = torch::tanh(h) + h.sum(1, true); break;
        case 7: h = torch::cos(h).clamp_(-0.5, 0.9); break;
        default: h = torch::sigmoid(h); break;
      }
    }
    return h;
  }
};

TEST(Repro, RandomProgramsReplayDeterministically) {
  load_faulty_plugin();
  const int programs = 12;
  for (int p = 0; p < programs; ++p) {
    SCOPED_TRACE("program " + std::to_string(p));
    ReproDir dir;
    ScopedEnv after("TORCHCOMPILE_REPRO_AFTER", "backend"), level("TORCHCOMPILE_REPRO_LEVEL", "4"),
        where("TORCHCOMPILE_REPRO_DIR", dir.str());
    torch::manual_seed(100 + p);
    auto net = std::make_shared<RandomProgram>(1000 + p);
    torch::Tensor x = torch::randn({4, 16});
    auto fast = torch::compile(net, "sigmoid_wrong");
    fast->forward(x);  // traces; the compiled graph runs from the next call on
    ReproDir second_call;
    ScopedEnv where2("TORCHCOMPILE_REPRO_DIR", second_call.str());
    torch::Tensor x_before = x.clone();
    at::Tensor state = cpu_generator().get_state();
    torch::Tensor eager;
    {
      torch::Tensor xe = x.clone();
      eager = net->forward(xe);
    }
    cpu_generator().set_state(state);
    fast->forward(x);
    auto repros = second_call.repros();
    ASSERT_EQ(repros.size(), 1u);
    repro::Repro r = repro::load(repros[0]);
    ASSERT_EQ(r.failure, repro::Failure::Accuracy);
    ASSERT_EQ(r.inputs.size(), 1u);
    EXPECT_TRUE(tensors_equal(x_before, r.inputs[0])) << "the inputs before the call's in-place updates";
    auto run = [&] {
      auto gm = torchcompile::repro::module_from_text(torchcompile::ir::to_text(r.gm->graph()), *r.gm);
      cpu_generator().set_state(r.rng_state);
      return gm->forward({r.inputs[0].clone()}).at(0);
    };
    torch::Tensor first = run(), second = run();
    EXPECT_TRUE(tensors_equal(first, second));
    EXPECT_TRUE(tensors_close(eager, first));
    repro::Outcome a = repro::replay(r), b = repro::replay(r);
    EXPECT_EQ(a.failure, repro::Failure::Accuracy);
    EXPECT_EQ(a.message, b.message);
    EXPECT_TRUE(tensors_equal(x_before, r.inputs[0])) << "replays do not change the repro";
  }
}

}  // namespace
