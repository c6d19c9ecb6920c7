#include "onednn_rnn.h"

#include "dnnl_compat.h"

#include <ATen/ATen.h>

#include <algorithm>

#include <cstdlib>
#include <cstring>
#include <string>

namespace torchcompile::backends::onednn::detail {

namespace {

using md_t = dnnl::memory::desc;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// One layer (both directions of a bidirectional one): its primitive and the layouts it reads.
struct Layer {
  dnnl::primitive prim;
  md_t src, src_iter, wei_layer, wei_iter, bias, dst, dst_iter, scratch;
  size_t wei_layer_bytes = 0, wei_iter_bytes = 0;
  std::shared_ptr<PackedHolder> packed;  // weights_layer | weights_iter | bias, in the primitive's layouts
};

// LibTorch's gate blocks (rows of w_ih / w_hh) in oneDNN's order. LSTM: i, f, g, o in both.
// GRU: LibTorch r, z, n; oneDNN's linear-before-reset GRU u (= z), r, o (= n).
at::Tensor gates_in_onednn_order(const at::Tensor& w, const RnnSpec& s) {
  if (!s.gru) return w;
  auto blocks = w.chunk(3, 0);
  return at::cat({blocks[1], blocks[0], blocks[2]}, 0);
}

// The packed weights and bias of `layer` from the module's parameters.
std::shared_ptr<const Packed> pack_layer(const RnnSpec& s, const Layer& L, const std::vector<const at::Tensor*>& src) {
  auto p = std::make_shared<Packed>();
  record_sources(*p, src);
  at::NoGradGuard no_grad;
  const int64_t per = s.params_per_cell(), G = s.gates(), H = s.hidden;
  std::vector<at::Tensor> wl, wi, b;
  for (int64_t d = 0; d < s.dirs; ++d) {
    const at::Tensor* const* q = src.data() + d * per;
    wl.push_back(gates_in_onednn_order(*q[0], s));
    wi.push_back(gates_in_onednn_order(*q[1], s));
    at::Tensor bias;
    if (s.has_biases) {
      at::Tensor bih = gates_in_onednn_order(*q[2], s), bhh = gates_in_onednn_order(*q[3], s);
      if (s.gru)  // u, r: summed; o: b_in, then b_hn (applied inside the reset gate's product)
        bias = at::cat({bih.slice(0, 0, 2 * H) + bhh.slice(0, 0, 2 * H), bih.slice(0, 2 * H), bhh.slice(0, 2 * H)});
      else
        bias = bih + bhh;
    } else {
      bias = at::zeros({(s.gru ? G + 1 : G) * H}, at::kFloat);
    }
    b.push_back(bias);
  }
  // ldgoi: per direction the (gates * hidden, input) matrix LibTorch stores.
  at::Tensor wl_user = at::stack(wl).contiguous(), wi_user = at::stack(wi).contiguous();
  at::Tensor b_user = at::stack(b).contiguous();
  const int64_t in = wl_user.size(2);
  const size_t bias_bytes = L.bias.get_size();
  p->weight = at::empty({static_cast<int64_t>(L.wei_layer_bytes + L.wei_iter_bytes + bias_bytes)}, at::kByte);
  auto* base = static_cast<char*>(p->weight.data_ptr());
  reorder_now(md_t({1, s.dirs, in, G, H}, dt::f32, tag::ldgoi), wl_user.data_ptr(), L.wei_layer, base);
  reorder_now(md_t({1, s.dirs, H, G, H}, dt::f32, tag::ldgoi), wi_user.data_ptr(), L.wei_iter,
               base + L.wei_layer_bytes);
  std::memcpy(base + L.wei_layer_bytes + L.wei_iter_bytes, b_user.data_ptr(), bias_bytes);
  return p;
}

struct RnnStep : Step {
  RnnSpec spec;
  PlainIn x, h0;
  std::optional<PlainIn> c0;
  std::vector<uint32_t> outs;
  std::vector<Layer> layers;
  std::vector<int64_t> out_sizes, state_sizes;
  size_t scratch_bytes = 0;

  void run(Ctx& c) const override {
    at::Tensor tx, th, tc;
    const at::Tensor& xs = x.get(c, tx);
    const at::Tensor& hs = h0.get(c, th);
    const at::Tensor* cs = c0 ? &c0->get(c, tc) : nullptr;
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    at::Tensor out = at::empty(out_sizes, f32), hn = at::empty(state_sizes, f32);
    at::Tensor cn = cs ? at::empty(state_sizes, f32) : at::Tensor();
    const int64_t state_floats = spec.dirs * spec.batch * spec.hidden;  // one layer's h (or c)
    // One scratchpad for the call, as large as the largest layer's (the layers run one by one).
    at::Tensor scratch = at::empty({static_cast<int64_t>(scratch_bytes) + 1}, at::kByte);
    void* cur = xs.data_ptr();
    at::Tensor mid[2];
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      std::shared_ptr<const Packed> pk = L.packed->get();
      char* w = static_cast<char*>(pk->weight.data_ptr());
      void* dst;
      if (l + 1 == layers.size()) {
        dst = out.data_ptr();
      } else {
        mid[l % 2] = at::empty({spec.seq, spec.batch, spec.dirs * spec.hidden}, f32);
        dst = mid[l % 2].data_ptr();
      }
      const int64_t off = static_cast<int64_t>(l) * state_floats;
      const dnnl::engine& e = cpu_engine();
      dnnl::memory m_src(L.src, e, cur), m_h(L.src_iter, e, hs.data_ptr<float>() + off),
          m_wl(L.wei_layer, e, w), m_wi(L.wei_iter, e, w + L.wei_layer_bytes),
          m_b(L.bias, e, w + L.wei_layer_bytes + L.wei_iter_bytes), m_dst(L.dst, e, dst),
          m_hn(L.dst_iter, e, hn.data_ptr<float>() + off), m_scratch(L.scratch, e, scratch.data_ptr());
      std::vector<dnnl_exec_arg_t> args = {
          {DNNL_ARG_SRC_LAYER, m_src.get()},     {DNNL_ARG_SRC_ITER, m_h.get()},
          {DNNL_ARG_WEIGHTS_LAYER, m_wl.get()},  {DNNL_ARG_WEIGHTS_ITER, m_wi.get()},
          {DNNL_ARG_BIAS, m_b.get()},            {DNNL_ARG_DST_LAYER, m_dst.get()},
          {DNNL_ARG_DST_ITER, m_hn.get()},       {DNNL_ARG_SCRATCHPAD, m_scratch.get()}};
      std::optional<dnnl::memory> m_c, m_cn;
      if (cs) {
        m_c.emplace(L.src_iter, e, cs->data_ptr<float>() + off);
        m_cn.emplace(L.dst_iter, e, cn.data_ptr<float>() + off);
        args.push_back({DNNL_ARG_SRC_ITER_C, m_c->get()});
        args.push_back({DNNL_ARG_DST_ITER_C, m_cn->get()});
      }
      dnnl::error::wrap_c_api(
          dnnl_primitive_execute(L.prim.get(), c.stream, static_cast<int>(args.size()), args.data()),
          "could not execute an RNN primitive");
      cur = dst;
    }
    c.slots[outs[0]] = spec.batch_first ? out.transpose(0, 1) : std::move(out);
    c.slots[outs[1]] = std::move(hn);
    if (cs) c.slots[outs[2]] = std::move(cn);
  }
};

}  // namespace

bool rnn_enabled() {
  const char* e = std::getenv("TORCHCOMPILE_ONEDNN_RNN");
  return !e || std::string(e) != "0";
}

std::unique_ptr<Step> make_rnn_step(const RnnSpec& spec, PlainIn x, PlainIn h0, std::optional<PlainIn> c0,
                                    std::vector<uint32_t> outs) {
  auto s = std::make_unique<RnnStep>();
  s->spec = spec;
  const int64_t T = spec.seq, N = spec.batch, H = spec.hidden, D = spec.dirs, G = spec.gates();
  const auto dir = D == 2 ? dnnl::rnn_direction::bidirectional_concat : dnnl::rnn_direction::unidirectional_left2right;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  for (int64_t l = 0; l < spec.layers; ++l) {
    Layer L;
    const int64_t in = l == 0 ? spec.input_size : D * H;
    // Sequences are (T, N, C) in oneDNN's terms; a batch-first input is the `ntc` layout of that.
    // Outputs are (T, N, C): ATen returns a batch-first one as the transposed view of that too.
    const tag first = spec.batch_first ? tag::ntc : tag::tnc;
    L.src = md_t({T, N, in}, dt::f32, l == 0 ? first : tag::tnc);
    L.dst = md_t({T, N, D * H}, dt::f32, tag::tnc);
    L.src_iter = md_t({1, D, N, H}, dt::f32, tag::ldnc);
    const md_t wl_any({1, D, in, G, H}, dt::f32, tag::any), wi_any({1, D, H, G, H}, dt::f32, tag::any);
    L.bias = md_t({1, D, spec.gru ? G + 1 : G, H}, dt::f32, tag::ldgo);
    // The layouts the primitive chose (weights) or reports (final state, scratchpad).
    auto take = [&L](const auto& pd) {
      L.wei_layer = pd.weights_layer_desc();
      L.wei_iter = pd.weights_iter_desc();
      L.dst_iter = pd.dst_iter_desc();
      L.scratch = pd.scratchpad_desc();
    };
    if (spec.gru) {
      auto pd = compat::lbr_gru_forward_pd(cpu_engine(), dnnl::prop_kind::forward_inference, dir, L.src, L.src_iter,
                                           wl_any, wi_any, L.bias, L.dst, L.src_iter, attr);
      L.prim = dnnl::lbr_gru_forward(pd);
      take(pd);
    } else {
      auto pd = compat::lstm_forward_pd(cpu_engine(), dnnl::prop_kind::forward_inference, dir, L.src, L.src_iter,
                                        L.src_iter, wl_any, wi_any, L.bias, L.dst, L.src_iter, L.src_iter, attr);
      L.prim = dnnl::lstm_forward(pd);
      take(pd);
    }
    s->scratch_bytes = std::max(s->scratch_bytes, L.scratch.get_size());
    // Packed weights are padded to 64 bytes each so the next part stays aligned.
    L.wei_layer_bytes = (L.wei_layer.get_size() + 63) / 64 * 64;
    L.wei_iter_bytes = (L.wei_iter.get_size() + 63) / 64 * 64;
    const size_t per = spec.params_per_cell();
    std::vector<const at::Tensor*> sources(spec.params.begin() + l * D * per, spec.params.begin() + (l + 1) * D * per);
    s->layers.push_back(L);
    Layer& stored = s->layers.back();
    const RnnSpec sp = spec;
    const Layer shape = L;  // the pack reads only the layouts
    stored.packed = std::make_shared<PackedHolder>(sources, [sp, shape, sources] { return pack_layer(sp, shape, sources); });
  }
  s->out_sizes = {T, N, D * H};
  s->state_sizes = {spec.layers * D, N, H};
  s->x = std::move(x);
  s->h0 = std::move(h0);
  s->c0 = std::move(c0);
  s->outs = std::move(outs);
  return s;
}

}  // namespace torchcompile::backends::onednn::detail
