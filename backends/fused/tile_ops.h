// The instruction set of the `fused` backend's tile programs, shared by the program builder
// (fused_program.cpp, with LibTorch) and the vector kernels (kernels_*.cpp, compiled once per ISA
// without LibTorch).
//
// A program is a list of instructions over tile registers. A register is a pointer to `n`
// contiguous floats for the tile being run: an input's memory, a buffer an input was gathered
// into, an output's memory, or a scratch buffer in L1. Every instruction reads its operands and
// writes its destination over the tile's `n` elements; the destination never aliases an operand
// of the same instruction unless the instruction is elementwise in place (which all are: element
// i of the destination depends only on element i of the operands).
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchcompile::fused {

enum class TileOp : uint16_t {
  // unary: d = f(a) (GeluErf: NaN at +inf when p0 != 0)
  Neg, Abs, Relu, Sigmoid, Tanh, Exp, Expm1, Log, Log1p, Sqrt, Rsqrt, Reciprocal, Sin, Cos, Erf, GeluErf, GeluTanh,
  Silu, Square, Cube, Hardsigmoid, Hardswish, Copy,
  // unary with scalar parameters
  LeakyRelu,  ///< a > 0 ? a : a * p0
  Clamp,      ///< min(max(a, p0), p1), NaN kept; ±inf for a missing bound
  AddS,       ///< a + p0
  MulS,       ///< a * p0
  MulAddS,    ///< (a * p0) + p1, rounded twice as the two ATen operations it replaces (no fused multiply-add)
  RSubS,      ///< p0 - a
  DivS,       ///< a / p0
  RDivS,      ///< p0 / a
  CmpS,       ///< a cmp p0 as 1 or 0, `sub` the comparison (Cmp); NaN compares false (not equal)
  LogicalNot, ///< a == 0 as 1 or 0
  // binary: d = f(a, b)
  Add,      ///< a + b
  AddMul,   ///< a + p0 * b (add/sub with alpha != 1)
  Sub,      ///< a - b
  Mul,      ///< a * b
  Div,      ///< a / b
  Max,      ///< maximum (NaN propagates)
  Min,      ///< minimum (NaN propagates)
  ThresholdBackward,  ///< b <= p0 ? 0 : a (a = grad, b = input)
  SigmoidBackward,    ///< a * (1 - b) * b (b = sigmoid's output)
  TanhBackward,       ///< a * (1 - b * b) (b = tanh's output)
  GeluErfBackward,    ///< a * gelu'(b) (b = gelu's input, erf form)
  Cmp,                ///< a cmp b as 1 or 0, `sub` the comparison (Cmp)
  LogicalAnd,         ///< a != 0 and b != 0, as 1 or 0
  LogicalOr,          ///< a != 0 or b != 0, as 1 or 0
  MaskedFillS,        ///< b != 0 ? p0 : a
  // ternary: d = f(a, b, c)
  Arith2,  ///< two arithmetic operations in one pass, `sub` says which (arith2_code): t = a op1 b, then t op2 c or
           ///< c op2 t, t rounded as ATen rounds the first operation's result (no fused multiply-add)
  Where,   ///< a != 0 ? b : c
};

/// The comparisons of CmpS and Cmp (their `sub`). Masks (comparison results, bool inputs) live in
/// float registers as 1 and 0, which is also their value when ATen promotes a bool to float.
enum class CmpKind : uint16_t { Lt, Le, Gt, Ge, Eq, Ne };

/// Operands an instruction reads: 1 (unary), 2 (binary) or 3 (Arith2). The enumeration lists unary
/// operators first, then binary ones, then ternary ones.
constexpr int operand_count(TileOp op) { return op >= TileOp::Arith2 ? 3 : op >= TileOp::Add ? 2 : 1; }

/// The arithmetic operations Arith2 combines.
enum class Arith : uint8_t { Add, Sub, Mul, Div };
constexpr int kArith2Variants = 32;
/// Arith2's `sub`: op1, op2, and whether t is op2's right operand.
constexpr uint16_t arith2_code(Arith op1, Arith op2, bool t_right) {
  return static_cast<uint16_t>(static_cast<int>(op1) * 8 + static_cast<int>(op2) * 2 + (t_right ? 1 : 0));
}

/// One instruction: destination and operand registers, scalar parameters.
struct TileInstr {
  TileOp op;
  uint16_t dst;
  uint16_t a, b, c;
  uint16_t sub;  ///< the variant of Arith2 (arith2_code); 0 otherwise
  float p0, p1;
};

/// Reductions of the row programs.
enum class ReduceOp : uint8_t {
  Sum,
  Max,
  Min,
  Variance,  ///< the sum of (x - mean)^2 over `divisor`, mean that of the same column: two passes, in double
  StdDev,    ///< the square root of Variance (taken in double, before rounding to float)
};

/// The kernels of one ISA.
struct IsaKernels {
  /// Runs `code` over one tile: every register in `regs` points at `n` floats (scratch registers
  /// at a multiple of 16 floats more, 64-byte aligned). Elements past `n` are never read from or
  /// written to memory registers.
  void (*run_tile)(const TileInstr* code, size_t count, float* const* regs, int64_t n);
  /// Softmax (or log-softmax) of each of `rows` contiguous rows of `cols` floats.
  void (*softmax_rows)(const float* in, float* out, int64_t rows, int64_t cols, bool log);
  /// The gradient of softmax (or log-softmax) of each of `rows` contiguous rows of `cols` floats,
  /// from the gradient of its result `grad` and the result `y`: y (grad - sum(grad y)) (log:
  /// grad - exp(y) sum(grad)), as ATen's _softmax_backward_data.
  void (*softmax_backward_rows)(const float* grad, const float* y, float* out, int64_t rows, int64_t cols, bool log);
  /// Layer normalization of each of `rows` contiguous rows of `cols` floats: (x - mean) * rstd,
  /// times `weight` and plus `bias` (each `cols` floats, or null), rstd = 1 / sqrt(var + eps).
  /// With `mean` and `rstd` non-null, each row's mean and rstd are stored there (native_layer_norm).
  void (*layer_norm_rows)(const float* in, float* out, const float* weight, const float* bias, int64_t rows,
                          int64_t cols, float eps, float* mean, float* rstd);
  /// The gradients of layer normalization for `rows` rows of `cols` floats, from the gradient of
  /// the result `grad`, the input `x` and each row's `mean` and `rstd`: with xhat = (x - mean)
  /// rstd and gw = grad * weight (grad without a weight), dx = rstd (gw - mean(gw) - xhat
  /// mean(gw xhat)) into `dx` if non-null; sum of grad xhat into `dweight` and sum of grad into
  /// `dbias` (each `cols` floats, accumulated with +=) if non-null.
  void (*layer_norm_backward_rows)(const float* grad, const float* x, const float* mean, const float* rstd,
                                   const float* weight, float* dx, float* dweight, float* dbias, int64_t rows,
                                   int64_t cols);
  /// Reduce a (red, inner) row-major block along its first dimension, for columns [i0, i1):
  /// out[i - i0] = op over r of in[r * inner + i] (`divisor`: Variance and StdDev only). Max and min propagate NaN; a sum adds blocks of
  /// rows first, then the blocks' sums.
  void (*reduce_block)(const float* in, float* out, int64_t red, int64_t inner, int64_t i0, int64_t i1, ReduceOp op,
                       double divisor);
};

/// The kernels compiled for each ISA (kernels_avx512.cpp, kernels_avx2.cpp, kernels_sse2.cpp).
const IsaKernels& isa_kernels_avx512();
const IsaKernels& isa_kernels_avx2();
const IsaKernels& isa_kernels_sse2();

}  // namespace torchcompile::fused
