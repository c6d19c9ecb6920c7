// Graph identity: a canonical form of what a graph computes, its hash, and structural equality
// (LTC's Node::hash plays this role for lazy tensors). Node names do not take part; operators,
// constant arguments, which earlier value each argument reads, attribute names, call_module
// targets and every value's recorded metadata do.
#pragma once

#include <torchcompile/ir/graph.h>

#include <cstdint>
#include <string>

namespace torchcompile::ir {

/// The canonical form of `g`: a byte string equal for two graphs exactly when they compute the
/// same thing from the same inputs and attributes (up to node names).
class GraphKey {
 public:
  GraphKey() = default;  ///< the key of no graph (equal only to another default key)
  explicit GraphKey(const Graph& g);
  /// A 64-bit hash of the canonical form, usable as a cache key (compare the keys on a match).
  uint64_t hash() const { return hash_; }
  const std::string& canonical() const { return canonical_; }
  bool operator==(const GraphKey& o) const { return hash_ == o.hash_ && canonical_ == o.canonical_; }
  bool operator!=(const GraphKey& o) const { return !(*this == o); }

 private:
  std::string canonical_;
  uint64_t hash_ = 0;
};

/// GraphKey(g).hash().
uint64_t structural_hash(const Graph& g);
/// GraphKey(a) == GraphKey(b).
bool structurally_equal(const Graph& a, const Graph& b);

}  // namespace torchcompile::ir
