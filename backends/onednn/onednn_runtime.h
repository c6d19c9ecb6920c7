// Private to the onednn backend: the executable program (steps over value slots and oneDNN
// primitives) and the prepacked-weight holder.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace torchcompile::backends::onednn::detail {

/// The CPU engine shared by every compiled graph.
dnnl::engine& cpu_engine();

/// What one call needs besides the value slots: oneDNN memory objects (one per primitive
/// argument, their data handles set at each call), the scratchpad and the buffers of blocked
/// intermediates. A call takes a set from the program's pool and gives it back at the end, so
/// concurrent calls never share one and steady-state calls allocate nothing here. Buffers of
/// kSharedBufferBytes or more are lent to the call by one pool every program shares (see
/// onednn_runtime.cpp) and given back with the set.
struct MemSet {
  std::vector<dnnl::memory> mems;
  std::vector<at::Tensor> buffers;  // [0]: scratchpad; then one per blocked value / reorder target
  std::vector<void*> buffer_ptrs;
};

constexpr size_t kSharedBufferBytes = size_t(1) << 20;

struct Ctx {
  at::Tensor* slots;
  MemSet* ms;
  dnnl_stream_t stream;
  std::vector<c10::IValue>* stack;  // scratch of the ATen steps
  bool below_autograd;               // see ir::may_dispatch_below_autograd
};

/// A plain fp32 tensor a primitive reads from a slot, with the layout the trace saw. A tensor
/// with other sizes/strides (an ATen op whose output layout changed) is copied to that layout.
struct PlainIn {
  uint32_t slot = 0;
  std::vector<int64_t> sizes, strides;
  const at::Tensor& get(const Ctx& c, at::Tensor& tmp) const;
};

/// A prepacked weight (and, for convolutions, the bias with BatchNorm folded in), with the
/// identity and version of every tensor it was computed from.
///
/// LibTorch's C++ optimizers update parameters through `p.data()`, which has its own version
/// counter: an optimizer step leaves `p._version()` unchanged. So the state of each source's
/// gradient is recorded too (a backward pass changes it), and while any source has a gradient
/// (the model is being trained) the pack also keeps a copy of the sources and compares their
/// contents at each call. Pure inference (no gradients) pays only the identity/version checks.
struct Packed {
  std::vector<const c10::TensorImpl*> impls;
  std::vector<int64_t> versions;
  std::vector<const c10::TensorImpl*> grad_impls;
  std::vector<int64_t> grad_versions;
  // Copies of sources whose contents are compared at each call, with their indices: every
  // source while any had a gradient when packing, else only those LibTorch may write without a
  // version bump (record_sources' `unversioned`).
  std::vector<at::Tensor> snapshots;
  std::vector<size_t> snapshot_of;
  at::Tensor weight;  // bytes, in the primitive's weights layout
  at::Tensor bias;    // fp32 (convolutions), may be undefined
  bool nonfinite = false;  // the packed weight or bias holds a NaN or an infinity
};

/// What a pack is besides its sources: the transform and the packed layouts. Packs of the same
/// source tensors (at the same versions) with equal keys hold the same bytes, so every compiled
/// graph that asks for one shares it (a graph compiled for several sizes by compile_per_shape,
/// or compiled again) instead of packing the weights again.
struct PackKey {
  std::string what;                          ///< the transform: "linear^T", "conv G=1 bn(1e-05)", ...
  std::vector<dnnl::memory::desc> layouts;  ///< the packed layouts
  bool operator==(const PackKey& o) const { return what == o.what && layouts == o.layouts; }
};

class PackedHolder {
 public:
  using PackFn = std::function<std::shared_ptr<const Packed>()>;
  /// With `share`, a pack of the same sources and key that another holder made (and that is
  /// still current for the sources) is taken instead of calling `pack`.
  PackedHolder(std::vector<const at::Tensor*> sources, PackFn pack, std::optional<PackKey> share = std::nullopt);
  /// The current pack, re-packed first if a source changed identity or version.
  std::shared_ptr<const Packed> get();
  const std::vector<const at::Tensor*>& sources() const { return sources_; }

 private:
  bool valid(const Packed& p) const;
  std::shared_ptr<const Packed> make();  // pack_, or a shared pack (share_)
  std::vector<const at::Tensor*> sources_;
  PackFn pack_;
  std::optional<PackKey> share_;
  std::shared_ptr<const Packed> current_;
  std::mutex mutex_;
};

/// Records the sources' identities and versions into `p` (call before reading their data).
/// `unversioned` (by index, may be shorter than `sources`) marks sources that can change without
/// a version bump, whose contents are compared at each call: a BatchNorm's running statistics,
/// which LibTorch 1.13's `native_batch_norm` updates in training mode without declaring them
/// written (its schema has no `Tensor(a!)` there; 2.x's `_native_batch_norm_legit` does).
void record_sources(Packed& p, const std::vector<const at::Tensor*>& sources, const std::vector<bool>& unversioned = {});

/// Reorders the data at `from` (layout `from_md`) into `to` (layout `to_md`) now, on a stream of
/// its own: how weights are packed.
void reorder_now(const dnnl::memory::desc& from_md, void* from, const dnnl::memory::desc& to_md, void* to);

struct Step {
  virtual ~Step() = default;
  virtual void run(Ctx& c) const = 0;
  std::vector<uint32_t> free_after;  // slots whose last use is this step
};

/// An executable graph.
class Program {
 public:
  size_t num_slots = 0;
  std::vector<uint32_t> input_slots;
  std::vector<std::unique_ptr<Step>> steps;
  std::vector<uint32_t> output_slots;
  std::vector<dnnl::memory::desc> mem_descs;  // one oneDNN memory object per entry
  std::vector<size_t> buffer_sizes;            // [0]: scratchpad (max over primitives)

  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs);

 private:
  std::unique_ptr<MemSet> acquire();
  void release(std::unique_ptr<MemSet> ms);
  std::mutex pool_mutex_;
  std::vector<std::unique_ptr<MemSet>> pool_;
};

}  // namespace torchcompile::backends::onednn::detail
