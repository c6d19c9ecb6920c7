#include <torchcompile/ir/graph_module.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/printer.h>

namespace torchcompile::ir {

GraphModule::GraphModule(std::shared_ptr<Graph> graph) : graph_(std::move(graph)) {
  TORCH_CHECK(graph_ != nullptr, "GraphModule needs a graph");
}

GraphModule::~GraphModule() = default;

void GraphModule::set_attribute(const std::string& qualified_name, at::Tensor value, AttributeKind kind) {
  TORCH_CHECK(!qualified_name.empty(), "attribute names must not be empty");
  auto it = attributes_.find(qualified_name);
  if (it == attributes_.end()) {
    attributes_.emplace(qualified_name, std::make_pair(std::move(value), kind));
    return;
  }
  // Assign in place: a prepared plan holds pointers to the map's entries.
  it->second.first = std::move(value);
  it->second.second = kind;
}

void GraphModule::remove_attribute(const std::string& qualified_name) {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  interpreter_.reset();
  attributes_.erase(qualified_name);
}

bool GraphModule::has_attribute(const std::string& qualified_name) const {
  return attributes_.count(qualified_name) != 0;
}

const at::Tensor& GraphModule::attribute(const std::string& qualified_name) const {
  auto it = attributes_.find(qualified_name);
  TORCH_CHECK(it != attributes_.end(), "graph module has no attribute '", qualified_name, "'");
  return it->second.first;
}

AttributeKind GraphModule::attribute_kind(const std::string& qualified_name) const {
  auto it = attributes_.find(qualified_name);
  TORCH_CHECK(it != attributes_.end(), "graph module has no attribute '", qualified_name, "'");
  return it->second.second;
}

void GraphModule::set_submodule(const std::string& path, ModuleFn fn) {
  TORCH_CHECK(fn != nullptr, "set_submodule('", path, "'): empty callable");
  submodules_[path] = std::move(fn);
}

const ModuleFn& GraphModule::submodule(const std::string& path) const {
  auto it = submodules_.find(path);
  TORCH_CHECK(it != submodules_.end(), "graph module has no submodule '", path,
              "' (call_module targets need set_submodule)");
  return it->second;
}

std::vector<at::Tensor> GraphModule::forward(std::vector<at::Tensor> inputs) {
  std::shared_ptr<Interpreter> interp;
  {
    std::lock_guard<std::mutex> lock(plan_mutex_);
    if (!interpreter_) interpreter_ = std::make_shared<Interpreter>(*this);
    interp = interpreter_;
  }
  return interp->run(std::move(inputs));
}

void GraphModule::recompile() {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  interpreter_.reset();
}

void GraphModule::print_tabular(std::ostream& os) const { ir::print_tabular(*graph_, os); }

void GraphModule::print_readable(std::ostream& os) const { ir::print_readable(*graph_, os); }

}  // namespace torchcompile::ir
