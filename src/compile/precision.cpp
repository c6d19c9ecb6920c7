#include "compile/precision.h"

#include <torchcompile/capture/tracer.h>
#include <torchcompile/compile/compile_report.h>
#include <torchcompile/ir/graph_module.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/support/isa.h>
#include <torchcompile/support/logging.h>

#include <c10/util/Exception.h>

#include <cstdlib>

#include <optional>
#include <utility>

namespace torchcompile {

const char* to_string(Precision p) {
  switch (p) {
    case Precision::Float32: return "float32";
    case Precision::Int8Dynamic: return "int8-dynamic";
    case Precision::BFloat16: return "bfloat16";
  }
  return "?";
}

namespace compile_stage {

namespace {

// Weights smaller than this (K x N elements) keep float32: quantizing the input costs about as
// much as the GEMM saves, and such layers (a classifier's last one) are where accuracy suffers.
constexpr int64_t kSmallGemm = 16384;

}  // namespace

const char* kernel_of(Precision p) {
  return p == Precision::Int8Dynamic ? "torchcompile::linear_int8_dynamic" : "torchcompile::linear_bf16";
}

namespace {

bool kept_by_user(const std::string& path, const std::vector<std::string>& keep) {
  for (const auto& k : keep)
    if (!k.empty() && (path == k || (path.size() > k.size() && path.compare(0, k.size(), k) == 0 && path[k.size()] == '.')))
      return true;
  return false;
}

bool is_f32_cpu(const ir::TensorMeta& m) { return m.defined && m.dtype == at::kFloat && m.device.is_cpu(); }

// What the precision rules look at in one Linear, from the graph (lower_precision) or from the
// tensors of the call that traces it (trace_substitute): the two must decide alike.
struct LinearFacts {
  bool f32 = false;     // float32 CPU input of 2 or more dimensions, 2-D weight, bias
  int64_t K = 0, N = 0;
  std::string weight_attribute;  // the parameter or buffer the weight is (through views), or ""
  std::string why_not;           // the pattern's own reason to keep float32
};

// The Linear's module: the one owning its weight (`fc1.weight` -> `fc1`).
std::string path_of(const LinearFacts& f) {
  const size_t dot = f.weight_attribute.rfind('.');
  return dot == std::string::npos ? "" : f.weight_attribute.substr(0, dot);
}

// "" if the Linear takes the precision, else why it keeps float32.
std::string keep_reason(const LinearFacts& f, const PrecisionOptions& options) {
  if (!f.why_not.empty()) return f.why_not;
  if (!f.f32) return "not float32 CPU tensors with a 2-D or larger input";
  if (kept_by_user(path_of(f), options.keep_float32)) return "keep_float32";
  if (f.weight_attribute.empty()) return "the weight is computed in the graph, not a parameter or buffer";
  if (f.K * f.N < kSmallGemm)
    return "small GEMM (K x N = " + std::to_string(f.K * f.N) + " < " + std::to_string(kSmallGemm) + ")";
  return "";
}

bool is_gemm_target(const std::string& t) {
  return t == "aten::linear" || t == "aten::addmm" || t == "aten::mm" || t == "aten::matmul";
}

}  // namespace

bool bf16_native() {
  static const c10::OperatorHandle op = ir::find_op("torchcompile::bf16_native");
  return op.typed<bool()>().call();
}

}  // namespace compile_stage

std::string precision_unavailable(Precision p) {
  if (p == Precision::Float32) return "";
  try {
    ir::find_op(compile_stage::kernel_of(p));
  } catch (const c10::Error&) {
    return std::string("precision ") + to_string(p) +
           " needs the int8 / bfloat16 kernels of the onednn backend, and this build of torchcompile has no oneDNN "
           "(install libdnnl-dev and rebuild)";
  }
  if (p == Precision::Int8Dynamic && !support::cpu_has(support::Isa::Avx2))
    return "precision int8-dynamic needs a CPU with AVX2 (oneDNN's int8 GEMM); this one has none";
  if (p == Precision::BFloat16 && !compile_stage::bf16_native()) {
    const char* isa = std::getenv("TORCHCOMPILE_ISA");
    return std::string("precision bfloat16 needs a CPU with AVX512-BF16 or AMX-BF16 instructions; this one has "
                       "neither") +
           (support::cpu_has_bf16() ? " that oneDNN uses (ONEDNN_MAX_CPU_ISA)"
            : isa && *isa          ? std::string(" (TORCHCOMPILE_ISA=") + isa + ")"
                                   : std::string());
  }
  return "";
}

namespace compile_stage {

void check_precision(const PrecisionOptions& options) {
  if (options.precision == Precision::Float32) return;
  const std::string why = precision_unavailable(options.precision);
  if (why.empty()) return;
  TORCH_CHECK(options.precision == Precision::BFloat16 && options.emulate &&
                  why.rfind("precision bfloat16 needs a CPU", 0) == 0,
              why,
              options.precision == Precision::BFloat16
                  ? ". Set CompileOptions::emulate_precision to round to bfloat16 and compute in float32 instead: the "
                    "same results, but slower than float32"
                  : "");
}

namespace {

// A GEMM with a weight: the Linear `x @ W^T (+ bias)` as LibTorch records it. `linear` itself, or
// what its composite implementation calls: `addmm(bias, x, W^T)` (2-D inputs with a bias),
// `mm(x, W^T)`, `matmul(x, W^T)` (the bias then added by a separate node, which stays).
struct Gemm {
  ir::Value x;
  std::optional<ir::Value> weight;   // (N, K): the `t` node's input, when W^T is a `t` / transpose
  ir::Value operand;                 // the GEMM's (K, N) operand (weight^T) otherwise
  std::optional<ir::Value> bias;
  std::string why_not;               // set: not a Linear this precision can take
};

bool is_value(const ir::Node* n, size_t i) { return n->args().size() > i && n->args()[i].is_value(); }

std::optional<ir::Value> transposed_input(const ir::Value& v) {
  const ir::Node* t = v.node;
  if (t->kind() != ir::NodeKind::CallFunction || !is_value(t, 0)) return std::nullopt;
  if (t->target() == "aten::t") return t->args()[0].value();
  if (t->target() == "aten::transpose.int" && t->args().size() >= 3 && t->args()[1].is_constant() &&
      t->args()[2].is_constant()) {
    const auto a = ir::int_values(t->args()[1].constant()), b = ir::int_values(t->args()[2].constant());
    if (a && b && a->size() == 1 && b->size() == 1 &&
        ((*a)[0] == 0 || (*a)[0] == -2) && ((*b)[0] == 1 || (*b)[0] == -1) && t->output_meta().at(0).sizes.size() == 2)
      return t->args()[0].value();
  }
  return std::nullopt;
}

std::optional<Gemm> match_gemm(const ir::Node* n) {
  if (n->kind() != ir::NodeKind::CallFunction || n->callable()) return std::nullopt;
  const std::string& t = n->target();
  Gemm g;
  if (t == "aten::linear") {
    if (!is_value(n, 0) || !is_value(n, 1)) return std::nullopt;
    g.x = n->args()[0].value();
    g.weight = n->args()[1].value();
    if (is_value(n, 2)) g.bias = n->args()[2].value();
    return g;
  }
  size_t xi = 0;
  if (t == "aten::addmm") {
    if (!is_value(n, 0)) return std::nullopt;
    const auto& beta = n->args().at(3), &alpha = n->args().at(4);
    if (!beta.is_constant() || !alpha.is_constant() || beta.constant().toScalar().toDouble() != 1.0 ||
        alpha.constant().toScalar().toDouble() != 1.0)
      return std::nullopt;
    g.bias = n->args()[0].value();
    xi = 1;
  } else if (t != "aten::mm" && t != "aten::matmul") {
    return std::nullopt;
  }
  if (!is_value(n, xi) || !is_value(n, xi + 1)) return std::nullopt;
  g.x = n->args()[xi].value();
  g.operand = n->args()[xi + 1].value();
  const ir::TensorMeta& om = g.operand.node->output_meta().at(g.operand.index);
  if (om.sizes.size() != 2) return std::nullopt;  // a batched matmul: no weight
  g.weight = transposed_input(g.operand);
  if (g.bias) {
    const ir::TensorMeta& bm = g.bias->node->output_meta().at(g.bias->index);
    if (bm.sizes.size() != 1 || bm.sizes[0] != om.sizes[1]) g.why_not = "the bias is not a vector of N elements";
  }
  return g;
}

}  // namespace

std::vector<std::string> lower_precision(GraphModule& gm, const PrecisionOptions& options) {
  std::vector<std::string> lines;
  if (options.precision == Precision::Float32) return lines;
  const c10::OperatorHandle kernel = ir::find_op(kernel_of(options.precision));
  const bool emulate = options.precision == Precision::BFloat16 && !bf16_native();
  std::string variant = emulate ? " (emulated)" : "";
  if (options.precision == Precision::Int8Dynamic &&
      ir::find_op("torchcompile::int8_weight_max").typed<int64_t()>().call() < 127)
    variant = " (weights in [-63, 63]: no VNNI)";
  ir::Graph& g = gm.graph();
  std::vector<ir::Node*> candidates;
  for (const auto& n : g.nodes())
    if (match_gemm(n.get())) candidates.push_back(n.get());
  bool changed = false;
  for (ir::Node* n : candidates) {
    Gemm m = *match_gemm(n);
    const ir::TensorMeta& xm = m.x.node->output_meta().at(m.x.index);
    const ir::Value wv = m.weight ? *m.weight : m.operand;
    const ir::TensorMeta& wm = wv.node->output_meta().at(wv.index);
    if (wm.sizes.size() != 2) continue;
    LinearFacts f;
    f.N = m.weight ? wm.sizes[0] : wm.sizes[1];
    f.K = m.weight ? wm.sizes[1] : wm.sizes[0];
    f.why_not = m.why_not;
    f.f32 = is_f32_cpu(xm) && is_f32_cpu(wm) && xm.sizes.size() >= 2 &&
            (!m.bias || is_f32_cpu(m.bias->node->output_meta().at(m.bias->index)));
    const ir::Node* base = ir::memory_base(wv).node;
    if (base->kind() == ir::NodeKind::GetAttr) f.weight_attribute = base->target();
    const std::string path = path_of(f).empty() ? n->module_path() : path_of(f);
    const std::string where = "linear " + (path.empty() ? n->name() : path);
    const std::string dims = " [" + std::to_string(f.K) + " -> " + std::to_string(f.N) + "]";
    const std::string why = keep_reason(f, options);
    if (!why.empty()) {
      lines.push_back("float32: " + where + dims + ": " + why);
    } else {
      g.set_insert_point(n);
      ir::Value weight = m.weight ? *m.weight : ir::Value();
      if (!m.weight) {  // a (K, N) weight: the kernel takes (N, K)
        ir::TensorMeta tm = wm;
        std::swap(tm.sizes[0], tm.sizes[1]);
        std::swap(tm.strides[0], tm.strides[1]);
        if (tm.sym_sizes.size() == 2) std::swap(tm.sym_sizes[0], tm.sym_sizes[1]);
        if (tm.sym_strides.size() == 2) std::swap(tm.sym_strides[0], tm.sym_strides[1]);
        ir::Node* t = g.call_function(ir::find_op("aten::t"), {m.operand}, {tm});
        t->set_module_path(n->module_path());
        weight = t->output(0);
      }
      std::vector<ir::Argument> args = {m.x, weight, m.bias ? ir::Argument(*m.bias) : ir::Argument(c10::IValue())};
      if (options.precision == Precision::BFloat16) args.push_back(c10::IValue(emulate));
      ir::Node* q = g.call_function(kernel, std::move(args), n->output_meta());
      g.set_insert_point(nullptr);
      q->set_module_path(n->module_path());
      g.replace_all_uses(n->output(0), q->output(0));
      g.erase(n);
      changed = true;
      lines.push_back(std::string(to_string(options.precision)) + variant + ": " + where + dims);
    }
  }
  if (changed) {
    ir::eliminate_dead_code(g);  // the `t` nodes no GEMM reads any more
    gm.recompile();
  }
  return lines;
}

capture::OpSubstitute trace_substitute(const PrecisionOptions& options, const capture::Tracer& tracer) {
  if (options.precision == Precision::Float32) return nullptr;
  const c10::OperatorHandle kernel = ir::find_op(kernel_of(options.precision));
  const bool emulate = options.precision == Precision::BFloat16 && !bf16_native();
  return [kernel, emulate, options, &tracer](const c10::OperatorHandle& op, std::vector<c10::IValue>* stack) {
    const std::string target = ir::op_target_name(op);
    if (!is_gemm_target(target)) return false;
    const size_t num_args = op.schema().arguments().size();
    const c10::IValue* a = stack->data() + (stack->size() - num_args);
    auto tensor = [&](size_t i) { return i < num_args && a[i].isTensor() ? a[i].toTensor() : at::Tensor(); };
    at::Tensor x, weight, operand, bias;
    LinearFacts f;
    if (target == "aten::linear") {
      x = tensor(0);
      weight = tensor(1);
      bias = tensor(2);
      operand = weight;
    } else {
      size_t xi = 0;
      if (target == "aten::addmm") {
        if (a[3].toScalar().toDouble() != 1.0 || a[4].toScalar().toDouble() != 1.0) return false;
        bias = tensor(0);
        xi = 1;
      }
      x = tensor(xi);
      operand = tensor(xi + 1);
      if (!operand.defined() || operand.dim() != 2) return false;
      weight = operand.t();
      if (bias.defined() && (bias.dim() != 1 || bias.size(0) != operand.size(1)))
        f.why_not = "the bias is not a vector of N elements";
    }
    if (!x.defined() || !weight.defined() || weight.dim() != 2) return false;
    auto f32 = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat && t.device().is_cpu(); };
    f.N = weight.size(0);
    f.K = weight.size(1);
    f.f32 = f32(x) && f32(weight) && x.dim() >= 2 && (!bias.defined() || f32(bias));
    if (auto name = tracer.attribute_behind(operand)) f.weight_attribute = *name;
    if (!keep_reason(f, options).empty()) return false;
    c10::optional<at::Tensor> b = bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
    at::Tensor result;
    if (options.precision == Precision::BFloat16) {
      result = kernel.typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, bool)>()
                   .call(x, weight, b, emulate);
    } else {
      result = kernel.typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&)>().call(
          x, weight, b);
    }
    stack->erase(stack->end() - num_args, stack->end());
    stack->push_back(std::move(result));
    return true;
  };
}

Backend with_precision(Backend backend, const PrecisionOptions& options) {
  if (options.precision == Precision::Float32) return backend;
  return [backend = std::move(backend), options](GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
    std::vector<std::string> lines;
    {
      TimedStep step(std::string("precision ") + to_string(options.precision), &gm);
      lines = lower_precision(gm, options);
    }
    if (CompileReport* report = detail::current_report())
      report->precision.insert(report->precision.end(), lines.begin(), lines.end());
    return backend(gm, example_inputs);
  };
}

}  // namespace compile_stage
}  // namespace torchcompile
