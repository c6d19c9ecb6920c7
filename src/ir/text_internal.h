// Private to src/ir: names shared by the printers and the parser of the text format.
#pragma once

#include <torchcompile/ir/graph.h>

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchcompile::ir::detail {

/// Python's names of the dtypes (`float32` for `torch.float32`).
inline const std::vector<std::pair<c10::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<c10::ScalarType, const char*>> kNames = {
      {c10::ScalarType::Float, "float32"},       {c10::ScalarType::Double, "float64"},
      {c10::ScalarType::Half, "float16"},        {c10::ScalarType::BFloat16, "bfloat16"},
      {c10::ScalarType::Long, "int64"},          {c10::ScalarType::Int, "int32"},
      {c10::ScalarType::Short, "int16"},         {c10::ScalarType::Char, "int8"},
      {c10::ScalarType::Byte, "uint8"},          {c10::ScalarType::Bool, "bool"},
      {c10::ScalarType::ComplexHalf, "complex32"}, {c10::ScalarType::ComplexFloat, "complex64"},
      {c10::ScalarType::ComplexDouble, "complex128"}, {c10::ScalarType::QInt8, "qint8"},
      {c10::ScalarType::QUInt8, "quint8"},       {c10::ScalarType::QInt32, "qint32"},
      {c10::ScalarType::QUInt4x2, "quint4x2"},
  };
  return kNames;
}

/// Python's names of the layouts (`strided` for `torch.strided`).
inline const std::vector<std::pair<c10::Layout, const char*>>& layout_names() {
  static const std::vector<std::pair<c10::Layout, const char*>> kNames = {
      {c10::Layout::Strided, "strided"}, {c10::Layout::Sparse, "sparse_coo"}, {c10::Layout::SparseCsr, "sparse_csr"},
      {c10::Layout::Mkldnn, "_mkldnn"},  {c10::Layout::SparseCsc, "sparse_csc"}, {c10::Layout::SparseBsr, "sparse_bsr"},
      {c10::Layout::SparseBsc, "sparse_bsc"},
  };
  return kNames;
}

/// Python's names of the memory formats (`contiguous_format` for `torch.contiguous_format`).
inline const std::vector<std::pair<c10::MemoryFormat, const char*>>& memory_format_names() {
  static const std::vector<std::pair<c10::MemoryFormat, const char*>> kNames = {
      {c10::MemoryFormat::Contiguous, "contiguous_format"},
      {c10::MemoryFormat::Preserve, "preserve_format"},
      {c10::MemoryFormat::ChannelsLast, "channels_last"},
      {c10::MemoryFormat::ChannelsLast3d, "channels_last_3d"},
  };
  return kNames;
}

/// The registered callables' names for error messages: `a, b` or `none`.
std::string registered_callable_names();

/// The short dtype names of TensorMeta::str() (`f32`), or nullptr.
const char* dtype_short_name(c10::ScalarType t);

}  // namespace torchcompile::ir::detail
