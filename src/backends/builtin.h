// Private: the registration of the built-in backends.
#pragma once

namespace torchcompile::detail {

/// Register every built-in backend compiled into the library (eager, debug, default, ...).
/// Called exactly once by the registry, before its first operation; it registers through
/// torchcompile::register_backend, which the registry lets through without re-entering its
/// one-time initialization.
void register_builtin_backends();

}  // namespace torchcompile::detail
