// Data-parallel training across processes (PyTorch's torch.distributed and
// DistributedDataParallel) for LibTorch C++ programs, on c10d's Gloo process group and its
// gradient Reducer. docs/distributed.md says more.
//
//     auto pg = torchcompile::init_process_group();   // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//     auto net = std::make_shared<Net>();
//     torchcompile::DistributedDataParallel ddp(net, pg);   // broadcasts rank 0's parameters
//     auto compiled = torch::compile(net, "default");       // optional, before or after
//     torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//     for (...) {
//       opt.zero_grad();
//       auto loss = torch::mse_loss(compiled(x_shard), y_shard);   // or torchcompile::call(net, x_shard)
//       loss.backward();             // gradients averaged across ranks, overlapped with the backward
//       opt.step();
//     }
//
// Where it hooks in. The object registers a forward pre-hook and a forward hook on the module
// (torchcompile/hooks/hooks.h), so the gradient synchronisation is armed by every call that
// fires the module's hooks: a call of `torch::compile(module, ...)`'s result or of
// `torchcompile::call(module, args...)`. A bare `module->forward(x)` fires no hook (the
// LibTorch frontend has no call boundary): its backward would not reduce the gradients, and the
// next hooked call says so.
#pragma once

#include <torchcompile/frontend/compiled.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchcompile {

// ---- process group -----------------------------------------------------------------------------

/// How init_process_group() finds its peers (PyTorch's init_process_group arguments). Unset
/// fields come from the environment, as PyTorch's launchers (and torchcompile-launch) set it.
struct ProcessGroupOptions {
  /// "gloo" (CPU): the only backend.
  std::string backend = "gloo";
  /// "env://" (MASTER_ADDR and MASTER_PORT: a TCP store served by rank 0), "tcp://host:port",
  /// or "file:///path" (a file store on a file system every rank sees).
  std::string init_method = "env://";
  /// -1: from WORLD_SIZE.
  int world_size = -1;
  /// -1: from RANK.
  int rank = -1;
  /// Timeout of the store's rendezvous and of every collective operation. Unset: the
  /// TORCHCOMPILE_DIST_TIMEOUT environment variable (seconds), else PyTorch's 30 minutes.
  std::optional<std::chrono::milliseconds> timeout;
  /// The network interface address Gloo binds to. Empty: the address MASTER_ADDR resolves to
  /// when it is a loopback address, else the host name's address (Gloo's default).
  std::string hostname;

  ProcessGroupOptions& with_backend(std::string b) { backend = std::move(b); return *this; }
  ProcessGroupOptions& with_init_method(std::string m) { init_method = std::move(m); return *this; }
  ProcessGroupOptions& with_world_size(int n) { world_size = n; return *this; }
  ProcessGroupOptions& with_rank(int r) { rank = r; return *this; }
  ProcessGroupOptions& with_timeout(std::chrono::milliseconds t) { timeout = t; return *this; }
  ProcessGroupOptions& with_hostname(std::string h) { hostname = std::move(h); return *this; }
};

/// Join the process group: every rank calls it, and it returns once all `world_size` ranks have
/// (or throws after the timeout, naming what it waited for). The result is what the c10d
/// operations and DistributedDataParallel take.
c10::intrusive_ptr<c10d::ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});

/// The timeout options.timeout or TORCHCOMPILE_DIST_TIMEOUT give (30 minutes when neither does).
std::chrono::milliseconds default_timeout(const std::optional<std::chrono::milliseconds>& timeout = std::nullopt);

// ---- DistributedDataParallel -------------------------------------------------------------------

/// DistributedDataParallel's keyword arguments.
struct DistributedOptions {
  /// Gradients are all-reduced in buckets of about this many MiB (PyTorch's bucket_cap_mb);
  /// the bucket of the last parameters is at most 1 MiB, as in PyTorch, so that the first
  /// all-reduce starts early in the backward.
  double bucket_cap_mb = 25;
  /// Look for parameters that get no gradient in a step (a branch the forward did not take)
  /// and mark them ready, at the cost of a walk over the autograd graph after every forward.
  /// Off: a parameter without gradient is an error at the next forward, naming it.
  bool find_unused_parameters = false;
  /// Broadcast rank 0's buffers (BatchNorm's running statistics) before every forward with grad
  /// mode on (forwards under torch::NoGradGuard, e.g. an evaluation on one rank, do not).
  bool broadcast_buffers = true;
  /// How long a gradient all-reduce may wait for the other ranks before the backward throws,
  /// naming the ranks that are gone. Unset: the TORCHCOMPILE_DIST_TIMEOUT environment
  /// variable (seconds), else PyTorch's 30 minutes.
  std::optional<std::chrono::milliseconds> timeout;

  DistributedOptions& with_bucket_cap_mb(double mb) { bucket_cap_mb = mb; return *this; }
  DistributedOptions& with_find_unused_parameters(bool on = true) { find_unused_parameters = on; return *this; }
  DistributedOptions& with_broadcast_buffers(bool on = true) { broadcast_buffers = on; return *this; }
  DistributedOptions& with_timeout(std::chrono::milliseconds t) { timeout = t; return *this; }
};

class DistributedDataParallel {
 public:
  /// Attach to `module` (a std::shared_ptr to a module or a ModuleHolder): broadcast rank 0's
  /// parameters and buffers to every rank (after checking that every rank's parameters have the
  /// same count, shapes and types), register the parameters that require grad with c10d's
  /// Reducer, and hook the module's calls. Every rank must construct it at the same point.
  template <typename M>
  DistributedDataParallel(const M& module, c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                          DistributedOptions options = {})
      : DistributedDataParallel(detail::module_shared(module), std::move(process_group), std::move(options), 0) {}
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Gradient accumulation: while the guard lives, backward passes accumulate local gradients
  /// without communication (PyTorch's `with ddp.no_sync():`); the first step after it reduces
  /// the accumulated gradients.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const;
  torch::nn::Module& module() const;
  int rank() const;
  int world_size() const;
  /// The gradient buckets, each a list of indices into module().parameters() (those requiring
  /// grad), in the order their all-reduces are launched.
  std::vector<std::vector<size_t>> bucket_indices() const;

  /// Timestamps of this rank's gradient all-reduces in the last backward: one per bucket, in
  /// launch order (the steady clock), for measuring how communication overlaps the backward.
  struct CommEvent {
    size_t bucket;
    std::chrono::steady_clock::time_point launched;
    std::chrono::steady_clock::time_point finished;
  };
  std::vector<CommEvent> last_comm_events() const;

  struct Impl;

 private:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, c10::intrusive_ptr<c10d::ProcessGroup> pg,
                          DistributedOptions options, int);
  std::shared_ptr<Impl> impl_;
};

// ---- checkpoints -------------------------------------------------------------------------------

/// Save `module`'s parameters and buffers, `optimizer`'s state and `step` to `path` from rank 0
/// (written to a temporary file and renamed, so a job killed while saving keeps the previous
/// checkpoint), then wait until every rank of `process_group` reaches the same point.
void save_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                     int64_t step, const c10::intrusive_ptr<c10d::ProcessGroup>& process_group);

/// Load a checkpoint written by save_checkpoint into `module` and `optimizer` (every rank reads
/// the file) and return its step; std::nullopt when `path` does not exist (a fresh start).
std::optional<int64_t> load_checkpoint(const std::string& path, torch::nn::Module& module,
                                       torch::optim::Optimizer& optimizer);

}  // namespace torchcompile
