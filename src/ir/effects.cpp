// effects_of (ir/effects.h).
#include "ir/effects.h"

#include <torchcompile/ir/op_properties.h>

#include <algorithm>
#include <functional>

namespace torchcompile::ir {

GraphEffects effects_of(const GraphModule& gm) {
  GraphEffects e;
  const ir::Graph& g = gm.graph();
  const auto placeholders = g.placeholders();
  std::function<void(const ir::Argument&)> note_argument;
  auto note_written = [&](const ir::Value& v) {
    const ir::Value base = ir::memory_base(v);
    if (base.node->kind() == ir::NodeKind::CallModule) {
      // A module called opaquely may return (views of) its arguments.
      for (const auto& a : base.node->args()) note_argument(a);
      return;
    }
    if (base.node->kind() == ir::NodeKind::Placeholder) {
      const size_t pos = std::find(placeholders.begin(), placeholders.end(), base.node) - placeholders.begin();
      if (pos < placeholders.size() &&
          std::find(e.written_inputs.begin(), e.written_inputs.end(), pos) == e.written_inputs.end())
        e.written_inputs.push_back(pos);
    } else if (base.node->kind() == ir::NodeKind::GetAttr) {
      const std::string& name = base.node->target();
      if (std::find(e.written_attributes.begin(), e.written_attributes.end(), name) == e.written_attributes.end())
        e.written_attributes.push_back(name);
    }
  };
  note_argument = [&](const ir::Argument& a) {
    if (a.is_value()) note_written(a.value());
    if (a.is_list())
      for (const auto& v : a.list())
        if (v) note_written(*v);
  };
  for (const auto& n : g.nodes()) {
    if (n->kind() == ir::NodeKind::CallModule) {
      e.opaque = e.random = true;
      for (const auto& a : n->args()) note_argument(a);
      continue;
    }
    if (n->kind() != ir::NodeKind::CallFunction) continue;
    e.random |= ir::node_is_random(*n);
    for (size_t i : ir::written_arguments(*n)) note_argument(n->args()[i]);
  }
  return e;
}

}  // namespace torchcompile::ir
