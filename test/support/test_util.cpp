#include "support/test_util.h"

#include <map>
#include <mutex>

#include <torchcompile/ir/parser.h>

#include <torchcompile/ir/graph_module.h>

#include <ATen/CPUGeneratorImpl.h>
#include <limits>

#include <sstream>

namespace tc_test {

namespace {

bool has_submodules(const torchcompile::GraphModule& gm) {
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == torchcompile::ir::NodeKind::CallModule) return true;
  return false;
}

}  // namespace

torchcompile::Backend CompileCounter::backend() const {
  auto s = state;
  return [s](torchcompile::GraphModule& gm, const std::vector<at::Tensor>&) -> torchcompile::CompiledFn {
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      ++s->frames;
      s->graphs.push_back(torchcompile::ir::to_text(gm.graph()));
      s->tabulars.push_back(torchcompile::ir::tabular_string(gm.graph()));
      s->op_counts.push_back(count_calls(gm.graph()));
    }
    // A graph with size symbols must round-trip through the text format, and the parsed graph
    // is what runs: the tests compare its results with eager at every size.
    if (!gm.graph().symbols().empty() && !has_submodules(gm)) {
      const std::string text = torchcompile::ir::to_text(gm.graph());
      std::shared_ptr<torchcompile::ir::Graph> parsed = torchcompile::ir::parse_graph(text);
      const std::string again = torchcompile::ir::to_text(*parsed);
      TORCH_CHECK(again == text, "CompileCounter: the graph with size symbols does not round-trip through the text ",
                  "format.\nPrinted:\n", text, "\nParsed and printed again:\n", again);
      auto pm = std::make_shared<torchcompile::GraphModule>(parsed);
      for (const auto& [name, attr] : gm.attributes()) pm->set_attribute(name, attr.first, attr.second);
      return [pm](std::vector<at::Tensor> inputs) { return pm->forward(std::move(inputs)); };
    }
    return [&gm](std::vector<at::Tensor> inputs) { return gm.forward(std::move(inputs)); };
  };
}

size_t count_calls(const torchcompile::ir::Graph& g) {
  size_t n = 0;
  for (const auto& node : g.nodes()) n += node->kind() == torchcompile::ir::NodeKind::CallFunction;
  return n;
}

size_t count_calls(const torchcompile::ir::Graph& g, const std::string& target) {
  size_t n = 0;
  for (const auto& node : g.nodes())
    n += node->kind() == torchcompile::ir::NodeKind::CallFunction && node->target() == target;
  return n;
}

void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto target = to.named_parameters();
  for (const auto& p : from.named_parameters()) target[p.key()].copy_(p.value());
}

::testing::AssertionResult tensors_close(const at::Tensor& expected, const at::Tensor& actual, double rtol,
                                         double atol) {
  if (expected.defined() != actual.defined())
    return ::testing::AssertionFailure() << "one tensor is undefined";
  if (!expected.defined()) return ::testing::AssertionSuccess();
  if (expected.sizes() != actual.sizes())
    return ::testing::AssertionFailure() << "sizes differ: expected " << expected.sizes() << ", got " << actual.sizes();
  if (expected.scalar_type() != actual.scalar_type())
    return ::testing::AssertionFailure() << "dtypes differ: expected " << expected.scalar_type() << ", got "
                                         << actual.scalar_type();
  if (!at::isFloatingType(expected.scalar_type()) && !at::isComplexType(expected.scalar_type()))
    return tensors_equal(expected, actual);
  if (rtol < 0) rtol = expected.scalar_type() == at::kDouble ? 1e-7 : 1e-5;
  if (atol < 0) atol = expected.scalar_type() == at::kDouble ? 1e-9 : 1e-6;
  if (torch::allclose(expected, actual, rtol, atol, /*equal_nan=*/true)) return ::testing::AssertionSuccess();
  auto diff = (expected - actual).abs().max().item<double>();
  return ::testing::AssertionFailure() << "tensors differ: max abs diff " << diff << " (rtol " << rtol << ", atol "
                                       << atol << ")";
}

::testing::AssertionResult tensors_close_or_as_accurate(const at::Tensor& expected, const at::Tensor& actual,
                                                        const at::Tensor& reference, const at::Tensor& nudged,
                                                        double rtol, double atol, double factor) {
  auto close = tensors_close(expected, actual, rtol, atol);
  if (close || !expected.defined() || expected.sizes() != actual.sizes() || expected.sizes() != reference.sizes() ||
      !at::isFloatingType(expected.scalar_type()) || expected.scalar_type() != actual.scalar_type())
    return close;
  const at::Tensor e = expected.to(at::kDouble), a = actual.to(at::kDouble), r = reference.to(at::kDouble);
  at::Tensor sensitivity = (e - r).abs();
  if (nudged.defined()) sensitivity = at::maximum(sensitivity, (nudged.to(at::kDouble) - e).abs());
  const at::Tensor near_eager = at::isclose(a, e, rtol, atol, /*equal_nan=*/true);
  const at::Tensor finite = at::isfinite(e) & at::isfinite(a) & at::isfinite(r) & at::isfinite(sensitivity);
  const at::Tensor tolerance = atol + rtol * r.abs();
  // Where eager's sensitivity (its own error, or how far a one-ULP nudge moves it) exceeds 1000
  // tolerances, the float result is rounding noise (sin of a huge exp): any finite value is as
  // good as eager's.
  const at::Tensor noise = sensitivity > 1000 * tolerance;
  const at::Tensor as_accurate = finite & (noise | ((a - r).abs() <= tolerance + factor * sensitivity));
  const at::Tensor bad = ~(near_eager | as_accurate);
  const int64_t n = bad.sum().item<int64_t>();
  if (n == 0) return ::testing::AssertionSuccess();
  const int64_t i = bad.reshape({-1}).nonzero()[0][0].item<int64_t>();
  auto at_i = [i](const at::Tensor& t) { return t.reshape({-1})[i].item<double>(); };
  return ::testing::AssertionFailure() << n << " element(s) neither close to eager (rtol " << rtol << ", atol " << atol
                                       << ") nor as accurate (within " << factor << "x eager's sensitivity of the float64 "
                                       << "result); the first, flat index " << i << ": eager " << at_i(e) << ", got "
                                       << at_i(a) << ", float64 " << at_i(r) << ", sensitivity " << at_i(sensitivity);
}

at::Tensor nudged_by_one_ulp(const at::Tensor& t, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor up = at::empty(t.sizes(), t.options().dtype(at::kBool)).bernoulli_(0.5, gen);
  const at::Tensor inf = at::full({}, std::numeric_limits<double>::infinity(), t.options());
  return at::nextafter(t, at::where(up, inf, -inf));
}

::testing::AssertionResult tensors_equal(const at::Tensor& expected, const at::Tensor& actual) {
  if (expected.sizes() != actual.sizes() || expected.scalar_type() != actual.scalar_type())
    return ::testing::AssertionFailure() << "shape or dtype differ";
  if (torch::equal(expected, actual)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "tensors are not bitwise equal";
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) old_ = old;
  if (value) {
    setenv(name, value, 1);
  } else {
    unsetenv(name);
  }
}

ScopedEnv::~ScopedEnv() {
  if (old_) {
    setenv(name_, old_->c_str(), 1);
  } else {
    unsetenv(name_);
  }
}

std::unique_ptr<torchcompile::GraphModule> cos_graph(const at::Tensor& example) {
  auto gm = std::make_unique<torchcompile::GraphModule>();
  auto& g = gm->graph();
  auto x = g.placeholder("x", torchcompile::ir::TensorMeta::of(example));
  auto* cos = g.call_function(torchcompile::ir::find_op("aten::cos"), {x}, {torchcompile::ir::TensorMeta::of(example.cos())});
  g.output({cos->output()});
  return gm;
}

torchcompile::Backend counting_backend(std::shared_ptr<std::atomic<int>> count) {
  return [count](torchcompile::GraphModule& gm, const std::vector<at::Tensor>&) -> torchcompile::CompiledFn {
    ++*count;
    return [&gm](std::vector<at::Tensor> in) { return gm.forward(std::move(in)); };
  };
}

std::string counting_backend_named(const std::string& prefix, const std::string& inner,
                                   std::shared_ptr<std::atomic<int>>& calls) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<std::atomic<int>>> counters;
  std::lock_guard<std::mutex> lock(mutex);
  const std::string name = prefix + "_" + inner;
  if (!counters.count(name)) {
    auto c = std::make_shared<std::atomic<int>>(0);
    counters[name] = c;
    torchcompile::register_backend(name, [inner, c](torchcompile::GraphModule& gm, const std::vector<at::Tensor>& ex) {
      ++*c;
      return torchcompile::lookup_backend(inner)(gm, ex);
    });
  }
  calls = counters[name];
  *calls = 0;
  return name;
}

std::string partition_of(const torchcompile::ExplainOutput& e) {
  std::string s;
  for (const auto& r : e.compiled)
    for (const auto& p : r.partition) s += p + "\n";
  return s;
}

}  // namespace tc_test
