// save_checkpoint / load_checkpoint: module state, optimizer state and step in one archive,
// written by rank 0 and renamed into place.
#include <torchcompile/distributed/ddp.h>
#include <torchcompile/hooks/hooks.h>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace torchcompile {

void save_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                     int64_t step, const c10::intrusive_ptr<c10d::ProcessGroup>& process_group) {
  TORCH_CHECK(process_group, "torchcompile::save_checkpoint: expected a process group, got null");
  if (process_group->getRank() == 0) {
    torch::serialize::OutputArchive archive, module_archive, optimizer_archive;
    // The module's state_dict by position (its keys are qualified names, which an archive does
    // not take as keys); loaded back in place (see load_checkpoint).
    int64_t i = 0;
    for (const auto& item : state_dict(module)) module_archive.write("t" + std::to_string(i++), item.value());
    module_archive.write("count", at::scalar_tensor(i, at::kLong));
    optimizer.save(optimizer_archive);
    archive.write("module", module_archive);
    archive.write("optimizer", optimizer_archive);
    archive.write("step", at::scalar_tensor(step, at::kLong));
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    archive.save_to(tmp);
    TORCH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "torchcompile::save_checkpoint: could not rename ", tmp,
                " to ", path);
  }
  process_group->barrier()->wait();
}

std::optional<int64_t> load_checkpoint(const std::string& path, torch::nn::Module& module,
                                       torch::optim::Optimizer& optimizer) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  torch::serialize::InputArchive archive, module_archive, optimizer_archive;
  archive.load_from(path);
  TORCH_CHECK(archive.try_read("module", module_archive) && archive.try_read("optimizer", optimizer_archive),
              "torchcompile::load_checkpoint: expected ", path, " to be written by torchcompile::save_checkpoint ",
              "(entries \"module\", \"optimizer\" and \"step\")");
  // In place (torchcompile::load_state_dict copies into the existing tensors): Module::load
  // would give the parameters new storage, and c10d's Reducer, which DistributedDataParallel
  // registered them with, then no longer reduces their gradients.
  StateDict current = state_dict(module), loaded;
  at::Tensor count;
  module_archive.read("count", count);
  TORCH_CHECK(count.item<int64_t>() == static_cast<int64_t>(current.size()), "torchcompile::load_checkpoint: ", path,
              " holds ", count.item<int64_t>(), " parameters and buffers; the module has ", current.size());
  int64_t i = 0;
  for (const auto& item : current) {
    at::Tensor t;
    module_archive.read("t" + std::to_string(i++), t);
    loaded.insert(item.key(), t);
  }
  load_state_dict(module, loaded, /*strict=*/true);
  optimizer.load(optimizer_archive);
  at::Tensor step;
  archive.read("step", step);
  return step.item<int64_t>();
}

}  // namespace torchcompile
