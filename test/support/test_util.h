// Helpers shared by the tests: a recording backend and comparison against eager.
#pragma once

#include <torchcompile/torchcompile.h>
#include <torchcompile/ir/printer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tc_test {

/// A backend that counts compiles, keeps the graphs it saw (as text) and runs them with the
/// interpreter: Dynamo's CompileCounter.
struct CompileCounter {
  struct State {
    std::mutex mutex;
    int frames = 0;
    std::vector<std::string> graphs;      // to_text of each graph
    std::vector<std::string> tabulars;    // print_tabular of each graph
    std::vector<size_t> op_counts;        // call_function nodes per graph
  };
  std::shared_ptr<State> state = std::make_shared<State>();

  torchcompile::Backend backend() const;
  int frames() const { return state->frames; }
  const std::vector<std::string>& graphs() const { return state->graphs; }
};

/// Copy the parameters of `from` into those of `to` (the same module type): an eager reference
/// of a module to be compiled.
void copy_parameters(torch::nn::Module& from, torch::nn::Module& to);

/// Number of call_function nodes in a graph.
size_t count_calls(const torchcompile::ir::Graph& g);
/// Number of call_function nodes whose target is `target` (`aten::add.Tensor`).
size_t count_calls(const torchcompile::ir::Graph& g, const std::string& target);

/// EXPECT that two tensors match (same shape and dtype, allclose with per-dtype tolerances;
/// exact for integral and bool dtypes).
::testing::AssertionResult tensors_close(const at::Tensor& expected, const at::Tensor& actual, double rtol = -1,
                                         double atol = -1);
/// tensors_close, except that an element of `actual` that is not close to `expected` (eager's
/// float result) passes if its error against `reference` (the same computation in float64) is
/// at most `factor` times eager's sensitivity there, plus the tolerance. The sensitivity is the
/// larger of eager's own error against `reference` and how far eager's result moves when every
/// input is nudged by one ULP (`nudged`, eager's result then; undefined to leave it out): where
/// the computation is ill-conditioned (sin of a large value, the square root of a cancelled
/// difference) two correct float programs differ beyond any fixed tolerance, and there the
/// result must be as accurate as eager's. Where eager is accurate and the computation stable,
/// the tolerance is tensors_close's. Where eager's sensitivity exceeds 1000 tolerances, the
/// float result is rounding noise, and any finite value passes. Non-finite values must match
/// eager's.
::testing::AssertionResult tensors_close_or_as_accurate(const at::Tensor& expected, const at::Tensor& actual,
                                                        const at::Tensor& reference, const at::Tensor& nudged,
                                                        double rtol, double atol, double factor = 4);
/// `t` with each float element moved by one ULP (towards +inf or -inf at random, drawn from `seed`).
at::Tensor nudged_by_one_ulp(const at::Tensor& t, uint64_t seed);
/// Bitwise equality (same shape, dtype, and every element identical).
::testing::AssertionResult tensors_equal(const at::Tensor& expected, const at::Tensor& actual);

/// The message of the c10::Error `f` throws (without backtrace), or "" if it does not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

/// Sets (or, with nullptr, unsets) an environment variable for the lifetime of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ScopedEnv(const char* name, const std::string& value) : ScopedEnv(name, value.c_str()) {}
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// x -> cos(x), built by hand: placeholder, call_function, output.
std::unique_ptr<torchcompile::GraphModule> cos_graph(const at::Tensor& example);

/// A backend that runs the graph as it is and counts how often it compiled.
torchcompile::Backend counting_backend(std::shared_ptr<std::atomic<int>> count);

/// The name of a backend registered under `<prefix>_<inner>` that counts its calls (compiles)
/// in `calls` (reset to 0 here) and compiles with the registered backend `inner`: for tests
/// that must name a backend (TorchScript modules, packages loaded by name).
std::string counting_backend_named(const std::string& prefix, const std::string& inner,
                                   std::shared_ptr<std::atomic<int>>& calls);

/// The compiled function's result on its second call: the first one traces, computing eager's
/// result while it records (comparing that with eager would test nothing).
template <class C, class... A>
auto second_call(C& compiled, const A&... args) {
  compiled(args...);
  return compiled(args...);
}

/// Every partition line of every graph `explain` reported, one per line.
std::string partition_of(const torchcompile::ExplainOutput& e);

}  // namespace tc_test
