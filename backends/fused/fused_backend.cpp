#include "fused_backend.h"

#include "fused_program.h"
#include "row_program.h"

#include <torchcompile/aot/aot_autograd.h>
#include <torchcompile/compile/compile_report.h>
#include <torchcompile/compile/partitioner.h>
#include <torchcompile/support/logging.h>

namespace torchcompile::backends {

namespace {

// One part as one program: a run of pointwise operators (fused::FusedProgram) or one row
// operation (fused::RowProgram).
template <class Program>
CompiledFn compile_program(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  if (needs_autograd(gm, example_inputs)) return decline(kNeedsAutogradReason);
  std::string why;
  auto program = Program::build(gm, &why);
  if (!program) return decline(why);
  report_partition(program->describe());
  return [program](std::vector<at::Tensor> inputs) { return program->run(inputs); };
}

// A part of a graph with size symbols as one program for every size (or a static program for a
// part without symbols); counts the parts that cannot be one, on this thread.
thread_local int t_parts_not_every_size = 0;
template <class Program>
CompiledFn compile_every_size(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  CompiledFn fn = compile_program<Program>(gm, example_inputs);
  if (!fn) ++t_parts_not_every_size;
  return fn;
}

// Claims: the nodes of each kind of program, unless they would have to record autograd.
Claim claim_of(bool (*supported)(const ir::Node&)) {
  return [supported](const GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
    if (needs_autograd(gm, example_inputs)) {
      decline(kNeedsAutogradReason);
      return std::unordered_set<const ir::Node*>{};
    }
    return claim_if(supported)(gm, example_inputs);
  };
}

bool pointwise_or_row(const ir::Node& n) { return fused::fusible(n) || fused::row_fusible(n); }

}  // namespace

bool fused_supports(const ir::Node& n) { return pointwise_or_row(n); }

CompiledFn fused_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  // Pointwise runs become tile programs, each row operation a row program.
  static const Backend backend = partitioned_backend(
      {{"fused", claim_of(&fused::fusible), &compile_program<fused::FusedProgram>},
       {"fused", claim_of(&fused::row_fusible), &compile_program<fused::RowProgram>}});
  // The same for a graph with size symbols, each part one program for every size.
  static const Backend every_size = partitioned_backend(
      {{"fused", claim_of(&fused::fusible), &compile_every_size<fused::FusedProgram>},
       {"fused", claim_of(&fused::row_fusible), &compile_every_size<fused::RowProgram>}});
  if (needs_autograd(gm, example_inputs)) return decline(kNeedsAutogradReason);
  if (!gm.graph().symbols().empty()) {
    // One program for every size where the graph is one run of pointwise operators whose sizes
    // are symbols or constants (FusedProgram::build says why not); else its parts, each one
    // program for every size (RowProgram::build too), when every part can be; else programs
    // built per combination of the symbols' values.
    if (CompiledFn fn = compile_program<fused::FusedProgram>(gm, example_inputs)) return fn;
    const std::string as_tiles = detail::take_decline_reason();
    CompileReport parts;  // kept only if used
    const int declined_before = t_parts_not_every_size;
    CompiledFn fn;
    {
      detail::ReportScope scope(&parts);
      fn = every_size(gm, example_inputs);
    }
    const std::string as_parts = detail::take_decline_reason();
    if (fn && t_parts_not_every_size == declined_before) {
      for (std::string& line : parts.partition) report_partition(std::move(line));
      return fn;
    }
    TORCHCOMPILE_LOG(logging::LogKind::Dynamic, "fused: programs per size: not one tile program (", as_tiles,
                     "), not one program per part for every size",
                     as_parts.empty() ? std::string() : " (" + as_parts + ")");
    return compile_per_shape(gm, example_inputs, &fused_backend);
  }
  return backend(gm, example_inputs);
}

void register_fused_backend() {
  register_backend("fused", &fused_backend, claim_of(&pointwise_or_row));
  register_backend("aot_fused", aot_autograd(&fused_backend));
}

}  // namespace torchcompile::backends
