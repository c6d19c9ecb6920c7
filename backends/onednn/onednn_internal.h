// Private to the onednn backend: what its compiler's source files share. Where things are:
//
//   onednn_internal.h   (this file) the graph helpers, Group (one matched pattern), the Compiler
//                       class, and the steps the compiler emits (their fields; run() is in
//                       onednn_steps.cpp), including AtenFallback.
//   onednn_match.cpp    the matching pass: Compiler::match, the post-op chains after an anchor
//                       (extend_chain), the helpers reading node arguments, group labels.
//   onednn_gemm.cpp     GEMM groups (linear, addmm, mm, matmul, bmm, baddbmm): match and emit.
//   onednn_conv.cpp     convolution groups (conv2d, transposed convolutions, folded BatchNorm,
//                       Winograd, training convolutions and their backward): match and emit.
//   onednn_pool.cpp     pooling groups (max, average, global average): match and emit.
//   onednn_rnn.cpp      LSTM / GRU groups: match, emit, and their step.
//   onednn_embedding.cpp EmbeddingBag groups (sum / mean, the backend's own loop): match, emit,
//                       and their step.
//   onednn_build.cpp    Compiler::build: slots and blocked values, reorders, the ATen steps of
//                       unmatched nodes, post-op lists, the fallback of a group (make_fallback).
//   onednn_steps.cpp    what the steps do at run time (MatmulStep, ConvStep, PoolStep, ...).
//   onednn_scan*.{h,cpp} the NaN / infinity scan and the transposed convolution's gather,
//                       compiled once per ISA.
//   onednn_runtime.*    the Program, per-call memory sets, prepacked weights.
//   onednn_backend.cpp  the entry points: compile, claim, the registered backend.
//
// One compile: Compiler::match() finds the groups (an anchor, its bias / BatchNorm, a chain of
// post-ops), then Compiler::build() walks the graph in order and emits one step per group
// (emit_group) and an ATen step (ir::OpStep) per other node, over numbered value slots.
#pragma once

#include "dnnl_compat.h"
#include "onednn_backend.h"
#include "onednn_rnn.h"
#include "onednn_runtime.h"
#include "onednn_scan.h"

#include <torchcompile/backends/registry.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_step.h>
#include <torchcompile/ir/op_properties.h>

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace torchcompile::backends::onednn::detail {

using ir::Node;
using ir::NodeKind;
using ir::TensorMeta;
using ir::Value;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;
using md_t = dnnl::memory::desc;

// ---- reading the graph (onednn_match.cpp) -------------------------------------------------------

inline const TensorMeta& meta(const Value& v) { return v.node->output_meta().at(v.index); }
inline const ir::Argument& arg(const Node* n, size_t i) { return n->args().at(i); }

/// A defined fp32 CPU tensor of rank >= 1.
inline bool is_f32(const TensorMeta& m) {
  return m.defined && m.dtype == at::kFloat && m.device.is_cpu() && !m.sizes.empty();
}

inline int64_t numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

/// A convolution's or pooling's stride / padding / dilation: one value for both spatial dims, or two.
inline std::vector<int64_t> pair_of(std::vector<int64_t> v) {
  return v.size() == 1 ? std::vector<int64_t>{v[0], v[0]} : v;
}

inline bool is_call(const Node* n, std::initializer_list<const char*> targets) {
  if (n->kind() != NodeKind::CallFunction) return false;
  for (const char* t : targets)
    if (n->target() == t) return true;
  return false;
}

inline md_t plain_md(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  return md_t(dims(sizes.begin(), sizes.end()), dt::f32, dims(strides.begin(), strides.end()));
}

/// Row-major contiguous (dimensions of size 1 may have any stride).
bool is_contiguous(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);
std::optional<std::vector<int64_t>> int_list(const c10::IValue& v);
std::optional<double> scalar(const c10::IValue& v);
/// The tensor value of argument i, if it is one and defined.
std::optional<Value> value_arg(const Node* n, size_t i);
/// Argument i is a constant None (or an undefined tensor).
bool none_arg(const Node* n, size_t i);
/// Argument i as a constant number (bools as 0 / 1).
std::optional<double> scalar_arg(const Node* n, size_t i);
/// Uses of every output of `n`.
size_t total_uses(const Node* n);
/// Collapse the leading dims of an activation (..., K) into (M, K): sizes and strides, or nullopt
/// if the layout does not allow it.
std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> as_2d(const TensorMeta& m);
/// The plain 2-D (M, N) layout of an activation (..., N), as_2d's.
md_t md_2d(const TensorMeta& m);
/// Whether oneDNN picked its reference implementation (`impl_info_str()`): too slow to use.
bool is_ref_impl(const char* impl);
/// A matmul whose weight is prepacked (created with format `any`): `pd` itself, or, where oneDNN
/// chose the plain dense (K, N) layout for the weight (its `gemm:jit`, the f32 GEMM of AVX2 CPUs)
/// and its rows would be a multiple of 512 bytes apart, the same matmul with the weight's rows
/// 16 floats longer (onednn_gemm.cpp says why). `src`, `bias`, `dst` and `attr` are `pd`'s.
dnnl::matmul::primitive_desc with_spaced_weight_rows(dnnl::matmul::primitive_desc pd, const md_t& src,
                                                     const md_t& bias, const md_t& dst,
                                                     const dnnl::primitive_attr& attr);
/// Whether a matmul of `macs` multiply-adds (0: not known when compiling) is created and run at
/// one thread (onednn_gemm.cpp says why); false when LibTorch runs one.
bool runs_on_one_thread(int64_t macs);
/// The calling thread's OpenMP thread count set to one while it lives (oneDNN reads it when a
/// primitive descriptor is created and when a primitive runs), then put back; nothing if !active.
class OneThreadScope {
 public:
  explicit OneThreadScope(bool active);
  ~OneThreadScope();
  OneThreadScope(const OneThreadScope&) = delete;
  OneThreadScope& operator=(const OneThreadScope&) = delete;

 private:
  int before_ = 0;
};
/// The implementation a matmul runs, for Compiled::impls: `impl_info_str()`, and the weight's
/// row stride where with_spaced_weight_rows() lengthened it ("gemm:jit, weight rows 1040 apart").
std::string matmul_impl_label(const dnnl::matmul::primitive_desc& pd);

// ---- matched groups -----------------------------------------------------------------------------

/// A oneDNN eltwise post-op.
struct Eltwise {
  dnnl::algorithm alg;
  float alpha = 0.f, beta = 0.f;
  std::string label;
};

struct PostOp {
  bool is_add = false;
  Eltwise e;
  Value other;  // is_add: the residual
};

enum class GroupKind { Linear, Batched, Conv, Pool, TrainConv, TrainConvBackward, Rnn, EmbeddingBag };

/// An eval BatchNorm folded into a convolution's prepacked weights and bias.
struct FoldedBatchNorm {
  const at::Tensor *weight = nullptr, *bias = nullptr;  // null: absent (affine=false)
  const at::Tensor *running_mean = nullptr, *running_var = nullptr;
  double eps = 1e-5;
};

/// One matched pattern: the fields every kind has, then those of some kinds (GEMMs and
/// convolutions share the weight, convolutions and poolings the window).
struct Group {
  // ---- every kind
  GroupKind kind;
  Node* anchor = nullptr;
  Value src;
  Value base;                  // the anchor's (+ bias / BN) result, where the chain starts
  std::vector<PostOp> post;    // the chain's post-ops (Batched: baddbmm's add)
  // Chain nodes, each with the number of post-ops applied once it has run.
  std::vector<std::pair<Node*, size_t>> chain;
  std::vector<Node*> head;     // anchor, bias add, BN: always part of the group
  std::vector<Node*> helpers;  // get_attr / t nodes read only by the group (emitted on demand)
  Value out;                   // the group's result (after emission: of the kept post-ops)
  size_t kept = 0;             // post-ops actually fused (after trimming)

  // ---- Linear / Batched / TrainConv: the weight operand (logical (K, N) or (B, K, N) for GEMMs)
  Value weight;
  const at::Tensor* weight_attr = nullptr;  // prepacked: the module attribute (Conv too)
  bool weight_transposed = false;           // logical weight = attr^T
  std::vector<int64_t> w_sizes, w_strides;  // logical weight layout (dynamic weights)
  std::optional<Value> bias;                // Linear, TrainConv: a 1-D value

  // ---- Conv / TrainConv / Pool: the window
  std::vector<int64_t> stride, padding, dilation;
  // ---- Conv / TrainConv
  int64_t groups = 1;
  const at::Tensor* conv_bias_attr = nullptr;
  std::optional<FoldedBatchNorm> bn;
  bool winograd = false;    // oneDNN's Winograd algorithm (set when emitted)
  bool transposed = false;  // a transposed convolution (oneDNN's deconvolution, or TConvStep)
  bool transposed_gemm = false;  // as a GEMM and a gather (TConvStep)
  // ---- Pool: max (else average) over `kernel`
  bool pool_max = false;
  bool ceil_mode = false;
  bool count_include_pad = false;  // average pooling: divide by the window including padding
  std::vector<int64_t> kernel;
  // ---- Rnn: the layer's shape and parameters; the initial states (c0: LSTM only).
  RnnSpec rnn;
  std::optional<Value> h0, c0;
  // ---- EmbeddingBag: `src` is the weight; mode mean (else sum)
  bool bag_mean = false;
  bool include_last_offset = false;
  int64_t padding_idx = -1;
};

/// The group's label in Compiled::fused, with its first `kept` post-ops.
std::string make_label(const Group& g, size_t kept);

// ---- steps (run() in onednn_steps.cpp) ----------------------------------------------------------

/// A module attribute into its slot.
struct AttrStep : Step {
  const at::Tensor* attr;
  uint32_t out;
  void run(Ctx& c) const override;
};

/// An ATen call of a node oneDNN does not run: the interpreter's prepared step.
struct AtenStep : Step {
  ir::OpStep call;
  explicit AtenStep(ir::OpStep c) : call(std::move(c)) {}
  void run(Ctx& c) const override;
};

inline void set_handle(const dnnl::memory& m, void* p) {
  dnnl::error::wrap_c_api(dnnl_memory_set_data_handle(m.get(), p), "could not set a memory handle");
}

/// The arguments of one primitive execution (oneDNN's C API: no allocation per call).
struct ExecArgs {
  dnnl_exec_arg_t a[12];
  int n = 0;
  void add(int arg, const dnnl::memory& m) { a[n++] = {arg, m.get()}; }
  // Points `m` at `p` and passes it as `arg`.
  void bind(int arg, const dnnl::memory& m, void* p) {
    set_handle(m, p);
    add(arg, m);
  }
};

inline void execute(const dnnl::primitive& p, const Ctx& c, const ExecArgs& args) {
  dnnl::error::wrap_c_api(dnnl_primitive_execute(p.get(), c.stream, args.n, args.a), "could not execute a primitive");
}

/// Reorder between two memory objects of the set (Compiler::make_reorder).
struct Reorder {
  dnnl::reorder prim;
  uint32_t mem_from = 0, mem_to = 0, mem_scratch = 0;
  bool has_scratch = false;
  void run(const Ctx& c, void* from, void* to) const;
};

/// Blocked value -> plain fp32 tensor.
struct ToPlainStep : Step {
  Reorder r;
  uint32_t buffer, out;
  std::vector<int64_t> sizes;
  void run(Ctx& c) const override;
};

/// The one way a step leaves its primitive for ATen: on a call whose inputs hold values the
/// primitive would get wrong, the step scans them first and, if one is found, runs its group's
/// nodes with the interpreter's op steps (ir::OpStep) instead, as eager does. Used by:
///  - GEMMs and convolutions fusing relu or clip (relu6, hardtanh, clamp): oneDNN computes those
///    as a max / min against a constant, which turns a NaN into the constant where ATen keeps
///    it. Trigger: a NaN or an infinity (which can make a NaN inside the GEMM) in an input or
///    in the packed weights. Finite inputs give finite pre-activations (barring overflow),
///    which those post-ops compute exactly.
///  - max pooling: oneDNN's max skips a NaN, ATen's propagates it. Trigger: a NaN in the input.
/// Built by Compiler::make_fallback; a blocked input is reordered to a plain tensor for ATen
/// (on that path only); the nodes' values live in private slots, cleared after the call.
struct AtenFallback {
  struct Scan {
    bool blocked = false;
    uint32_t index = 0;  // buffer (blocked) or slot
    size_t floats = 0;   // blocked: the buffer's size in floats (its layout's padding included)
  };
  struct Unblock {  // a blocked input, made plain for the ATen steps
    uint32_t buffer = 0;
    std::vector<int64_t> sizes;
    std::optional<Reorder> reorder;
    uint32_t slot = 0;
  };
  const ScanKernels* scan = nullptr;  // the program's (Compiler::scan_)
  int32_t limit = kNonFiniteAbove;    // kNanAbove or kNonFiniteAbove (onednn_scan.h)
  std::vector<Scan> scans;
  std::vector<Unblock> unblock;
  std::vector<ir::OpStep> steps;  // the group's nodes, in graph order
  std::vector<uint32_t> private_slots;
  uint32_t result_slot = 0;

  /// Whether this call must take the ATen path: `packed` (may be null) holds a non-finite value,
  /// or a scanned input a value above `limit`.
  bool triggered(const Ctx& c, const Packed* packed) const;
  /// Runs the group's nodes; returns their result (and clears the private slots).
  at::Tensor run(Ctx& c) const;
};

/// Whether the tensor holds a value whose magnitude's bits exceed `limit` (onednn_scan.h), with
/// `scan` over its memory when it is dense enough (see onednn_steps.cpp), else with ATen.
bool any_above(const ScanKernels& scan, const at::Tensor& t, int32_t limit);

struct MatmulStep : Step {
  dnnl::matmul prim;
  PlainIn src;
  std::shared_ptr<PackedHolder> packed;
  PlainIn wei;  // dynamic weights
  bool has_bias = false;
  PlainIn bias;
  std::vector<PlainIn> bins;        // binary-add operands
  std::vector<int> bin_post_index;  // their positions among the post-ops
  std::vector<int64_t> out_sizes;
  // Nonzero when the primitive has run-time rows (Compiler::vary_rows): the source is any
  // (..., rows_k) tensor, read as (M, rows_k), and the result (..., rows_n); m_src and m_dst are
  // then made per call.
  int64_t rows_k = 0, rows_n = 0;
  uint32_t out = 0;
  uint32_t m_src = 0, m_wei = 0, m_bias = 0, m_dst = 0, m_scratch = 0;
  std::vector<uint32_t> m_bins;
  bool has_scratch = false;
  bool one_thread = false;  // created and run at one thread (runs_on_one_thread)
  std::shared_ptr<const AtenFallback> fallback;
  void run(Ctx& c) const override;
};

/// Where a conv / pool reads its source: a plain slot or a blocked buffer, optionally reordered
/// into the primitive's source layout first.
struct ActIn {
  bool blocked = false;
  uint32_t index = 0;  // buffer (blocked) or slot
  PlainIn plain;
  std::optional<Reorder> reorder;  // to `reorder_buffer`
  uint32_t reorder_buffer = 0;
  void* get(const Ctx& c, at::Tensor& tmp) const;
};

/// Conv / pool output: a blocked buffer, a plain tensor directly, or a buffer reordered to plain.
struct ActOut {
  bool blocked = false;  // stays in `buffer`
  bool direct = false;   // the primitive writes the plain tensor
  uint32_t buffer = 0;
  std::optional<Reorder> to_plain;
  std::vector<int64_t> sizes;  // plain tensor
  uint32_t slot = 0;
};

struct ConvStep : Step {
  dnnl::primitive prim;
  ActIn src;
  std::shared_ptr<PackedHolder> packed;
  ActOut out;
  bool has_sum = false;
  ActIn sum_src;  // residual: read, then reordered into the destination
  std::optional<Reorder> sum_reorder;
  uint32_t m_src, m_wei, m_bias, m_dst, m_scratch;
  bool has_scratch = false;
  std::shared_ptr<const AtenFallback> fallback;
  std::optional<Reorder> fallback_to_blocked;  // the ATen result into a blocked output
  void run(Ctx& c) const override;
};

/// A transposed convolution as a GEMM and a gather (onednn_conv.cpp says where it is used): the
/// channels-last source, read as (N*IH*IW, IC), times the prepacked (IC, KH*KW*OC) weights gives
/// each input pixel's contribution to the output pixels it reaches (the `cols` buffer); the
/// gather (Col2im, onednn_scan.h) sums each output pixel's contributions, adds the bias (a
/// BatchNorm folded in) and applies a fused relu.
struct TConvStep : Step {
  dnnl::primitive prim;  // the matmul
  ActIn src;             // channels-last
  std::shared_ptr<PackedHolder> packed;
  ActOut out;  // blocked: a channels-last buffer; else the plain NCHW tensor, written directly
  uint32_t cols = 0;  // buffer
  uint32_t m_src = 0, m_wei = 0, m_dst = 0, m_scratch = 0;
  bool has_scratch = false;
  int64_t N = 0;
  Col2im shape;  // its tap pointers are set at each call, from the vectors below
  std::vector<int32_t> row_taps, row_begin;
  const ScanKernels* kernels = nullptr;
  void run(Ctx& c) const override;
};

/// An EmbeddingBag of mode sum or mean without per-sample weights (onednn_embedding.cpp): the
/// backend's own loop (ScanKernels::bag_reduce) over int64 indices and offsets, its result a new
/// (bags x dim) tensor. Inputs it does not handle (other dtypes, a weight whose rows are not
/// contiguous, offsets that are not non-decreasing within the indices, an index out of range)
/// run ATen's operator instead, which computes or rejects them as eager does.
struct EmbeddingBagStep : Step {
  uint32_t weight = 0, indices = 0, offsets = 0, out = 0;
  bool mean = false;
  bool include_last_offset = false;
  int64_t padding_idx = -1;
  const ScanKernels* kernels = nullptr;
  std::optional<ir::OpStep> aten;  // the node itself, writing all its results
  void run(Ctx& c) const override;
};

struct PoolStep : Step {
  dnnl::primitive prim;
  ActIn src;
  ActOut out;  // plain
  uint32_t m_src, m_dst, m_scratch;
  bool has_scratch = false;
  std::shared_ptr<const AtenFallback> fallback;  // max pooling: a NaN in the input
  void run(Ctx& c) const override;
};

/// A oneDNN primitive over plain (NCHW / OIHW) tensors from slots: each input reordered into the
/// primitive's layout if it has another, each result allocated plain and reordered back into it.
struct PlainPrimitiveStep : Step {
  struct In {
    int arg = 0;
    PlainIn src;
    uint32_t mem = 0;
    std::optional<Reorder> reorder;
    uint32_t buffer = 0;
  };
  struct Out {
    int arg = 0;
    uint32_t slot = 0;
    std::vector<int64_t> sizes;
    uint32_t mem = 0;
    std::optional<Reorder> reorder;
    uint32_t buffer = 0;
  };
  dnnl::primitive prim;
  std::vector<In> ins;
  std::vector<Out> outs;
  uint32_t m_scratch = 0;
  bool has_scratch = false;
  void run(Ctx& c) const override;
};

// ---- the compiler -------------------------------------------------------------------------------

/// Primitive attributes with oneDNN's user scratchpad mode (the program's shared scratch buffer).
dnnl::primitive_attr user_scratchpad_attr();
/// The post-ops of a group's first `kept` chain entries (a residual as `sum` for convolutions,
/// else as a binary add of `add_mds` in order).
dnnl::post_ops make_post_ops(const Group& g, size_t kept, const std::vector<md_t>& add_mds, bool conv_sum);
/// Whether oneDNN computes `e` as a max/min against a constant, turning NaN into a number (relu,
/// clip) where ATen keeps the NaN.
bool loses_nan(const Eltwise& e);
/// Whether the first `kept` post-ops include relu or clip, which lose NaNs (see AtenFallback).
bool fuses_nan_losing_activation(const Group& g, size_t kept);

class Compiler {
 public:
  explicit Compiler(GraphModule& gm);

  void match();
  /// The program, with `scan` for its NaN / infinity checks.
  std::shared_ptr<Program> build(const ScanKernels& scan);
  const std::vector<std::string>& fused() const { return fused_; }
  size_t num_groups() const { return groups_.size(); }
  /// The call_function nodes of the matched groups: members and helpers (weight transposes).
  std::unordered_set<const Node*> group_nodes() const;
  size_t blocked_values() const { return blocked_values_; }
  size_t winograd_convs() const { return winograd_convs_; }
  /// The implementation oneDNN chose for each GEMM (matmul) primitive, in emission order.
  const std::vector<std::string>& impls() const { return impls_; }

  /// Builds one program for every value of the graph's size symbols (call before match()): each
  /// GEMM a oneDNN matmul whose number of rows is given at run time, every other node an ATen
  /// step. After match(), rows_obstacle() says why the graph cannot have such a program (a group
  /// of another kind, a weight that is not an attribute, a symbolic reduced dimension), empty if
  /// it can.
  void vary_rows() { rows_vary_ = true; }
  /// The weights of the graph `gm` is a part of (graph_weight_bytes at the first compile, which a
  /// rebuild outside it keeps: its choices of weight layout stay the same).
  void set_weight_bytes(int64_t bytes) { weight_bytes_ = bytes; }
  int64_t weight_bytes() const { return weight_bytes_; }
  const std::string& rows_obstacle() const { return rows_obstacle_; }

 private:
  std::string rows_obstacle_of(const Group& g) const;
  // matching (each kind's matcher is in that kind's file)
  bool match_linear(Node* n, Group& g);
  bool match_batched(Node* n, Group& g);
  bool match_conv(Node* n, Group& g);
  bool match_batch_norm(Group& g, int64_t channels);
  bool match_pool(Node* n, Group& g);
  bool match_train_conv(Node* n, Group& g);
  bool match_rnn(Node* n, Group& g);
  bool match_embedding_bag(Node* n, Group& g);
  void extend_chain(Group& g);
  bool scan_outweighs_activation(const Group& g, const Eltwise& e, const std::vector<int64_t>& out_sizes) const;
  bool sole_use(const Value& v, ir::Use* use) const;
  bool claimed(const Node* n) const { return claimed_.count(n) != 0; }
  const at::Tensor* attr_of(const Value& v) const;
  bool side_effects_between(const Group& g, const Node* n) const;
  // A 2-D weight operand (K, N): prepacked attribute (through t / transpose) or a plain value.
  bool set_weight_2d(Group& g, const Value& w);

  // building
  uint32_t new_slot() { return static_cast<uint32_t>(prog_->num_slots++); }
  uint32_t plain(const Value& v);
  void emit_node(Node* n);
  // The ATen call of `n` over new slots for its outputs (which become their locations).
  ir::OpStep op_step(Node* n);
  void emit_aten(Node* n);
  bool emit_group(Group& g);
  bool emit_linear(Group& g, bool batched);
  bool emit_conv(Group& g);
  bool emit_tconv_gemm(Group& g);
  bool emit_pool(Group& g);
  bool emit_train_conv(Group& g);
  bool emit_rnn(Group& g);
  bool emit_embedding_bag(Group& g);
  bool keep_blocked(const Value& v) const;
  PlainIn plain_in(const Value& v);
  // Where a conv / pool reads `v`: its blocked buffer, or its plain slot (appended to `reads`).
  ActIn act_in(const Value& v, std::vector<uint32_t>& reads);
  // `out` written as the plain tensor `v` (NCHW): by the primitive itself when its destination
  // layout `dst` is plain, else into a buffer reordered to plain.
  void plain_output(ActOut& out, const md_t& dst, const md_t& plain_dst, const Value& v);
  // The ATen path of a group's nodes up to its first `kept` post-ops, whose result is `out`,
  // taken on a call where a scanned input has a value above `limit` (AtenFallback). Appends the
  // slots it reads to `reads`.
  std::shared_ptr<AtenFallback> make_fallback(const Group& g, size_t kept, const Value& out, int32_t limit,
                                              std::vector<uint32_t>& reads);
  uint32_t add_mem(const md_t& md) {
    prog_->mem_descs.push_back(md);
    return static_cast<uint32_t>(prog_->mem_descs.size() - 1);
  }
  uint32_t add_buffer(size_t size) {
    prog_->buffer_sizes.push_back(size);
    return static_cast<uint32_t>(prog_->buffer_sizes.size() - 1);
  }
  // A reorder between two memory objects of the set, with its scratchpad.
  Reorder make_reorder(const md_t& from, const md_t& to);
  // A primitive's scratchpad: a memory object over the shared scratch buffer, if it needs one.
  void add_scratchpad(const md_t& md, bool& has_scratch, uint32_t& mem) {
    if (!md.get_size()) return;
    has_scratch = true;
    mem = add_mem(md);
    prog_->buffer_sizes[0] = std::max(prog_->buffer_sizes[0], md.get_size());
  }
  // The value a group produces with its first `kept` post-ops fused.
  static Value kept_output(const Group& g, size_t kept);
  void push(std::unique_ptr<Step> s, std::vector<uint32_t> reads) {
    reads_.push_back(std::move(reads));
    prog_->steps.push_back(std::move(s));
  }

  GraphModule& gm_;
  std::vector<Node*> order_;
  std::unordered_map<const Node*, size_t> pos_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::unordered_set<const Node*> claimed_;           // group members (anchor, head, chain)
  std::unordered_map<const Node*, Group*> group_of_;  // every member -> its group
  std::unordered_map<const Node*, Group*> group_end_; // last member -> group
  std::unordered_set<const Node*> deferred_;          // helpers emitted only on demand
  std::vector<std::string> fused_;
  size_t blocked_values_ = 0;
  size_t winograd_convs_ = 0;
  std::vector<std::string> impls_;
  bool rows_vary_ = false;
  std::string rows_obstacle_;
  int64_t weight_bytes_ = 0;  // the weights of the graph of which gm_ may be a part (set_weight_bytes)

  // Where a value is during the build: a slot, or a blocked buffer (with its plain slot once a
  // reader needed it plain).
  struct Loc {
    enum Kind { None, Slot, Blocked } kind = None;
    uint32_t index = 0;  // slot, or buffer
    md_t md;
    int64_t plain_slot = -1;
    std::vector<int64_t> sizes;
  };
  static Loc slot_loc(uint32_t slot) {
    Loc l;
    l.kind = Loc::Slot;
    l.index = slot;
    return l;
  }
  // The blocked location of `v`, or null.
  const Loc* blocked_loc(const Value& v) const {
    auto it = locs_.find(v);
    return it != locs_.end() && it->second.kind == Loc::Blocked ? &it->second : nullptr;
  }
  std::unordered_map<Value, Loc, ir::ValueHash> locs_;
  std::shared_ptr<Program> prog_;
  const ScanKernels* scan_ = nullptr;
  std::vector<std::vector<uint32_t>> reads_;
};

}  // namespace torchcompile::backends::onednn::detail
