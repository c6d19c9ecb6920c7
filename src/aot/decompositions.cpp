// The decomposition table and the built-in decompositions (torch._decomp in C++).
#include <torchcompile/aot/aot_autograd.h>

#include <ATen/ATen.h>

#include <cmath>

namespace torchcompile {

void DecompositionTable::add(const std::string& op, Decomposition fn) {
  TORCH_CHECK(!op.empty() && fn, "DecompositionTable::add: an operator name and a function are required");
  table_[op] = std::move(fn);
}

const Decomposition* DecompositionTable::find(const std::string& op) const {
  auto it = table_.find(op);
  return it == table_.end() ? nullptr : &it->second;
}

std::vector<std::string> DecompositionTable::ops() const {
  std::vector<std::string> names;
  for (const auto& [name, fn] : table_) names.push_back(name);
  return names;
}

void DecompositionTable::update(const DecompositionTable& other) {
  for (const auto& [name, fn] : other.table_) table_[name] = fn;
}

namespace {

using Args = std::vector<c10::IValue>;

std::vector<c10::IValue> one(at::Tensor t) { return {c10::IValue(std::move(t))}; }

bool is_one(const c10::Scalar& s) { return s.isIntegral(false) ? s.toLong() == 1 : s.toDouble() == 1.0; }
bool is_zero(const c10::Scalar& s) { return s.isIntegral(false) ? s.toLong() == 0 : s.toDouble() == 0.0; }

// Overload name -> decomposition, built once.
const std::map<std::string, Decomposition>& builtins() {
  static const std::map<std::string, Decomposition> table = {
      // addmm(self, mat1, mat2, beta, alpha) = beta * self + alpha * (mat1 @ mat2)
      {"aten::addmm",
       [](const Args& a) {
         const c10::Scalar beta = a[3].toScalar(), alpha = a[4].toScalar();
         at::Tensor out = at::mm(a[1].toTensor(), a[2].toTensor());
         if (!is_one(alpha)) out = at::mul(out, alpha);
         if (is_zero(beta)) return one(out);
         at::Tensor self = is_one(beta) ? a[0].toTensor() : at::mul(a[0].toTensor(), beta);
         return one(at::add(out, self));
       }},
      {"aten::silu", [](const Args& a) { return one(at::mul(a[0].toTensor(), at::sigmoid(a[0].toTensor()))); }},
      // gelu(x, approximate): 0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation.
      {"aten::gelu",
       [](const Args& a) {
         const at::Tensor& x = a[0].toTensor();
         at::Tensor inner;
         if (a[1].toStringRef() == "tanh") {
           const double k = std::sqrt(2.0 / M_PI);
           inner = at::tanh(at::mul(at::add(x, at::mul(at::pow(x, 3), 0.044715)), k));
         } else {
           inner = at::erf(at::mul(x, M_SQRT1_2));
         }
         return one(at::mul(at::mul(x, 0.5), at::add(inner, 1)));
       }},
      // hardsigmoid(x) = clamp(x + 3, 0, 6) / 6; hardswish(x) = x * hardsigmoid(x)
      {"aten::hardsigmoid",
       [](const Args& a) { return one(at::div(at::clamp(at::add(a[0].toTensor(), 3), 0, 6), 6)); }},
      {"aten::hardswish",
       [](const Args& a) {
         const at::Tensor& x = a[0].toTensor();
         return one(at::div(at::mul(x, at::clamp(at::add(x, 3), 0, 6)), 6));
       }},
      // leaky_relu(x, slope) = where(x > 0, x, x * slope)
      {"aten::leaky_relu",
       [](const Args& a) {
         const at::Tensor& x = a[0].toTensor();
         return one(at::where(at::gt(x, 0), x, at::mul(x, a[1].toScalar())));
       }},
  };
  return table;
}

}  // namespace

std::vector<std::string> available_decompositions() {
  std::vector<std::string> names;
  for (const auto& [name, fn] : builtins()) names.push_back(name);
  return names;
}

DecompositionTable get_decompositions(const std::vector<std::string>& ops) {
  DecompositionTable table;
  for (const std::string& op : ops) {
    bool found = false;
    for (const auto& [name, fn] : builtins()) {
      // `aten::gelu` selects `aten::gelu` and any `aten::gelu.<overload>`.
      if (name == op || (name.size() > op.size() && name.compare(0, op.size(), op) == 0 && name[op.size()] == '.')) {
        table.add(name, fn);
        found = true;
      }
    }
    if (!found) {
      std::string known;
      for (const auto& n : available_decompositions()) known += (known.empty() ? "" : ", ") + n;
      TORCH_CHECK(false, "get_decompositions: no built-in decomposition of '", op, "'; available: ", known);
    }
  }
  return table;
}

}  // namespace torchcompile
