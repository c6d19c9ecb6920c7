// CompileOptions::mode: "default" compiles with the backend as given; "max-autotune" compiles an
// inference graph with every built-in that can run it (the chosen backend, onednn, fused, the
// interpreter), times each on the real inputs and keeps the fastest, cached per (graph
// structure, shapes, ISA, thread count) in memory and, with TORCHCOMPILE_CACHE_DIR, on disk.
#pragma once

#include <torchcompile/backends/backend.h>

#include <string>

namespace torchcompile::compile_stage {

/// Throws (saying which modes exist and what each does) unless `mode` is one.
void check_mode(const std::string& mode);

/// `backend` (registered as `backend_name`) as `mode` compiles with it.
Backend with_mode(Backend backend, const std::string& backend_name, const std::string& mode);

namespace detail {
/// Forget the choices made in this process (tests: the next compile reads TORCHCOMPILE_CACHE_DIR).
void forget_autotune_choices();
}  // namespace detail

}  // namespace torchcompile::compile_stage
