#include "onednn_runtime.h"

#include <torchcompile/ir/op_step.h>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <cstring>
#include <list>

namespace torchcompile::backends::onednn::detail {

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

namespace {

dnnl_stream_t thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream.get();
}

}  // namespace

void reorder_now(const dnnl::memory::desc& from_md, void* from, const dnnl::memory::desc& to_md, void* to) {
  dnnl::memory a(from_md, cpu_engine(), from), b(to_md, cpu_engine(), to);
  dnnl::stream st(cpu_engine());
  dnnl::reorder(a, b).execute(st, a, b);
  st.wait();
}

const at::Tensor& PlainIn::get(const Ctx& c, at::Tensor& tmp) const {
  const at::Tensor& t = c.slots[slot];
  if (C10_LIKELY(t.scalar_type() == at::kFloat && t.sizes().equals(sizes) && t.strides().equals(strides) &&
                 !t.is_neg() && !t.is_conj()))
    return t;
  tmp = at::empty_strided(sizes, strides, t.options().dtype(at::kFloat));
  tmp.copy_(t);
  return tmp;
}

PackedHolder::PackedHolder(std::vector<const at::Tensor*> sources, PackFn pack, std::optional<PackKey> share)
    : sources_(std::move(sources)), pack_(std::move(pack)), share_(std::move(share)) {
  current_ = make();
}

namespace {

// Packs any holder may share (PackKey): the sources are held weakly, which keeps their
// TensorImpl's address from being reused by another tensor while the entry exists, and the pack
// weakly (it lives as long as a holder uses it).
struct SharedPack {
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> sources;
  PackKey key;
  std::weak_ptr<const Packed> pack;
};
std::mutex shared_packs_mutex;
std::vector<SharedPack>& shared_packs() {
  static auto* packs = new std::vector<SharedPack>();  // never destroyed: holders may outlive statics
  return *packs;
}

bool same_sources(const SharedPack& e, const std::vector<const at::Tensor*>& sources) {
  if (e.sources.size() != sources.size()) return false;
  for (size_t i = 0; i < sources.size(); ++i) {
    auto alive = e.sources[i].lock();
    if (alive.get() != sources[i]->unsafeGetTensorImpl()) return false;
  }
  return true;
}

// The gradient of `t` without LibTorch's warning for non-leaf tensors.
const at::Tensor& grad_of(const at::Tensor& t) { return t.unsafeGetTensorImpl()->grad(); }

}  // namespace

void record_sources(Packed& p, const std::vector<const at::Tensor*>& sources, const std::vector<bool>& unversioned) {
  p.impls.clear();
  p.versions.clear();
  p.grad_impls.clear();
  p.grad_versions.clear();
  p.snapshots.clear();
  p.snapshot_of.clear();
  bool any_grad = false;
  for (const at::Tensor* s : sources) {
    p.impls.push_back(s->unsafeGetTensorImpl());
    p.versions.push_back(s->_version());
    const at::Tensor& g = grad_of(*s);
    p.grad_impls.push_back(g.defined() ? g.unsafeGetTensorImpl() : nullptr);
    p.grad_versions.push_back(g.defined() && !g.is_inference() ? g._version() : 0);
    any_grad |= g.defined();
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!any_grad && !(i < unversioned.size() && unversioned[i])) continue;
    p.snapshots.push_back(sources[i]->detach().clone(at::MemoryFormat::Contiguous));
    p.snapshot_of.push_back(i);
  }
}

bool PackedHolder::valid(const Packed& p) const {
  for (size_t i = 0; i < sources_.size(); ++i) {
    const at::Tensor& s = *sources_[i];
    if (s.unsafeGetTensorImpl() != p.impls[i] || s._version() != p.versions[i]) return false;
    const at::Tensor& g = grad_of(s);
    if (C10_UNLIKELY(g.defined() || p.grad_impls[i])) {
      if ((g.defined() ? g.unsafeGetTensorImpl() : nullptr) != p.grad_impls[i]) return false;
      if (g.defined() && !g.is_inference() && g._version() != p.grad_versions[i]) return false;
    }
  }
  // Sources with gradients (optimizer steps write through `.data()`) and unversioned ones:
  // compare contents.
  for (size_t k = 0; k < p.snapshots.size(); ++k) {
    const at::Tensor& s = *sources_[p.snapshot_of[k]];
    const at::Tensor& snap = p.snapshots[k];
    if (s.is_contiguous()) {
      if (std::memcmp(s.data_ptr(), snap.data_ptr(), snap.nbytes()) != 0) return false;
    } else {
      at::NoGradGuard no_grad;
      if (!at::equal(s.detach(), snap)) return false;
    }
  }
  return true;
}

std::shared_ptr<const Packed> PackedHolder::make() {
  if (!share_) return pack_();
  {
    std::lock_guard<std::mutex> lock(shared_packs_mutex);
    auto& packs = shared_packs();
    packs.erase(std::remove_if(packs.begin(), packs.end(), [](const SharedPack& e) { return e.pack.expired(); }),
                packs.end());
    for (const SharedPack& e : packs)
      if (e.key == *share_ && same_sources(e, sources_))
        if (auto p = e.pack.lock(); p && valid(*p)) return p;
  }
  std::shared_ptr<const Packed> p = pack_();
  SharedPack entry{{}, *share_, p};
  for (const at::Tensor* s : sources_) entry.sources.emplace_back(s->getIntrusivePtr());
  std::lock_guard<std::mutex> lock(shared_packs_mutex);
  shared_packs().push_back(std::move(entry));
  return p;
}

std::shared_ptr<const Packed> PackedHolder::get() {
  std::shared_ptr<const Packed> p = std::atomic_load(&current_);
  if (C10_LIKELY(valid(*p))) return p;
  std::lock_guard<std::mutex> lock(mutex_);
  p = std::atomic_load(&current_);
  if (valid(*p)) return p;
  // A new pack: calls still running keep the old one alive through their shared_ptr.
  p = make();
  std::atomic_store(&current_, p);
  return p;
}

namespace {

// The large buffers of every program's memory sets (blocked activations, reorder targets, big
// scratchpads), lent for one call and given back after it. Programs built for other sizes of one
// graph (compile_per_shape keeps 64) then reuse memory earlier calls have already touched instead
// of each keeping buffers of its own: a new size does not fault in fresh pages for all of them,
// and what stays allocated between calls is bounded by what calls use at once plus kIdleLimit,
// not by the number of sizes seen. Capacities are rounded up to 2^k * (1 + j/4), so a buffer
// serves requests up to 25% smaller than it; idle buffers beyond kIdleLimit bytes are freed,
// those given back longest ago first.
class SharedBuffers {
 public:
  static constexpr size_t kIdleLimit = size_t(512) << 20;

  static size_t capacity(size_t size) {
    size_t top = size_t(1) << (63 - __builtin_clzll(size));  // the largest power of 2 <= size
    const size_t quarter = top / 4;
    return (size + quarter - 1) / quarter * quarter;
  }

  at::Tensor take(size_t size) {
    const size_t cap = capacity(size);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if (it->first == cap) {
          at::Tensor b = std::move(it->second);
          idle_.erase(it);
          idle_bytes_ -= cap;
          return b;
        }
    }
    return at::empty({static_cast<int64_t>(cap + 64)}, at::kByte);
  }

  void give(size_t size, at::Tensor b) {
    const size_t cap = capacity(size);
    std::vector<at::Tensor> freed;  // released outside the lock
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.emplace_back(cap, std::move(b));
    idle_bytes_ += cap;
    while (idle_bytes_ > kIdleLimit && idle_.size() > 1) {
      idle_bytes_ -= idle_.front().first;
      freed.push_back(std::move(idle_.front().second));
      idle_.pop_front();
    }
  }

 private:
  std::mutex mutex_;
  std::list<std::pair<size_t, at::Tensor>> idle_;  // oldest first
  size_t idle_bytes_ = 0;
};

SharedBuffers& shared_buffers() {
  static auto* pool = new SharedBuffers();  // never destroyed: programs may outlive static destruction
  return *pool;
}

void* aligned(const at::Tensor& b) {
  // 64 extra bytes so the data can be aligned to a cache line whatever the allocator does.
  auto addr = reinterpret_cast<uintptr_t>(b.data_ptr());
  return reinterpret_cast<void*>((addr + 63) & ~uintptr_t(63));
}

}  // namespace

std::unique_ptr<MemSet> Program::acquire() {
  std::unique_ptr<MemSet> ms;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!pool_.empty()) {
      ms = std::move(pool_.back());
      pool_.pop_back();
    }
  }
  if (!ms) {
    ms = std::make_unique<MemSet>();
    ms->mems.reserve(mem_descs.size());
    for (const auto& md : mem_descs) ms->mems.emplace_back(md, cpu_engine(), static_cast<void*>(DNNL_MEMORY_NONE));
    ms->buffers.resize(buffer_sizes.size());
    ms->buffer_ptrs.resize(buffer_sizes.size(), nullptr);
    for (size_t i = 0; i < buffer_sizes.size(); ++i)
      if (buffer_sizes[i] && buffer_sizes[i] < kSharedBufferBytes) {
        ms->buffers[i] = at::empty({static_cast<int64_t>(buffer_sizes[i] + 64)}, at::kByte);
        ms->buffer_ptrs[i] = aligned(ms->buffers[i]);
      }
  }
  for (size_t i = 0; i < buffer_sizes.size(); ++i)
    if (buffer_sizes[i] >= kSharedBufferBytes) {
      ms->buffers[i] = shared_buffers().take(buffer_sizes[i]);
      ms->buffer_ptrs[i] = aligned(ms->buffers[i]);
    }
  return ms;
}

void Program::release(std::unique_ptr<MemSet> ms) {
  for (size_t i = 0; i < buffer_sizes.size(); ++i)
    if (buffer_sizes[i] >= kSharedBufferBytes) {
      shared_buffers().give(buffer_sizes[i], std::move(ms->buffers[i]));
      ms->buffer_ptrs[i] = nullptr;
    }
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.push_back(std::move(ms));
}

std::vector<at::Tensor> Program::run(std::vector<at::Tensor> inputs) {
  TORCH_CHECK(inputs.size() == input_slots.size(), "onednn backend: the graph expects ", input_slots.size(),
              " inputs, got ", inputs.size());
  const bool below_autograd = ir::may_dispatch_below_autograd(inputs.data(), inputs.size());
  std::vector<at::Tensor> slots(num_slots);
  for (size_t i = 0; i < inputs.size(); ++i) slots[input_slots[i]] = std::move(inputs[i]);
  inputs.clear();

  std::unique_ptr<MemSet> ms = acquire();
  struct Release {
    Program* p;
    std::unique_ptr<MemSet>& ms;
    ~Release() { p->release(std::move(ms)); }
  } release_guard{this, ms};

  ir::ScratchStack stack;
  Ctx ctx{slots.data(), ms.get(), thread_stream(), &stack.get(), below_autograd};
  for (const auto& step : steps) {
    step->run(ctx);
    for (uint32_t s : step->free_after) slots[s].reset();
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(output_slots.size());
  for (uint32_t s : output_slots) outputs.push_back(slots[s]);
  return outputs;
}

}  // namespace torchcompile::backends::onednn::detail
