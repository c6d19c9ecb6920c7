// Data-parallel training: two ranks started by torchcompile-launch (ddp_worker.cpp) on loopback,
// compared with each other and with one process training on the whole batch.
#include "distributed/ddp_common.h"

#include <torchcompile/distributed/ddp.h>
#include <torchcompile/support/logging.h>
#include <torchcompile/torchcompile.h>

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

using namespace ddp_test;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("torchcompile_ddp_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// Run two ranks of `ddp_worker args dir extra` (bounded by `limit_s`), the output appended to
// dir/log.txt; returns the launcher's exit status.
int launch(const std::string& args, const std::string& dir, const std::string& extra = "",
           const std::string& env = "", int limit_s = 240) {
  std::string cmd = "env " + env + " timeout -k 5 " + std::to_string(limit_s) + " " + TORCHCOMPILE_LAUNCH +
                    " --nproc 2 --grace 10 " + TORCHCOMPILE_DDP_WORKER + " " + args + " " + dir + " " + extra +
                    " >>" + dir + "/log.txt 2>&1";
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<torch::Tensor> load_tensors(const std::string& path) {
  std::vector<torch::Tensor> ts;
  torch::load(ts, path);
  return ts;
}

// One process training on the whole global batch (eager), parameters after every step.
std::vector<std::vector<torch::Tensor>> reference_run(const std::string& model) {
  torch::manual_seed(0);
  torchcompile_examples::Mlp net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::vector<std::vector<torch::Tensor>> out;
  for (int64_t k = 0; k < kSteps; ++k) {
    Batch b = global_batch(model, k);
    opt.zero_grad();
    loss_of(model, net->forward(b.x), b.y).backward();
    opt.step();
    std::vector<torch::Tensor> ps;
    for (const auto& p : net->parameters()) ps.push_back(p.detach().clone());
    out.push_back(ps);
  }
  return out;
}

class DdpTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(DdpTraining, MlpRanksIdenticalAndEqualToOneProcessOnTheWholeBatch) {
  at::set_num_threads(1);
  const std::string dir = fresh_dir("mlp_" + GetParam());
  ASSERT_EQ(launch("train " + GetParam() + " mlp", dir), 0) << read_text(dir + "/log.txt");
  auto reference = reference_run("mlp");
  for (int64_t k = 0; k < kSteps; ++k) {
    auto r0 = load_tensors(dir + "/rank0_step" + std::to_string(k) + ".pt");
    auto r1 = load_tensors(dir + "/rank1_step" + std::to_string(k) + ".pt");
    ASSERT_EQ(r0.size(), reference[k].size());
    for (size_t i = 0; i < r0.size(); ++i) {
      EXPECT_TRUE(torch::equal(r0[i], r1[i])) << "step " << k << " parameter " << i << " differs between ranks";
      EXPECT_TRUE(torch::allclose(r0[i], reference[k][i], 1e-5, 1e-7))
          << "step " << k << " parameter " << i << ": max difference from one process "
          << (r0[i] - reference[k][i]).abs().max().item<float>();
    }
  }
}

TEST_P(DdpTraining, CnnWithBatchNormRanksIdentical) {
  const std::string dir = fresh_dir("cnn_" + GetParam());
  ASSERT_EQ(launch("train " + GetParam() + " cnn", dir), 0) << read_text(dir + "/log.txt");
  for (int64_t k = 0; k < kSteps; ++k) {
    auto r0 = load_tensors(dir + "/rank0_step" + std::to_string(k) + ".pt");
    auto r1 = load_tensors(dir + "/rank1_step" + std::to_string(k) + ".pt");
    ASSERT_EQ(r0.size(), r1.size());
    for (size_t i = 0; i < r0.size(); ++i)
      EXPECT_TRUE(torch::equal(r0[i], r1[i])) << "step " << k << " parameter " << i << " differs between ranks";
    if (k == kSteps - 1) {  // it trained
      auto first = load_tensors(dir + "/rank0_step0.pt");
      EXPECT_FALSE(torch::equal(first[0], r0[0]));
    }
  }
}

// The all-reduce of the last layers' gradient bucket starts while the backward still computes
// the first layer's gradients (with 0.5 MiB buckets, fc2-fc4 and fc1 are two buckets, each its
// own part of the compiled graph; for the uncompiled module, autograd's own order).
TEST_P(DdpTraining, AllReduceOverlapsTheBackward) {
  const std::string dir = fresh_dir("overlap_" + GetParam());
  ASSERT_EQ(launch("overlap " + GetParam() + " wide", dir), 0) << read_text(dir + "/log.txt");
  EXPECT_GE(std::stoi(read_text(dir + "/buckets_rank0.txt")), 2);
  std::istringstream in(read_text(dir + "/times_rank0.txt"));
  std::vector<double> gaps;
  int64_t step, events;
  double gap_us;
  while (in >> step >> events >> gap_us)
    if (step >= 2) {
      EXPECT_GE(events, 2) << "all-reduces per backward";
      gaps.push_back(gap_us);
    }
  ASSERT_GE(gaps.size(), 10u);
  std::sort(gaps.begin(), gaps.end());
  // The median step: the first all-reduce was launched this long before the first layer's weight
  // gradient was computed (its GEMM alone takes milliseconds at this size on one thread; without
  // overlap, the whole backward runs before any all-reduce, and the gap is below zero or a few
  // microseconds of gradient accumulation).
  EXPECT_GT(gaps[gaps.size() / 2], 300.0) << "microseconds between the first all-reduce and the end of the backward";
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpTraining, ::testing::Values("none", "aot_eager", "default"));

TEST(Ddp, NoSyncAccumulatesThenReducesOnce) {
  const std::string dir = fresh_dir("nosync");
  ASSERT_EQ(launch("nosync default mlp", dir), 0) << read_text(dir + "/log.txt");
  auto g0 = load_tensors(dir + "/grads_rank0.pt"), g1 = load_tensors(dir + "/grads_rank1.pt");
  torch::manual_seed(0);
  torchcompile_examples::Mlp net;
  for (int64_t k = 0; k < 3; ++k) {
    Batch b = global_batch("mlp", k);
    loss_of("mlp", net->forward(b.x), b.y).backward();
  }
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(g0[i], g1[i])) << "gradient " << i << " differs between ranks";
    EXPECT_TRUE(torch::allclose(g0[i], params[i].grad(), 1e-5, 1e-7)) << "gradient " << i;
  }
}

TEST(Ddp, UnusedParameterIsAnErrorNamingIt) {
  const std::string dir = fresh_dir("unused");
  ASSERT_EQ(launch("unused default unused", dir), 0) << read_text(dir + "/log.txt");
  const std::string r0 = read_text(dir + "/result_rank0.txt");
  EXPECT_NE(r0.find("spare.weight"), std::string::npos) << r0;
  EXPECT_NE(r0.find("with_find_unused_parameters(true)"), std::string::npos) << r0;

  const std::string dir2 = fresh_dir("unused_found");
  ASSERT_EQ(launch("unused default unused", dir2, "find_unused"), 0) << read_text(dir2 + "/log.txt");
  EXPECT_EQ(read_text(dir2 + "/result_rank0.txt"), "ok\n");
  EXPECT_EQ(read_text(dir2 + "/result_rank1.txt"), "ok\n");
}

// A rank that stops responding without ending (stopped by SIGSTOP): the other one's backward
// throws once the timeout has passed, naming it; the launcher then terminates the stopped rank.
TEST(Ddp, HungRankTimesOutNamingIt) {
  const std::string dir = fresh_dir("hang");
  const int status = launch("hang default mlp", dir, "", "TORCHCOMPILE_DIST_TIMEOUT=3", 120);
  EXPECT_NE(status, 0);
  std::istringstream r0(read_text(dir + "/result_rank0.txt"));
  double waited = 1e9;
  r0 >> waited;
  std::string message((std::istreambuf_iterator<char>(r0)), std::istreambuf_iterator<char>());
  EXPECT_GE(waited, 2.5) << message;
  EXPECT_LT(waited, 3.0 + 5.0) << message;
  // Gloo's own receive timeout (the process group's, the same 3 s) and the watchdog race to fail
  // the all-reduce first; either says that it timed out.
  EXPECT_TRUE(message.find("did not complete within the timeout of 3") != std::string::npos ||
              message.find("Timed out waiting 3000ms") != std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 1 (process"), std::string::npos) << message;
  EXPECT_NE(message.find("is stopped"), std::string::npos) << message;
}

TEST(Ddp, ParametersGivenNewStorageAfterAttachingAreAnError) {
  const std::string dir = fresh_dir("reload");
  ASSERT_EQ(launch("reload default mlp", dir), 0) << read_text(dir + "/log.txt");
  const std::string r0 = read_text(dir + "/result_rank0.txt");
  EXPECT_NE(r0.find("parameter fc1.weight was given new data"), std::string::npos) << r0;
}

TEST(Ddp, LostRankIsNamedWithinTheTimeout) {
  const std::string dir = fresh_dir("kill");
  auto start = std::chrono::steady_clock::now();
  const int status = launch("kill default mlp", dir, "", "TORCHCOMPILE_DIST_TIMEOUT=20", 120);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(status, 0);
  const std::string log = read_text(dir + "/log.txt");
  EXPECT_NE(log.find("rank 1 (pid"), std::string::npos) << log;  // the launcher reports the killed rank
  std::istringstream r0(read_text(dir + "/result_rank0.txt"));
  double waited = 1e9;
  r0 >> waited;
  std::string message((std::istreambuf_iterator<char>(r0)), std::istreambuf_iterator<char>());
  EXPECT_LT(waited, 20.0 + 5.0) << message;
  EXPECT_NE(message.find("lost rank 1"), std::string::npos) << message;
  EXPECT_LT(seconds, 100.0);
}

// Uncompiled, the resumed run is bit-identical to the uninterrupted one. Compiled, the first call
// after a restart is a tracing call, which runs ATen's eager kernels where the uninterrupted run
// ran the compiled graph (other kernels, other rounding): equal within rtol 1e-5.
class DdpCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(DdpCheckpoint, RestartFromCheckpointReproducesTheUninterruptedRun) {
  const std::string b = GetParam();
  const std::string whole = fresh_dir("ckpt_whole_" + b), broken = fresh_dir("ckpt_broken_" + b);
  ASSERT_EQ(launch("checkpoint " + b + " mlp", whole), 0) << read_text(whole + "/log.txt");
  // Rank 1 dies at step 12 (the last checkpoint: after step 9); the job fails; a rerun resumes.
  EXPECT_NE(launch("checkpoint " + b + " mlp", broken, "kill_at=12", "TORCHCOMPILE_DIST_TIMEOUT=20", 120), 0);
  ASSERT_TRUE(fs::exists(broken + "/checkpoint.pt"));
  ASSERT_FALSE(fs::exists(broken + "/final_rank0.pt"));
  ASSERT_EQ(launch("checkpoint " + b + " mlp", broken), 0) << read_text(broken + "/log.txt");
  EXPECT_NE(read_text(broken + "/log.txt").find("resumed after step 9"), std::string::npos);
  auto p = load_tensors(whole + "/final_rank0.pt"), q = load_tensors(broken + "/final_rank0.pt");
  auto q1 = load_tensors(broken + "/final_rank1.pt");
  ASSERT_EQ(p.size(), q.size());
  for (size_t i = 0; i < p.size(); ++i) {
    if (b == "none")
      EXPECT_TRUE(torch::equal(p[i], q[i])) << "parameter " << i << ": max difference "
                                            << (p[i] - q[i]).abs().max().item<float>();
    else
      EXPECT_TRUE(torch::allclose(p[i], q[i], 1e-5, 1e-7)) << "parameter " << i << ": max difference "
                                                           << (p[i] - q[i]).abs().max().item<float>();
    EXPECT_TRUE(torch::equal(q[i], q1[i])) << "parameter " << i << " differs between ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpCheckpoint, ::testing::Values("none", "default"));

// ---- in one process (a world of one rank; these also run under ThreadSanitizer: test/tsan) ----

c10::intrusive_ptr<c10d::ProcessGroup> world_of_one(const std::string& name) {
  const std::string file = fresh_dir(name) + "/store";
  return torchcompile::init_process_group(torchcompile::ProcessGroupOptions()
                                              .with_init_method("file://" + file)
                                              .with_world_size(1)
                                              .with_rank(0)
                                              .with_hostname("127.0.0.1"));
}

// 10 SGD steps of the wide MLP through `backend` ("none": uncompiled), with or without DDP.
std::vector<torch::Tensor> train_alone(const std::string& backend, bool with_ddp) {
  torch::manual_seed(0);
  WideMlp net;
  std::unique_ptr<torchcompile::DistributedDataParallel> ddp;
  if (with_ddp)
    ddp = std::make_unique<torchcompile::DistributedDataParallel>(
        net, world_of_one("alone_" + backend), torchcompile::DistributedOptions().with_bucket_cap_mb(0.5));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::function<torch::Tensor(const torch::Tensor&)> fwd;
  if (backend == "none") {
    fwd = [net](const torch::Tensor& x) { return torchcompile::call(net, x); };
  } else {
    auto compiled = std::make_shared<decltype(torch::compile(net, backend))>(torch::compile(net, backend));
    fwd = [compiled](const torch::Tensor& x) { return (*compiled)(x); };
  }
  for (int64_t k = 0; k < 10; ++k) {
    Batch b = global_batch("wide", k);
    opt.zero_grad();
    loss_of("wide", fwd(b.x), b.y).backward();
    opt.step();
  }
  if (ddp) EXPECT_EQ(ddp->last_comm_events().size(), ddp->bucket_indices().size());
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

class DdpSingleProcess : public ::testing::TestWithParam<std::string> {};

TEST_P(DdpSingleProcess, WorldOfOneTrainsAsWithoutIt) {
  auto plain = train_alone(GetParam(), false), with = train_alone(GetParam(), true);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(torch::allclose(plain[i], with[i], 1e-5, 1e-7))
        << "parameter " << i << ": max difference " << (plain[i] - with[i]).abs().max().item<float>();
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpSingleProcess, ::testing::Values("none", "aot_eager", "default"));

// A module compiled and trained before DistributedDataParallel is attached: attaching registers
// hooks on it, which its guards notice, so the next call compiles again, split at the buckets.
TEST(DdpSingleProcess, CompiledBeforeAttachingIsSplitAfterwards) {
  torch::manual_seed(0);
  WideMlp net;
  auto compiled = torch::compile(net, "aot_eager");
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
  auto step = [&](int64_t k) {
    Batch b = global_batch("wide", k);
    opt.zero_grad();
    loss_of("wide", compiled(b.x), b.y).backward();
    opt.step();
  };
  torchcompile::logging::set_logs("passes");
  ::testing::internal::CaptureStderr();
  step(0);
  const std::string before = ::testing::internal::GetCapturedStderr();
  torchcompile::DistributedDataParallel ddp(net, world_of_one("late"),
                                            torchcompile::DistributedOptions().with_bucket_cap_mb(0.5));
  ::testing::internal::CaptureStderr();
  step(1);
  step(2);
  const std::string after = ::testing::internal::GetCapturedStderr();
  torchcompile::logging::reset_logs();
  EXPECT_EQ(before.find("gradient bucket"), std::string::npos) << before;
  EXPECT_NE(after.find("split at 1 gradient bucket boundaries"), std::string::npos) << after;
  EXPECT_EQ(ddp.last_comm_events().size(), 2u);
}

TEST(DdpSingleProcess, InitProcessGroupErrorsSayWhatWasExpected) {
  auto message = [](const torchcompile::ProcessGroupOptions& o) {
    try {
      torchcompile::init_process_group(o);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  using O = torchcompile::ProcessGroupOptions;
  EXPECT_NE(message(O().with_backend("nccl").with_rank(0).with_world_size(1)).find("expected backend \"gloo\""),
            std::string::npos);
  EXPECT_NE(message(O().with_rank(2).with_world_size(2)).find("expected a rank in [0, 2), got 2"), std::string::npos);
  EXPECT_NE(message(O().with_rank(0).with_world_size(1).with_init_method("udp://x")).find("expected init_method"),
            std::string::npos);
  EXPECT_NE(message(O().with_rank(0).with_world_size(1).with_init_method("tcp://127.0.0.1:99999"))
                .find("expected a master port in [1, 65535], got 99999"),
            std::string::npos);
  unsetenv("RANK");
  EXPECT_NE(message(O().with_world_size(1)).find("RANK is not set"), std::string::npos);
  setenv("TORCHCOMPILE_DIST_TIMEOUT", "soon", 1);
  EXPECT_NE(message(O().with_rank(0).with_world_size(1)).find("TORCHCOMPILE_DIST_TIMEOUT must be a positive"),
            std::string::npos);
  unsetenv("TORCHCOMPILE_DIST_TIMEOUT");
}

}  // namespace
