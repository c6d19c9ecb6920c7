// Verify mode (CompileOptions::verify, TORCHCOMPILE_VERIFY=1): every call runs the forward
// eagerly first, puts back what that changed, runs the compiled entry and compares the two
// results; the first mismatch is warned about and kept (CompiledFunction::verify_failure).
#include <torchcompile/runtime/compiled_function.h>

#include "runtime/call_state.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>

#include <mutex>
#include <sstream>

namespace torchcompile::runtime {

namespace {

// How the compiled results differ from eager's, or empty if they agree (floating-point results
// within a tolerance).
std::string first_mismatch(const std::vector<at::Tensor>& expected, const std::vector<at::Tensor>& actual) {
  if (expected.size() != actual.size()) {
    return "the compiled call returned " + std::to_string(actual.size()) + " tensors, eager " +
           std::to_string(expected.size());
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const at::Tensor &e = expected[i], &a = actual[i];
    std::ostringstream os;
    if (e.defined() != a.defined()) {
      os << "output " << i << " is " << (e.defined() ? "defined" : "undefined") << " in eager, "
         << (a.defined() ? "defined" : "undefined") << " compiled";
    } else if (!e.defined()) {
      continue;
    } else if (e.sizes() != a.sizes() || e.scalar_type() != a.scalar_type()) {
      os << "output " << i << ": eager gives " << e.scalar_type() << e.sizes() << ", compiled " << a.scalar_type()
         << a.sizes();
    } else if (at::isFloatingType(e.scalar_type()) ? !at::allclose(e, a, 1e-4, 1e-5, /*equal_nan=*/true)
                                                   : !at::equal(e, a)) {
      os << "output " << i << " differs from eager: max abs difference "
         << (e.to(at::kDouble) - a.to(at::kDouble)).abs().max().item<double>();
    }
    if (!os.str().empty()) return os.str();
  }
  return "";
}

}  // namespace

std::vector<at::Tensor> CompiledFunction::call_verified(const CallArgs& args, const ForwardFn& forward,
                                                        OutputSpec& spec) {
  // Snapshot what the forward may change: inputs, module state, the random generator.
  StateSnapshot before;
  for (const at::Tensor& t : args.tensors) before.save(t);
  if (root_) {
    for (const auto& p : root_->parameters(/*recurse=*/true)) before.save(p);
    for (const auto& b : root_->buffers(/*recurse=*/true)) before.save(b);
  }
  before.save_rng();
  OutputSpec eager_spec;
  std::vector<at::Tensor> expected = forward(eager_spec);
  before.restore();
  std::vector<at::Tensor> actual = call_compiled(args, forward, spec);
  const std::string mismatch = first_mismatch(expected, actual);
  if (!mismatch.empty()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (verify_failure_.empty()) verify_failure_ = mismatch;
    }
    TORCH_WARN("torch::compile(", name_, ") verify: ", mismatch,
               ". Does the forward depend on host state the trace cannot see (a read of tensor data outside "
               "the dispatcher, a counter)? See docs/limitations.md (Host reads of tensor data)");
  }
  return actual;
}

}  // namespace torchcompile::runtime
