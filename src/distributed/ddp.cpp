// DistributedDataParallel: c10d's Reducer (gradient buckets, all-reduce as gradients become
// ready, copy-back) driven by the module's call hooks, with our own all-reduce hook (division
// by the world size, timestamps, a watchdog that turns a lost peer into an error naming it).
#include <torchcompile/distributed/ddp.h>
#include <torchcompile/hooks/hooks.h>

#include "compile/gradient_buckets.h"

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace torchcompile {
namespace {

constexpr const char* kWho = "torchcompile::DistributedDataParallel";
constexpr size_t kFirstBucketBytes = size_t(1) << 20;        // PyTorch's _DEFAULT_FIRST_BUCKET_BYTES
constexpr size_t kBroadcastBucketBytes = size_t(250) << 20;  // PyTorch's broadcast_bucket_size

int64_t host_id() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return static_cast<int64_t>(std::hash<std::string>{}(name) & 0x7fffffffffffffffULL);
}

// The state of process `pid` of this machine: 'X' gone, 'Z' a zombie its parent has not reaped,
// 'T' stopped, else the state letter of /proc/<pid>/stat ('R', 'S', ...).
char process_state(int64_t pid) {
  if (pid <= 0) return '?';
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return 'X';
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  std::getline(stat, content);
  auto close = content.rfind(')');
  if (close == std::string::npos || close + 2 >= content.size()) return '?';
  const char c = content[close + 2];
  return c == 't' ? 'T' : c;
}

}  // namespace

// What Gloo's completion callbacks and the watchdog use: shared with them, owning no process
// group, Reducer or thread, so that releasing it on any thread is harmless (the process group's
// destructor joins Gloo's threads: it must not run on one of them).
struct CommState {
  int rank = 0;
  int world = 1;
  std::chrono::milliseconds timeout{};
  std::vector<std::pair<int64_t, int64_t>> peers;  // (host id, pid) per rank

  // Communication events of the current backward.
  mutable std::mutex events_mu;
  std::vector<DistributedDataParallel::CommEvent> events;
  bool events_reset = true;

  // The watchdog and Gloo's completion callback hold no reference to the result: the Reducer
  // owns it and waits for it, so it lives until it is completed, and only the one that sets
  // `done` first (completion, failure or timeout) touches it. (Shared references released on
  // LibTorch's uninstrumented threads would also hide the ordering from ThreadSanitizer.)
  struct Pending {
    c10::ivalue::Future* result;
    std::shared_ptr<std::atomic<bool>> done;
    std::chrono::steady_clock::time_point deadline;
    size_t bucket;
  };
  // Who is gone, for an error message: peers on this machine by their process state. A peer
  // that was killed closes its sockets while the kernel tears the process down, before its state
  // says it has ended: the connection reset can reach this rank while the peer still reads as
  // running. So, when no peer on this machine reads as ended or stopped, look again every 10 ms
  // for up to kSettle before saying so (an error path only: a hung peer's error comes that much
  // later).
  std::string lost_ranks() const {
    static constexpr auto kSettle = std::chrono::milliseconds(1000);
    const int64_t me = host_id();
    std::vector<char> states(peers.size(), '?');
    const auto settle_until = std::chrono::steady_clock::now() + kSettle;
    for (;;) {
      bool local = false, named = false;
      for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
        if (r == rank || peers[r].first != me) continue;
        local = true;
        states[r] = process_state(peers[r].second);
        named = named || states[r] == 'X' || states[r] == 'Z' || states[r] == 'T';
      }
      if (!local || named || std::chrono::steady_clock::now() >= settle_until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ostringstream gone, stopped, unknown;
    for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
      if (r == rank) continue;
      const char state = states[r];
      if (state == 'X' || state == 'Z')
        gone << (gone.tellp() ? ", " : "") << "rank " << r << " (process " << peers[r].second << " has ended)";
      else if (state == 'T')
        stopped << (stopped.tellp() ? ", " : "") << "rank " << r << " (process " << peers[r].second << ") is stopped";
      else
        unknown << (unknown.tellp() ? ", " : "") << r;
    }
    std::string out;
    if (gone.tellp()) out = "lost " + gone.str();
    if (stopped.tellp()) out += (out.empty() ? "" : "; ") + stopped.str();
    if (out.empty())
      out = "no rank on this machine has ended; rank(s) " + unknown.str() +
            " did not respond (a process on another machine that ended or hangs, or a network failure)";
    return out;
  }

  void fail(const Pending& p, const std::string& why) {
    if (p.done->exchange(true)) return;
    std::ostringstream msg;
    msg << kWho << " (rank " << rank << " of " << world << "): the gradient all-reduce of bucket " << p.bucket
        << " failed: " << why << "; " << lost_ranks();
    std::exception_ptr error;
    try {
      TORCH_CHECK(false, msg.str());
    } catch (...) {
      error = std::current_exception();
    }
    p.result->setError(error);
  }

  void record(size_t bucket, bool finished) {
    std::lock_guard<std::mutex> lock(events_mu);
    auto now = std::chrono::steady_clock::now();
    if (!finished) {
      if (events_reset) events.clear();
      events_reset = false;
      events.push_back(DistributedDataParallel::CommEvent{bucket, now, now});
    } else {
      for (DistributedDataParallel::CommEvent& e : events)
        if (e.bucket == bucket) e.finished = now;
    }
  }

};

struct DistributedDataParallel::Impl {
  std::shared_ptr<torch::nn::Module> module;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  DistributedOptions options;
  std::vector<at::Tensor> params;  // requiring grad, in parameters() order
  std::vector<std::string> names;
  std::vector<at::Tensor> buffers;
  // Each parameter's gradient accumulator, where the Reducer's hooks are.
  std::vector<const torch::autograd::Node*> accumulators;
  std::shared_ptr<c10d::Reducer> reducer;
  std::atomic<bool> require_sync{true};
  RemovableHandle pre_hook, post_hook;
  std::shared_ptr<compile_stage::GradientBucketsRegistration> split_registration;
  std::shared_ptr<CommState> comm = std::make_shared<CommState>();

  // Watchdog: pending all-reduces with their deadlines.
  std::mutex wd_mu;
  std::condition_variable wd_cv;
  std::vector<CommState::Pending> pending;
  bool stopping = false;
  std::thread watchdog;

  void watch() {
    std::unique_lock<std::mutex> lock(wd_mu);
    while (!stopping) {
      auto now = std::chrono::steady_clock::now();
      auto next = now + std::chrono::hours(1);
      std::vector<CommState::Pending> expired;
      pending.erase(std::remove_if(pending.begin(), pending.end(),
                                   [&](const CommState::Pending& p) {
                                     if (p.done->load()) return true;
                                     if (p.deadline <= now) {
                                       expired.push_back(p);
                                       return true;
                                     }
                                     next = std::min(next, p.deadline);
                                     return false;
                                   }),
                    pending.end());
      if (!expired.empty()) {
        lock.unlock();
        for (const CommState::Pending& p : expired)
          comm->fail(p, "it did not complete within the timeout of " +
                            std::to_string(comm->timeout.count() / 1000.0) + " s");
        lock.lock();
        continue;
      }
      wd_cv.wait_until(lock, next);
    }
  }

  c10::intrusive_ptr<c10::ivalue::Future> allreduce(c10d::GradBucket& bucket) {
    at::Tensor buffer = bucket.getBufferRef();
    buffer.div_(comm->world);
    const size_t index = bucket.getIndex();
    comm->record(index, false);
    auto result = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    CommState::Pending p{result.get(), std::make_shared<std::atomic<bool>>(false),
                         std::chrono::steady_clock::now() + comm->timeout, index};
    std::vector<at::Tensor> tensors{buffer};
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = pg->allreduce(tensors);
    } catch (const std::exception& e) {
      comm->fail(p, e.what());
      return result;
    }
    {
      std::lock_guard<std::mutex> lock(wd_mu);
      pending.push_back(p);
    }
    wd_cv.notify_one();
    work->getFuture()->addCallback([comm = comm, p](c10::ivalue::Future& f) {
      if (f.hasError()) {
        std::string why = "communication error";
        try {
          std::rethrow_exception(f.exception_ptr());
        } catch (const std::exception& e) {
          why = e.what();
        } catch (...) {
        }
        comm->fail(p, why);
        return;
      }
      if (p.done->exchange(true)) return;
      comm->record(p.bucket, true);
      p.result->markCompleted(f.value());  // the bucket's buffer, reduced in place
    });
    return result;
  }

  // The Reducer's error for a parameter without gradient, in this API's terms.
  [[noreturn]] void rethrow_unfinished(const c10::Error& e) const {
    std::string text = e.what_without_backtrace();
    if (text.find("Expected to have finished reduction") == std::string::npos) throw;
    std::string named;
    auto at = text.find("did not receive grad for rank");
    if (at != std::string::npos) {
      std::istringstream in(text.substr(text.find(':', at) + 1));
      size_t i;
      while (in >> i)
        if (i < names.size()) named += (named.empty() ? "" : ", ") + names[i];
    }
    TORCH_CHECK(false, kWho, ": the previous backward produced no gradient for ",
                named.empty() ? std::string("some parameters") : "the parameters " + named,
                ", so its gradient all-reduce never completed. Either make every parameter take part in the ",
                "loss, or construct with DistributedOptions().with_find_unused_parameters(true). It also happens ",
                "when a forward run with grad enabled is not followed by a backward (run evaluation under ",
                "torch::NoGradGuard), or when a forward ran without the module's hooks (call the module ",
                "through torch::compile's result or torchcompile::call). (c10d: ", text, ")");
  }

  // A parameter whose data was replaced (Module::load, torch::load, set_data: new storage)
  // gets a new gradient accumulator, without the Reducer's hook: its gradients would silently
  // stay local.
  void check_accumulators() const {
    for (size_t i = 0; i < params.size(); ++i) {
      auto acc = torch::autograd::impl::try_get_grad_accumulator(params[i]);
      TORCH_CHECK(acc.get() == accumulators[i], kWho, ": parameter ", names[i],
                  " was given new data after the module was attached (Module::load, torch::load or ",
                  "set_data replace a parameter's storage and its gradient accumulator), so its gradient would no ",
                  "longer be averaged across ranks. Load before constructing DistributedDataParallel, or load in ",
                  "place: torchcompile::load_state_dict or torchcompile::load_checkpoint.");
    }
  }

  void pre_forward() {
    const bool grad = at::GradMode::is_enabled();
    if (grad) check_accumulators();
    try {
      if (grad && require_sync.load()) reducer->prepare_for_forward();
      if (grad) reducer->rebuild_buckets();
    } catch (const c10::Error& e) {
      rethrow_unfinished(e);
    }
    // Only forwards that train (grad mode on) are collective: every rank makes them. An
    // evaluation on one rank alone (under torch::NoGradGuard) must not wait for the others.
    if (grad && options.broadcast_buffers && !buffers.empty() && comm->world > 1) {
      torch::NoGradGuard no_grad;
      c10d::broadcast_coalesced(pg, buffers, kBroadcastBucketBytes, 0);
    }
  }

  void post_forward(const Tensors& outputs) {
    if (!at::GradMode::is_enabled() || !require_sync.load()) return;
    {
      std::lock_guard<std::mutex> lock(comm->events_mu);
      comm->events_reset = true;
    }
    try {
      reducer->prepare_for_backward(options.find_unused_parameters ? outputs : std::vector<at::Tensor>{});
    } catch (const c10::Error& e) {
      rethrow_unfinished(e);
    }
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(wd_mu);
      stopping = true;
      for (const CommState::Pending& p : pending) p.done->store(true);  // no one touches their results now
    }
    wd_cv.notify_one();
    if (watchdog.joinable()) watchdog.join();
  }
};

namespace {

class AllreduceHook final : public c10d::CommHookInterface {
 public:
  explicit AllreduceHook(DistributedDataParallel::Impl* ddp) : ddp_(ddp) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    return ddp_->allreduce(bucket);
  }
  at::Tensor parseHookResult(const c10::IValue& result) override {
    return result.isTensor() ? result.toTensor() : result.toTensorVector()[0];
  }

 private:
  DistributedDataParallel::Impl* ddp_;
};

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 c10::intrusive_ptr<c10d::ProcessGroup> pg, DistributedOptions options,
                                                 int)
    : impl_(std::make_shared<Impl>()) {
  TORCH_CHECK(pg, kWho, ": expected a process group (torchcompile::init_process_group()), got null");
  TORCH_CHECK(options.bucket_cap_mb > 0, kWho, ": expected bucket_cap_mb > 0, got ", options.bucket_cap_mb);
  Impl& d = *impl_;
  d.module = std::move(module);
  d.pg = std::move(pg);
  d.options = options;
  d.comm->timeout = default_timeout(options.timeout);
  d.comm->rank = d.pg->getRank();
  d.comm->world = d.pg->getSize();

  for (const auto& item : d.module->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    TORCH_CHECK(item.value().device().is_cpu() && item.value().layout() == c10::kStrided, kWho,
                ": expected dense CPU parameters (the Gloo backend), got ", item.key(), " on ",
                item.value().device(), " with layout ", item.value().layout());
    d.params.push_back(item.value());
    d.names.push_back(item.key());
  }
  TORCH_CHECK(!d.params.empty(), kWho, ": the module has no parameter that requires grad");
  for (const auto& item : d.module->named_buffers(/*recurse=*/true))
    if (item.value().defined() && item.value().numel() > 0) d.buffers.push_back(item.value());

  // Same parameters everywhere, then rank 0's values everywhere (parameters and buffers).
  c10d::verify_params_across_processes(d.pg, d.params, {});
  {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> state;
    for (const auto& p : d.module->parameters()) state.push_back(p);
    state.insert(state.end(), d.buffers.begin(), d.buffers.end());
    if (d.comm->world > 1) c10d::broadcast_coalesced(d.pg, state, kBroadcastBucketBytes, 0);
  }
  // Every rank's machine and process id, to name a lost rank in errors.
  {
    at::Tensor mine = at::tensor({host_id(), static_cast<int64_t>(getpid())}, at::kLong);
    std::vector<std::vector<at::Tensor>> all(1);
    for (int r = 0; r < d.comm->world; ++r) all[0].push_back(at::empty({2}, at::kLong));
    std::vector<at::Tensor> in{mine};
    d.pg->allgather(all, in)->wait();
    for (const at::Tensor& t : all[0]) d.comm->peers.emplace_back(t[0].item<int64_t>(), t[1].item<int64_t>());
  }

  // Buckets in reverse parameter order (gradients of the last layers are ready first); the first
  // at most 1 MiB, as PyTorch's DDP. The Reducer rebuilds them in the order gradients became
  // ready after the first backward.
  const size_t cap = static_cast<size_t>(options.bucket_cap_mb * 1024.0 * 1024.0);
  std::vector<bool> sparse(d.params.size(), false);
  auto assignment = c10d::compute_bucket_assignment_by_size(d.params, {std::min(kFirstBucketBytes, cap), cap}, sparse);
  auto indices = std::get<0>(assignment);
  auto limits = std::get<1>(assignment);
  std::reverse(indices.begin(), indices.end());
  std::reverse(limits.begin(), limits.end());
  std::unordered_map<size_t, std::string> param_names;
  for (size_t i = 0; i < d.names.size(); ++i) param_names[i] = d.names[i];
  d.reducer = std::make_shared<c10d::Reducer>(d.params, indices, limits, d.pg, sparse, static_cast<int64_t>(cap),
                                              options.find_unused_parameters, /*gradient_as_bucket_view=*/false,
                                              param_names, static_cast<int64_t>(std::min(kFirstBucketBytes, cap)));
  d.reducer->register_comm_hook(std::make_unique<AllreduceHook>(&d));
  for (const at::Tensor& p : d.params) d.accumulators.push_back(torch::autograd::impl::try_get_grad_accumulator(p).get());
  d.watchdog = std::thread([&d] { d.watch(); });

  // Compiled forwards that read these parameters are split at bucket boundaries (each part its
  // own backward, so a bucket's all-reduce starts while the earlier layers' backward runs).
  d.split_registration = compile_stage::register_gradient_buckets(d.params, cap, std::min(kFirstBucketBytes, cap));

  Impl* raw = &d;
  d.pre_hook = register_forward_pre_hook(
      d.module, [raw](torch::nn::Module&, const Tensors&) -> std::optional<Tensors> {
        raw->pre_forward();
        return std::nullopt;
      });
  d.post_hook = register_forward_hook(
      d.module, [raw](torch::nn::Module&, const Tensors&, const Tensors& outputs) -> std::optional<Tensors> {
        raw->post_forward(outputs);
        return std::nullopt;
      });
}

DistributedDataParallel::~DistributedDataParallel() {
  if (!impl_) return;
  impl_->pre_hook.remove();
  impl_->post_hook.remove();
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.impl_->require_sync.exchange(false)) {}
DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.impl_->require_sync.store(previous_); }

const c10::intrusive_ptr<c10d::ProcessGroup>& DistributedDataParallel::process_group() const { return impl_->pg; }
torch::nn::Module& DistributedDataParallel::module() const { return *impl_->module; }
int DistributedDataParallel::rank() const { return impl_->comm->rank; }
int DistributedDataParallel::world_size() const { return impl_->comm->world; }

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_indices() const {
  std::vector<std::vector<size_t>> out;
  for (const c10d::GradBucket& b : impl_->reducer->get_grad_buckets(/*return_zero_tensors=*/true)) {
    std::vector<size_t> idx;
    for (const at::Tensor& p : b.getParameters())
      for (size_t i = 0; i < impl_->params.size(); ++i)
        if (impl_->params[i].is_same(p)) idx.push_back(i);
    out.push_back(std::move(idx));
  }
  return out;
}

std::vector<DistributedDataParallel::CommEvent> DistributedDataParallel::last_comm_events() const {
  std::lock_guard<std::mutex> lock(impl_->comm->events_mu);
  return impl_->comm->events;
}

}  // namespace torchcompile
