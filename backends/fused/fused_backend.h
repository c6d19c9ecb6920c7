// The `fused` backend: maximal groups of pointwise operators run as tile programs (fused_program.h)
// by vector kernels compiled into the library for AVX-512, AVX2 and SSE2, chosen from cpuid
// (TORCHCOMPILE_ISA overrides); no compiler, no process and no disk at run time.
//
// A graph is split (partitioned_backend) into runs of consecutive fusible operators
// (fused_program.h's `fusible`: float32 pointwise operators it has kernels for), each run one
// tile program, and row operations (row_program.h: softmax, log_softmax, layer_norm), each one
// row program; the rest of the graph runs with the interpreter around them. A run whose outputs
// do not all have the broadcast shape of its operators stays with the interpreter (reported in
// the partition). Declines (with the reason): grad mode with an input or parameter that requires
// grad (the programs record no autograd graph); a graph with nothing it fuses.
#pragma once

#include <torchcompile/backends/registry.h>

namespace torchcompile::backends {

/// The registered `fused` backend (also `aot_fused`: AOT autograd's forward and backward graphs).
CompiledFn fused_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

/// Whether the fused backend computes this node in one of its programs.
bool fused_supports(const ir::Node& n);

}  // namespace torchcompile::backends
