// The hook registry: one HookTable per module that ever had a hook (or was marked a leaf),
// holding an immutable snapshot of its hooks that calls read without holding a lock for long.
#pragma once

#include <torchcompile/hooks/hooks.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torchcompile::detail {

template <typename F>
struct HookEntry {
  uint64_t id;
  F fn;
  bool always_call = false;
  bool traceable = false;
};

/// A module's hooks at one moment. Never modified after publication.
struct HookSet {
  std::vector<HookEntry<ForwardPreHook>> forward_pre;
  std::vector<HookEntry<ForwardHook>> forward;
  std::vector<HookEntry<BackwardPreHook>> backward_pre;
  std::vector<HookEntry<BackwardHook>> backward;
  std::vector<HookEntry<StateDictPreHook>> state_dict_pre;
  std::vector<HookEntry<StateDictPostHook>> state_dict_post;
  std::vector<HookEntry<LoadStateDictPreHook>> load_pre;
  std::vector<HookEntry<LoadStateDictPostHook>> load_post;
  bool leaf = false;

  bool has_call_hooks() const { return !forward_pre.empty() || !forward.empty() || has_backward_hooks(); }
  bool has_backward_hooks() const { return !backward_pre.empty() || !backward.empty(); }
  /// Whether a compiled caller can inline the module's call: no backward hooks, every forward
  /// hook traceable, not a leaf.
  bool inlinable() const;
  /// (what, how many): `{"forward hooks", "2 (1 traceable)"}`, ..., `{"leaf", "no"}`.
  std::vector<std::pair<std::string, std::string>> counts() const;
  /// `forward pre-hooks 0, forward hooks 2 (1 traceable), ...`.
  std::string summary() const;
  /// What changed from `before` (counts() of an earlier set): `forward hooks 1 -> 0`.
  std::string change_from(const std::vector<std::pair<std::string, std::string>>& before) const;
};

/// The registry entry of one module.
struct HookTable {
  std::weak_ptr<torch::nn::Module> owner;
  const torch::nn::Module* address = nullptr;
  std::mutex mutex;
  std::shared_ptr<const HookSet> hooks = std::make_shared<HookSet>();
  /// The hook epoch at this table's last change to call hooks or the leaf flag (0: never).
  std::atomic<uint64_t> version{0};

  /// Copy the hook set, apply `edit`, publish; bumps the epoch if `call_hooks` changed.
  void update(const std::function<void(HookSet&)>& edit, bool call_hooks);
  /// Add an entry to one of the HookSet's lists; returns its handle.
  template <typename F>
  RemovableHandle add(std::vector<HookEntry<F>> HookSet::*list, F fn, const HookOptions& o, bool call_hooks);
  void remove(uint64_t id);
  bool contains(uint64_t id);
  std::shared_ptr<const HookSet> snapshot() {
    std::lock_guard<std::mutex> lock(mutex);
    return hooks;
  }
  std::shared_ptr<HookTable> self() { return self_.lock(); }
  std::weak_ptr<HookTable> self_;
};

/// Incremented by every change of call hooks or leaf flags, anywhere. A compiled entry that saw
/// this value has seen every module's hooks as they are.
uint64_t hook_epoch();

/// The hooks of `m` (null if it never had any): a lock-free early exit while no module in the
/// process has hooks.
std::shared_ptr<const HookSet> hooks_of(const torch::nn::Module& m);
/// The epoch of `m`'s last call-hook change (0 if never).
uint64_t hook_version(const torch::nn::Module& m);

}  // namespace torchcompile::detail
