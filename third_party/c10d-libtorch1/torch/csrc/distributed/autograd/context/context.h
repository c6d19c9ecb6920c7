// Stand-in for a header that Debian 12's libtorch-dev (1.13) leaves out although its c10d
// Reducer header (torch/csrc/distributed/c10d/reducer.hpp) includes it. The Reducer only needs
// the two names below (a callback type and a pointer to a context it never touches in our use:
// the distributed-autograd context of RPC training); the class is declared with the members the
// Reducer names, nothing else. Added to the include path only when the real header is missing
// (CMakeLists.txt); LibTorch 2.x ships it.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch {
namespace distributed {
namespace autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};

using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace autograd
}  // namespace distributed
}  // namespace torch
