#include "compile/autotune.h"

#include "compile/pipeline.h"
#include "ir/effects.h"

#include <torchcompile/backends/registry.h>
#include <torchcompile/compile/compile_report.h>
#include <torchcompile/ir/split.h>
#include <torchcompile/ir/structure.h>
#include <torchcompile/support/isa.h>
#include <torchcompile/support/logging.h>

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace torchcompile::compile_stage {
namespace {

using logging::LogKind;

constexpr const char* kModes = "\"default\" (compile with the backend as given) or \"max-autotune\" (also compile "
                               "each inference graph with onednn, fused and the interpreter, time them on the real "
                               "inputs, keep the fastest)";

// The built-ins a tuned graph may also run with, after the backend given.
const char* const kCandidates[] = {"default", "onednn", "fused", "eager"};

// Chosen backend per key: in memory, and in TORCHCOMPILE_CACHE_DIR/autotune-v1.txt.
struct Choices {
  std::mutex mu;
  std::unordered_map<std::string, std::string> chosen;
  bool loaded = false;

  static std::string file() {
    const char* dir = std::getenv("TORCHCOMPILE_CACHE_DIR");
    return dir && *dir ? std::string(dir) + "/autotune-v1.txt" : std::string();
  }
  std::optional<std::string> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    if (!loaded) {
      loaded = true;
      if (std::string f = file(); !f.empty()) {
        std::ifstream in(f);
        std::string line;
        while (std::getline(in, line)) {
          auto tab = line.rfind('\t');
          if (tab != std::string::npos) chosen[line.substr(0, tab)] = line.substr(tab + 1);
        }
      }
    }
    auto it = chosen.find(key);
    if (it == chosen.end()) return std::nullopt;
    return it->second;
  }
  void store(const std::string& key, const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    chosen[key] = name;
    if (std::string f = file(); !f.empty()) {
      // One line per write, appended (O_APPEND): processes sharing the directory interleave lines,
      // never parts of lines.
      std::string line = key + "\t" + name + "\n";
      if (FILE* out = std::fopen(f.c_str(), "a")) {
        std::fwrite(line.data(), 1, line.size(), out);
        std::fclose(out);
      }
    }
  }
};

Choices& choices() {
  static Choices c;
  return c;
}

void describe_tensor(std::ostream& s, const at::Tensor& t) {
  if (!t.defined()) {
    s << "undef";
    return;
  }
  s << c10::toString(t.scalar_type()) << t.sizes() << t.strides();
}

// What the timing depends on: the graph's structure, the inputs' and attributes' dtypes, sizes
// and strides, the ISA our kernels use, the intra-op thread count, the candidates.
std::string tuning_key(const GraphModule& gm, const std::vector<at::Tensor>& inputs, const std::string& backend_name) {
  std::ostringstream s;
  s << std::hex << ir::structural_hash(gm.graph()) << std::dec << "|";
  for (const at::Tensor& t : inputs) describe_tensor(s, t), s << ";";
  s << "|";
  for (const auto& [name, attr] : gm.attributes()) s << name << ":", describe_tensor(s, attr.first), s << ";";
  s << "|" << support::to_string(support::selected_isa()) << "|threads=" << at::get_num_threads() << "|" << backend_name;
  std::string key = s.str();
  std::replace(key.begin(), key.end(), '\t', ' ');
  std::replace(key.begin(), key.end(), '\n', ' ');
  return key;
}

// Median wall time of `fn` on `inputs` (ms): one warm-up call, then calls until ~20 ms have passed
// (at least 3, at most 50).
double time_ms(const CompiledFn& fn, const std::vector<at::Tensor>& inputs) {
  using Clock = std::chrono::steady_clock;
  fn(inputs);
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 3 || (t.size() < 50 && Clock::now() - start < std::chrono::milliseconds(20))) {
    const auto a = Clock::now();
    fn(inputs);
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

CompiledFn tuned(const Backend& backend, const std::string& backend_name, GraphModule& gm,
                 const std::vector<at::Tensor>& inputs) {
  // Only inference graphs without effects are run more than once: a training graph records
  // autograd, a graph that writes its inputs or buffers, draws random numbers or calls a module
  // would change state with every timing run.
  std::string why_not;
  if (needs_autograd(gm, inputs)) why_not = "it records autograd (training)";
  else if (ir::effects_of(gm).any()) why_not = "running it changes state (in-place updates, random numbers or module calls)";
  for (const at::Tensor& t : inputs)
    if (t.defined() && !t.device().is_cpu()) why_not = "an input is not on the CPU";
  if (!why_not.empty()) {
    TORCHCOMPILE_LOG(LogKind::Passes, "max-autotune: not tuned, ", why_not, ": backend ", backend_name);
    return call_backend(backend, backend_name, gm, inputs);
  }

  std::vector<std::pair<std::string, Backend>> candidates{{backend_name, backend}};
  for (const char* name : kCandidates)
    if (name != backend_name && has_backend(name)) candidates.emplace_back(name, lookup_backend(name));

  const std::string key = tuning_key(gm, inputs, backend_name);
  std::string summary;
  std::optional<std::string> winner = choices().find(key);
  if (winner) {
    summary = "max-autotune: " + *winner + " (chosen earlier, cached)";
  } else {
    at::NoGradGuard no_grad;
    double best = 0;
    for (const auto& [name, candidate] : candidates) {
      std::string outcome;
      try {
        auto copy = ir::copy_module(gm);
        CompileReport trial;
        CompiledFn fn;
        {
          torchcompile::detail::ReportScope scope(&trial);
          fn = candidate(*copy, inputs);
          torchcompile::detail::take_decline_reason();
        }
        if (!fn) {
          outcome = "declined";
        } else {
          const double ms = time_ms(fn, inputs);
          char buf[32];
          std::snprintf(buf, sizeof(buf), "%.3f ms", ms);
          outcome = buf;
          if (!winner || ms < best) winner = name, best = ms;
        }
      } catch (const std::exception& e) {
        outcome = "failed";
      }
      summary += (summary.empty() ? "" : ", ") + name + " " + outcome;
    }
    if (!winner) winner = backend_name;
    summary = "max-autotune: " + *winner + " (" + summary + ")";
    choices().store(key, *winner);
  }
  TORCHCOMPILE_LOG(LogKind::Passes, summary);
  for (const auto& [name, candidate] : candidates) {
    if (name != *winner) continue;
    CompiledFn fn = call_backend(candidate, name, gm, inputs);
    if (CompileReport* report = torchcompile::detail::current_report()) report->partition.push_back(summary);
    if (fn) return fn;
  }
  return call_backend(backend, backend_name, gm, inputs);  // a cached choice this build lacks
}

}  // namespace

namespace detail {
void forget_autotune_choices() {
  std::lock_guard<std::mutex> lock(choices().mu);
  choices().chosen.clear();
  choices().loaded = false;
}
}  // namespace detail

void check_mode(const std::string& mode) {
  if (mode == "default" || mode == "max-autotune" || mode == "max-autotune-no-cudagraphs") return;
  TORCH_CHECK(mode != "reduce-overhead", "torch::compile: mode \"reduce-overhead\" captures CUDA graphs in PyTorch to ",
              "cut launch overhead; this CPU build has nothing it would change. Expected ", kModes);
  TORCH_CHECK(false, "torch::compile: unknown mode \"", mode, "\"; expected ", kModes);
}

Backend with_mode(Backend backend, const std::string& backend_name, const std::string& mode) {
  check_mode(mode);
  if (mode == "default") return backend;
  return [backend = std::move(backend), backend_name](GraphModule& gm, const std::vector<at::Tensor>& inputs) {
    return tuned(backend, backend_name, gm, inputs);
  };
}

}  // namespace torchcompile::compile_stage
