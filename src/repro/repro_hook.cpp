// TORCHCOMPILE_REPRO_*: the compile pipeline writes a repro directory when a backend fails to
// compile a graph, fails running it, or (level 4) computes a wrong result.
#include "repro/repro_internal.h"

#include "backends/registry_internal.h"
#include "support/error_text.h"

#include <torchcompile/ir/printer.h>
#include <torchcompile/support/logging.h>

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>

namespace torchcompile::repro::detail {

using support::error_message;

namespace {

void warn_bad_setting_once(const std::string& message) {
  static std::mutex m;
  static std::vector<std::string> warned;
  std::lock_guard<std::mutex> lock(m);
  if (std::find(warned.begin(), warned.end(), message) != warned.end()) return;
  warned.push_back(message);
  TORCH_WARN(message);
}

// A directory name of its own for each repro of this process.
std::string next_directory(const Config& cfg, const std::string& backend, Failure failure) {
  static std::atomic<int> counter{0};
  std::string safe;
  for (char c : backend) safe += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ? c : '_';
  return (std::filesystem::path(cfg.dir) /
          (safe + "-" + failure_name(failure) + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
      .string();
}

}  // namespace

std::optional<Config> config_from_env() {
  const char* after = std::getenv("TORCHCOMPILE_REPRO_AFTER");
  if (after == nullptr || *after == '\0') return std::nullopt;
  if (std::string(after) != "backend") {
    warn_bad_setting_once(std::string("TORCHCOMPILE_REPRO_AFTER='") + after +
                          "' is not supported (expected 'backend'): no repros are written");
    return std::nullopt;
  }
  Config cfg;
  if (const char* level = std::getenv("TORCHCOMPILE_REPRO_LEVEL"); level && *level) {
    const std::string s(level);
    if (s.size() == 1 && s[0] >= '1' && s[0] <= '4') {
      cfg.level = s[0] - '0';
    } else {
      warn_bad_setting_once("TORCHCOMPILE_REPRO_LEVEL='" + s + "' is not one of 1, 2, 3, 4: using 2");
    }
  }
  const char* dir = std::getenv("TORCHCOMPILE_REPRO_DIR");
  cfg.dir = dir && *dir ? dir : (std::filesystem::current_path() / "torchcompile_repro").string();
  if (const char* tol = std::getenv("TORCHCOMPILE_REPRO_TOLERANCE"); tol && *tol) {
    char* end = nullptr;
    double v = std::strtod(tol, &end);
    if (end && *end == '\0' && v > 0) {
      cfg.tolerance = v;
    } else {
      warn_bad_setting_once(std::string("TORCHCOMPILE_REPRO_TOLERANCE='") + tol + "' is not a positive number: using 1e-3");
    }
  }
  return cfg;
}

std::string write_failure(const Config& cfg, const ir::GraphModule& gm, const std::vector<at::Tensor>& inputs,
                          const std::string& backend, Failure failure, const std::string& message,
                          const at::Tensor& rng) {
  const std::string dir = next_directory(cfg, backend, failure);
  try {
    Repro r;
    r.gm = copy_with_attributes(gm);
    r.inputs = copy_tensors(inputs);
    r.backend = backend;
    r.plugin = torchcompile::detail::plugin_of_backend(backend);
    r.failure = failure;
    r.error = message;
    r.tolerance = cfg.tolerance;
    r.rng_state = rng;
    r.libtorch_version = TORCH_VERSION;
    save(r, dir);
    write_program(r, dir);
    std::string note = "repro written to " + dir + " (replay: torchcompile-minify --replay " + dir + ")";
    if (cfg.level >= 3) {
      std::ostringstream log;
      Repro small = minify(r, MinifyOptions{false, &log});
      const std::string min_dir = (std::filesystem::path(dir) / "minified").string();
      save(small, min_dir);
      write_program(small, min_dir);
      note += "; minified to " + std::to_string(count_calls(small.gm->graph())) + " call_function nodes in " +
              min_dir + ":\n" + ir::tabular_string(small.gm->graph());
      TORCHCOMPILE_LOG(logging::LogKind::Passes, log.str());
    }
    TORCH_WARN("backend '", backend, "' ", failure == Failure::CompileError ? "failed to compile a graph"
                                           : failure == Failure::RunError   ? "failed running a compiled graph"
                                                                            : "computed a wrong result",
               " (", message.substr(0, message.find('\n')), "); ", note);
    return dir;
  } catch (const std::exception& e) {
    TORCH_WARN("backend '", backend, "' failed (", failure_name(failure), ") but its repro could not be written to ",
               dir, ": ", error_message(e));
    return "";
  }
}

CompiledFn watch(const Config& cfg, std::shared_ptr<const ir::GraphModule> gm, const std::string& backend,
                 CompiledFn fn) {
  // One repro per compiled graph: the first failure is the one to look at.
  auto written = std::make_shared<std::atomic<bool>>(false);
  return [cfg, gm = std::move(gm), backend, fn = std::move(fn), written](std::vector<at::Tensor> inputs) {
    // The inputs before the call (an in-place op of the graph may change them), the buffers
    // (BatchNorm's running statistics), the generator.
    std::vector<at::Tensor> before = copy_tensors(inputs);
    std::unique_ptr<ir::GraphModule> state_before;
    if (cfg.level >= 4) state_before = copy_with_attributes(*gm);
    at::Tensor rng = rng_state();
    std::vector<at::Tensor> outputs;
    try {
      outputs = fn(std::move(inputs));
    } catch (const std::exception& e) {
      if (!written->exchange(true)) write_failure(cfg, *gm, before, backend, Failure::RunError, error_message(e), rng);
      throw;
    }
    if (state_before && !written->load()) {
      std::string mismatch;
      try {
        mismatch = accuracy_mismatch(*state_before, before, outputs, cfg.tolerance, rng);
      } catch (const std::exception& e) {
        warn_bad_setting_once("TORCHCOMPILE_REPRO_LEVEL=4: the interpreter could not run a graph compiled by '" +
                              backend + "' for comparison: " + error_message(e));
      }
      if (!mismatch.empty() && !written->exchange(true))
        write_failure(cfg, *state_before, before, backend, Failure::Accuracy, mismatch, rng);
    }
    return outputs;
  };
}

}  // namespace torchcompile::repro::detail
