// Everything that differs between the LibTorch generations we build against (1.13 and 2.x).
// Nothing else in the project tests TORCH_VERSION_*.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace torchcompile::compat {

constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchMinor = TORCH_VERSION_MINOR;

/// The functionality key the tracer's boxed fallback is registered on: a key above Autograd
/// that LibTorch itself leaves free. DeferredInit is free in 1.13 through 2.6 (only the
/// unmaintained torchdistx ever registered it). If a future LibTorch registers a fallback on
/// it, registering a second one aborts at load time: change the choice here, per version, and
/// test/capture's key test fails first.
constexpr c10::DispatchKey kTracingKey = c10::DispatchKey::DeferredInit;

/// The functionality key AOT's joint trace records on: below Autograd and below Functionalize,
/// so it sees functionalized, decomposed ops and, during backward(), the derivative formulas.
/// Fake is free in 1.13 through 2.6 (only torchdistx's fake tensors ever registered it).
constexpr c10::DispatchKey kBelowAutogradTracingKey = c10::DispatchKey::Fake;

/// LibTorch 1.13's functionalization gets `detach` of a view wrong once the graph has updated
/// something in place: the detached tensor comes out as the whole base, not the view (seen
/// with narrow, select and t). 2.x keeps the view. AOT does not functionalize such graphs.
constexpr bool kFunctionalDetachOfViewLosesTheView = TORCH_VERSION_MAJOR < 2;

/// A storage's bytes, writable. LibTorch 2.x split `Storage::data()` into a const `data()` and
/// `mutable_data()` (which also materializes copy-on-write storage).
#if TORCH_VERSION_MAJOR >= 2
inline void* mutable_storage_data(const c10::Storage& s) { return s.mutable_data(); }
#else
inline void* mutable_storage_data(const c10::Storage& s) { return s.data(); }
#endif

/// CPU autocast state of the calling thread. LibTorch 2.4 generalized the per-device functions
/// (`is_cpu_enabled()`, `get_autocast_cpu_dtype()`, ...) into `is_autocast_enabled(device)` and
/// friends and deprecated the old names (they now warn on every call).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_cpu_enabled() { return at::autocast::is_autocast_enabled(c10::DeviceType::CPU); }
inline void set_autocast_cpu_enabled(bool on) { at::autocast::set_autocast_enabled(c10::DeviceType::CPU, on); }
inline c10::ScalarType autocast_cpu_dtype() { return at::autocast::get_autocast_dtype(c10::DeviceType::CPU); }
inline void set_autocast_cpu_dtype(c10::ScalarType t) { at::autocast::set_autocast_dtype(c10::DeviceType::CPU, t); }
#else
inline bool autocast_cpu_enabled() { return at::autocast::is_cpu_enabled(); }
inline void set_autocast_cpu_enabled(bool on) { at::autocast::set_cpu_enabled(on); }
inline c10::ScalarType autocast_cpu_dtype() { return at::autocast::get_autocast_cpu_dtype(); }
inline void set_autocast_cpu_dtype(c10::ScalarType t) { at::autocast::set_autocast_cpu_dtype(t); }
#endif

/// A CPU allocator that forwards to `base` and counts the allocations made through it, and the
/// bytes they hold: live now and the peak since reset_peak() (tests and benchmarks measure
/// allocations and memory with it: install with c10::SetCPUAllocator). Its DataPtrs keep
/// `get() == get_context()` (raw_allocate needs it) and free through raw_deleter(), which finds
/// the block in a registry shared by all instances. c10::Allocator::allocate is const in 1.x
/// and not in 2.x, which also requires copy_data.
class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return counted(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return counted(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  c10::Allocator* base() const { return base_; }
  int count() const { return count_.load(); }
  void reset() { count_ = 0; }
  /// Bytes allocated through this allocator and not yet freed.
  int64_t live_bytes() const { return live_.load(); }
  /// The most live bytes since the last reset_peak() (or since construction).
  int64_t peak_bytes() const { return peak_.load(); }
  void reset_peak() { peak_ = live_.load(); }

 private:
  struct Block {
    const CountingAllocator* owner;
    int64_t bytes;
    c10::DataPtr base;
  };
  struct Registry {
    std::mutex mutex;
    std::unordered_map<void*, Block> blocks;
  };
  static Registry& registry() {
    static auto* r = new Registry();  // outlives every tensor (never destroyed)
    return *r;
  }
  static void release(void* p) {
    if (p == nullptr) return;
    Block b;
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      auto it = r.blocks.find(p);
      if (it == r.blocks.end()) return;
      b = std::move(it->second);
      r.blocks.erase(it);
    }
    b.owner->live_ -= b.bytes;
  }  // b.base frees the memory
  c10::DataPtr counted(size_t n) const {
    ++count_;
    c10::DataPtr dp = base_->allocate(n);
    void* p = dp.get();
    if (p == nullptr) return dp;  // zero bytes
    const c10::Device device = dp.device();
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      r.blocks[p] = Block{this, static_cast<int64_t>(n), std::move(dp)};
    }
    const int64_t now = live_ += static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return c10::DataPtr(p, p, &release, device);
  }
  c10::Allocator* base_;
  mutable std::atomic<int> count_{0};
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

/// The key of a parameter's entry in torch::optim::Optimizer::state() (`StateMap` is that
/// map's type): LibTorch 1.13 keys it by the address of the parameter's TensorImpl printed as a
/// string (c10::guts::to_string, an ostringstream), 2.x by the address itself.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const void* impl) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << impl;
    return s.str();
  } else {
    return const_cast<void*>(impl);
  }
}

/// c10d's Gloo process group (template parameters: the c10d classes, so that this header does
/// not include c10d's): in 1.13 ProcessGroupGloo is itself a ProcessGroup; in 2.x it is a
/// Backend, which a ProcessGroup holds per device type.
template <class ProcessGroup, class Store, class Gloo>
c10::intrusive_ptr<ProcessGroup> gloo_process_group(const c10::intrusive_ptr<Store>& store, int rank, int size,
                                                    c10::intrusive_ptr<Gloo> gloo) {
#if TORCH_VERSION_MAJOR >= 2
  auto pg = c10::make_intrusive<ProcessGroup>(store, rank, size);
  pg->setBackend(c10::DeviceType::CPU, ProcessGroup::BackendType::GLOO, gloo);
  pg->setDefaultBackend(ProcessGroup::BackendType::GLOO);
  return pg;
#else
  (void)store, (void)rank, (void)size;
  return gloo;
#endif
}

/// c10d's TCPStore options: 2.x serves the store with libuv by default; the classic server
/// (the only one in 1.13) is kept so both generations behave alike.
template <class TCPStoreOptions>
void classic_tcp_store(TCPStoreOptions& options) {
#if TORCH_VERSION_MAJOR >= 2
  options.useLibUV = false;
#else
  (void)options;
#endif
}

}  // namespace torchcompile::compat
