// bitsandbytes' NF4 on the host (see Nf4.h).
#include "Nf4.h"
#include <algorithm>
#include <cmath>

namespace sd {

const float kNf4Values[16] = {-1.0f,
                              -0.6961928009986877f,
                              -0.5250730514526367f,
                              -0.39491748809814453f,
                              -0.28444138169288635f,
                              -0.18477343022823334f,
                              -0.09105003625154495f,
                              0.0f,
                              0.07958029955625534f,
                              0.16093020141124725f,
                              0.24611230194568634f,
                              0.33791524171829224f,
                              0.44070982933044434f,
                              0.5626170039176941f,
                              0.7229568362236023f,
                              1.0f};

// Each block's absmax, the values times its reciprocal clamped to [-1, 1],
// each given the code whose interval between the table's midpoints holds it
// (a midpoint itself going down).
void quantizeNf4(const float *w, size_t n, std::vector<uint8_t> &packed, std::vector<float> &absmax) {
  float bounds[15];
  for (int i = 0; i < 15; ++i) bounds[i] = (kNf4Values[i] + kNf4Values[i + 1]) / 2.0f; // float32, as torch computes them
  std::vector<uint8_t> codes(n);
  const size_t block = size_t(kNf4Block);
  absmax.assign(n / block, 0.0f);
  for (size_t b = 0; b < absmax.size(); ++b) {
    float m = 0;
    for (size_t i = 0; i < block; ++i) m = std::max(m, std::fabs(w[b * block + i]));
    absmax[b] = m;
    const float inv = 1.0f / std::max(m, 1e-38f);
    for (size_t i = 0; i < block; ++i) {
      const float scaled = std::clamp(w[b * block + i] * inv, -1.0f, 1.0f);
      // torch.bucketize (right=False): the number of bounds strictly below the value.
      codes[b * block + i] = uint8_t(std::lower_bound(bounds, bounds + 15, scaled) - bounds);
    }
  }
  packed.resize(codes.size() / 2);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t(codes[2 * i] << 4 | codes[2 * i + 1]);
}

std::vector<float> dequantizeNf4(const std::vector<uint8_t> &packed, const std::vector<float> &absmax) {
  std::vector<float> w(packed.size() * 2);
  for (size_t i = 0; i < w.size(); ++i) {
    uint8_t code = i % 2 ? packed[i / 2] & 15 : packed[i / 2] >> 4;
    w[i] = kNf4Values[code] * absmax[i / size_t(kNf4Block)];
  }
  return w;
}

} // namespace sd
