// Printers for the graph IR: FX's tabular listing, a code-like listing, and the text format
// that parse_graph() reads back.
#pragma once

#include <torchcompile/ir/graph.h>

#include <ostream>
#include <string>

namespace torchcompile::ir {

/// FX's `Graph.print_tabular()`: columns opcode, name, target, args, kwargs, separated by two
/// spaces, under a dashed rule. call_function args are the schema's positional arguments with
/// trailing defaults dropped; kwargs are the keyword-only arguments that differ from their
/// defaults. Constants print as Python would (`1`, `1.5`, `True`, `None`, `[2, 3]`,
/// `torch.float32`); tensor values by node name, with `.i` for output i of multi-output nodes.
/// A node calling a user function shows the function's name as its target.
void print_tabular(const Graph& g, std::ostream& os);
std::string tabular_string(const Graph& g);

/// A code-like listing: one line per node, `add = aten::add.Tensor(cos, sin)  # f32[10]{1}`,
/// with each node's module path when known, ending in `return (...)`.
void print_readable(const Graph& g, std::ostream& os);

/// The round-trip text format, also printed by `operator<<`:
///
///     graph():
///       %x : f32[10]{1} = placeholder[target=x]
///       %cos : f32[10]{1} = call_function[target=aten::cos](args = (%x,), kwargs = {})
///       %max : (f32[3]{1}, i64[3]{1}) = call_function[target=aten::max.dim](args = (%x, 1), kwargs = {})
///       return (%cos, %max.1)
///
/// A node calling a user function (Graph::set_target) shows the function's name and the
/// operator whose arguments it takes: `call_function[target=test_add, op=aten::add.Tensor]`.
/// Every node's metadata and module path are kept; parse_graph(to_text(g)) prints identically
/// (user functions are looked up by name in the registry: torchcompile::register_callable).
std::string to_text(const Graph& g);
std::ostream& operator<<(std::ostream& os, const Graph& g);

/// Python-like rendering of a constant argument (used by all printers).
std::string constant_repr(const c10::IValue& v);

}  // namespace torchcompile::ir
