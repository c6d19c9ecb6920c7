#include "compile/pipeline.h"

#include "backends/verify_text.h"
#include "compile/gradient_buckets.h"

#include "repro/repro_internal.h"
#include "support/error_text.h"

#include <torchcompile/compile/partitioner.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>
#include <torchcompile/support/logging.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <memory>
#include <optional>
#include <unordered_set>

namespace torchcompile::compile_stage {

namespace {

using logging::LogKind;

// Drop attributes no get_attr node reads any more (after dead-code elimination).
void remove_unused_attributes(GraphModule& gm) {
  std::unordered_set<std::string> used;
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == ir::NodeKind::GetAttr) used.insert(n->target());
  std::vector<std::string> unused;
  for (const auto& kv : gm.attributes())
    if (!used.count(kv.first)) unused.push_back(kv.first);
  for (const auto& name : unused) gm.remove_attribute(name);
}

}  // namespace

CompiledFn call_backend(const Backend& backend, const std::string& name, GraphModule& gm,
                        const std::vector<at::Tensor>& example_inputs) {
  CompileReport* report = detail::current_report();
  const size_t recorded = report ? report->attempts.size() : 0;
  auto record = [&](BackendAttempt::Outcome outcome, std::string reason) {
    if (!report || report->attempts.size() != recorded) return;  // a nested chain recorded its own
    report->attempts.push_back({name, outcome, std::move(reason)});
  };
  detail::take_decline_reason();  // a stale reason from a decline outside any pipeline
  detail::verify_text_round_trip(gm, example_inputs);
  CompiledFn fn;
  try {
    fn = backend(gm, example_inputs);
  } catch (const std::exception& e) {
    record(BackendAttempt::Outcome::Failed, support::error_message(e));
    throw;
  }
  std::string reason = detail::take_decline_reason();
  if (fn) {
    record(BackendAttempt::Outcome::Compiled, "");
    if (report && report->backend.empty()) report->backend = name;
  } else {
    record(BackendAttempt::Outcome::Declined, std::move(reason));
  }
  return fn;
}

CompiledGraph compile_graph(GraphModule& gm, const std::vector<at::Tensor>& example_inputs, const Backend& backend,
                            const std::string& backend_name, const std::string& owner) {
  CompiledGraph out;
  detail::ReportScope scope(&out.report);
  TORCHCOMPILE_LOG(LogKind::Passes, "torch::compile(", owner, "): compiling a graph of ", gm.graph().nodes().size(),
                   " nodes with backend '", backend_name, "'");
  {
    TimedStep step("lint (the captured graph)");
    ir::lint(gm.graph());
  }
  {
    TimedStep step("dead-code elimination", &gm);
    ir::eliminate_dead_code(gm.graph());
    remove_unused_attributes(gm);
    ir::lint(gm.graph());
  }
  // A graph without operators (a segment between two graph breaks that only reads, a forward
  // returning its input) has nothing to compile: as torch.compile, the backend is not called.
  bool any_operator = false;
  for (const auto& n : gm.graph().nodes())
    any_operator = any_operator || n->kind() == ir::NodeKind::CallFunction || n->kind() == ir::NodeKind::CallModule;
  if (!any_operator) {
    out.fn = ir::interpreter_fn(gm);
    out.report.backend = "interpreter";
    TORCHCOMPILE_LOG(LogKind::Passes, "torch::compile(", owner, "): the graph has no operator: backend '", backend_name,
                     "' is not called");
    return out;
  }
  // TORCHCOMPILE_REPRO_AFTER=backend: keep the graph as the backend receives it, for a repro.
  const std::optional<repro::detail::Config> repro_cfg = repro::detail::config_from_env();
  std::shared_ptr<const GraphModule> as_received;
  if (repro_cfg) as_received = ir::copy_module(gm);
  // Data-parallel training: one part per gradient bucket, each compiled by the backend
  // (compile/gradient_buckets.h).
  Backend chosen = backend;
  std::string chosen_name = backend_name;
  if (auto buckets = gradient_bucket_groups(gm); !buckets.empty()) {
    std::vector<PartitionBackend> parts;
    for (size_t k = 0; k < buckets.size(); ++k) {
      std::unordered_set<const ir::Node*> mine(buckets[k].begin(), buckets[k].end());
      parts.push_back(PartitionBackend{
          backend_name + " (gradient bucket " + std::to_string(k) + ")",
          [mine](const GraphModule&, const std::vector<at::Tensor>&) { return mine; }, backend});
    }
    chosen = partitioned_backend(std::move(parts));
    chosen_name = backend_name + " split at " + std::to_string(buckets.size() - 1) + " gradient bucket boundaries";
    TORCHCOMPILE_LOG(LogKind::Passes, "torch::compile(", owner, "): the graph reads parameters of ", buckets.size(),
                     " gradient buckets of DistributedDataParallel: compiled as one part per bucket");
  }
  {
    TimedStep step("backend " + chosen_name);
    try {
      out.fn = call_backend(chosen, chosen_name, gm, example_inputs);
    } catch (const std::exception& e) {
      if (repro_cfg) {
        repro::detail::write_failure(*repro_cfg, *as_received, example_inputs, backend_name,
                                     repro::Failure::CompileError, support::error_message(e),
                                     repro::detail::rng_state());
      }
      throw;
    }
  }
  if (out.fn && repro_cfg && repro_cfg->level >= 2)
    out.fn = repro::detail::watch(*repro_cfg, std::move(as_received), backend_name, std::move(out.fn));
  if (!out.fn) {
    out.fn = ir::interpreter_fn(gm);
    out.report.backend = "interpreter";
  }
  if (logging::log_enabled(LogKind::Passes)) {
    std::string msg = "torch::compile(" + owner + "): graph ";
    for (const auto& line : out.report.describe()) msg += line + "\n";
    logging::log(LogKind::Passes, msg);
  }
  return out;
}

}  // namespace torchcompile::compile_stage
