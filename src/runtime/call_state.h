// What a call of a compiled forward changes outside its graphs' own values, and the snapshot
// that puts it back: the seam that lets a call with graph breaks run the C++ forward again from
// the start when it reaches a branch value with no compiled continuation.
#pragma once

#include "ir/effects.h"

#include <torchcompile/ir/graph_module.h>

#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/variable.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchcompile::runtime {

using ir::effects_of;
using ir::GraphEffects;

/// Copies of tensors and of the default CPU generator's state, written back by restore().
class StateSnapshot {
 public:
  /// Save `t`'s contents and autograd history (once per tensor; undefined tensors are ignored).
  void save(const at::Tensor& t);
  /// Save only `t`'s autograd history: a view of a saved tensor, whose history an in-place
  /// update of that tensor changes although its contents are restored with it.
  void save_history(const at::Tensor& t);
  /// Save the default CPU generator (once).
  void save_rng();
  /// Write every saved tensor and the generator back, in place, and give each tensor its
  /// autograd history back (an in-place op under grad mode gives its target, and the base of a
  /// view target, a new grad_fn; a view keeps the grad_fn autograd last built for it).
  void restore() const;
  bool empty() const { return tensors_.empty() && !rng_; }

 private:
  struct Saved {
    at::Tensor live, copy;
    std::shared_ptr<torch::autograd::Node> grad_fn;  // when saved
    uint32_t output_nr = 0;
    bool view = false;
    bool contents = true;
  };
  Saved* find(const at::Tensor& t);
  static Saved history_of(const at::Tensor& t);
  std::vector<Saved> tensors_;
  std::optional<at::Generator> rng_;
};

}  // namespace torchcompile::runtime
