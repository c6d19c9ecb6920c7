// Results whose sizes depend on the data (`nonzero`, `masked_select`, boolean indexing, `unique`):
// host code that reads those sizes, later ops that are recorded for them, losses over masked
// elements. Each forward runs compiled and eagerly on random data (so the counts change from call
// to call, and the batch size too), under every built-in backend, in inference and in training
// (gradients compared), and every result must be eager's.
#include "support/test_util.h"

#include <torchcompile/ir/interpreter.h>

#include <random>

using tc_test::copy_parameters;
using tc_test::tensors_close;

namespace {

constexpr int kKinds = 7;

const char* kind_name(int kind) {
  static const char* names[kKinds] = {"masked_select count read on the host",
                                      "nonzero count used as a size",
                                      "masked loss (no host read)",
                                      "index_select by nonzero",
                                      "boolean indexing, its size read",
                                      "unique with counts",
                                      "nonzero count returned through a tensor factory"};
  return names[kind];
}

struct DataDependent : torch::nn::Module {
  int kind;
  torch::nn::Linear lin{nullptr};
  explicit DataDependent(int k) : kind(k) { lin = register_module("lin", torch::nn::Linear(6, 6)); }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = lin->forward(x);  // [B, 6]
    switch (kind) {
      case 0: {
        torch::Tensor sel = h.masked_select(h > 0);
        const int64_t n = sel.size(0);
        return sel.sum() * static_cast<double>(n) + h.sum();
      }
      case 1: {
        const int64_t n = torch::nonzero(h.sum(1) > 0).size(0);
        return torch::cat({h.narrow(0, 0, n).sum(0), h.narrow(0, n, h.size(0) - n).mean(0) * 2});
      }
      case 2:
        return (h - x).masked_select(x > 0).pow(2).sum() + h.sum() * 0.5;
      case 3: {
        // At least one row (>= the mean): AOT autograd cannot yet trace index_select's
        // backward over an empty index on LibTorch 1.13 (that signature then runs eagerly).
        torch::Tensor rows = torch::nonzero(h.select(1, 0) >= h.select(1, 0).mean()).select(1, 0);
        return h.index_select(0, rows).relu().sum(0) + h.mean(0);
      }
      case 4: {
        torch::Tensor r = h.index({h.select(1, 1) > 0});
        return r.sum(0) * static_cast<double>(r.size(0) + 1);
      }
      case 5: {
        auto [values, inverse, counts] = at::_unique2(h.gt(0).sum(1), /*sorted=*/true, /*return_inverse=*/true,
                                                      /*return_counts=*/true);
        return torch::cat({values.to(torch::kFloat), counts.to(torch::kFloat) * h.sum(),
                           inverse.to(torch::kFloat)});
      }
      default: {
        const int64_t n = torch::nonzero(h > 0.3).size(0);
        return torch::ones({n + 1, 2}) * h.sum();
      }
    }
  }
};

class DataDependentSizes : public ::testing::TestWithParam<std::string> {};

TEST_P(DataDependentSizes, RandomForwardsMatchEagerOnEveryCall) {
  const std::string backend = GetParam();
  std::mt19937 rng(3801);
  for (int kind = 0; kind < kKinds; ++kind) {
    for (bool training : {false, true}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + (training ? ", training" : ", inference"));
      torch::manual_seed(kind);
      auto m = std::make_shared<DataDependent>(kind);
      auto reference = std::make_shared<DataDependent>(kind);
      copy_parameters(*m, *reference);
      auto fast = torch::compile(m, backend);
      std::optional<torch::NoGradGuard> no_grad;
      if (!training) no_grad.emplace();
      // torch::compile's warnings (a branch or signature running eagerly) go to stderr.
      ::testing::internal::CaptureStderr();
      for (int call = 0; call < 10; ++call) {
        // Two batch sizes, so that dynamic entries are made too.
        const int64_t B = call < 6 ? 5 : std::uniform_int_distribution<int64_t>(2, 8)(rng);
        torch::Tensor x = torch::randn({B, 6});
        torch::Tensor expected = reference->forward(x);
        torch::Tensor actual = fast(x);
        EXPECT_TRUE(tensors_close(expected, actual)) << "call " << call << ", batch " << B;
        if (training) {
          m->zero_grad();
          reference->zero_grad();
          expected.sum().backward();
          actual.sum().backward();
          for (const auto& p : reference->named_parameters()) {
            const torch::Tensor& g = m->named_parameters()[p.key()].grad();
            EXPECT_TRUE(g.defined() && tensors_close(p.value().grad(), g)) << p.key() << ", call " << call;
          }
        }
      }
      const std::string err = ::testing::internal::GetCapturedStderr();
      EXPECT_EQ(err.find("torch::compile("), std::string::npos) << err;
      ASSERT_FALSE(fast.state().entries().empty());
      for (const auto& entry : fast.state().entries()) {
        EXPECT_FALSE(entry->runs_eagerly()) << entry->eager_reason();
        EXPECT_GE(entry->num_breaks(), 1u);
      }
    }
  }
}

// The break is a graph break like `item()`'s: fullgraph refuses it, naming the operator.
TEST(DataDependentSizesFullgraph, FullgraphNamesTheOperator) {
  auto m = std::make_shared<DataDependent>(0);
  torch::NoGradGuard no_grad;
  auto fast = torch::compile(m, torchcompile::CompileOptions("eager").with_fullgraph());
  try {
    fast(torch::randn({4, 6}));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("masked_select"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("depend on the data"), std::string::npos) << e.what();
  }
}

// A backend receives, with each graph, the values its inputs had when the traced call ran it,
// though the forward writes them in place later (after a break, or in the same graph): with
// them, the sizes of a data-dependent result are the graph's.
struct ReadsThenWritesItsInput : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    const int64_t n = std::get<0>(torch::_unique(x.round())).size(0);  // a break
    x.add_(0.25);
    return x * static_cast<double>(n);
  }
};

TEST(DataDependentSizesExamples, BackendsGetTheInputsTheGraphsWereTracedOn) {
  torch::NoGradGuard no_grad;
  std::vector<std::string> mismatches;
  int graphs = 0;
  auto backend = [&](torchcompile::GraphModule& gm, const std::vector<at::Tensor>& example) -> torchcompile::CompiledFn {
    ++graphs;
    // Run the graph on copies of its example inputs: each data-dependent result must have the
    // sizes the graph was traced with.
    torchcompile::ir::Interpreter run(gm);
    run.override_if([](const torchcompile::ir::Node&) { return true; },
                    [&](const torchcompile::ir::Node& n, const std::vector<c10::IValue>& args) {
                      std::vector<at::Tensor> out = torchcompile::ir::run_target(n, args);
                      for (size_t i = 0; i < out.size() && i < n.num_outputs(); ++i)
                        if (out[i].defined() && out[i].sizes() != c10::IntArrayRef(n.output_meta()[i].sizes))
                          mismatches.push_back(n.name() + ": traced " + n.output_meta()[i].str() + ", got " +
                                               torchcompile::ir::TensorMeta::of(out[i]).str());
                      return out;
                    });
    std::vector<at::Tensor> copies;
    for (const at::Tensor& t : example) copies.push_back(t.clone());
    run.run(copies);
    return nullptr;  // the interpreter runs it
  };
  auto m = std::make_shared<ReadsThenWritesItsInput>();
  auto fast = torch::compile(m, torchcompile::CompileOptions(backend));
  for (int call = 0; call < 4; ++call) {
    torch::Tensor x = torch::randn({3, 6}) * 3, x_eager = x.clone();
    torch::Tensor expected = m->forward(x_eager);
    EXPECT_TRUE(tensors_close(expected, fast(x)));
    EXPECT_TRUE(tensors_close(x_eager, x));
  }
  EXPECT_GE(graphs, 2);
  EXPECT_TRUE(mismatches.empty()) << mismatches.front();
}

INSTANTIATE_TEST_SUITE_P(Backends, DataDependentSizes,
                         ::testing::Values("eager", "aot_eager", "fused", "onednn", "default"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace

