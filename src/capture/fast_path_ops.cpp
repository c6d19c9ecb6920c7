// Fast-path operators traced as the operators they are made of (capture/fast_path_ops.h).
#include "capture/fast_path_ops.h"

#include "capture/observed.h"

#include <ATen/ATen.h>

#include <cmath>

namespace torchcompile::capture {

namespace {

// The masked softmax over the last dimension of attention scores `s` (B, H, T, T) as the native
// attention runs it with a key padding mask `mask` (B, T), true where a key is padding: a row
// masked entirely gives zeros (the masked softmax kernel's rule). The mask is broadcast with
// views only (no size read), so the trace holds for every size.
at::Tensor masked_softmax(const at::Tensor& s, at::Tensor mask) {
  if (mask.scalar_type() != at::kBool) mask = mask.to(at::kBool);
  return at::_masked_softmax(s, mask.unsqueeze(1).unsqueeze(2).expand_as(s), /*dim=*/3, /*mask_type=*/2);
}

// t.size(d), read by the tracer itself: not a read of the forward's (capture/observed.h).
int64_t size_unobserved(const at::Tensor& t, int64_t d) {
  ObservedTensorImpl* o = ObservedTensorImpl::of(t);
  const bool was = o != nullptr && o->observing();
  if (was) o->set_observing(false);
  const int64_t n = t.size(d);
  if (was) o->set_observing(true);
  return n;
}

// Multi-head self-attention as `_native_multi_head_attention(x, x, x, ...)` computes it
// (need_weights false): one GEMM for q, k and v, q scaled by 1/sqrt(head size), scores, masked
// softmax, context, output projection.
at::Tensor self_attention(const at::Tensor& x, int64_t embed_dim, int64_t num_heads, const at::Tensor& qkv_weight,
                          const at::Tensor& qkv_bias, const at::Tensor& proj_weight, const at::Tensor& proj_bias,
                          const c10::optional<at::Tensor>& mask) {
  const int64_t head = embed_dim / num_heads;
  // (B, T, 3E) -> (3, B, H, T, D)
  at::Tensor qkv = at::linear(x, qkv_weight, qkv_bias).unflatten(-1, {3, num_heads, head}).permute({2, 0, 3, 1, 4});
  at::Tensor q = qkv.select(0, 0).mul(1.0 / std::sqrt(static_cast<double>(head)));
  at::Tensor scores = at::matmul(q, qkv.select(0, 1).transpose(-2, -1));
  at::Tensor attn = mask ? masked_softmax(scores, *mask) : at::softmax(scores, -1);
  at::Tensor context = at::matmul(attn, qkv.select(0, 2)).transpose(1, 2).flatten(2);  // (B, T, E)
  return at::linear(context, proj_weight, proj_bias);
}

bool is(const c10::OperatorHandle& op, const char* name) {
  const auto& n = op.schema().operator_name();
  return n.overload_name.empty() && n.name == name;
}

}  // namespace

bool decompose_fast_path_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!is(op, "aten::_transformer_encoder_layer_fwd") || op.schema().arguments().size() != 20) return false;
  auto arg = [&](size_t i) -> const c10::IValue& { return (*stack)[stack->size() - 20 + i]; };
  const at::Tensor& src = arg(0).toTensor();
  if (src.is_nested() || src.layout() != at::kStrided || src.dim() != 3 || !at::isFloatingType(src.scalar_type()))
    return false;
  // Masks: a key padding mask (B, T) with mask_type 1, as nn.TransformerEncoderLayer passes
  // src_key_padding_mask, or none. Other masks are left to the operator (LibTorch 1.13's CPU
  // kernel rejects an attention mask (T, T) unless T is the batch size: the trace must throw as
  // the forward does).
  c10::optional<at::Tensor> mask;
  if (arg(18).isTensor() && arg(18).toTensor().defined()) {
    mask = arg(18).toTensor();
    if (!arg(19).isInt() || arg(19).toInt() != 1 || mask->is_nested() || mask->dim() != 2 ||
        size_unobserved(*mask, 0) != size_unobserved(src, 0) || size_unobserved(*mask, 1) != size_unobserved(src, 1))
      return false;
  }
  const int64_t E = arg(1).toInt(), H = arg(2).toInt();
  if (H <= 0 || E % H != 0) return false;
  const bool use_gelu = arg(7).toBool(), norm_first = arg(8).toBool();
  const double eps = arg(9).toDouble();
  auto norm = [&](const at::Tensor& x, size_t w) { return at::layer_norm(x, {E}, arg(w).toTensor(), arg(w + 1).toTensor(), eps); };
  auto attention = [&](const at::Tensor& x) {
    return self_attention(x, E, H, arg(3).toTensor(), arg(4).toTensor(), arg(5).toTensor(), arg(6).toTensor(), mask);
  };
  auto ffn = [&](const at::Tensor& x) {
    at::Tensor h = at::linear(x, arg(14).toTensor(), arg(15).toTensor());
    h = use_gelu ? at::gelu(h) : at::relu(h);
    return at::linear(h, arg(16).toTensor(), arg(17).toTensor());
  };
  // transformer_encoder_layer_forward: attention, residual, norm, feed-forward, residual, norm
  // (the norms first with norm_first).
  at::Tensor x;
  if (norm_first) {
    x = at::add(src, attention(norm(src, 10)));
    x = at::add(x, ffn(norm(x, 12)));
  } else {
    x = norm(at::add(attention(src), src), 10);
    x = norm(at::add(ffn(x), x), 12);
  }
  torch::jit::drop(*stack, 20);
  stack->push_back(std::move(x));
  return true;
}

}  // namespace torchcompile::capture
