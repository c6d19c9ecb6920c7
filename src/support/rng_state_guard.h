// Keeps the default CPU generator's state across work that may draw random numbers on the
// user's behalf without being the user's call (tracing a joint graph, probing a graph at other
// sizes): the user's random stream must not shift.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <mutex>

namespace torchcompile::support {

/// Restores the default CPU generator's state on destruction.
class RngStateGuard {
 public:
  RngStateGuard() : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    state_ = gen_.get_state();
  }
  ~RngStateGuard() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(state_);
  }
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  at::Generator gen_;
  at::Tensor state_;
};

}  // namespace torchcompile::support
