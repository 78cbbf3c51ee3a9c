// bitsandbytes' 4-bit NormalFloat (nf4) quantization on the host, bit for
// bit as quantize_4bit / dequantize_4bit compute it with blocks of 64: shared
// by sd-quantize-nf4 (QLoRA's stored codes) and LoftQ's start (which
// alternates quantization and SVD), so both see the same codes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sd {

constexpr int64_t kNf4Block = 64; // bitsandbytes' default blocksize, and QLoRA's
// bitsandbytes' NF4 code values (float32), ascending.
extern const float kNf4Values[16];

// quantize_4bit (nf4) of `w` (its size a multiple of kNf4Block): two codes a
// byte, the first in the high half, and each block's absmax.
void quantizeNf4(const float *w, size_t n, std::vector<uint8_t> &packed, std::vector<float> &absmax);
// dequantize_4bit: each code's value times its block's absmax (float32).
std::vector<float> dequantizeNf4(const std::vector<uint8_t> &packed, const std::vector<float> &absmax);

} // namespace sd
