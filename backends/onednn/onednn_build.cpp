// Compiler::build, the onednn backend's program builder: walks the graph in order and emits, for
// each matched group, the step of its kind (emit_group; the emitters are in that kind's file),
// falling back to ATen steps for a group oneDNN refuses and for the chain nodes past what it
// accepted; every other node becomes an ATen step (the interpreter's ir::OpStep). Also here:
// where values live (slots, blocked buffers made plain on demand), reorders, post-op lists, and
// the compile side of AtenFallback (make_fallback).
#include "onednn_internal.h"

namespace torchcompile::backends::onednn::detail {

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::post_ops make_post_ops(const Group& g, size_t kept, const std::vector<md_t>& add_mds, bool conv_sum) {
  dnnl::post_ops po;
  size_t add_index = 0;
  for (size_t i = 0; i < kept; ++i) {
    const PostOp& p = g.post[i];
    if (p.is_add) {
      if (conv_sum) po.append_sum(1.f);
      else po.append_binary(dnnl::algorithm::binary_add, add_mds.at(add_index++));
    } else {
      compat::append_eltwise(po, p.e.alg, p.e.alpha, p.e.beta);
    }
  }
  return po;
}

bool loses_nan(const Eltwise& e) {
  return (e.alg == dnnl::algorithm::eltwise_relu && e.alpha == 0.f) || e.alg == dnnl::algorithm::eltwise_clip;
}

bool fuses_nan_losing_activation(const Group& g, size_t kept) {
  for (size_t i = 0; i < kept; ++i)
    if (!g.post[i].is_add && loses_nan(g.post[i].e)) return true;
  return false;
}

// ---- values -------------------------------------------------------------------------------------

PlainIn Compiler::plain_in(const Value& v) {
  PlainIn p;
  p.slot = plain(v);
  p.sizes = meta(v).sizes;
  p.strides = meta(v).strides;
  return p;
}

ActIn Compiler::act_in(const Value& v, std::vector<uint32_t>& reads) {
  ActIn in;
  if (const Loc* l = blocked_loc(v)) {
    in.blocked = true;
    in.index = l->index;
  } else {
    in.plain = plain_in(v);
    reads.push_back(in.plain.slot);
  }
  return in;
}

uint32_t Compiler::plain(const Value& v) {
  auto it = locs_.find(v);
  if (it == locs_.end() || it->second.kind == Loc::None) {
    TORCH_INTERNAL_ASSERT(deferred_.count(v.node), "onednn backend: value of ", v.node->name(), " is not available");
    deferred_.erase(v.node);
    emit_node(v.node);
    it = locs_.find(v);
    TORCH_INTERNAL_ASSERT(it != locs_.end());
  }
  Loc& l = it->second;
  if (l.kind == Loc::Slot) return l.index;
  if (l.plain_slot < 0) {
    auto s = std::make_unique<ToPlainStep>();
    s->r = make_reorder(l.md, md_t(dims(l.sizes.begin(), l.sizes.end()), dt::f32, tag::nchw));
    s->buffer = l.index;
    s->sizes = l.sizes;
    s->out = new_slot();
    l.plain_slot = s->out;
    push(std::move(s), {});
  }
  return static_cast<uint32_t>(l.plain_slot);
}

bool Compiler::keep_blocked(const Value& v) const {
  const auto& uses = v.node->uses(v.index);
  if (uses.empty()) return false;
  // A chain node of the group that makes `v`, left out of it when the chain was trimmed, runs in ATen.
  auto own = group_of_.find(v.node);
  const Group* maker = own == group_of_.end() ? nullptr : own->second;
  for (const auto& u : uses) {
    auto it = group_of_.find(u.user);
    if (it == group_of_.end() || it->second == maker) return false;
    if (it->second->kind != GroupKind::Conv && it->second->kind != GroupKind::Pool) return false;
  }
  return true;
}

void Compiler::plain_output(ActOut& out, const md_t& dst, const md_t& plain_dst, const Value& v) {
  out.slot = new_slot();
  if (dst == plain_dst) {
    out.direct = true;
  } else {
    out.buffer = add_buffer(dst.get_size());
    out.to_plain = make_reorder(dst, plain_dst);
  }
  locs_[v] = slot_loc(out.slot);
}

Reorder Compiler::make_reorder(const md_t& from, const md_t& to) {
  Reorder r;
  dnnl::reorder::primitive_desc rpd(cpu_engine(), from, cpu_engine(), to, user_scratchpad_attr());
  r.prim = dnnl::reorder(rpd);
  r.mem_from = add_mem(from);
  r.mem_to = add_mem(to);
  add_scratchpad(rpd.scratchpad_desc(), r.has_scratch, r.mem_scratch);
  return r;
}

Value Compiler::kept_output(const Group& g, size_t kept) {
  Value out = g.base;
  for (const auto& c : g.chain)
    if (c.second <= kept) out = c.first->output(0);
    else break;
  return out;
}

// ---- ATen steps ---------------------------------------------------------------------------------

void Compiler::emit_node(Node* n) {
  switch (n->kind()) {
    case NodeKind::Placeholder:
      TORCH_INTERNAL_ASSERT(false, "placeholder emitted as a step");
    case NodeKind::GetAttr: {
      auto s = std::make_unique<AttrStep>();
      s->attr = &gm_.attribute(n->target());
      s->out = new_slot();
      locs_[n->output(0)] = slot_loc(s->out);
      push(std::move(s), {});
      return;
    }
    case NodeKind::CallFunction:
      emit_aten(n);
      return;
    default:
      TORCH_CHECK(false, "onednn backend: cannot run node ", n->name());
  }
}

ir::OpStep Compiler::op_step(Node* n) {
  std::vector<uint32_t> outs;
  for (size_t i = 0; i < n->num_outputs(); ++i) outs.push_back(new_slot());
  ir::OpStep call(*n, [&](const ir::Value& v) { return plain(v); }, outs);
  for (size_t i = 0; i < n->num_outputs(); ++i) locs_[n->output(i)] = slot_loc(outs[i]);
  return call;
}

void Compiler::emit_aten(Node* n) {
  ir::OpStep call = op_step(n);
  std::vector<uint32_t> reads = call.reads();
  push(std::make_unique<AtenStep>(std::move(call)), std::move(reads));
}

std::shared_ptr<AtenFallback> Compiler::make_fallback(const Group& g, size_t kept, const Value& out, int32_t limit,
                                                      std::vector<uint32_t>& reads) {
  auto f = std::make_shared<AtenFallback>();
  f->scan = scan_;
  f->limit = limit;
  std::vector<Node*> nodes(g.head.begin(), g.head.end());
  for (const auto& ch : g.chain) {
    if (ch.second > kept) break;
    nodes.push_back(ch.first);
  }
  std::sort(nodes.begin(), nodes.end(), [&](Node* a, Node* b) { return pos_.at(a) < pos_.at(b); });
  std::unordered_map<Value, uint32_t, ir::ValueHash> local, outside;
  // A value from outside the group: its slot (a blocked one made plain on the ATen path only),
  // scanned on every call unless it is the packed weight (checked when packing).
  auto from_outside = [&](const Value& v) -> uint32_t {
    if (auto it = outside.find(v); it != outside.end()) return it->second;
    uint32_t slot;
    if (const Loc* l = blocked_loc(v)) {
      AtenFallback::Unblock u;
      u.buffer = l->index;
      u.sizes = l->sizes;
      u.reorder = make_reorder(l->md, md_t(u.sizes, dt::f32, tag::nchw));
      u.slot = slot = new_slot();
      f->scans.push_back({true, u.buffer, l->md.get_size() / sizeof(float)});
      f->private_slots.push_back(u.slot);
      f->unblock.push_back(std::move(u));
    } else {
      slot = plain(v);
      reads.push_back(slot);
      const bool packed_weight = g.weight_attr && (v == g.weight || attr_of(v) == g.weight_attr);
      if (!packed_weight) f->scans.push_back({false, slot, 0});
    }
    outside.emplace(v, slot);
    return slot;
  };
  for (Node* n : nodes) {
    std::vector<uint32_t> outs;
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      outs.push_back(new_slot());
      local.emplace(n->output(i), outs.back());
      f->private_slots.push_back(outs.back());
    }
    f->steps.emplace_back(
        *n, [&](const Value& v) { return local.count(v) ? local.at(v) : from_outside(v); }, std::move(outs));
  }
  f->result_slot = local.at(out);
  return f;
}

// ---- the program --------------------------------------------------------------------------------

bool Compiler::emit_group(Group& g) {
  try {
    switch (g.kind) {
      case GroupKind::Linear: return emit_linear(g, false);
      case GroupKind::Batched: return emit_linear(g, true);
      case GroupKind::Conv: return emit_conv(g);
      case GroupKind::Pool: return emit_pool(g);
      case GroupKind::TrainConv:
      case GroupKind::TrainConvBackward: return emit_train_conv(g);
      case GroupKind::Rnn: return emit_rnn(g);
      case GroupKind::EmbeddingBag: return emit_embedding_bag(g);
    }
  } catch (const dnnl::error&) {
  }
  return false;
}

std::shared_ptr<Program> Compiler::build(const ScanKernels& scan) {
  scan_ = &scan;
  prog_ = std::make_shared<Program>();
  prog_->buffer_sizes.push_back(0);  // scratchpad
  for (Node* n : order_) {
    switch (n->kind()) {
      case NodeKind::Placeholder: {
        uint32_t s = new_slot();
        prog_->input_slots.push_back(s);
        locs_[n->output(0)] = slot_loc(s);
        break;
      }
      case NodeKind::Output: {
        for (const auto& e : n->args().at(0).list()) {
          TORCH_CHECK(e.has_value(), "onednn backend: the output node returns None");
          prog_->output_slots.push_back(plain(*e));
        }
        break;
      }
      default: {
        if (deferred_.count(n)) break;
        auto ge = group_end_.find(n);
        if (ge != group_end_.end()) {
          Group& g = *ge->second;
          size_t steps_before = prog_->steps.size();
          if (emit_group(g)) {
            fused_.push_back(make_label(g, g.kept));
            winograd_convs_ += g.winograd;
            // Chain nodes beyond what oneDNN accepted run with ATen, in order.
            size_t first_left = 0;
            for (size_t i = 0; i < g.chain.size(); ++i)
              if (g.chain[i].first->output(0) == g.out) first_left = i + 1;
            for (size_t i = first_left; i < g.chain.size(); ++i) emit_aten(g.chain[i].first);
          } else {
            TORCH_INTERNAL_ASSERT(prog_->steps.size() >= steps_before);
            for (Node* m : g.head) emit_aten(m);
            for (auto& c : g.chain) emit_aten(c.first);
          }
          break;
        }
        if (claimed(n)) break;  // emitted with its group
        emit_node(n);
      }
    }
  }
  // Free each slot after its last reader (outputs are never freed).
  std::vector<int64_t> last(prog_->num_slots, -1);
  for (size_t i = 0; i < reads_.size(); ++i)
    for (uint32_t s : reads_[i]) last[s] = static_cast<int64_t>(i);
  for (uint32_t s : prog_->output_slots) last[s] = -2;
  for (uint32_t s = 0; s < prog_->num_slots; ++s)
    if (last[s] >= 0) prog_->steps[last[s]]->free_after.push_back(s);
  return prog_;
}

}  // namespace torchcompile::backends::onednn::detail
