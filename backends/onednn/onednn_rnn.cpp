// LSTM and GRU layers in the onednn backend: matching `aten::lstm.input` / `aten::gru.input`
// (Compiler::match_rnn), emission (Compiler::emit_rnn), and the step running one oneDNN RNN
// primitive per layer with prepacked weights (RnnStep, make_rnn_step).
#include "onednn_rnn.h"

#include "dnnl_compat.h"
#include "onednn_internal.h"

#include <ATen/ATen.h>

#include <algorithm>

#include <cstdlib>
#include <cstring>
#include <string>

namespace torchcompile::backends::onednn::detail {

namespace {

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
    // oneDNN 3's brgemm RNN kernels, which it picks where the weights' layout is left to it, give
    // wrong results (checked against LibTorch in double precision, oneDNN 3.7): the GRU on AVX2 CPUs,
    // the GRU and the LSTM on AVX-512 CPUs whenever the hidden size modulo 32 is 1 to 16. Plain
    // weights select the reference implementation over oneDNN's GEMM (what oneDNN 2 runs GRUs with),
    // which agrees with LibTorch.
    const bool plain = DNNL_VERSION_MAJOR >= 3 && (spec.gru || (H % 32 >= 1 && H % 32 <= 16));
    const md_t wl_any({1, D, in, G, H}, dt::f32, plain ? tag::ldigo : tag::any);
    const md_t wi_any({1, D, H, G, H}, dt::f32, plain ? tag::ldigo : tag::any);
    L.bias = md_t({1, D, spec.gru ? G + 1 : G, H}, dt::f32, tag::ldgo);
    // The layouts the primitive chose (weights) or reports (final state, scratchpad).
    auto take = [&L, plain](const auto& pd) {
      if (plain && std::string(pd.impl_info_str()).find("brgemm") != std::string::npos)
        throw dnnl::error(dnnl_unimplemented, "only oneDNN's brgemm RNN kernel, wrong for this layer, takes it");
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
    stored.packed = std::make_shared<PackedHolder>(
        sources, [sp, shape, sources] { return pack_layer(sp, shape, sources); },
        PackKey{std::string(spec.gru ? "gru" : "lstm") + " dirs=" + std::to_string(spec.dirs) +
                    (spec.has_biases ? " biases" : ""),
                {L.wei_layer, L.wei_iter, L.bias}});
  }
  s->out_sizes = {T, N, D * H};
  s->state_sizes = {spec.layers * D, N, H};
  s->x = std::move(x);
  s->h0 = std::move(h0);
  s->c0 = std::move(c0);
  s->outs = std::move(outs);
  return s;
}

// ---- the compiler's part ------------------------------------------------------------------------

// aten::lstm.input(input, hx[], params[], has_biases, num_layers, dropout, train, bidirectional,
// batch_first) and aten::gru.input (the same with one hx tensor) over fp32 sequences, with the
// parameters as module attributes (prepacked) and without dropout between layers.
bool Compiler::match_rnn(Node* n, Group& g) {
  if (!rnn_enabled() || !is_call(n, {"aten::lstm.input", "aten::gru.input"})) return false;
  g.kind = GroupKind::Rnn;
  g.anchor = n;
  RnnSpec& s = g.rnn;
  s.gru = n->target() == "aten::gru.input";
  for (size_t i = 3; i < 9; ++i)
    if (!scalar_arg(n, i)) return false;
  s.has_biases = *scalar_arg(n, 3) != 0;
  s.layers = static_cast<int64_t>(*scalar_arg(n, 4));
  const bool dropout_active = *scalar_arg(n, 6) != 0 && *scalar_arg(n, 5) != 0 && s.layers > 1;
  s.dirs = *scalar_arg(n, 7) != 0 ? 2 : 1;
  s.batch_first = *scalar_arg(n, 8) != 0;
  if (dropout_active || s.layers < 1) return false;
  auto x = value_arg(n, 0);
  if (!x) return false;
  const TensorMeta& xm = meta(*x);
  if (!is_f32(xm) || xm.sizes.size() != 3 || !is_contiguous(xm.sizes, xm.strides) || numel(xm.sizes) == 0) return false;
  s.seq = xm.sizes[s.batch_first ? 1 : 0];
  s.batch = xm.sizes[s.batch_first ? 0 : 1];
  s.input_size = xm.sizes[2];
  // Initial states: (layers * dirs, batch, hidden), contiguous fp32.
  std::vector<Value> states;
  if (s.gru) {
    auto h = value_arg(n, 1);
    if (!h) return false;
    states.push_back(*h);
  } else {
    if (!arg(n, 1).is_list() || arg(n, 1).list().size() != 2) return false;
    for (const auto& e : arg(n, 1).list())
      if (!e || !meta(*e).defined) return false;
      else states.push_back(*e);
  }
  if (meta(states[0]).sizes.size() != 3) return false;
  s.hidden = meta(states[0]).sizes[2];
  const std::vector<int64_t> state_sizes{s.layers * s.dirs, s.batch, s.hidden};
  for (const Value& v : states)
    if (!is_f32(meta(v)) || meta(v).sizes != state_sizes || !is_contiguous(meta(v).sizes, meta(v).strides)) return false;
  // Parameters: module attributes of LibTorch's shapes (no projections).
  if (!arg(n, 2).is_list()) return false;
  const auto& ps = arg(n, 2).list();
  const int64_t per = s.params_per_cell(), G = s.gates(), H = s.hidden;
  if (static_cast<int64_t>(ps.size()) != s.layers * s.dirs * per) return false;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!ps[i]) return false;
    const at::Tensor* t = attr_of(*ps[i]);
    if (!t || !t->is_contiguous()) return false;
    const int64_t layer = static_cast<int64_t>(i) / (s.dirs * per), which = static_cast<int64_t>(i) % per;
    const int64_t in = layer == 0 ? s.input_size : s.dirs * H;
    const std::vector<int64_t> want = which == 0 ? std::vector<int64_t>{G * H, in}
                                      : which == 1 ? std::vector<int64_t>{G * H, H}
                                                   : std::vector<int64_t>{G * H};
    if (t->sizes().vec() != want) return false;
    s.params.push_back(t);
    g.helpers.push_back(ps[i]->node);
  }
  // The states come out contiguous; the sequence output is (T, N, D*H), batch-first as its
  // transposed view (ATen's layout).
  for (size_t i = 0; i < n->num_outputs(); ++i) {
    const TensorMeta& om = meta(n->output(i));
    if (!is_f32(om)) return false;
    if (i == 0 && s.batch_first) {
      std::vector<int64_t> tnc{om.sizes.at(1), om.sizes.at(0), om.sizes.at(2)};
      if (!is_contiguous(tnc, {om.strides.at(1), om.strides.at(0), om.strides.at(2)})) return false;
    } else if (!is_contiguous(om.sizes, om.strides)) {
      return false;
    }
  }
  g.src = *x;
  g.h0 = states[0];
  if (!s.gru) g.c0 = states[1];
  g.head.push_back(n);
  g.base = n->output(0);
  return true;
}

bool Compiler::emit_rnn(Group& g) {
  Node* n = g.anchor;
  std::vector<uint32_t> outs;
  for (size_t i = 0; i < n->num_outputs(); ++i) outs.push_back(new_slot());
  PlainIn x = plain_in(g.src), h0 = plain_in(*g.h0);
  std::optional<PlainIn> c0;
  if (g.c0) c0 = plain_in(*g.c0);
  std::vector<uint32_t> reads{x.slot, h0.slot};
  if (c0) reads.push_back(c0->slot);
  auto step = make_rnn_step(g.rnn, std::move(x), std::move(h0), std::move(c0), outs);
  for (size_t i = 0; i < n->num_outputs(); ++i) locs_[n->output(i)] = slot_loc(outs[i]);
  push(std::move(step), std::move(reads));
  return true;
}

}  // namespace torchcompile::backends::onednn::detail
