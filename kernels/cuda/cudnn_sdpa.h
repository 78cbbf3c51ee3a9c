// Fused attention through cuDNN's SDPA graphs (cudnn-frontend, header-only,
// from PyPI's nvidia-cudnn-frontend wheel), for the Attention and
// AttentionGrad kernels in bf16/f16: no mask or a causal one as cuDNN's
// causal band; another mask and packed sequences' bounds enter as an
// additive bias (0, the fill, or -inf before a sequence's first key): one
// shared by every item, one per batch row shared by its heads, or one per
// item. cuDNN is loaded at run time (libcudnn.so.9): where it is
// missing, or refuses a shape, the plan carries the reason and the kernels
// run their GEMM + fused-masked-softmax path instead. This header keeps the
// frontend (and its JSON library) out of every other translation unit.
#pragma once
#include "sd/ops/kernel.h"
#include <map>
#include <memory>
#include <string>
#include <cuda_runtime_api.h>

namespace sd::cuda {

// batch x heads attentions, each q [T, d], k [S, d] (rows: keys), v [S, dv],
// y [T, dv]: stored item after item (heads = kvHeads = 1, batch = the items),
// or token-major (q and y [batch, T, heads, .], k and v [batch, S, kvHeads,
// .], query head h reading key/value head h / (heads / kvHeads)).
struct SdpaShape {
  int64_t batch = 0, heads = 1, kvHeads = 1, T = 0, S = 0, d = 0, dv = 0;
  bool tokenMajor = false;
  // QkvAttention: q, k and v (and their gradients) are heads of one
  // token-major tensor of qkvHeads heads per token (its rows that far
  // apart); 0: each its own tensor.
  int64_t qkvHeads = 0;
  float scale = 1;
  bool causal = false; // key j visible to query i iff j <= i
  bool bias = false;   // an additive bias [biasBatch, biasHeads, T, S] (a mask's 0 or fill),
  int64_t biasBatch = 1, biasHeads = 1; // each 1 (broadcast) or the batch's / heads' count
  DType dtype = DType::BF16;
};

class CudnnSdpa {
public:
  virtual ~CudnnSdpa() = default;
  // y = softmax(scale q kᵀ) v; with `stats` (f32 [batch, heads, T]; a forward
  // planned with forwardStats) also each row's log-sum-exp, which backward() needs.
  virtual Status forward(const void *q, const void *k, const void *v, const void *bias, void *y, float *stats,
                         cudaStream_t stream) const = 0;
  // dq, dk, dv from the forward's y and stats and dy (deterministic: no atomics).
  virtual Status backward(const void *q, const void *k, const void *v, const void *bias, const void *y,
                          const void *dy, const float *stats, void *dq, void *dk, void *dv,
                          cudaStream_t stream) const = 0;
};

// Which graphs a step needs: the forward (writing row statistics or not) and the backward.
struct SdpaGraphs {
  bool forward = true, forwardStats = false, backward = false;
};

// The cuDNN graphs for `shape`, built and their workspace allocated now,
// when the session is created. Null with `why` set when cuDNN cannot run it.
// `shared` holds the session's one cuDNN handle.
std::shared_ptr<CudnnSdpa> planCudnnSdpa(const SdpaShape &shape, const SdpaGraphs &graphs, cudaStream_t stream,
                                         std::map<std::string, std::shared_ptr<const void>> &shared,
                                         std::string &why);

} // namespace sd::cuda
