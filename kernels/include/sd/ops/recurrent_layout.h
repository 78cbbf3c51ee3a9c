// What the Recurrence op (one direction of an ONNX RNN/GRU/LSTM) keeps per
// step for its backward, shared by its shape rule and its kernels.
#pragma once
#include <cstdint>
#include <string>

namespace sd::recurrent {

enum class Cell { RNN, GRU, LSTM, Unknown };

inline Cell cellOf(const std::string &name) {
  return name == "LSTM" ? Cell::LSTM : name == "GRU" ? Cell::GRU : name == "RNN" ? Cell::RNN : Cell::Unknown;
}
inline int64_t gates(Cell c) { return c == Cell::LSTM ? 4 : c == Cell::GRU ? 3 : 1; }
inline int64_t activationCount(Cell c) { return c == Cell::LSTM ? 3 : c == Cell::GRU ? 2 : 1; }

// Per step and batch row, `saved` holds, in units of the hidden size H:
//   the gate inputs before clip and activation (gates(c) H; ONNX gate order),
//   the previous hidden state (H),
//   LSTM: the previous and the new cell state (2H); GRU: the recurrent term
//   of the candidate (H: (r*h)·Rhᵀ, or h·Rhᵀ + Rbh with linear_before_reset).
inline int64_t savedWidth(Cell c, int64_t h) { return (gates(c) + 1 + (c == Cell::LSTM ? 2 : c == Cell::GRU ? 1 : 0)) * h; }

} // namespace sd::recurrent
