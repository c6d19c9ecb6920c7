// Values kept per combination of size-symbol values, most recently used first: a dynamic entry's
// compiled graphs or trace trees per size (runtime/dynamic_entry.h), compile_per_shape's
// specializations (backends/per_shape.cpp).
#pragma once

#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace torchcompile::support {

/// The values of size symbols in one call, in symbol order.
using SizeKey = c10::SmallVector<int64_t, 4>;

/// Values kept per combination of symbol values, most recently used first; beyond kMax the
/// least recently used is dropped. Thread-safe.
template <class V>
class BySize {
 public:
  static constexpr size_t kMax = 64;

  /// The value for `key` (made most recently used), or V().
  V find(const SizeKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < items_.size(); ++i) {
      if (items_[i].first != key) continue;
      if (i != 0) std::rotate(items_.begin(), items_.begin() + i, items_.begin() + i + 1);
      return items_.front().second;
    }
    return V();
  }
  /// Adds `value` for `key` (replacing the one it had); returns how many are kept.
  size_t insert(SizeKey key, V value) {
    std::lock_guard<std::mutex> lock(mutex_);
    items_.erase(std::remove_if(items_.begin(), items_.end(), [&](const auto& item) { return item.first == key; }),
                 items_.end());
    items_.insert(items_.begin(), {std::move(key), std::move(value)});
    if (items_.size() > kMax) items_.pop_back();
    return items_.size();
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.size();
  }
  /// The keys and values kept, most recently used first.
  std::vector<std::pair<SizeKey, V>> items() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_;
  }
  /// The values kept, most recently used first.
  std::vector<V> values() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<V> out;
    for (const auto& item : items_) out.push_back(item.second);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<SizeKey, V>> items_;
};

}  // namespace torchcompile::support
