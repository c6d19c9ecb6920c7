// GraphModule: a Graph plus the attributes its get_attr nodes read.
#pragma once

#include <torchcompile/ir/graph.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torchcompile::ir {

class Interpreter;

/// What a GraphModule attribute is.
enum class AttributeKind { Parameter, Buffer, Constant };

/// An opaque callable behind a call_module node: tensors in, tensors out.
using ModuleFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// A captured graph with its attributes, the unit handed to backends.
///
/// Parameters and buffers are held as tensors sharing storage and identity with the root
/// module's own (an optimizer step or a load_state_dict copy is seen by the next call); graph
/// constants are tensors the forward used that are neither inputs, parameters nor buffers.
class GraphModule {
 public:
  explicit GraphModule(std::shared_ptr<Graph> graph = std::make_shared<Graph>());
  ~GraphModule();
  GraphModule(const GraphModule&) = delete;
  GraphModule& operator=(const GraphModule&) = delete;

  Graph& graph() { return *graph_; }
  const Graph& graph() const { return *graph_; }
  std::shared_ptr<Graph> shared_graph() const { return graph_; }

  /// Set (or replace) an attribute.
  void set_attribute(const std::string& qualified_name, at::Tensor value, AttributeKind kind);
  /// Remove an attribute (no get_attr node may still read it).
  void remove_attribute(const std::string& qualified_name);
  bool has_attribute(const std::string& qualified_name) const;
  /// The attribute's tensor; throws naming the attribute if it does not exist.
  const at::Tensor& attribute(const std::string& qualified_name) const;
  AttributeKind attribute_kind(const std::string& qualified_name) const;
  /// All attributes by qualified name, sorted.
  const std::map<std::string, std::pair<at::Tensor, AttributeKind>>& attributes() const { return attributes_; }

  /// Register the callable behind a call_module target.
  void set_submodule(const std::string& path, ModuleFn fn);
  const ModuleFn& submodule(const std::string& path) const;
  bool has_submodule(const std::string& path) const { return submodules_.count(path) != 0; }

  /// Run the graph with the interpreter: placeholders bound to `inputs` in order; returns the
  /// output node's values. The call plan is prepared on first use and reused.
  std::vector<at::Tensor> forward(std::vector<at::Tensor> inputs);
  std::vector<at::Tensor> operator()(std::vector<at::Tensor> inputs) { return forward(std::move(inputs)); }

  /// Drop the prepared call plan (call after mutating the graph).
  void recompile();

  /// FX's tabular listing (opcode, name, target, args, kwargs).
  void print_tabular(std::ostream& os) const;
  /// Code-like listing.
  void print_readable(std::ostream& os) const;

 private:
  std::shared_ptr<Graph> graph_;
  std::map<std::string, std::pair<at::Tensor, AttributeKind>> attributes_;
  std::map<std::string, ModuleFn> submodules_;
  std::shared_ptr<Interpreter> interpreter_;
  mutable std::mutex plan_mutex_;
};

}  // namespace torchcompile::ir
