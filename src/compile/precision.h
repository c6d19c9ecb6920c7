// Reduced precision (CompileOptions::precision): the pass that gives a graph's Linears int8 or
// bfloat16 kernels before its backend sees it. The kernels are operators
// (`torchcompile::linear_int8_dynamic`, `torchcompile::linear_bf16`, registered with oneDNN's
// implementations by the onednn backend's files), so every backend runs them: the interpreter,
// the fused backend's ATen parts, a user's backend.
#pragma once

#include <torchcompile/backends/backend.h>
#include <torchcompile/capture/tracer.h>
#include <torchcompile/compile/precision.h>

#include <string>
#include <vector>

namespace torchcompile::compile_stage {

/// Throws, before anything is traced, if `options` asks for a precision this build or CPU
/// cannot give: no kernels (built without oneDNN), BFloat16 on a CPU without AVX512-BF16 or AMX
/// unless emulated.
void check_precision(const PrecisionOptions& options);

/// The operator implementing `p` (not Float32).
const char* kernel_of(Precision p);

/// Whether bfloat16 GEMMs run natively here: the CPU has AVX512-BF16 or AMX-BF16 (and
/// TORCHCOMPILE_ISA allows AVX-512) and oneDNN uses them. Needs the kernels (check_precision).
bool bf16_native();

/// `backend` with the graph's Linears lowered to `options.precision` first (the backend itself
/// for Float32). What became of each Linear goes into the compile report (explain()).
Backend with_precision(Backend backend, const PrecisionOptions& options);

/// For the tracer of a call compiled with `options`: computes the Linears the lowering will give
/// the precision with its kernels while the call is traced, so that the call that traces returns
/// what the compiled graph computes (the same rules, from the call's tensors). Null for Float32.
capture::OpSubstitute trace_substitute(const PrecisionOptions& options, const capture::Tracer& tracer);

/// The lowering itself, on `gm`: returns one line per Linear ("int8-dynamic: linear fc1
/// [784 -> 512]", "float32: linear fc3 [512 -> 10]: small GEMM ...").
std::vector<std::string> lower_precision(GraphModule& gm, const PrecisionOptions& options);

}  // namespace torchcompile::compile_stage
