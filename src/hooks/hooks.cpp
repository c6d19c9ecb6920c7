#include "hooks/hooks_internal.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

namespace torchcompile {
namespace detail {

namespace {

std::atomic<uint64_t> g_epoch{0};
std::atomic<size_t> g_num_tables{0};
std::atomic<uint64_t> g_next_id{1};

struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<HookTable>> tables;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: modules may outlive static destruction
  return *r;
}

// The live table of `m`, or null. A table whose module died is ignored: its address may have
// been reused by a new module.
std::shared_ptr<HookTable> find_table(const torch::nn::Module& m) {
  if (g_num_tables.load(std::memory_order_acquire) == 0) return nullptr;
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  auto it = r.tables.find(&m);
  if (it == r.tables.end() || it->second->owner.expired()) return nullptr;
  return it->second;
}

std::shared_ptr<HookTable> table_for(torch::nn::Module& m, const char* what) {
  std::weak_ptr<torch::nn::Module> owner = m.weak_from_this();
  TORCH_CHECK(!owner.expired(), "torchcompile::", what, ": the module (", m.name(),
              ") must be owned by a std::shared_ptr (a ModuleHolder, std::make_shared or register_module) so "
              "its hooks can be dropped with it");
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  auto it = r.tables.find(&m);
  if (it != r.tables.end() && !it->second->owner.expired()) return it->second;
  // Drop the tables of dead modules while we hold the lock.
  for (auto i = r.tables.begin(); i != r.tables.end();)
    i = i->second->owner.expired() ? r.tables.erase(i) : std::next(i);
  auto table = std::make_shared<HookTable>();
  table->owner = owner;
  table->address = &m;
  table->self_ = table;
  r.tables[&m] = table;
  g_num_tables.store(r.tables.size(), std::memory_order_release);
  return table;
}

template <typename F>
void erase_id(std::vector<HookEntry<F>>& v, uint64_t id, bool& found) {
  auto it = std::find_if(v.begin(), v.end(), [&](const HookEntry<F>& e) { return e.id == id; });
  if (it == v.end()) return;
  v.erase(it);
  found = true;
}

template <typename F>
bool has_id(const std::vector<HookEntry<F>>& v, uint64_t id) {
  return std::any_of(v.begin(), v.end(), [&](const HookEntry<F>& e) { return e.id == id; });
}

}  // namespace

uint64_t hook_epoch() { return g_epoch.load(std::memory_order_acquire); }

std::shared_ptr<const HookSet> hooks_of(const torch::nn::Module& m) {
  auto table = find_table(m);
  return table ? table->snapshot() : nullptr;
}

uint64_t hook_version(const torch::nn::Module& m) {
  auto table = find_table(m);
  return table ? table->version.load(std::memory_order_acquire) : 0;
}

bool HookSet::inlinable() const {
  if (leaf || has_backward_hooks()) return false;
  auto traceable = [](const auto& e) { return e.traceable; };
  return std::all_of(forward_pre.begin(), forward_pre.end(), traceable) &&
         std::all_of(forward.begin(), forward.end(), traceable);
}

std::vector<std::pair<std::string, std::string>> HookSet::counts() const {
  auto count = [](const auto& v) {
    size_t t = 0;
    for (const auto& e : v) t += e.traceable ? 1 : 0;
    std::string s = std::to_string(v.size());
    if (t) s += " (" + std::to_string(t) + " traceable)";
    return s;
  };
  return {{"forward pre-hooks", count(forward_pre)},
          {"forward hooks", count(forward)},
          {"backward pre-hooks", std::to_string(backward_pre.size())},
          {"backward hooks", std::to_string(backward.size())},
          {"leaf", leaf ? "yes" : "no"}};
}

std::string HookSet::summary() const {
  std::string s;
  for (const auto& [what, n] : counts()) s += (s.empty() ? "" : ", ") + what + " " + n;
  return s;
}

std::string HookSet::change_from(const std::vector<std::pair<std::string, std::string>>& before) const {
  const auto now = counts();
  std::string s;
  for (size_t i = 0; i < now.size() && i < before.size(); ++i)
    if (now[i].second != before[i].second)
      s += (s.empty() ? "" : ", ") + now[i].first + " " + before[i].second + " -> " + now[i].second;
  // Same counts, different hooks (one removed, another added).
  return s.empty() ? "hooks replaced (" + summary() + ")" : s;
}

void HookTable::update(const std::function<void(HookSet&)>& edit, bool call_hooks) {
  std::lock_guard<std::mutex> lock(mutex);
  auto next = std::make_shared<HookSet>(*hooks);
  edit(*next);
  hooks = std::move(next);
  if (call_hooks) version.store(g_epoch.fetch_add(1, std::memory_order_acq_rel) + 1, std::memory_order_release);
}

template <typename F>
RemovableHandle HookTable::add(std::vector<HookEntry<F>> HookSet::*list, F fn, const HookOptions& o,
                               bool call_hooks) {
  TORCH_CHECK(fn, "torchcompile: cannot register an empty hook function");
  const uint64_t id = g_next_id.fetch_add(1);
  update(
      [&](HookSet& s) {
        HookEntry<F> e{id, std::move(fn), o.always_call_, o.traceable_};
        auto& v = s.*list;
        if (o.prepend_) {
          v.insert(v.begin(), std::move(e));
        } else {
          v.push_back(std::move(e));
        }
      },
      call_hooks);
  return RemovableHandle(self(), id);
}

void HookTable::remove(uint64_t id) {
  bool found = false, call_hook = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const HookSet& s = *hooks;
    call_hook = has_id(s.forward_pre, id) || has_id(s.forward, id) || has_id(s.backward_pre, id) ||
                has_id(s.backward, id);
  }
  update(
      [&](HookSet& s) {
        erase_id(s.forward_pre, id, found);
        erase_id(s.forward, id, found);
        erase_id(s.backward_pre, id, found);
        erase_id(s.backward, id, found);
        erase_id(s.state_dict_pre, id, found);
        erase_id(s.state_dict_post, id, found);
        erase_id(s.load_pre, id, found);
        erase_id(s.load_post, id, found);
      },
      call_hook);
}

bool HookTable::contains(uint64_t id) {
  auto s = snapshot();
  return has_id(s->forward_pre, id) || has_id(s->forward, id) || has_id(s->backward_pre, id) ||
         has_id(s->backward, id) || has_id(s->state_dict_pre, id) || has_id(s->state_dict_post, id) ||
         has_id(s->load_pre, id) || has_id(s->load_post, id);
}

namespace {
// Register `fn` in `list` of m's table, after checking which options apply to this kind.
template <typename F>
RemovableHandle add_hook(torch::nn::Module& m, std::vector<HookEntry<F>> HookSet::*list, F fn, const HookOptions& o,
                         const char* what, bool forward_kind, bool forward_hook, bool call_hook = true) {
  TORCH_CHECK(forward_kind || !o.traceable_, "torchcompile::", what,
              ": only forward pre-hooks and forward hooks can be traceable (a backward or state_dict hook always "
              "runs with the real tensors)");
  TORCH_CHECK(forward_hook || !o.always_call_, "torchcompile::", what, ": always_call applies to forward hooks only");
  return table_for(m, what)->add(list, std::move(fn), o, call_hook);
}
}  // namespace

RemovableHandle add_forward_pre_hook(torch::nn::Module& m, ForwardPreHook hook, const HookOptions& o) {
  return add_hook(m, &HookSet::forward_pre, std::move(hook), o, "register_forward_pre_hook", true, false);
}
RemovableHandle add_forward_hook(torch::nn::Module& m, ForwardHook hook, const HookOptions& o) {
  return add_hook(m, &HookSet::forward, std::move(hook), o, "register_forward_hook", true, true);
}
RemovableHandle add_backward_pre_hook(torch::nn::Module& m, BackwardPreHook hook, const HookOptions& o) {
  return add_hook(m, &HookSet::backward_pre, std::move(hook), o, "register_full_backward_pre_hook", false, false);
}
RemovableHandle add_backward_hook(torch::nn::Module& m, BackwardHook hook, const HookOptions& o) {
  return add_hook(m, &HookSet::backward, std::move(hook), o, "register_full_backward_hook", false, false);
}
RemovableHandle add_state_dict_pre_hook(torch::nn::Module& m, StateDictPreHook hook, const HookOptions& o) {
  return add_hook(m, &HookSet::state_dict_pre, std::move(hook), o, "register_state_dict_pre_hook", false, false, /*call_hook=*/false);
}
RemovableHandle add_state_dict_post_hook(torch::nn::Module& m, StateDictPostHook hook, const HookOptions& o) {
  return add_hook(m, &HookSet::state_dict_post, std::move(hook), o, "register_state_dict_post_hook", false, false, /*call_hook=*/false);
}
RemovableHandle add_load_state_dict_pre_hook(torch::nn::Module& m, LoadStateDictPreHook hook, const HookOptions& o) {
  return add_hook(m, &HookSet::load_pre, std::move(hook), o, "register_load_state_dict_pre_hook", false, false, /*call_hook=*/false);
}
RemovableHandle add_load_state_dict_post_hook(torch::nn::Module& m, LoadStateDictPostHook hook,
                                              const HookOptions& o) {
  return add_hook(m, &HookSet::load_post, std::move(hook), o, "register_load_state_dict_post_hook", false, false, /*call_hook=*/false);
}

}  // namespace detail

void RemovableHandle::remove() {
  if (table_) table_->remove(id_);
}

bool RemovableHandle::active() const { return table_ && table_->contains(id_); }

void mark_leaf(torch::nn::Module& module, bool leaf) {
  detail::table_for(module, "mark_leaf")->update([&](detail::HookSet& s) { s.leaf = leaf; }, true);
}

bool is_leaf(const torch::nn::Module& module) {
  auto hooks = detail::hooks_of(module);
  return hooks && hooks->leaf;
}

}  // namespace torchcompile
