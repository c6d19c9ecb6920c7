// compile_per_shape (backends/backend.h): a backend that compiles for concrete sizes, serving a
// graph with size symbols.
#include <torchcompile/backends/backend.h>

#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/split.h>
#include <torchcompile/support/logging.h>

#include <c10/util/Exception.h>

#include "capture/metadata_at.h"
#include "ir/effects.h"
#include "support/by_size.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace torchcompile {

const char* const detail::kDeclinedAtExampleSizes = "at the example sizes: ";

namespace {

using SizeValues = support::SizeKey;

struct Specialization {
  std::shared_ptr<GraphModule> gm;  // the static graph its compiled form reads
  CompiledFn fn;
};

class PerShape {
 public:
  PerShape(GraphModule& gm, Backend static_backend)
      : gm_(gm),
        static_backend_(std::move(static_backend)),
        metadata_without_data_(pure_with_data_independent_sizes(gm)),
        bindings_(gm.graph().symbol_bindings()) {}

  SizeValues key_of(const std::vector<at::Tensor>& inputs) const {
    SizeValues key;
    key.reserve(bindings_.size());
    for (const auto& [input, dim] : bindings_) {
      TORCH_CHECK(input < inputs.size() && inputs[input].defined() && dim < inputs[input].dim(),
                  "compile_per_shape: input ", input, " does not have the dimension ", dim,
                  " that binds a size symbol");
      key.push_back(inputs[input].size(dim));
    }
    return key;
  }

  // The static graph at the example sizes (exactly as traced), compiled now.
  CompiledFn compile_example(const std::vector<at::Tensor>& example_inputs) {
    auto gm = static_copy(gm_.graph().symbol_examples());
    CompiledFn fn = static_backend_(*gm, example_inputs);
    if (!fn) return fn;
    insert(key_of(example_inputs), Specialization{gm, fn});
    return fn;
  }

  std::vector<at::Tensor> operator()(std::vector<at::Tensor> inputs) {
    const SizeValues key = key_of(inputs);
    if (auto s = find(key)) return s->fn(std::move(inputs));
    std::lock_guard<std::mutex> one_at_a_time(specialize_mutex_);
    if (auto s = find(key)) return s->fn(std::move(inputs));
    return specialize(key, std::move(inputs));
  }

 private:
  std::shared_ptr<const Specialization> find(const SizeValues& key) { return items_.find(key); }

  void insert(SizeValues key, Specialization s) {
    items_.insert(std::move(key), std::make_shared<const Specialization>(std::move(s)));
  }

  // A static copy of the graph at these sizes, compiled for the next calls with them; returns
  // this call's results. The copy's metadata comes from running its ops on meta tensors
  // (capture::metadata_at) and the compiled function computes this call, when the graph is pure
  // and no op's result sizes depend on the data; otherwise, or if that fails, from running the
  // graph on these inputs (the interpreter), whose results this call returns.
  std::vector<at::Tensor> specialize(const SizeValues& key, std::vector<at::Tensor> inputs) {
    const std::map<std::string, int64_t> values = gm_.graph().symbol_values(inputs);
    auto gm = static_copy(values);
    std::vector<ir::TensorMeta> input_metas;
    for (const at::Tensor& t : inputs) input_metas.push_back(ir::TensorMeta::of(t));
    if (metadata_without_data_) {
      try {
        set_metadata(*gm, input_metas, capture::metadata_at(*gm, input_metas), /*keep_device=*/true);
        std::string how;
        CompiledFn fn = compile(*gm, inputs, how);
        std::vector<at::Tensor> outputs = fn(inputs);
        TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "compile_per_shape: new sizes ", c10::IntArrayRef(key), ": ", how);
        insert(key, Specialization{gm, std::move(fn)});
        return outputs;
      } catch (const std::exception& e) {
        // A pure graph: running it again below changes nothing but the time.
        TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "compile_per_shape: new sizes ", c10::IntArrayRef(key),
                         ": the graph's metadata from meta tensors did not serve (", e.what(),
                         "); recording it on the inputs");
        gm = static_copy(values);
      }
    }
    std::unordered_map<std::string, std::vector<ir::TensorMeta>> seen;
    std::vector<at::Tensor> outputs;
    {
      ir::Interpreter recording(*gm);
      recording.override_if([](const ir::Node&) { return true; },
                            [&seen](const ir::Node& n, const std::vector<c10::IValue>& args) {
                              std::vector<at::Tensor> out = ir::run_target(n, args);
                              std::vector<ir::TensorMeta>& metas = seen[n.name()];
                              for (const at::Tensor& t : out) metas.push_back(ir::TensorMeta::of(t));
                              return out;
                            });
      outputs = recording.run(inputs);
    }
    set_metadata(*gm, input_metas, std::move(seen));
    std::string how;
    CompiledFn fn = compile(*gm, inputs, how);
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "compile_per_shape: new sizes ", c10::IntArrayRef(key), ": ", how);
    insert(key, Specialization{gm, std::move(fn)});
    return outputs;
  }

  // A copy of the graph without symbols: its size expressions take `values`.
  std::shared_ptr<GraphModule> static_copy(const std::map<std::string, int64_t>& values) const {
    auto gm = std::shared_ptr<GraphModule>(ir::copy_module(gm_));
    gm->graph().clear_symbols(values);
    return gm;
  }

  // Gives every node of `gm` the metadata `seen` has for it (by name), placeholders `inputs`'.
  // With `keep_device`, each value keeps the device and requires_grad of its traced metadata
  // (`seen` comes from meta tensors).
  static void set_metadata(GraphModule& gm, const std::vector<ir::TensorMeta>& inputs,
                           std::unordered_map<std::string, std::vector<ir::TensorMeta>> seen,
                           bool keep_device = false) {
    size_t input = 0;
    for (const auto& node : gm.graph().nodes()) {
      ir::Node* n = node.get();
      if (n->kind() == ir::NodeKind::Placeholder) {
        n->set_output_meta(0, inputs.at(input++));
        continue;
      }
      auto it = seen.find(n->name());
      if (it == seen.end()) continue;
      TORCH_CHECK(it->second.size() == n->num_outputs(), "compile_per_shape: node '", n->name(), "' returned ",
                  it->second.size(), " values at new sizes; the graph has ", n->num_outputs());
      for (size_t i = 0; i < it->second.size(); ++i) {
        ir::TensorMeta& m = it->second[i];
        if (keep_device) {
          const ir::TensorMeta& traced = n->output_meta()[i];
          m.device = traced.device;
          m.requires_grad = traced.requires_grad;
        }
        n->set_output_meta(i, std::move(m));
      }
    }
  }

  // The static backend's function for `gm`, or the interpreter's where it declines or fails
  // (`how` says which).
  CompiledFn compile(GraphModule& gm, const std::vector<at::Tensor>& inputs, std::string& how) {
    CompiledFn fn;
    try {
      fn = static_backend_(gm, inputs);
      how = fn ? "compiled" : "declined (" + detail::take_decline_reason() + "); the interpreter runs them";
    } catch (const std::exception& e) {
      how = std::string("failed (") + e.what() + "); the interpreter runs them";
    }
    if (!fn) fn = ir::interpreter_fn(gm);
    return fn;
  }

  // Whether specialize may take a new size's metadata from meta tensors (see there).
  static bool pure_with_data_independent_sizes(const GraphModule& gm) {
    return !ir::effects_of(gm).any() && ir::first_node_with_data_dependent_sizes(gm.graph()) == nullptr;
  }

  GraphModule& gm_;  // the graph with symbols; the runtime keeps it alive as long as the CompiledFn
  Backend static_backend_;
  bool metadata_without_data_;
  std::vector<std::pair<size_t, int64_t>> bindings_;
  std::mutex specialize_mutex_;
  support::BySize<std::shared_ptr<const Specialization>> items_;  // the 64 most recent sizes
};

}  // namespace

CompiledFn compile_per_shape(GraphModule& gm, const std::vector<at::Tensor>& example_inputs, Backend static_backend) {
  TORCH_CHECK(static_backend, "compile_per_shape: expected a backend, got an empty function");
  if (gm.graph().symbols().empty()) return static_backend(gm, example_inputs);
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == ir::NodeKind::CallModule)
      return decline("compile_per_shape: the graph calls the opaque module '" + n->target() +
                     "', whose metadata at other sizes cannot be recorded");
  auto per_shape = std::make_shared<PerShape>(gm, std::move(static_backend));
  if (!per_shape->compile_example(example_inputs)) {
    // The static backend declined the graph at the example sizes: not because of the symbols.
    return decline(std::string(detail::kDeclinedAtExampleSizes) + detail::take_decline_reason());
  }
  return [per_shape](std::vector<at::Tensor> inputs) { return (*per_shape)(std::move(inputs)); };
}

}  // namespace torchcompile
