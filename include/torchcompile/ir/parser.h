// Reader for the text format printed by to_text().
#pragma once

#include <torchcompile/ir/graph.h>

#include <memory>
#include <string>

namespace torchcompile::ir {

/// Parse the text format of to_text() into a new graph. Arguments are matched against the
/// operator's schema (positional, then keyword), missing ones take their defaults, and
/// constants are converted to the schema's types. Errors name the line and what was expected.
std::unique_ptr<Graph> parse_graph(const std::string& text);

}  // namespace torchcompile::ir
