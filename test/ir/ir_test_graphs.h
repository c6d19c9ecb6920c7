// Small graphs and metadata helpers shared by the IR tests.
#pragma once

#include <torchcompile/ir/graph.h>

#include <ATen/core/Tensor.h>

#include <cstring>
#include <memory>
#include <vector>

namespace tc_test {

/// Bitwise equality, NaNs included (same dtype and shape).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
  auto ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

/// Metadata of a contiguous CPU tensor.
inline torchcompile::ir::TensorMeta meta(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::ScalarType::Float) {
  torchcompile::ir::TensorMeta m;
  m.dtype = dtype;
  m.strides.resize(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    m.strides[i] = stride;
    stride *= sizes[i];
  }
  m.sizes = std::move(sizes);
  return m;
}

/// The graph of seed 000's `fn(x, y): return torch.cos(x) + torch.sin(y)` on two [10] inputs.
inline std::unique_ptr<torchcompile::ir::Graph> seed_graph() {
  using namespace torchcompile::ir;
  auto g = std::make_unique<Graph>();
  Value x = g->placeholder("x", meta({10}));
  Value y = g->placeholder("y", meta({10}));
  Node* cos = g->call_function(find_op("aten::cos"), {x}, {meta({10})});
  Node* sin = g->call_function(find_op("aten::sin"), {y}, {meta({10})});
  Node* add = g->call_function(find_op("aten::add.Tensor"), {cos->output(), sin->output()}, {meta({10})});
  g->output({add->output()});
  return g;
}

/// Seed 000's print_tabular table for that graph, with ATen targets as AOT graphs print them
/// (FX layout, tabulate "simple": column width = max(cells, header + 2), two spaces between).
inline constexpr const char* kSeedTable =
    "opcode         name    target            args        kwargs\n"
    "-------------  ------  ----------------  ----------  --------\n"
    "placeholder    x       x                 ()          {}\n"
    "placeholder    y       y                 ()          {}\n"
    "call_function  cos     aten.cos.default  (x,)        {}\n"
    "call_function  sin     aten.sin.default  (y,)        {}\n"
    "call_function  add     aten.add.Tensor   (cos, sin)  {}\n"
    "output         output  output            ((add,),)   {}\n";

}  // namespace tc_test
