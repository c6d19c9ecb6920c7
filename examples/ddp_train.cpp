// Data-parallel training on one machine or several: each process (rank) trains the same MLP on
// its share of every batch; DistributedDataParallel averages the gradients across ranks during
// the backward, so every rank takes the same optimizer step. The data is MNIST-like and made in
// the program: 28x28 images of 10 classes (a fixed random pattern per class plus noise).
//
//   torchcompile-launch --nproc 2 build/examples/ddp_train            # two processes, this machine
//   torchcompile-launch --nproc 2 build/examples/ddp_train --steps 300 --checkpoint /tmp/ddp.pt
//
// docs/distributed.md shows the multi-machine form. Options: --steps N (default 200),
// --batch N (global batch, default 128), --backend NAME (torch::compile backend, default
// "default"; "none" runs uncompiled), --checkpoint PATH (save every 50 steps; resume from it).
#include <torchcompile/distributed/ddp.h>
#include <torchcompile/torchcompile.h>

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <thread>
#include <string>

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 128))),
        fc3(register_module("fc3", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// `n` images (n, 784) and labels: the same on every rank for the same `seed`.
std::pair<torch::Tensor, torch::Tensor> make_digits(int64_t n, uint64_t seed) {
  torch::manual_seed(12345);  // the class patterns: fixed
  torch::Tensor patterns = torch::randn({10, 784});
  torch::manual_seed(seed);
  torch::Tensor labels = torch::randint(0, 10, {n});
  torch::Tensor images = 0.15 * patterns.index_select(0, labels) + torch::randn({n, 784});
  return {images, labels};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 200, batch = 128;
  std::string backend = "default", checkpoint;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "ddp_train: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps") steps = std::stoll(next());
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--backend") backend = next();
    else if (a == "--checkpoint") checkpoint = next();
    else {
      std::cerr << "ddp_train: unknown option " << a << "\n";
      return 2;
    }
  }
  if (!std::getenv("RANK")) {
    std::cerr << "ddp_train: RANK is not set. Start the ranks with torchcompile-launch, e.g.\n"
                 "  torchcompile-launch --nproc 2 "
              << argv[0] << "\n";
    return 2;
  }

  // One intra-op thread per rank when several ranks share this machine's cores.
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  if (local_world && std::atoi(local_world) > 1)
    torch::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::atoi(local_world)));

  auto pg = torchcompile::init_process_group();  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
  const int rank = pg->getRank(), world = pg->getSize();
  TORCH_CHECK(batch % world == 0, "ddp_train: the global batch (", batch, ") must divide by the number of ranks (",
              world, ")");

  torch::manual_seed(0);  // rank 0's initial parameters are broadcast anyway
  Mlp net;
  torchcompile::DistributedDataParallel ddp(net, pg);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  int64_t first = 0;
  if (!checkpoint.empty())
    if (auto step = torchcompile::load_checkpoint(checkpoint, *net, opt)) {
      first = *step + 1;
      if (rank == 0) std::cout << "resuming after step " << *step << "\n";
    }

  std::function<torch::Tensor(const torch::Tensor&)> forward;
  if (backend == "none") {
    forward = [net](const torch::Tensor& x) { return torchcompile::call(net, x); };  // fires DDP's hooks
  } else {
    auto compiled = std::make_shared<decltype(torch::compile(net, backend))>(torch::compile(net, backend));
    forward = [compiled](const torch::Tensor& x) { return (*compiled)(x); };
  }

  const int64_t share = batch / world;
  for (int64_t step = first; step < steps; ++step) {
    auto [x, y] = make_digits(batch, 1000 + step);                 // the global batch of this step
    x = x.narrow(0, rank * share, share), y = y.narrow(0, rank * share, share);  // this rank's share
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(forward(x), y);
    loss.backward();  // gradients averaged across ranks, bucket by bucket, during the backward
    opt.step();
    if (rank == 0 && (step % 50 == 0 || step == steps - 1))
      std::cout << "step " << step << " loss (rank 0's share) " << loss.item<float>() << std::endl;
    if (!checkpoint.empty() && step % 50 == 49) torchcompile::save_checkpoint(checkpoint, *net, opt, step, pg);
  }

  // Every rank holds the same parameters; rank 0 evaluates on held-out data.
  if (rank == 0) {
    torch::NoGradGuard no_grad;
    auto [x, y] = make_digits(2000, 999);
    const double accuracy = net->forward(x).argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
    std::cout << "held-out accuracy " << accuracy << " with " << world << " ranks" << std::endl;
  }
  return 0;
}
