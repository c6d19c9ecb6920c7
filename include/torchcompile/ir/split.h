// Splitting a graph into parts (FX's split_module and capability-based partitioning): groups of
// nodes become graph modules of their own, called from the rest of the graph through
// call_module nodes, so that each part can go to a different backend.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace torchcompile::ir {

/// The values `n` reads, in argument order (list elements in place, a value read twice listed
/// twice).
std::vector<Value> input_values(const Node& n);

/// A name for `v` as a placeholder of a graph extracted from its own: its node's name, with
/// `_<index>` for outputs after the first.
std::string value_name(const Value& v);

/// Copy a call_function or call_module node into `dst` (at its insertion point), its argument
/// values mapped through `map`; the copy keeps the node's name where `dst` has it free, its
/// module path, output metadata and return counts.
Node* copy_node(Graph& dst, const Node& n, const std::function<Value(const Value&)>& map);

/// A copy of `gm`: the same nodes (names, metadata, module paths, user-function targets), the
/// same attributes (sharing their tensors) and submodules.
std::unique_ptr<GraphModule> copy_module(const GraphModule& gm);

/// The size symbols `g`'s metadata and size expressions use.
std::set<std::string> used_symbols(const Graph& g);

/// Declares in `part` (made of nodes of `gm`) the symbols of `gm` it uses, if a dimension of its
/// placeholders binds each (Graph::symbol_bindings); otherwise makes it static at the example
/// sizes. Returns whether it keeps its symbols (true for a part of a graph without symbols).
bool carry_symbols(const GraphModule& gm, Graph& part);

/// Groups of consecutive call_function nodes (in graph order) for which `supported` holds:
/// a run of supported nodes ends at the first call_function or call_module node that is not
/// supported (get_attr nodes between them do not end it). A run keeps the graph's order, so
/// split_module never has to move a node across it. Runs shorter than `min_size` nodes are
/// left out.
std::vector<std::vector<const Node*>> group_by_support(const Graph& g,
                                                       const std::function<bool(const Node&)>& supported,
                                                       size_t min_size = 1);

/// One part of a split graph.
struct SplitPart {
  /// The call_module target in the parent (`submod_0`, `submod_1`, ...).
  std::string path;
  /// The part's nodes as a graph module: its placeholders are the values it reads from the rest
  /// of the graph, its outputs the values the rest (or the graph's output) reads from it; the
  /// attributes it reads are copied in (sharing the tensors). In a graph with size symbols the
  /// part declares the symbols it uses when its placeholders' dimensions bind them all.
  std::shared_ptr<GraphModule> module;
  /// The graph had size symbols the part uses but its placeholders do not bind (only expressions
  /// of them reach it, `[4*s0]`): the part was made static, at the example sizes.
  bool made_static = false;
};

/// A graph split by split_module.
struct SplitGraph {
  /// The original graph with each group replaced by one call_module node (same placeholders,
  /// attributes and outputs). Each call_module target runs its part's module with the
  /// interpreter until the caller registers something else (`parent->set_submodule`, e.g. the
  /// part compiled by a backend, then `parent->recompile()`).
  std::unique_ptr<GraphModule> parent;
  /// One per group, in the order of `groups`.
  std::vector<SplitPart> parts;
};

/// Split `gm`: each group of call_function nodes (disjoint; get_attr nodes are copied into the
/// parts that read them) becomes one part. The parent runs the remaining nodes and the parts in
/// an order that respects every data dependency and keeps each side effect (a mutation, a
/// random op, a call_module) in its original order relative to every other node; groups that
/// cannot be ordered so (a group that needs a value computed from its own result outside it, or
/// that would move a node across a side effect) are refused with an error naming the group. The
/// parent, run with the interpreter, computes what `gm` computes; each part is linted.
SplitGraph split_module(const GraphModule& gm, const std::vector<std::vector<const Node*>>& groups);

}  // namespace torchcompile::ir
