// A fused group of pointwise operators as a tile program: built in microseconds from a graph,
// run by vector kernels compiled into the library for each ISA (no compiler at run time).
#pragma once

#include "tile_ops.h"

#include <torchcompile/ir/graph_module.h>
#include <torchcompile/support/isa.h>

#include <c10/util/SmallVector.h>

#include <memory>
#include <string>
#include <vector>

namespace torchcompile::fused {

/// The ISA the kernels run with, and its choice (cpuid, TORCHCOMPILE_ISA): support/isa.h.
using support::Isa;
using support::selected_isa;
using support::to_string;

/// The kernels compiled for `isa`.
const IsaKernels& kernels_of(Isa isa);

/// Metadata checks shared by the programs: a defined float32 CPU tensor; row-major contiguous
/// (dimensions of size 1 may have any stride).
bool is_float_cpu(const ir::TensorMeta& m);
bool is_bool_cpu(const ir::TensorMeta& m);
bool is_contiguous(const ir::TensorMeta& m);

/// A size of a program built from a graph with size symbols: one symbol (its index in the
/// graph's symbols) or, with `symbol` -1, the constant `value`.
struct SymbolicDim {
  int32_t symbol = -1;
  int64_t value = 0;
  /// Its value for these values of the symbols.
  int64_t at(c10::ArrayRef<int64_t> symbol_values) const { return symbol >= 0 ? symbol_values[symbol] : value; }
};

/// The sizes of `m` (of a graph whose symbols are `symbols`) as SymbolicDims: each a constant or
/// one symbol. A size that is another expression of them (`s0*s1`) is kept as its traced value and
/// sets `*bad`, if empty, to say which (`what` names the tensor).
std::vector<SymbolicDim> symbolic_dims(const ir::TensorMeta& m, const std::vector<ir::SizeSymbolDecl>& symbols,
                                       const std::string& what, std::string* bad);
/// Their values at these values of the symbols.
std::vector<int64_t> sizes_at(c10::ArrayRef<SymbolicDim> dims, c10::ArrayRef<int64_t> symbol_values);
/// The values of the symbols in a call: each the size `dim` of input `input` (`bindings`, as
/// Graph::symbol_bindings gives them); checks the inputs have those dimensions.
void read_symbol_values(const std::vector<std::pair<size_t, int64_t>>& bindings, const std::vector<at::Tensor>& inputs,
                        c10::SmallVector<int64_t, 8>& values);
/// Why a program that bakes in its operators' arguments cannot serve every size of `gm`: an
/// argument that is a size expression (the `div(%expand, %s0)` of a mean's gradient); or "".
std::string size_expression_argument(const ir::GraphModule& gm);

/// Where a program reads a tensor from: a placeholder of its graph (by index) or an attribute of
/// its graph module (read at each call).
struct TensorSource {
  int64_t input = -1;
  const at::Tensor* attr = nullptr;
  std::vector<int64_t> sizes;  // as traced
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool present = false;
  /// In a program for every size (built from a graph with size symbols): its sizes.
  std::vector<SymbolicDim> dims;

  /// The source of a placeholder (the `*num_placeholders`-th, which it counts) or get_attr node.
  static TensorSource of(const ir::GraphModule& gm, const ir::Node& n, int64_t* num_placeholders);
  /// The tensor for this call; checks it is a CPU tensor of the traced dtype and sizes.
  const at::Tensor& resolve(const std::vector<at::Tensor>& inputs, const char* what) const;
  /// The same, the sizes checked against `dims` at these values of the symbols.
  const at::Tensor& resolve_symbolic(const std::vector<at::Tensor>& inputs, const char* what,
                                     c10::ArrayRef<int64_t> symbol_values) const;
};

/// Whether the backend can compute `n` inside a fused group: a call_function of a pointwise
/// operator it has a kernel for (with these constant arguments), on defined float32 CPU tensors,
/// with one float32 result.
bool fusible(const ir::Node& n);

/// A graph whose call_function nodes are all fusible, compiled to one tile program.
///
/// A graph with size symbols gives one program for every size when each size of its inputs and
/// operator results is a constant or one symbol (`f32[s0, 8]`): the program reads the symbols'
/// values from its inputs at each call (the iteration shape and the inputs' sizes follow them;
/// which dimensions broadcast does not change, since a symbol is never 0 or 1). Otherwise build()
/// fails, with the reason.
///
/// All operator results are computed over one iteration shape, the broadcast of their sizes;
/// every output of the graph must have that shape and be contiguous (as eager makes it for
/// contiguous inputs). Inputs of any strides and of any shape that broadcasts to it are read in
/// place when they are contiguous with that shape, and gathered tile by tile otherwise. Inside
/// the program no tensor is allocated: each input is read once per element, each output written
/// once, intermediates live in tile registers in L1.
class FusedProgram {
 public:
  /// The program for `gm`, or nullptr with the reason in `*why`. `gm` must outlive the program
  /// (its attributes are read at each call).
  static std::shared_ptr<const FusedProgram> build(const ir::GraphModule& gm, std::string* why);

  /// Run on the graph's inputs (placeholders, in order). Checks each input's dtype and sizes
  /// against the graph's.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) const;

  /// "fused: tanh+mul+add+gelu+sigmoid+mul+sub (7 instructions, 3 scratch registers, tile 2048, avx512)"
  std::string describe() const;

  Isa isa() const { return isa_; }
  size_t num_instructions() const { return code_.size(); }

 private:
  FusedProgram() = default;

  struct Operand {
    TensorSource source;
    const ir::TensorMeta* meta = nullptr;  // while building
    uint32_t vreg = 0;  // while building
    uint16_t reg = 0;
  };
  struct Output {
    int64_t reg = -1;      // computed into this register
    int64_t operand = -1;  // or one of the operands returned as it is
  };

  // A program built from a graph with size symbols: its sizes, evaluated per call.
  bool symbolic_ = false;
  std::vector<std::pair<size_t, int64_t>> bindings_;    // per symbol: (input, dimension) giving its value
  std::vector<SymbolicDim> shape_dims_;                 // the iteration shape

  std::vector<TileInstr> code_;
  int64_t copy_of_ = -1;  // a program that only copies operand copy_of_ into its one output: gathered there directly
  std::vector<Operand> operands_;
  std::vector<Output> outputs_;
  std::vector<uint16_t> output_regs_;  // the registers bound to output memory, one per output tensor
  std::vector<bool> output_is_mask_;   // per output tensor: bool (a tile buffer converted after each tile)
  std::vector<int64_t> shape_;         // the iteration shape
  int64_t numel_ = 1;
  size_t num_regs_ = 0;
  size_t num_scratch_ = 0;  // scratch registers (after operands and outputs)
  int64_t tile_ = 0;
  Isa isa_ = Isa::Sse2;
  decltype(IsaKernels::run_tile) run_tile_ = nullptr;
  std::vector<std::string> op_names_;
};

}  // namespace torchcompile::fused
