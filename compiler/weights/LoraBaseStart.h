// PEFT's LoRA initializations that start the adapter from the base weight and
// rewrite the base weight (init_lora_weights "pissa", "olora", "loftq"),
// shared by sd-peft-lora (the plan's start) and sdc merge (which rebuilds the
// rewritten base from the original model, as PEFT does when it loads such an
// adapter). Weights are [out, in] as nn.Linear holds them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

struct LoraBaseStart {
  std::vector<float> a;    // lora_A [r, in]
  std::vector<float> b;    // lora_B [out, r]
  std::vector<float> base; // the weight the layer keeps [out, in]
};

// Whether `init` is one of the initializations above.
bool rewritesBaseWeight(const std::string &init);

// The start for `w` [out, in]:
//   pissa  W = U S Vᵀ; A = sqrt(S_r / scale) V_rᵀ, B = U_r sqrt(S_r / scale), base W - scale B A
//   olora  W = Q R;    A = R[:r], B = Q[:, :r],                              base W - scale B A
//   loftq  loftqIter rounds of: Q = nf4(res); B A = rank-r SVD of W - deq(Q); res = W - B A;
//          base deq(Q) (B A unscaled, as PEFT's loftq_init)
// computed in fp64 (LAPACK) and rounded, the SVD's signs fixed as
// OsftSplit's. Fails with `error` set (r larger than min(out, in), a weight
// LoftQ cannot quantize, a LAPACK failure).
bool loraBaseStart(const std::string &init, const std::vector<float> &w, int64_t out, int64_t in, int64_t r,
                   double scale, int64_t loftqIter, LoraBaseStart &start, std::string &error);

} // namespace sd
