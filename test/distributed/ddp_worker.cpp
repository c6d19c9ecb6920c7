// One rank of the data-parallel tests (test_distributed.cpp starts two through
// torchcompile-launch). Usage: ddp_worker SCENARIO BACKEND MODEL OUTDIR [EXTRA]
//   train      20 SGD-momentum steps on half of each global batch; writes the parameters after
//              every step (OUTDIR/rank<R>_step<K>.pt) and, for `overlap`, the communication times;
//              then rank 0 evaluates alone under NoGradGuard
//   nosync     two steps accumulated under no_sync(), then one synchronised step
//   unused     a parameter the forward does not use: the error of the next forward
//   kill       rank 1 kills itself at step 5; rank 0 writes the error it gets
//   hang       rank 1 stops itself (SIGSTOP) at step 5; rank 0 writes the error it gets
//   checkpoint steps 0..19 with a checkpoint every 5 steps; with ARGS "kill_at=12" rank 1 dies there;
//              a rerun resumes from the checkpoint
// BACKEND: "none" (torchcompile::call, uncompiled) or a backend name for torch::compile.
// MODEL: "mlp" (M1) or "cnn" (M3, BatchNorm in training mode).
#include "distributed/ddp_common.h"

#include <torchcompile/distributed/ddp.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

using namespace ddp_test;

namespace {

struct Runner {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

template <typename Holder>
Runner make_runner(Holder net, const std::string& backend) {
  Runner r;
  r.module = net.ptr();
  if (backend == "none") {
    r.forward = [net](const torch::Tensor& x) { return torchcompile::call(net, x); };
  } else {
    auto compiled = std::make_shared<decltype(torch::compile(net, backend))>(torch::compile(net, backend));
    r.forward = [compiled](const torch::Tensor& x) { return (*compiled)(x); };
  }
  return r;
}

Runner runner_for(const std::string& model, const std::string& backend) {
  torch::manual_seed(0);
  if (model == "mlp") return make_runner(torchcompile_examples::Mlp(), backend);
  if (model == "wide") return make_runner(WideMlp(), backend);
  if (model == "cnn") return make_runner(torchcompile_examples::ConvNet(), backend);  // M3
  if (model == "unused") return make_runner(WithUnused(), backend);
  std::cerr << "unknown model " << model << "\n";
  std::exit(2);
}

void save_params(const std::string& path, torch::nn::Module& m) {
  std::vector<torch::Tensor> ps;
  for (const auto& p : m.parameters()) ps.push_back(p.detach().clone());
  torch::save(ps, path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: ddp_worker SCENARIO BACKEND MODEL OUTDIR [ARGS]\n";
    return 2;
  }
  const std::string scenario = argv[1], backend = argv[2], model = argv[3], out = argv[4];
  const std::string extra = argc > 5 ? argv[5] : "";
  at::set_num_threads(1);
  auto pg = torchcompile::init_process_group();
  const int rank = pg->getRank(), world = pg->getSize();
  Runner run = runner_for(model, backend);
  torchcompile::DistributedOptions options;
  if (scenario == "overlap") options.with_bucket_cap_mb(0.5);
  if (extra == "find_unused") options.with_find_unused_parameters(true);
  torchcompile::DistributedDataParallel ddp(run.module, pg, options);
  torch::optim::SGD opt(run.module->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto step_fn = [&](int64_t k) {
    Batch b = global_batch(model, k);
    const int64_t half = b.x.size(0) / world;
    auto x = b.x.narrow(0, rank * half, half), y = b.y.narrow(0, rank * half, half);
    opt.zero_grad();
    auto loss = loss_of(model, run.forward(x), y);
    loss.backward();
    opt.step();
  };

  if (scenario == "train" || scenario == "overlap") {
    std::ofstream times;
    if (scenario == "overlap") times.open(out + "/times_rank" + std::to_string(rank) + ".txt");
    for (int64_t k = 0; k < kSteps; ++k) {
      if (scenario == "overlap") {
        // The first layer's weight gradient: the last one the backward computes.
        auto first = run.module->parameters()[0];
        std::chrono::steady_clock::time_point first_grad;
        auto h = first.register_hook([&](torch::Tensor g) { first_grad = std::chrono::steady_clock::now(); return g; });
        step_fn(k);
        first.remove_hook(h);
        auto ev = ddp.last_comm_events();
        if (!ev.empty()) {
          times << k << " " << ev.size() << " "
                << std::chrono::duration<double, std::micro>(first_grad - ev.front().launched).count() << "\n";
        }
      } else {
        step_fn(k);
        save_params(out + "/rank" + std::to_string(rank) + "_step" + std::to_string(k) + ".pt", *run.module);
      }
    }
    // Rank 0 evaluates alone (grad mode off): nothing collective may happen (the CNN's BatchNorm
    // buffers are not broadcast), or it would wait for rank 1, which has finished.
    if (rank == 0) {
      torch::NoGradGuard no_grad;
      run.forward(global_batch(model, 0).x);
    }
    if (scenario == "overlap") {
      std::ofstream buckets(out + "/buckets_rank" + std::to_string(rank) + ".txt");
      buckets << ddp.bucket_indices().size() << "\n";
    }
    return 0;
  }
  if (scenario == "nosync") {
    for (int64_t k = 0; k < 3; ++k) {
      Batch b = global_batch(model, k);
      const int64_t half = b.x.size(0) / world;
      auto x = b.x.narrow(0, rank * half, half), y = b.y.narrow(0, rank * half, half);
      if (k < 2) {
        auto guard = ddp.no_sync();
        loss_of(model, run.forward(x), y).backward();
      } else {
        loss_of(model, run.forward(x), y).backward();
      }
    }
    std::vector<torch::Tensor> grads;
    for (const auto& p : run.module->parameters()) grads.push_back(p.grad().clone());
    torch::save(grads, out + "/grads_rank" + std::to_string(rank) + ".pt");
    return 0;
  }
  if (scenario == "reload") {
    // Module::load after attaching: the next forward must say that the gradients would stay local.
    std::stringstream buffer;
    {
      torch::serialize::OutputArchive archive;
      run.module->save(archive);
      archive.save_to(buffer);
    }
    step_fn(0);
    torch::serialize::InputArchive archive;
    archive.load_from(buffer);
    run.module->load(archive);
    try {
      step_fn(1);
      std::ofstream(out + "/result_rank" + std::to_string(rank) + ".txt") << "ok\n";
    } catch (const std::exception& e) {
      std::ofstream(out + "/result_rank" + std::to_string(rank) + ".txt") << e.what() << "\n";
    }
    return 0;
  }
  if (scenario == "unused") {
    try {
      for (int64_t k = 0; k < 3; ++k) step_fn(k);
      std::ofstream(out + "/result_rank" + std::to_string(rank) + ".txt") << "ok\n";
    } catch (const std::exception& e) {
      std::ofstream(out + "/result_rank" + std::to_string(rank) + ".txt") << e.what() << "\n";
    }
    return 0;
  }
  if (scenario == "kill" || scenario == "hang") {
    auto start = std::chrono::steady_clock::now();
    try {
      for (int64_t k = 0; k < kSteps; ++k) {
        if (k == 5 && rank == 1) raise(scenario == "kill" ? SIGKILL : SIGSTOP);
        if (k == 5) start = std::chrono::steady_clock::now();
        step_fn(k);
      }
      std::ofstream(out + "/result_rank" + std::to_string(rank) + ".txt") << "no error\n";
      return 0;
    } catch (const std::exception& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::ofstream(out + "/result_rank" + std::to_string(rank) + ".txt") << s << "\n" << e.what() << "\n";
      std::_Exit(3);  // a peer is gone: leave without waiting for Gloo's threads
    }
  }
  if (scenario == "checkpoint") {
    const int64_t kill_at = extra.rfind("kill_at=", 0) == 0 ? std::stoll(extra.substr(8)) : -1;
    const std::string ckpt = out + "/checkpoint.pt";
    int64_t start = 0;
    if (auto step = torchcompile::load_checkpoint(ckpt, *run.module, opt)) {
      start = *step + 1;
      std::cout << "resumed after step " << *step << std::endl;
    }
    try {
      for (int64_t k = start; k < kSteps; ++k) {
        if (k == kill_at && rank == 1) raise(SIGKILL);
        step_fn(k);
        if (k % 5 == 4) torchcompile::save_checkpoint(ckpt, *run.module, opt, k, pg);
      }
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      std::_Exit(3);
    }
    save_params(out + "/final_rank" + std::to_string(rank) + ".pt", *run.module);
    return 0;
  }
  std::cerr << "unknown scenario " << scenario << "\n";
  return 2;
}
