// Observed tensors (capture/observed.h).
#include "capture/observed.h"

#include <c10/core/SymIntArrayRef.h>
#include <c10/core/WrapDimMinimal.h>

namespace torchcompile::capture {

using Policy = c10::TensorImpl::SizesStridesPolicy;

#ifdef C10_DISABLE_TENSORIMPL_EXTENSIBILITY
#error "observed tensors need TensorImpl's virtual has_storage() (LibTorch built without C10_DISABLE_TENSORIMPL_EXTENSIBILITY)"
#endif

namespace {
// Set while a data-read handler runs on this thread: what it does to the tensor is not a read.
thread_local bool tls_in_data_read = false;
}  // namespace

std::vector<std::string> SizeReads::first_reads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_reads_;
}

void SizeReads::note(uint64_t bits, const std::string& label, const char* what, int64_t dim) const {
  if (bits == 0 || !active()) return;
  const uint64_t before = read_.fetch_or(bits, std::memory_order_relaxed);
  if ((before | bits) == before) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (first_reads_.empty()) first_reads_.resize(64);
  std::string text = dim >= 0 ? std::string(what) + "(" + std::to_string(dim) + ") of " + label
                              : std::string(what) + " of " + label;
  for (int b = 0; b < 64; ++b)
    if ((bits >> b & 1) && !(before >> b & 1) && first_reads_[b].empty()) first_reads_[b] = text;
}

IgnoreDataReads::IgnoreDataReads() : previous_(tls_in_data_read) { tls_in_data_read = true; }
IgnoreDataReads::~IgnoreDataReads() { tls_in_data_read = previous_; }

void SizeReads::note_data(const c10::TensorImpl& t) const {
  if (tls_in_data_read || !active() || !on_data_read_) return;
  IgnoreDataReads ignore;
  on_data_read_(at::Tensor(
      c10::intrusive_ptr<c10::TensorImpl>::unsafe_reclaim_from_nonowning(const_cast<c10::TensorImpl*>(&t))));
}

void SizeReads::add(const c10::intrusive_ptr<c10::TensorImpl>& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  made_.emplace_back(t);
}

void SizeReads::start() {
  active_.store(true, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& weak : made_)
    if (auto t = weak.lock()) static_cast<ObservedTensorImpl*>(t.get())->set_observing(true);
}

void SizeReads::finish() {
  active_.store(false, std::memory_order_relaxed);
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> made;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    made.swap(made_);
  }
  for (auto& weak : made)
    if (auto t = weak.lock()) static_cast<ObservedTensorImpl*>(t.get())->set_observing(false);
}

ObservedTensorImpl::ObservedTensorImpl(const at::Tensor& src, std::shared_ptr<SizeReads> reads,
                                       std::vector<uint64_t> dim_bits, std::string label)
    : c10::TensorImpl(c10::Storage(src.storage()), src.key_set(), src.dtype()),
      reads_(std::move(reads)),
      dim_bits_(std::move(dim_bits)),
      label_(std::move(label)) {
  const c10::TensorImpl* s = src.unsafeGetTensorImpl();
  copy_tensor_metadata(s, this, s->version_counter(), s->allow_tensor_metadata_change());
  set_custom_sizes_strides(Policy::Default);
  refresh_numel();
  refresh_contiguous();
  for (uint64_t b : dim_bits_) all_bits_ |= b;
}

at::Tensor ObservedTensorImpl::make(const at::Tensor& src, std::shared_ptr<SizeReads> reads,
                                    std::vector<uint64_t> dim_bits, std::string label) {
  TORCH_INTERNAL_ASSERT(src.defined() && src.has_storage() && src.layout() == c10::kStrided);
  TORCH_INTERNAL_ASSERT(dim_bits.size() == static_cast<size_t>(src.dim()));
  SizeReads* r = reads.get();
  auto impl = c10::make_intrusive<ObservedTensorImpl>(src, std::move(reads), std::move(dim_bits), std::move(label));
  impl->set_observing(r->active());
  c10::intrusive_ptr<c10::TensorImpl> base = impl;
  r->add(base);
  return at::Tensor(std::move(base));
}

ObservedTensorImpl* ObservedTensorImpl::of(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  return dynamic_cast<ObservedTensorImpl*>(t.unsafeGetTensorImpl());
}

void ObservedTensorImpl::set_observing(bool on) {
  const bool observing = on && reads_->active();
  observing_.store(observing, std::memory_order_relaxed);
  // Tensors without candidates keep the default (inline) size policy: only data reads are seen.
  set_custom_sizes_strides(observing && all_bits_ != 0 ? Policy::CustomSizes : Policy::Default);
}

bool ObservedTensorImpl::has_storage() const {
  if (C10_UNLIKELY(observing_.load(std::memory_order_relaxed))) reads_->note_data(*this);
  return c10::TensorImpl::has_storage();
}

void ObservedTensorImpl::note_all(const char* what) const { reads_->note(all_bits_, label_, what, -1); }

void ObservedTensorImpl::note_dim(int64_t d) const {
  reads_->note(dim_bits_[d], label_, "size", d);
}

c10::IntArrayRef ObservedTensorImpl::sizes_custom() const {
  note_all("sizes()");
  return sizes_default();
}
int64_t ObservedTensorImpl::size_custom(int64_t d) const {
  d = c10::maybe_wrap_dim(d, dim_default(), /*wrap_scalar=*/false);
  note_dim(d);
  return sizes_default()[d];
}
c10::SymIntArrayRef ObservedTensorImpl::sym_sizes_custom() const {
  note_all("sym_sizes()");
  return sym_sizes_default();
}
c10::SymInt ObservedTensorImpl::sym_size_custom(int64_t d) const {
  d = c10::maybe_wrap_dim(d, dim_default(), /*wrap_scalar=*/false);
  note_dim(d);
  return c10::SymInt(sizes_default()[d]);
}
c10::IntArrayRef ObservedTensorImpl::strides_custom() const {
  note_all("strides()");
  return strides_default();
}
c10::SymIntArrayRef ObservedTensorImpl::sym_strides_custom() const {
  note_all("sym_strides()");
  return sym_strides_default();
}
int64_t ObservedTensorImpl::numel_custom() const {
  note_all("numel()");
  return numel_default();
}
c10::SymInt ObservedTensorImpl::sym_numel_custom() const {
  note_all("sym_numel()");
  return sym_numel_default();
}
int64_t ObservedTensorImpl::storage_offset_custom() const {
  note_all("storage_offset()");
  return storage_offset_default();
}
c10::SymInt ObservedTensorImpl::sym_storage_offset_custom() const {
  note_all("sym_storage_offset()");
  return sym_storage_offset_default();
}
int64_t ObservedTensorImpl::dim_custom() const { return dim_default(); }
bool ObservedTensorImpl::is_contiguous_custom(at::MemoryFormat memory_format) const {
  return is_contiguous_default(memory_format);
}
bool ObservedTensorImpl::is_strides_like_custom(at::MemoryFormat memory_format) const {
  return is_strides_like_default(memory_format);
}
bool ObservedTensorImpl::is_non_overlapping_and_dense_custom() const { return is_non_overlapping_and_dense_default(); }

// A detached copy (`variable_data()`, `.data()`) is an ordinary tensor: the tracer refuses
// tensors derived outside the dispatcher anyway.
c10::intrusive_ptr<c10::TensorImpl> ObservedTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::TensorImpl::shallow_copy_and_detach(version_counter, allow_tensor_metadata_change);
  impl->set_custom_sizes_strides(Policy::Default);
  return impl;
}
c10::intrusive_ptr<c10::TensorImpl> ObservedTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return shallow_copy_and_detach(static_cast<const c10::VariableVersion&>(version_counter),
                                 allow_tensor_metadata_change);
}

}  // namespace torchcompile::capture
