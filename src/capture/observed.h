// Observed tensors: how a trace learns which sizes the forward's host code read.
//
// A dimension of a graph input may become symbolic only if no integer the trace recorded was
// computed from it. Host code reads sizes without the dispatcher (`x.size(0)`, `x.sizes()`,
// `x.numel()`), so the tracer cannot see those reads as ops. Instead, while a dynamic trace
// runs, the forward receives *observed* tensors: TensorImpls that share the input's storage,
// version counter and metadata, but use the `CustomSizes` sizes/strides policy, which routes
// `sizes()`, `size(d)`, `strides()`, `numel()`, `storage_offset()` and their symbolic variants
// through virtual methods. Those methods note the read (which candidate dimensions the value
// may depend on) and return the real value. Every tensor a recorded op produces is observed in
// turn, tagged with the candidate dimensions its arguments carry (conservatively: all of them,
// for each of its dimensions). While the tracer's fallback runs an op, its observed arguments
// and results use the default policy, so reads by kernels (and by the tracer itself) are
// neither counted nor slowed, and kernels may resize them. When the trace ends every observed
// tensor goes back to the default policy: after the trace it is an ordinary tensor.
//
// Not counted: `dim()` (the rank is guarded) and `is_contiguous()` (contiguity is guarded, and
// for sizes >= 2 it does not depend on the sizes: sizes 0 and 1 are never symbolic).
//
// Data reads. Every trace of a forward (static or dynamic) observes its tensors this way, with no
// candidates when its sizes are static: host code that reads an observed tensor's data
// (`data_ptr`, `accessor`, `const_data_ptr`, a memcpy from it, printing it) goes through the
// virtual `has_storage()`, which reports the read to the data-read handler (the tracer ends the
// graph there, keyed by the tensor's contents) and then answers as an ordinary tensor. Reads by
// kernels (the tensor is muted while an op runs) and by the handler itself are not reported.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torchcompile::capture {

/// The size reads of one trace, shared by its observed tensors. Candidate dimensions are bits
/// 0..63 of a mask.
class SizeReads {
 public:
  /// Bits of the candidates host code read.
  uint64_t read() const { return read_.load(std::memory_order_relaxed); }
  /// For each bit read: what was read first (`size(0) of input 'x'`), for logs.
  std::vector<std::string> first_reads() const;
  /// Whether reads are counted (between start() and finish()).
  bool active() const { return active_.load(std::memory_order_relaxed); }
  /// Begin counting (the forward starts): observed tensors made before are observed from now.
  void start();
  /// End the observation: every observed tensor still alive becomes an ordinary tensor.
  void finish();
  /// Called when host code reads the data of an observed tensor (while active, on any thread:
  /// the handler checks it is the tracing one). Not called again while it runs.
  using DataReadHandler = std::function<void(const at::Tensor&)>;
  void set_data_read_handler(DataReadHandler handler) { on_data_read_ = std::move(handler); }

 private:
  friend class ObservedTensorImpl;
  void note(uint64_t bits, const std::string& label, const char* what, int64_t dim) const;
  void note_data(const c10::TensorImpl& t) const;
  void add(const c10::intrusive_ptr<c10::TensorImpl>& t);

  mutable std::atomic<uint64_t> read_{0};
  std::atomic<bool> active_{false};
  mutable std::mutex mutex_;
  mutable std::vector<std::string> first_reads_;  // 64 entries once something is read
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> made_;
  DataReadHandler on_data_read_;
};

/// While alive, data reads on this thread are not reported (the tracer's own reads).
class IgnoreDataReads {
 public:
  IgnoreDataReads();
  ~IgnoreDataReads();
  IgnoreDataReads(const IgnoreDataReads&) = delete;
  IgnoreDataReads& operator=(const IgnoreDataReads&) = delete;

 private:
  bool previous_;
};

/// A tensor whose size and data reads by host code are seen (see the file comment).
class ObservedTensorImpl final : public c10::TensorImpl {
 public:
  /// Observe `src` (shares its storage, version counter and metadata). `dim_bits[d]` are the
  /// candidates dimension d may depend on; `label` names it in logs.
  static at::Tensor make(const at::Tensor& src, std::shared_ptr<SizeReads> reads, std::vector<uint64_t> dim_bits,
                         std::string label);
  /// The observed tensor behind `t`, or null.
  static ObservedTensorImpl* of(const at::Tensor& t);

  /// Whether reads are seen (false while an op runs on it).
  void set_observing(bool on);
  bool observing() const { return observing_.load(std::memory_order_relaxed); }
  /// Names it in logs and messages: `input 'x'`, `the result of aten::gt.Scalar`.
  const std::string& label() const { return label_; }
  /// The union of the candidates of all its dimensions.
  uint64_t all_bits() const { return all_bits_; }
  /// Every dimension may now also depend on `bits` (an op wrote into it).
  void add_bits(uint64_t bits) {
    for (uint64_t& b : dim_bits_) b |= bits;
    all_bits_ |= bits;
    set_observing(observing_.load(std::memory_order_relaxed));
  }
  /// Count a read of all its dimensions (`what` names it in logs).
  void note_read_all(const char* what) const { note_all(what); }

  /// Use make().
  ObservedTensorImpl(const at::Tensor& src, std::shared_ptr<SizeReads> reads, std::vector<uint64_t> dim_bits,
                     std::string label);

 private:
  void note_all(const char* what) const;
  void note_dim(int64_t d) const;

  // Every data access (`data_ptr`, `data()`, accessors) asks this first.
  bool has_storage() const override;

  c10::IntArrayRef sizes_custom() const override;
  int64_t size_custom(int64_t d) const override;
  c10::SymIntArrayRef sym_sizes_custom() const override;
  c10::SymInt sym_size_custom(int64_t d) const override;
  c10::IntArrayRef strides_custom() const override;
  c10::SymIntArrayRef sym_strides_custom() const override;
  int64_t numel_custom() const override;
  c10::SymInt sym_numel_custom() const override;
  int64_t storage_offset_custom() const override;
  c10::SymInt sym_storage_offset_custom() const override;
  int64_t dim_custom() const override;
  bool is_contiguous_custom(at::MemoryFormat memory_format) const override;
  bool is_strides_like_custom(at::MemoryFormat memory_format) const override;
  bool is_non_overlapping_and_dense_custom() const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;

  std::shared_ptr<SizeReads> reads_;
  std::vector<uint64_t> dim_bits_;
  uint64_t all_bits_ = 0;
  std::string label_;
  std::atomic<bool> observing_{false};  // read by any thread that reads the data
};

}  // namespace torchcompile::capture
