// Counter-based random bits for training-time randomness (dropout): every
// value is a pure function of (seed, counter, stream, global element index), so the
// backward pass regenerates the forward's mask instead of storing it, a
// resumed run continues the same sequence from the checkpointed counter, and
// any device computes the same bits. The generator is SplitMix64: element i
// of a stream is output i of a SplitMix64 sequence whose state starts at the
// stream's key (a fixed definition; test/e2e reproduces it in NumPy).
#pragma once
#include "sd/ops/math/host_device.h"
#include <cmath>
#include <cstdint>

namespace sd {

constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

// SplitMix64's output function of state z (the state already advanced).
SD_HD uint64_t splitMixOutput(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The key of one stream (an op site) at one counter value (a micro-batch).
SD_HD uint64_t counterRngKey(uint64_t seed, uint64_t counter, uint64_t stream) {
  uint64_t k = splitMixOutput((seed ^ (stream * 0xD1B54A32D192ED03ull)) + kSplitMixGamma);
  return splitMixOutput((k ^ counter) + kSplitMixGamma);
}

// 64 random bits for element i of the stream with `key`.
SD_HD uint64_t counterRngBits(uint64_t key, uint64_t i) { return splitMixOutput(key + (i + 1) * kSplitMixGamma); }

// Dropout drops element i when its top 24 bits, read as u in [0, 1), fall below the ratio.
SD_HD uint32_t dropoutThreshold(double ratio) { return uint32_t(ratio * double(1u << 24)); }
SD_HD bool dropoutKeeps(uint64_t key, uint64_t i, uint32_t threshold) {
  return uint32_t(counterRngBits(key, i) >> 40) >= threshold;
}

// Element i's uniform draw in [0, 1): the top 24 bits, as dropout reads them.
SD_HD float counterUniform(uint64_t key, uint64_t i) {
  return float(counterRngBits(key, i) >> 40) * (1.0f / 16777216.0f);
}
// Element i's standard normal draw: Box-Muller on two 24-bit uniforms from the
// same bits (the top 24, moved into (0, 1], and the next 24).
SD_HD float counterNormal(uint64_t key, uint64_t i) {
  const uint64_t bits = counterRngBits(key, i);
  const float u1 = float((bits >> 40) + 1) * (1.0f / 16777216.0f);
  const float u2 = float((bits >> 16) & 0xFFFFFFu) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795865f * u2);
}

// Where element 0 of a batch-major tensor of `elements` values sits among the
// global batch's: rng = [seed, counter, row_offset, rows] (rngSize 4) says the
// tensor's `rows` rows start at global row row_offset, so element i is
// global element offset + i, and a row draws the same mask on whichever rank
// holds it. 0 for [seed, counter] states and before the trainer sets rows;
// -1 when `elements` is not a whole number of rows.
SD_HD int64_t dropoutElementOffset(const int64_t *rng, int64_t rngSize, int64_t elements) {
  if (rngSize < 4 || rng[3] <= 0) return 0;
  if (elements % rng[3]) return -1;
  return rng[2] * (elements / rng[3]);
}

} // namespace sd
