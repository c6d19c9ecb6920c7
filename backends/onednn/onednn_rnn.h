// Private to the onednn backend: LibTorch's LSTM and GRU layers (`aten::lstm.input`,
// `aten::gru.input`, inference) as oneDNN RNN primitives, one per layer, with prepacked weights.
// onednn_rnn.cpp also holds the compiler's RNN matcher and emitter (Compiler::match_rnn, emit_rnn).
#pragma once

#include "onednn_runtime.h"

#include <memory>
#include <optional>
#include <vector>

namespace torchcompile::backends::onednn::detail {

/// What an `aten::lstm.input` / `aten::gru.input` node computes, as the matcher read it.
struct RnnSpec {
  bool gru = false;  // else LSTM
  int64_t layers = 1, dirs = 1;
  int64_t seq = 0, batch = 0, input_size = 0, hidden = 0;
  bool batch_first = false;
  bool has_biases = true;
  /// Per (layer, direction), in LibTorch's order: w_ih, w_hh[, b_ih, b_hh].
  std::vector<const at::Tensor*> params;
  int64_t gates() const { return gru ? 3 : 4; }
  int64_t params_per_cell() const { return has_biases ? 4 : 2; }
};

/// The step running `spec`: reads `x` (the sequence) and `h0` (and `c0` for an LSTM), writes
/// `outs` (output, h_n[, c_n]) as ATen lays them out. Throws dnnl::error if oneDNN has no
/// primitive for it.
std::unique_ptr<Step> make_rnn_step(const RnnSpec& spec, PlainIn x, PlainIn h0, std::optional<PlainIn> c0,
                                    std::vector<uint32_t> outs);

/// `TORCHCOMPILE_ONEDNN_RNN=0` leaves LSTM and GRU layers to ATen (default: lowered).
bool rnn_enabled();

}  // namespace torchcompile::backends::onednn::detail
