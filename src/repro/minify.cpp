// The minifier: shrink a failing graph while it still fails the same way, with the interpreter
// as the oracle for accuracy failures; and the standalone program that replays a repro.
#include <torchcompile/repro/repro.h>

#include "repro/repro_internal.h"

#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>

#include <c10/util/Exception.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <sstream>
#include <unordered_map>

namespace torchcompile::repro {

namespace {

using Edit = std::function<void(ir::GraphModule& gm, std::vector<at::Tensor>& inputs)>;

// After an edit: drop dead nodes, attributes no node reads, and inputs no node reads.
void tidy(ir::GraphModule& gm, std::vector<at::Tensor>& inputs) {
  ir::Graph& g = gm.graph();
  ir::eliminate_dead_code(g);
  std::vector<ir::Node*> placeholders = g.placeholders();
  TORCH_CHECK(placeholders.size() == inputs.size(), "minify: the graph has ", placeholders.size(),
              " placeholders for ", inputs.size(), " inputs");
  for (size_t i = placeholders.size(); i-- > 0;) {
    if (placeholders[i]->has_uses()) continue;
    g.erase(placeholders[i]);
    inputs.erase(inputs.begin() + static_cast<std::ptrdiff_t>(i));
  }
  std::vector<std::string> read, unread;
  for (const auto& n : g.nodes())
    if (n->kind() == ir::NodeKind::GetAttr) read.push_back(n->target());
  for (const auto& kv : gm.attributes())
    if (std::find(read.begin(), read.end(), kv.first) == read.end()) unread.push_back(kv.first);
  for (const auto& name : unread) gm.remove_attribute(name);
  ir::lint(g);
}

std::vector<ir::Node*> calls(const ir::Graph& g) {
  std::vector<ir::Node*> out;
  for (const auto& n : g.nodes())
    if (n->kind() == ir::NodeKind::CallFunction) out.push_back(n.get());
  return out;
}

class Minifier {
 public:
  Minifier(const Repro& original, const MinifyOptions& options)
      : original_(original), options_(options), accuracy_(original.failure == Failure::Accuracy), current_(original) {}

  Repro run() {
    Outcome first = check(original_, accuracy_);
    TORCH_CHECK(same_failure(original_, first, options_.any_error), "minify: the repro does not fail as recorded (",
                failure_name(original_.failure), ": ", original_.error.substr(0, original_.error.find('\n')),
                "); replaying it gave ", first.describe());
    log("replayed: " + first.describe().substr(0, first.describe().find('\n')));
    // Start from a tidy graph (unused inputs and attributes dropped), if that still fails.
    try_edit("tidy", [](ir::GraphModule&, std::vector<at::Tensor>&) {});
    for (bool changed = true; changed && checks_ < kMaxChecks;) {
      changed = truncate();
      changed |= cut_inputs();
      changed |= remove_nodes();
    }
    log("minimized to " + std::to_string(count_calls(current_.gm->graph())) + " call_function nodes after " +
        std::to_string(checks_) + " checks");
    return current_;
  }

 private:
  static constexpr size_t kMaxChecks = 5000;

  void log(const std::string& line) {
    if (options_.log) *options_.log << "minify: " << line << "\n";
  }

  // Apply `edit` to a copy of the current repro; keep the copy if it is smaller or equal and
  // still fails the same way.
  bool try_edit(const std::string& what, const Edit& edit) {
    if (checks_ >= kMaxChecks) return false;
    Repro candidate = current_;
    std::shared_ptr<ir::GraphModule> gm(ir::copy_module(*current_.gm));
    try {
      edit(*gm, candidate.inputs);
      tidy(*gm, candidate.inputs);
    } catch (const std::exception&) {
      return false;  // not a valid graph
    }
    candidate.gm = gm;
    ++checks_;
    Outcome o;
    try {
      o = check(candidate, accuracy_);
    } catch (const std::exception&) {
      return false;
    }
    if (!same_failure(original_, o, options_.any_error)) return false;
    current_ = std::move(candidate);
    log(what + ": " + std::to_string(count_calls(current_.gm->graph())) + " call_function nodes");
    return true;
  }

  // Make the earliest value that still fails the graph's only output (everything after it goes).
  bool truncate() {
    std::vector<ir::Node*> nodes = calls(current_.gm->graph());
    for (size_t k = 0; k < nodes.size(); ++k) {
      const std::string name = nodes[k]->name();
      for (size_t j = 0; j < nodes[k]->num_outputs(); ++j) {
        if (!nodes[k]->output_meta()[j].defined) continue;
        bool last = k + 1 == nodes.size();
        if (last && is_only_output(nodes[k], j)) return false;
        auto edit = [&](ir::GraphModule& gm, std::vector<at::Tensor>&) {
          ir::Graph& g = gm.graph();
          ir::Node* keep = g.find_node(name);
          g.erase(g.output_node());
          while (g.nodes().back().get() != keep) g.erase(g.nodes().back().get());
          g.output({keep->output(j)});
        };
        if (try_edit("truncate after " + name, edit)) return true;
      }
    }
    return false;
  }

  bool is_only_output(ir::Node* n, size_t j) const {
    const auto& outs = current_.gm->graph().output_node()->args().at(0).list();
    return outs.size() == 1 && outs[0] && outs[0]->node == n && outs[0]->index == j;
  }

  // Each value every node computed (at its node, before later in-place updates).
  std::unordered_map<std::string, std::vector<at::Tensor>> values() {
    std::unordered_map<std::string, std::vector<at::Tensor>> out;
    auto gm = detail::copy_with_attributes(*current_.gm);
    ir::Interpreter interp(*gm);
    interp.override_if([](const ir::Node&) { return true; },
                       [&](const ir::Node& n, const std::vector<c10::IValue>& args) {
                         std::vector<at::Tensor> results = ir::run_target(n, args);
                         out[n.name()] = detail::copy_tensors(results);
                         return results;
                       });
    detail::RngScope rng(current_.rng_state);
    try {
      interp.run(detail::copy_tensors(current_.inputs));
    } catch (const std::exception&) {
      // a run error: the values before the failing node are known
    }
    return out;
  }

  // Replace a node's result by a new input holding what it computed (its producers then die).
  bool cut_inputs() {
    bool changed = false;
    auto computed = values();
    // By name: an accepted edit replaces the current graph (and its nodes).
    std::vector<std::string> names;
    for (ir::Node* n : calls(current_.gm->graph())) names.push_back(n->name());
    for (const std::string& name : names) {
      auto it = computed.find(name);
      if (it == computed.end()) continue;
      for (size_t j = 0; j < it->second.size(); ++j) {
        at::Tensor value = it->second[j];
        ir::Node* live = current_.gm->graph().find_node(name);
        if (!value.defined() || !live || j >= live->num_outputs() || live->uses(j).empty()) continue;
        auto edit = [&](ir::GraphModule& gm, std::vector<at::Tensor>& inputs) {
          ir::Graph& g = gm.graph();
          ir::Value v = g.placeholder(name + "_value", ir::TensorMeta::of(value));
          g.replace_all_uses(g.find_node(name)->output(j), v);
          inputs.push_back(value);
        };
        changed |= try_edit("replace " + name + " by an input", edit);
      }
    }
    return changed;
  }

  // Delete nodes: one without users (an in-place update), or one whose users can read one of
  // its tensor arguments of the same shape and dtype instead.
  bool remove_nodes() {
    bool changed = false;
    std::vector<ir::Node*> nodes = calls(current_.gm->graph());
    std::vector<std::string> names;
    for (ir::Node* n : nodes) names.push_back(n->name());
    for (size_t k = names.size(); k-- > 0;) {
      ir::Node* n = current_.gm->graph().find_node(names[k]);
      if (!n) continue;
      const std::string name = names[k];
      if (!n->has_uses()) {
        changed |= try_edit("delete " + name, [&](ir::GraphModule& gm, std::vector<at::Tensor>&) {
          gm.graph().erase(gm.graph().find_node(name));
        });
        continue;
      }
      if (n->num_outputs() != 1) continue;
      std::vector<std::string> operands;
      for (const auto& a : n->args()) {
        a.for_each_value([&](const ir::Value& v) {
          if (v.node->output_meta().at(v.index) == n->output_meta().at(0)) operands.push_back(v.node->name() + ":" + std::to_string(v.index));
        });
      }
      for (const std::string& operand : operands) {
        auto colon = operand.rfind(':');
        const std::string op_name = operand.substr(0, colon);
        const size_t op_index = std::stoul(operand.substr(colon + 1));
        auto edit = [&](ir::GraphModule& gm, std::vector<at::Tensor>&) {
          ir::Graph& g = gm.graph();
          ir::Node* node = g.find_node(name);
          g.replace_all_uses(node->output(0), g.find_node(op_name)->output(op_index));
          g.erase(node);
        };
        if (try_edit("delete " + name + " (its users read " + op_name + ")", edit)) {
          changed = true;
          break;
        }
      }
    }
    return changed;
  }

  const Repro& original_;
  const MinifyOptions& options_;
  const bool accuracy_;
  Repro current_;
  size_t checks_ = 0;
};

std::string cpp_string_literal_delimiter(const std::string& text) {
  std::string delim = "TORCHCOMPILE";
  while (text.find(")" + delim + "\"") != std::string::npos) delim += "_";
  return delim;
}

}  // namespace

Repro minify(const Repro& r, const MinifyOptions& options) {
  TORCH_CHECK(r.gm, "minify: the repro has no graph");
  TORCH_CHECK(r.failure != Failure::None, "minify: the repro records no failure");
  return Minifier(r, options).run();
}

void write_program(const Repro& r, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string graph = ir::to_text(r.gm->graph());
  const std::string delim = cpp_string_literal_delimiter(graph);
  const std::string plugin_note = r.plugin.empty() ? "registered, or found on TORCHCOMPILE_BACKEND_PATH"
                                                    : "loaded from " + r.plugin;
  std::ostringstream cpp;
  cpp << "// Replays a graph that fails in backend '" << r.backend << "' (" << failure_name(r.failure)
      << "), written by torchcompile.\n"
      << "// Build: cmake -S . -B build -DCMAKE_PREFIX_PATH=<torchcompile prefix> && cmake --build build\n"
      << "// Run:   build/repro [repro directory]   (exit status 1: it fails as recorded)\n"
      << "#include <torchcompile/backends/registry.h>\n"
      << "#include <torchcompile/ir/interpreter.h>\n"
      << "#include <torchcompile/repro/repro.h>\n\n"
      << "#include <ATen/CPUGeneratorImpl.h>\n"
      << "#include <c10/util/Exception.h>\n\n"
      << "#include <iostream>\n\n"
      << "// The graph, in torchcompile's text format (" << count_calls(r.gm->graph()) << " call_function nodes).\n"
      << "static const char* const kGraph = R\"" << delim << "(" << graph << ")" << delim << "\";\n\n"
      << "// A copy a run cannot change.\n"
      << "static at::Tensor copy(const at::Tensor& t) {\n"
      << "  if (!t.defined()) return t;\n"
      << "  at::Tensor c = t.detach().clone();\n"
      << "  return t.requires_grad() ? c.requires_grad_(true) : c;\n"
      << "}\n\n"
      << "int main(int argc, char** argv) {\n"
      << "  namespace repro = torchcompile::repro;\n"
      << "  // The inputs, attributes and generator state (tensors.pt) and the backend's name and\n"
      << "  // plugin (repro.txt) come from the repro directory.\n"
      << "  repro::Repro r = repro::load(argc > 1 ? argv[1] : TORCHCOMPILE_REPRO_DIR);\n"
      << "  r.gm = repro::module_from_text(kGraph, *r.gm);\n"
      << "  std::cout << \"graph:\\n\";\n"
      << "  r.gm->print_tabular(std::cout);\n"
      << "  // The module the backend compiles gets copies of the attributes: the reference below reads r.gm's.\n"
      << "  auto gm = repro::module_from_text(kGraph, *r.gm);\n"
      << "  for (const auto& [name, attr] : r.gm->attributes()) gm->set_attribute(name, copy(attr.first), attr.second);\n"
      << "  std::vector<at::Tensor> example_inputs;\n"
      << "  for (const auto& t : r.inputs) example_inputs.push_back(copy(t));\n\n"
      << "  repro::ensure_backend(r);  // " << plugin_note << "\n"
      << "  torchcompile::Backend backend = torchcompile::lookup_backend(r.backend);\n"
      << "  repro::Outcome o;\n"
      << "  torchcompile::CompiledFn fn;\n"
      << "  try {\n"
      << "    fn = backend(*gm, example_inputs);\n"
      << "  } catch (const c10::Error& e) {\n"
      << "    o = {repro::Failure::CompileError, e.what_without_backtrace()};\n"
      << "  } catch (const std::exception& e) {\n"
      << "    o = {repro::Failure::CompileError, e.what()};\n"
      << "  }\n"
      << "  if (o.failure == repro::Failure::None) {\n"
      << "    if (!fn) fn = torchcompile::ir::interpreter_fn(*gm);  // declined: the interpreter runs it\n"
      << "    std::vector<at::Tensor> inputs;\n"
      << "    for (const auto& t : r.inputs) inputs.push_back(copy(t));\n"
      << "    at::Generator generator = at::detail::getDefaultCPUGenerator();\n"
      << "    if (r.rng_state.defined()) generator.set_state(r.rng_state);  // as at the failing call\n"
      << "    std::vector<at::Tensor> outputs;\n"
      << "    try {\n"
      << "      outputs = fn(std::move(inputs));\n"
      << "    } catch (const c10::Error& e) {\n"
      << "      o = {repro::Failure::RunError, e.what_without_backtrace()};\n"
      << "    } catch (const std::exception& e) {\n"
      << "      o = {repro::Failure::RunError, e.what()};\n"
      << "    }\n"
      << "    if (o.failure == repro::Failure::None && r.failure == repro::Failure::Accuracy) {\n"
      << "      // The interpreter (in float64 where the graph allows) on the same inputs and generator state.\n"
      << "      std::string mismatch = repro::accuracy_mismatch(*r.gm, r.inputs, outputs, r.tolerance, r.rng_state);\n"
      << "      if (!mismatch.empty()) o = {repro::Failure::Accuracy, mismatch};\n"
      << "    }\n"
      << "  }\n"
      << "  std::cout << o.describe() << \"\\n\";\n"
      << "  if (o.failure == repro::Failure::None) return 0;\n"
      << "  return repro::same_failure(r, o) ? 1 : 2;  // 2: it fails, but not as recorded\n"
      << "}\n";
  std::ostringstream cmake;
  cmake << "# Builds the repro program against an installed torchcompile (find_package(TorchCompile)).\n"
        << "cmake_minimum_required(VERSION 3.18)\n"
        << "project(torchcompile_repro LANGUAGES CXX)\n"
        << "set(CMAKE_CXX_STANDARD 17)\n"
        << "set(CMAKE_CXX_STANDARD_REQUIRED ON)\n"
        << "find_package(TorchCompile REQUIRED)\n"
        << "add_executable(repro repro.cpp)\n"
        << "target_link_libraries(repro PRIVATE torchcompile::torchcompile)\n"
        << "target_compile_definitions(repro PRIVATE TORCHCOMPILE_REPRO_DIR=\"${CMAKE_CURRENT_SOURCE_DIR}\")\n";
  fs::create_directories(dir);
  std::ofstream(fs::path(dir) / "repro.cpp", std::ios::trunc) << cpp.str();
  std::ofstream(fs::path(dir) / "CMakeLists.txt", std::ios::trunc) << cmake.str();
  TORCH_CHECK(fs::exists(fs::path(dir) / "repro.cpp"), "write_program: cannot write into ", dir);
}

}  // namespace torchcompile::repro
