// Operators that PyTorch's own fast paths call instead of the layers' ordinary operators, traced
// as those operators (capture/tracer.cpp calls decompose_fast_path_op before recording an op).
//
// TorchScript modules scripted from torch.nn in eval mode (and, in LibTorch 2.x, C++ programs
// that call the fast path themselves) run a whole TransformerEncoderLayer as one native operator,
// `aten::_transformer_encoder_layer_fwd`. Recorded as it is, a backend can only call it: its
// GEMMs cannot be fused with their bias and activation, nor its residual adds with the layer
// norms. Traced as the operators it runs — the same kernels in the same order (linear, the
// masked softmax, matmuls, layer_norm), so the result is the operator's own bit for bit when
// they run as ATen — the backends see an ordinary encoder layer.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torchcompile::capture {

/// If `op` is a fast-path operator whose arguments the decomposition covers (a dense input; a
/// key padding mask or none), pops its arguments from `stack`, runs it as the
/// operators it is made of (each dispatched, hence traced) and pushes its results; returns true.
/// Returns false, touching nothing, otherwise.
bool decompose_fast_path_op(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchcompile::capture
