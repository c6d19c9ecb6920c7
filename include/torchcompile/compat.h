// Everything that differs between the LibTorch generations we build against (1.13 and 2.x).
// Nothing else in the project tests TORCH_VERSION_*.
#pragma once

#include <c10/core/DispatchKey.h>
#include <torch/version.h>

namespace torchcompile::compat {

constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchMinor = TORCH_VERSION_MINOR;

/// The functionality key the tracer's boxed fallback is registered on: a key above Autograd
/// that LibTorch itself leaves free. DeferredInit is free in 1.13 through 2.6 (only the
/// unmaintained torchdistx ever registered it). If a future LibTorch registers a fallback on
/// it, registering a second one aborts at load time: change the choice here, per version, and
/// test/capture's key test fails first.
constexpr c10::DispatchKey kTracingKey = c10::DispatchKey::DeferredInit;

}  // namespace torchcompile::compat
