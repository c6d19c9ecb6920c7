// The `onednn` backend: lowers GEMMs and convolutions of the captured graph to oneDNN primitives
// with fused post-ops; everything else runs through ATen.
//
// What it matches (fp32 CPU tensors only; anything else stays ATen):
//  - linear-like GEMMs with a 2-D weight: `aten::linear`, `aten::addmm(bias, x, t(W))`,
//    `aten::mm`, `aten::matmul(x, W)` with x of any rank >= 2 (leading dims collapsed), plus a
//    following `add`/`add_` of a 1-D bias of size N (the C++ Linear's spelling for 3-D inputs).
//    A weight read from a module attribute (get_attr, possibly through `aten::t`) is reordered
//    once to the primitive's preferred blocked layout; any other weight is read as it is.
//  - batched GEMMs: `aten::bmm`, `aten::matmul` of two 3-D tensors, `aten::baddbmm` (beta = alpha
//    = 1); declined when oneDNN only has its reference implementation for the strides.
//  - 2-D convolutions: `aten::conv2d`, `aten::convolution` (not transposed) with attribute
//    weights, and an eval-mode BatchNorm directly after (`aten::batch_norm` with training=false,
//    `aten::native_batch_norm`, `aten::_native_batch_norm_legit_no_training`) folded into the
//    prepacked weights and bias. Conv outputs consumed only by other oneDNN convs (or by a global
//    average pool, `adaptive_avg_pool2d(x, 1)` / `mean([2, 3])`, also lowered) stay in oneDNN's
//    blocked layout; they are reordered to a plain tensor only where ATen or an output needs it.
//  - after the anchor (and its bias / BN), a chain of post-ops in graph order: relu, leaky_relu,
//    gelu (erf and tanh), sigmoid, tanh, silu, hardswish, hardtanh / relu6 / clamp, and one
//    residual `add` (alpha 1, same shape; oneDNN `sum` for convs, `binary_add` for GEMMs).
//    Eval dropout (`dropout(x, p, false)`) in the chain is skipped. A value is fused into its
//    user only when that user is its only use (and it is not a graph output).
//
// Frozen weights stay correct: before each call every prepacked weight's sources (weight, bias,
// BN parameters and running statistics) are checked against the TensorImpl and version counter
// seen when packing; a change (in-place edit, load_state_dict copy) re-packs (folding BN again)
// under a per-weight mutex before the primitive runs. LibTorch's C++ optimizers step through
// `p.data()`, which does not bump `p`'s version counter, so the state of each source's `.grad()`
// is checked too (a backward pass re-packs), and while a source has a gradient its contents are
// also compared with a copy taken when packing (pure inference, without gradients, pays only the
// identity/version checks). Attributes that are inference tensors (no version counter) are not
// prepacked: their GEMMs read them as they are, their convolutions stay ATen.
//
// Thread-safe: one CompiledFn may run on many threads at once. Primitives use oneDNN's user
// scratchpad mode; scratchpad, blocked intermediates and oneDNN memory objects come from a pool
// of per-call sets (created on first need, then reused), and each thread has its own stream.
//
// NaN and infinity as eager: oneDNN's relu / clip post-ops and its max pooling lose a NaN, so a
// step fusing one scans its inputs on each call (a vectorized scan compiled per ISA, see
// scan_isa()) and, when one holds a NaN (or, for GEMMs and convolutions, an infinity), runs the
// group's nodes with ATen on that call instead.
//
// Declines (torchcompile::decline, with the reason): with grad mode enabled and any input or
// parameter requiring grad (ATen autograd keeps gradients correct); a graph with nothing to
// fuse, or with call_module nodes; a graph oneDNN accepts no primitive of; a compile error
// (which also warns). `default` then runs the graph with the interpreter.
//
// The sources: onednn_backend.cpp (these entry points); the compiler's parts, one file per kind
// of group, are listed at the top of onednn_internal.h.
#pragma once

#include <torchcompile/backends/registry.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace torchcompile::backends {

/// The registered `onednn` backend (the first backend of `default` when oneDNN is compiled in).
/// Reports each fused primitive as a part of the graph's partition (explain(), the logs).
CompiledFn onednn_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

namespace onednn {

/// The result of compiling one graph.
struct Compiled {
  CompiledFn fn;
  /// One entry per fused primitive, in graph order: the anchor (`linear`, `matmul`, `bmm`,
  /// `conv`, `avgpool`) then what was fused into it, joined by '+': `bias`, `bn` (folded eval
  /// BatchNorm), `relu`, `leaky_relu`, `gelu` (erf), `gelu_tanh`, `sigmoid`, `tanh`, `silu`,
  /// `hardswish`, `clamp`, `add` (residual). E.g. "conv+bias+bn+relu", "linear+bias+gelu".
  std::vector<std::string> fused;
  /// Conv outputs kept in oneDNN's blocked layout for the next oneDNN primitive (not reordered
  /// to a plain tensor in between).
  size_t blocked_values = 0;
  /// Convolutions run with oneDNN's Winograd algorithm (3x3, stride 1; see
  /// TORCHCOMPILE_ONEDNN_WINOGRAD in the backend's source) rather than the direct one.
  size_t winograd_convs = 0;
  /// Operators of the graph run by ATen (the interpreter's op steps) between the primitives.
  size_t aten_ops = 0;
  /// The NaN / infinity scan the graph's steps run (scan_isa() when it was compiled).
  std::string scan_isa;
  /// The implementation oneDNN chose for each GEMM (matmul) primitive, in graph order
  /// ("brg:avx512_core", "gemm:jit", ...); other primitives are not listed.
  std::vector<std::string> impls;
  /// compile_rows(): the GEMMs whose number of rows is given at each call.
  size_t rows_gemms = 0;
  /// When oneDNN declines the graph, `fn` is empty (the pipeline runs the next backend of a chain
  /// or the interpreter) and this is the reason compile() gave torchcompile::decline().
  std::string reason;
};

/// The nodes `compile` would lower (anchors, what it fuses into them, weight transposes): the
/// backend's claim in `default`'s partition. Empty when it would decline for grad mode.
std::unordered_set<const ir::Node*> claim(const GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

/// Whether this oneDNN runs 3x3 convolutions with the Winograd algorithm on this CPU (oneDNN 2.x
/// does on AVX-512 machines; oneDNN 3 dropped it on most). Without it, inference convolutions
/// use the direct algorithm and training convolutions stay with ATen.
bool winograd_available();

/// Compile `gm` for oneDNN. The GraphModule must outlive the CompiledFn (attributes are read
/// live from it). A decline calls torchcompile::decline(reason) and returns an empty `fn`.
Compiled compile(GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

/// One program for every value of the size symbols of `gm`, where they size only the rows of its
/// GEMMs: each `linear` / `addmm` / `matmul` with a weight attribute and a reduced dimension of
/// fixed size becomes a oneDNN matmul whose number of rows (the product of the source's other
/// dimensions) is given at each call, its fused post-ops up to the first residual `add`; every
/// other operator runs in ATen. Declined, with the reason, when the graph has size expressions
/// in its arguments or a primitive oneDNN builds only for fixed sizes (convolution, pooling,
/// batched GEMM, RNN); its caller then compiles per size (compile_per_shape).
Compiled compile_rows(GraphModule& gm, const std::vector<at::Tensor>& example_inputs);

/// The NaN / infinity scan compile() gives a graph's steps now: "avx512", "avx2" or "scalar
/// (sse2)". It is compiled once per ISA (like the fused backend's kernels) and chosen like them:
/// the best this CPU runs, unless TORCHCOMPILE_ISA (`avx512`, `avx2`, `scalar` or `sse2`) asks
/// for another; an unknown name, or an ISA the CPU lacks, is an error (c10::Error, which fails
/// the compile as it fails fused's). Read at each compile; a compiled graph keeps its scan.
const char* scan_isa();

/// Runs the scan scan_isa() names over the `n` floats at `p`: whether one is a NaN, or (with
/// `or_infinity`) a NaN or an infinity. What the fallback checks and weight packing run; for tests.
bool scan_finds(const float* p, size_t n, bool or_infinity);

}  // namespace onednn

}  // namespace torchcompile::backends
