// CUDA kernels of fused scaled-dot-product attention and its gradient, the
// GEMM + fused-masked-softmax path (f32): per (batch, head) item,
//   P = softmax(scale q kt, mask_value where mask, -inf before the packed
//       sequence's first key), y = P v;
// the gradient recomputes P, then dv = P^T dy, dP = dy v^T,
// dS = P (dP - rowsum(dP P)) (0 where masked), dq = scale dS kt^T,
// dkt = scale q^T dS. Every product is one strided-batched cuBLASLt GEMM
// planned when the session is created, with the [items, T, S] scratch for P
// (and dS) allocated then too. The semantics are the CPU kernel's
// (kernels/cpu/attention.cc). bf16/f16 operands (mixed precision) are widened
// into f32 copies and the results narrowed, as the CPU kernel computes them.
//
// bf16/f16 attention runs cuDNN's fused SDPA instead (cudnn_sdpa.h: flash
// attention, P never materialized): a constant causal mask as cuDNN's
// causal band, any other mask and packed sequences' bounds as an additive
// bias filled each run (one matrix for every item, one per batch row, or
// one per item; a mask that differs between items needs a finite fill). The backward
// takes the forward's output and row statistics (sd-attention-stats: the
// Attention step writes them; else it recomputes both), then runs cuDNN's
// deterministic backward. K reaches cuDNN as [S, d] rows, permuted from the
// op's kt. Layout bshd (token-major operands, keys as rows, grouped key/value
// heads; sd-attention-layout) reaches cuDNN with its strides and head counts
// as it is; the GEMM path runs it on f32 copies in the default layout (the
// keys repeated per query head, their gradients summed back in order).
// QkvAttention (sd-qkv-attention) is layout bshd on q, k and v heads side
// by side in one tensor [B, T, H + 2 Hkv, d], and its gradient writes dq,
// dk and dv side by side in one tensor again: both paths read and write
// them there, through offsets and the wider rows' stride.
// SD_CUDNN_SDPA=0 keeps the GEMM path (to compare the two);
// SD_CUDNN_SDPA=log says per step which path it took and why.
#include "block_reduce.cuh"
#include "cudnn_sdpa.h"
#include "gemm_lt.h"
#include "sd/ops/attention_mask.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <memory>
#include <vector>

namespace sd::cuda {
namespace {

struct AttnGeometry {
  int64_t items = 0, T = 0, S = 0, d = 0, dv = 0;
  int64_t strideQ = 0, strideKt = 0, strideV = 0; // elements between items' matrices (0: shared)
  float scale = 1, maskValue = -INFINITY;
  bool zeroMaskedRows = false; // a row with every key at -inf: probabilities 0, not NaN
  const int64_t *maskOffsets = nullptr; // device, per item; null without a mask
  int64_t maskRowStride = 0, maskColStride = 0;
  int64_t itemsPerRow = 1; // items per positions row (batch row b = item / itemsPerRow)
  // Layout bshd: q [B, T, H, d], k [B, S, Hkv, d], v [B, S, Hkv, dv], items B x H.
  bool tokenMajor = false;
  int64_t B = 0, H = 1, Hkv = 1;
  int64_t P = 0; // QkvAttention: heads per token of its qkv tensor (H + 2 Hkv); 0 for Attention
};

// Where a step's operands sit: q, kt, v at `first` (dy before them for the
// gradient), then mask and positions, then (the gradient) the forward's y
// and row statistics; QkvAttention's one qkv at `first` holds all three.
struct Slots {
  size_t first = 0;
  bool qkv = false;
  size_t mask() const { return first + (qkv ? 1 : 3); }
  size_t positions() const { return mask() + 1; }
  size_t forwardY() const { return positions() + 1; }
};

struct AttnPrepared : PreparedError {
  AttnGeometry g;
  float *p = nullptr, *ds = nullptr; // [items, T, S] scratch
  int64_t *maskOffsets = nullptr;
  std::shared_ptr<LtGemm> scores, output, gradV, gradP, gradQ, gradKt;
  // bf16/f16 operands (mixed precision) run the f32 path through these
  // copies: the float inputs widened, the outputs narrowed after.
  DType dtype = DType::F32;
  std::vector<float *> wideIn, wideOut;
  size_t first = 0; // 1 for AttentionGrad (dy before q, kt, v)
  Slots at;
  // Attention writes each row's log-sum-exp (its second result); AttentionGrad
  // reads the forward's y and log-sum-exp (operands 6 and 7) instead of
  // recomputing them (sd-attention-stats).
  bool writesStats = false, readsStats = false;
  // cuDNN's SDPA, when it takes the step: K as rows (and for the gradient
  // the recomputed output, its row statistics and dK as rows).
  std::shared_ptr<CudnnSdpa> sdpa;
  void *k = nullptr, *o = nullptr, *dk = nullptr, *bias = nullptr;
  float *stats = nullptr;
  // The mask's matrix per item (host), and per bias matrix (device).
  std::vector<int64_t> hostMaskOffsets;
  int64_t *biasItems = nullptr, biasMatrices = 0;
  bool maskInBias = false;
  ~AttnPrepared() {
    cudaFree(bias);
    cudaFree(biasItems);
    cudaFree(k);
    cudaFree(o);
    cudaFree(dk);
    cudaFree(stats);
    cudaFree(p);
    cudaFree(ds);
    cudaFree(maskOffsets);
    for (float *w : wideIn) cudaFree(w);
    for (float *w : wideOut) cudaFree(w);
  }
};

// Offsets of each item's matrix in an operand whose leading dims broadcast to `batch`.
std::vector<int64_t> itemOffsets(const Dims &operand, const Dims &batch, int64_t matrix) {
  size_t lead = operand.size() - 2;
  Dims strides(batch.size(), 0);
  int64_t acc = 1;
  for (size_t i = lead; i-- > 0;) {
    size_t o = batch.size() - lead + i;
    strides[o] = operand[i] == 1 ? 0 : acc;
    acc *= operand[i];
  }
  int64_t items = 1;
  for (int64_t b : batch) items *= b;
  std::vector<int64_t> offsets(static_cast<size_t>(items));
  for (int64_t item = 0; item < items; ++item) {
    int64_t rem = item, off = 0;
    for (size_t d = batch.size(); d-- > 0;) {
      off += (rem % batch[d]) * strides[d];
      rem /= batch[d];
    }
    offsets[size_t(item)] = off * matrix;
  }
  return offsets;
}

// The one stride between consecutive items' offsets, or -1 when there is none.
int64_t uniformStride(const std::vector<int64_t> &offsets) {
  if (offsets.size() < 2) return 0;
  int64_t s = offsets[1] - offsets[0];
  for (size_t i = 0; i < offsets.size(); ++i)
    if (offsets[i] != int64_t(i) * s) return -1;
  return s;
}

GemmShape batched(const AttnGeometry &g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                  int64_t ldc, int64_t sa, int64_t sb, int64_t sc) {
  GemmShape s;
  s.transA = ta;
  s.transB = tb;
  s.m = m;
  s.n = n;
  s.k = k;
  s.lda = lda;
  s.ldb = ldb;
  s.ldc = ldc;
  s.batch = g.items;
  s.strideA = sa;
  s.strideB = sb;
  s.strideC = sc;
  return s;
}

// The mask operand is the causal one (key j hidden from query i iff j > i,
// the same for every item), read from its constant at prepare time.
bool causalMask(const PrepareContext &p, size_t i, const AttnGeometry &g) {
  const KernelContext &c = p.kernel;
  if (i >= p.hostInputs.size() || !p.hostInputs[i]) return false;
  const TensorView &m = c.inputs[i];
  if (m.dtype != DType::Bool || m.dims.size() < 2 || m.dims[m.dims.size() - 2] != g.T || m.dims.back() != g.S)
    return false;
  if (m.numElements() != g.T * g.S) return false; // a mask per item is a padding mask
  return g.maskValue <= kFillThatZeroes && hidesLaterKeys(static_cast<const bool *>(p.hostInputs[i]), g.S, 1, g.T, g.S);
}

// What reaches cuDNN as its additive bias [batch, heads, T, S] (a count of
// 1 broadcasts): the mask, unless it is the causal band, and the packed
// sequences' bounds (-inf before a query's first key). One matrix when
// every item's are equal, one per batch row when its heads share theirs
// (layout bshd: a padding mask, packed sequences), else one per item;
// `items` holds the item each matrix is made for. A row that sees no key
// keeps the GEMM path's rule where it is zeros (zero_masked_rows); a mask
// that differs between items needs a finite fill, so that such a row
// averages every value there as on the GEMM path.
struct BiasLayout {
  int64_t batch = 1, heads = 1;
  std::vector<int64_t> items;
};

bool biasLayout(const AttnPrepared &a, const SdpaShape &shape, bool maskInBias, bool packed, BiasLayout &out) {
  const AttnGeometry &g = a.g;
  const std::vector<int64_t> &om = a.hostMaskOffsets;
  const int64_t items = shape.batch * shape.heads;
  if (!maskInBias && !packed) return false;
  if (maskInBias && (g.zeroMaskedRows || int64_t(om.size()) != items)) return false;
  // What an item's bias matrix depends on: its mask's matrix and its packed row.
  auto key = [&](int64_t i) {
    return std::pair<int64_t, int64_t>{maskInBias ? om[size_t(i)] : 0, packed ? i / g.itemsPerRow : 0};
  };
  bool shared = true, perRow = shape.heads > 1;
  for (int64_t i = 0; i < items; ++i) {
    shared = shared && key(i) == key(0);
    perRow = perRow && key(i) == key(i / shape.heads * shape.heads);
  }
  bool sameMask = !maskInBias || std::all_of(om.begin(), om.end(), [&](int64_t o) { return o == om[0]; });
  if (!sameMask && !std::isfinite(g.maskValue)) return false;
  if (shared) out = {1, 1, {0}};
  else if (perRow) {
    out = {shape.batch, 1, {}};
    for (int64_t b = 0; b < shape.batch; ++b) out.items.push_back(b * shape.heads);
  } else {
    out = {shape.batch, shape.heads, {}};
    for (int64_t i = 0; i < items; ++i) out.items.push_back(i);
  }
  return true;
}

// Plans cuDNN's SDPA for the step when it can take it (why not, under
// SD_CUDNN_SDPA=log); true when it did, with its scratch allocated.
bool useCudnn(const PrepareContext &p, size_t first, AttnPrepared &a) {
  const KernelContext &c = p.kernel;
  const AttnGeometry &g = a.g;
  const char *env = std::getenv("SD_CUDNN_SDPA");
  const bool log = env && std::strcmp(env, "log") == 0;
  std::string why;
  const size_t maskAt = a.at.mask();
  const bool hasMask = c.hasInput(maskAt) && c.inputs[maskAt].data;
  const bool causal = hasMask && causalMask(p, maskAt, g);
  SdpaShape shape;
  shape.batch = g.tokenMajor ? g.B : g.items;
  shape.heads = g.tokenMajor ? g.H : 1;
  shape.kvHeads = g.tokenMajor ? g.Hkv : 1;
  shape.tokenMajor = g.tokenMajor;
  shape.qkvHeads = g.P;
  shape.T = g.T, shape.S = g.S, shape.d = g.d, shape.dv = g.dv;
  const bool packed = c.hasInput(a.at.positions()) && c.inputs[a.at.positions()].data;
  BiasLayout layout;
  const bool bias = biasLayout(a, shape, hasMask && !causal, packed, layout);
  shape.biasBatch = layout.batch, shape.biasHeads = layout.heads;
  shape.scale = g.scale, shape.causal = causal, shape.bias = bias, shape.dtype = a.dtype;
  std::shared_ptr<CudnnSdpa> plan;
  if (env && std::strcmp(env, "0") == 0) why = "SD_CUDNN_SDPA=0";
  else if (a.dtype != DType::BF16 && a.dtype != DType::F16) why = "f32 (cuDNN's SDPA takes bf16 and f16)";
  else if (((hasMask && !causal) || packed) && !bias)
    why = g.zeroMaskedRows ? "rows that see no key get zeros (zero_masked_rows)"
                           : "a mask that differs between items, with an infinite fill";
  else if (!g.tokenMajor && g.items > 1 &&
           (g.strideQ != g.T * g.d || g.strideKt != g.d * g.S || g.strideV != g.S * g.dv))
    why = "operands shared between items";
  else {
    // The forward graph for Attention, and for a gradient that recomputes it; its statistics where read.
    SdpaGraphs graphs{first == 0 || !a.readsStats, (first == 0 && a.writesStats) || (first == 1 && !a.readsStats),
                      first == 1};
    plan = planCudnnSdpa(shape, graphs, streamOf(c), p.shared, why);
  }
  const size_t elem = dtypeSize(a.dtype);
  auto alloc = [&](void **ptr, int64_t elements, size_t size) {
    return cudaMalloc(ptr, size_t(std::max<int64_t>(1, elements)) * size) == cudaSuccess;
  };
  // Keys as rows for cuDNN (the default layout's kt permuted; layout bshd has them).
  const bool keyRows = !g.tokenMajor;
  a.biasMatrices = bias ? layout.batch * layout.heads : 0;
  a.maskInBias = bias && hasMask && !causal;
  if (plan && ((keyRows && !alloc(&a.k, g.items * g.S * g.d, elem)) ||
               (bias && (!alloc(&a.bias, a.biasMatrices * g.T * g.S, elem) ||
                         !uploadVector(layout.items, a.biasItems))) ||
               (first == 1 && ((!a.readsStats && (!alloc(&a.o, g.items * g.T * g.dv, elem) ||
                                                   !alloc(reinterpret_cast<void **>(&a.stats), g.items * g.T,
                                                          sizeof(float)))) ||
                               (keyRows && !alloc(&a.dk, g.items * g.S * g.d, elem)))))) {
    cudaGetLastError();
    why = "cannot allocate its scratch", plan = nullptr;
  }
  if (log) {
    std::string path = "GEMM path: " + why;
    if (plan) {
      path = causal ? "cuDNN SDPA, causal" : "cuDNN SDPA";
      if (bias)
        path += std::string(a.maskInBias ? ", mask" : "") + (packed ? ", packed sequences" : "") + " as bias" +
                (layout.batch == 1 ? "" : layout.heads == 1 && shape.heads > 1 ? " per batch row" : " per item");
    }
    std::fprintf(stderr, "sd: %s %lldx%lldx%lld (d %lld%s): %s\n", first ? "AttentionGrad" : "Attention",
                 (long long)g.items, (long long)g.T, (long long)g.S, (long long)g.d, g.P ? ", q|k|v in one tensor" : "",
                 path.c_str());
  }
  a.sdpa = plan;
  return plan != nullptr;
}

// [items, rows, cols] -> [items, cols, rows].
Status transpose(DType t, const void *x, void *y, int64_t items, int64_t rows, int64_t cols, cudaStream_t s) {
  return permute(TensorView{const_cast<void *>(x), t, {items, rows, cols}}, TensorView{y, t, {items, cols, rows}},
                 {0, 2, 1}, s, "Attention");
}

// A layout-bshd tensor as the GEMM path's items see it: [B, rows, heads,
// cols] token-major, each item (b, h) reading head h / group, its matrix
// [rows, cols] (or, for the keys, transposed: kt [cols, rows]).
struct TokenMajorOperand {
  int64_t rows, heads, group, cols;
  bool transposed;
  int64_t tokenStride; // elements between a token's row and the next: heads * cols, or QkvAttention's wider rows
};

// Operand `i` of the step's inputs (`output` false) or outputs: dy, q, kt, v
// for the gradient (first 1) or q, kt, v (first 0); y, or dq, dkt, dv.
TokenMajorOperand tokenMajorOperand(const AttnGeometry &g, size_t first, size_t i, bool output) {
  const size_t role = output ? (first == 0 ? 3 : i) : (first == 1 && i == 0 ? 3 : i - first); // 0 q, 1 k, 2 v, 3 y
  const int64_t group = g.H / g.Hkv, wide = g.P * g.d; // QkvAttention's q, k, v rows (and their gradients')
  switch (role) {
  case 0: return {g.T, g.H, 1, g.d, false, g.P ? wide : g.H * g.d};
  case 1: return {g.S, g.Hkv, group, g.d, true, g.P ? wide : g.Hkv * g.d};
  case 2: return {g.S, g.Hkv, group, g.dv, false, g.P ? wide : g.Hkv * g.dv};
  default: return {g.T, g.H, 1, g.dv, false, g.H * g.dv};
  }
}

int64_t itemMatrix(const AttnGeometry &g, size_t first, size_t i, bool output) {
  TokenMajorOperand o = tokenMajorOperand(g, first, i, output);
  return o.rows * o.cols;
}

// QkvAttention's geometry: layout bshd on the heads of qkv [B, T, H + 2 Hkv, d].
bool qkvGeometry(const KernelContext &c, size_t first, AttnGeometry &g) {
  const TensorView &qkv = c.inputs[first];
  const int64_t kvHeads = c.attrs.getInt("kv_heads", 0);
  if (qkv.dims.size() != 4 || kvHeads <= 0 || qkv.dims[2] <= 2 * kvHeads || (qkv.dims[2] - 2 * kvHeads) % kvHeads)
    return false;
  g.tokenMajor = true;
  g.P = qkv.dims[2];
  g.B = qkv.dims[0], g.T = g.S = qkv.dims[1], g.H = g.P - 2 * kvHeads, g.Hkv = kvHeads, g.d = g.dv = qkv.dims[3];
  g.items = g.B * g.H;
  g.strideQ = g.T * g.d, g.strideKt = g.d * g.S, g.strideV = g.S * g.dv; // the GEMM path's f32 copies
  return true;
}

// first: 0 for Attention (q, kt, v, mask, positions), 1 for AttentionGrad
// (dy first); `qkv`: QkvAttention (its one qkv instead of q, kt, v).
std::shared_ptr<AttnPrepared> prepareAttention(const PrepareContext &p, size_t first, bool qkv) {
  auto a = std::make_shared<AttnPrepared>();
  a->first = first;
  a->at = Slots{first, qkv};
  const KernelContext &c = p.kernel;
  const size_t statsAt = a->at.forwardY() + 1;
  a->writesStats = first == 0 && c.outputs.size() > 1 && c.outputs[1].data;
  a->readsStats = first == 1 && c.hasInput(statsAt) && c.inputs[statsAt].data;
  AttnGeometry &g = a->g;
  Dims batch;
  const TensorView &q = c.inputs[first], &kt = c.inputs[qkv ? first : first + 1], &v = c.inputs[qkv ? first : first + 2];
  size_t r = q.dims.size();
  if (r < 2 || kt.dims.size() < 2 || v.dims.size() < 2) {
    a->error = "Attention operands need rank >= 2";
    return a;
  }
  g.tokenMajor = qkv || c.attrs.getString("layout", "bhtd") == "bshd";
  if (qkv) {
    if (!qkvGeometry(c, first, g)) {
      a->error = "QkvAttention takes qkv [B, T, H + 2 Hkv, d], H a positive multiple of kv_heads";
      return a;
    }
    batch = {g.B, g.H};
  } else if (g.tokenMajor) {
    if (r != 4 || kt.dims.size() != 4 || v.dims.size() != 4 || kt.dims[2] <= 0 || q.dims[2] % kt.dims[2]) {
      a->error = "Attention in layout bshd takes q [B, T, H, d], k [B, S, Hkv, d], v [B, S, Hkv, dv]";
      return a;
    }
    g.B = q.dims[0], g.T = q.dims[1], g.H = q.dims[2], g.d = q.dims[3];
    g.S = kt.dims[1], g.Hkv = kt.dims[2], g.dv = v.dims[3];
    batch = {g.B, g.H};
    g.items = g.B * g.H;
    // The GEMM path's f32 copies, item after item.
    g.strideQ = g.T * g.d, g.strideKt = g.d * g.S, g.strideV = g.S * g.dv;
  } else {
    g.T = q.dims[r - 2];
    g.d = q.dims[r - 1];
    g.S = kt.dims.back();
    g.dv = v.dims.back();
    batch = first == 0 ? Dims(c.outputs[0].dims.begin(), c.outputs[0].dims.end() - 2)
                       : Dims(q.dims.begin(), q.dims.end() - 2);
    std::vector<int64_t> oq = itemOffsets(q.dims, batch, g.T * g.d), okt = itemOffsets(kt.dims, batch, g.d * g.S),
                         ov = itemOffsets(v.dims, batch, g.S * g.dv);
    g.items = int64_t(oq.size());
    g.strideQ = uniformStride(oq);
    g.strideKt = uniformStride(okt);
    g.strideV = uniformStride(ov);
  }
  if (g.strideQ < 0 || g.strideKt < 0 || g.strideV < 0 ||
      (first == 1 && ((g.items > 1 && (g.strideQ == 0 || g.strideKt == 0 || g.strideV == 0))))) {
    a->error = "Attention on CUDA needs q, kt and v with one matrix per (batch, head) item";
    return a;
  }
  g.scale = float(c.attrs.getFloat("scale", 1.0));
  g.maskValue = float(c.attrs.getFloat("mask_value", -INFINITY));
  g.zeroMaskedRows = c.attrs.getInt("zero_masked_rows", 0) != 0;
  if (c.hasInput(a->at.mask()) && c.inputs[a->at.mask()].data) {
    const TensorView &m = c.inputs[a->at.mask()];
    int64_t mr = m.dims[m.dims.size() - 2], mc = m.dims.back();
    g.maskColStride = mc == 1 ? 0 : 1;
    g.maskRowStride = mr == 1 ? 0 : mc;
    std::vector<int64_t> om = itemOffsets(m.dims, batch, mr * mc);
    a->hostMaskOffsets = om;
    if (!uploadVector(om, a->maskOffsets)) {
      cudaGetLastError();
      a->error = "cannot allocate Attention's mask offsets";
      return a;
    }
    g.maskOffsets = a->maskOffsets;
  }
  if (c.hasInput(a->at.positions()) && c.inputs[a->at.positions()].data)
    g.itemsPerRow = batch.empty() || !batch[0] ? 1 : g.items / batch[0];
  a->dtype = q.dtype;
  if (useCudnn(p, first, *a)) return a;
  if (a->dtype != DType::F32 || g.tokenMajor) {
    size_t floats = first + 3; // q, kt, v (and dy first for the gradient)
    size_t results = first == 0 ? 1 : 3; // y (the f32 log-sum-exp is written as it is), or dq, dkt, dv
    for (size_t i = 0; i < floats + results; ++i) {
      const int64_t elements = g.tokenMajor ? g.items * itemMatrix(g, first, i < floats ? i : i - floats, i >= floats)
                                            : (i < floats ? c.inputs[i] : c.outputs[i - floats]).numElements();
      float *w = nullptr;
      if (cudaMalloc(&w, size_t(std::max<int64_t>(1, elements)) * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        a->error = "cannot allocate Attention's f32 copies";
        return a;
      }
      (i < floats ? a->wideIn : a->wideOut).push_back(w);
    }
  }
  size_t scratch = size_t(std::max<int64_t>(1, g.items * g.T * g.S)) * sizeof(float);
  if (cudaMalloc(&a->p, scratch) != cudaSuccess || (first == 1 && cudaMalloc(&a->ds, scratch) != cudaSuccess)) {
    cudaGetLastError();
    a->error = "cannot allocate Attention's " + std::to_string(scratch >> 20) + " MiB score scratch";
    return a;
  }
  int64_t ts = g.T * g.S;
  // scores[T, S] = q[T, d] kt[d, S] (scale applied as alpha).
  a->scores = planGemm(p, batched(g, false, false, g.T, g.S, g.d, g.d, g.S, g.S, g.strideQ, g.strideKt, ts));
  if (first == 0) {
    // y[T, dv] = P[T, S] v[S, dv].
    a->output = planGemm(p, batched(g, false, false, g.T, g.dv, g.S, g.S, g.dv, g.dv, ts, g.strideV, g.T * g.dv));
  } else {
    // dv[S, dv] = P^T dy[T, dv]; dP[T, S] = dy v^T; dq[T, d] = dS kt^T; dkt[d, S] = q^T dS.
    a->gradV = planGemm(p, batched(g, true, false, g.S, g.dv, g.T, g.S, g.dv, g.dv, ts, g.T * g.dv, g.strideV));
    a->gradP = planGemm(p, batched(g, false, true, g.T, g.S, g.dv, g.dv, g.dv, g.S, g.T * g.dv, g.strideV, ts));
    a->gradQ = planGemm(p, batched(g, false, true, g.T, g.d, g.S, g.S, g.S, g.d, ts, g.strideKt, g.strideQ));
    a->gradKt = planGemm(p, batched(g, true, false, g.d, g.S, g.T, g.d, g.S, g.S, g.strideQ, ts, g.strideKt));
  }
  return a;
}

std::shared_ptr<const void> prepareForward(const PrepareContext &p) { return prepareAttention(p, 0, false); }
std::shared_ptr<const void> prepareGrad(const PrepareContext &p) { return prepareAttention(p, 1, false); }
std::shared_ptr<const void> prepareQkvForward(const PrepareContext &p) { return prepareAttention(p, 0, true); }
std::shared_ptr<const void> prepareQkvGrad(const PrepareContext &p) { return prepareAttention(p, 1, true); }

constexpr int kRowThreads = 256;

__device__ inline bool maskedAt(const AttnGeometry &g, const bool *mask, int64_t item, int64_t i, int64_t j) {
  return mask && mask[g.maskOffsets[item] + i * g.maskRowStride + j * g.maskColStride];
}

// First key query i of `item` may see: the start of its packed sequence.
__device__ inline int64_t keyStart(const AttnGeometry &g, const int64_t *positions, int64_t item, int64_t i) {
  if (!positions) return 0;
  int64_t pos = positions[(item / g.itemsPerRow) * g.T + i];
  return i - (pos < 0 ? 0 : pos > i ? i : pos);
}

// cuDNN's additive bias: per matrix m [T, S] (made for item items[m]),
// -inf before the query's first key (packed sequences), the fill where the
// mask (if in the bias) hides the key, else 0: the GEMM path's scores.
template <typename T>
__global__ void maskBias(AttnGeometry g, const bool *mask, const int64_t *positions, const int64_t *items, float fill,
                         T *bias, int64_t n) {
  const int64_t matrix = g.T * g.S;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t item = items[e / matrix], i = e % matrix / g.S, j = e % g.S;
    bias[e] = store<T>(j < keyStart(g, positions, item, i) ? -INFINITY
                       : maskedAt(g, mask, item, i, j)     ? fill
                                                           : 0.0f);
  }
}

// The fill as the bias's type holds it: a finite fill past its range (the
// float minimum that transformers' masks use, in f16) becomes the type's
// lowest value rather than -inf, so a row that hides every key still
// averages every value, as on the GEMM path.
float biasFill(float fill, DType t) {
  if (!std::isfinite(fill)) return fill;
  return std::max(fill, t == DType::F16 ? -65504.0f : -3.38953139e38f);
}

const bool *maskOf(const KernelContext &c, size_t i) {
  return c.hasInput(i) && c.inputs[i].data ? c.inputs[i].as<bool>() : nullptr;
}
const int64_t *positionsOf(const KernelContext &c, size_t i) {
  return c.hasInput(i) && c.inputs[i].data ? c.inputs[i].as<int64_t>() : nullptr;
}

// The bias for this run's mask and positions (run-time values: written before cuDNN reads it).
Status fillBias(const AttnPrepared &a, const KernelContext &c) {
  if (!a.bias) return Status::ok();
  const AttnGeometry &g = a.g;
  const int64_t n = a.biasMatrices * g.T * g.S;
  return dispatchFloatStorage(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    maskBias<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(
        g, a.maskInBias ? maskOf(c, a.at.mask()) : nullptr, positionsOf(c, a.at.positions()), a.biasItems,
        biasFill(g.maskValue, a.dtype), static_cast<T *>(a.bias), n);
    return launchStatus("Attention");
  });
}

// Rows of P in place: mask, then softmax (sum in f64); with `lse`, each row's
// log-sum-exp (natural log, -inf for a row that sees no key) there too.
__global__ void maskedSoftmax(AttnGeometry g, const bool *mask, const int64_t *positions, float *p, float *lse) {
  for (int64_t row = blockIdx.x; row < g.items * g.T; row += gridDim.x) {
    int64_t item = row / g.T, i = row % g.T, start = keyStart(g, positions, item, i);
    float *pr = p + row * g.S;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < g.S; j += blockDim.x) {
      float s = j < start ? -INFINITY : maskedAt(g, mask, item, i, j) ? g.maskValue : pr[j];
      pr[j] = s;
      mx = MaxOp()(mx, s);
    }
    mx = blockReduce(mx, MaxOp(), -INFINITY);
    if (g.zeroMaskedRows && mx == -INFINITY) {
      for (int64_t j = threadIdx.x; j < g.S; j += blockDim.x) pr[j] = 0.0f;
      if (lse && threadIdx.x == 0) lse[row] = -INFINITY;
      continue;
    }
    if (!(mx > -INFINITY && mx < INFINITY) && mx == mx) mx = 0;
    double sum = 0;
    for (int64_t j = threadIdx.x; j < g.S; j += blockDim.x) sum += double(std::exp(pr[j] - mx));
    sum = blockReduce(sum, SumOp(), 0.0);
    if (lse && threadIdx.x == 0) lse[row] = float(double(mx) + std::log(sum));
    float inv = float(1.0 / sum);
    for (int64_t j = threadIdx.x; j < g.S; j += blockDim.x) pr[j] = std::exp(pr[j] - mx) * inv;
  }
}

// dS = P (dP - rowsum(dP P)) in place of dP, 0 where masked.
__global__ void softmaxBackward(AttnGeometry g, const bool *mask, const float *p, float *ds) {
  for (int64_t row = blockIdx.x; row < g.items * g.T; row += gridDim.x) {
    int64_t item = row / g.T, i = row % g.T;
    const float *pr = p + row * g.S;
    float *dr = ds + row * g.S;
    double dot = 0;
    for (int64_t j = threadIdx.x; j < g.S; j += blockDim.x) dot += double(dr[j]) * double(pr[j]);
    dot = blockReduce(dot, SumOp(), 0.0);
    for (int64_t j = threadIdx.x; j < g.S; j += blockDim.x)
      dr[j] = maskedAt(g, mask, item, i, j) ? 0.0f : pr[j] * (dr[j] - float(dot));
  }
}


const AttnPrepared *preparedOf(const KernelContext &c, Status &st) {
  auto *a = static_cast<const AttnPrepared *>(c.prepared);
  if (!a) st = sdError("Attention was not prepared");
  else if (!a->error.empty()) st = sdError(a->error);
  return st.isOk() ? a : nullptr;
}


template <typename T> __global__ void widenKernel(const T *x, float *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = float(load(x[i]));
}
template <typename T> __global__ void narrowKernel(const float *x, T *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = store<T>(Compute<T>(x[i]));
}

// Token-major [B, rows, heads, cols] to the items' f32 matrices [B*H, rows,
// cols] (transposed: [B*H, cols, rows]), item (b, h) reading head h / group.
template <typename T>
__global__ void gatherItems(const T *x, float *y, int64_t items, int64_t H, TokenMajorOperand o) {
  const int64_t n = items * o.rows * o.cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t item = i / (o.rows * o.cols), at = i % (o.rows * o.cols);
    const int64_t r = o.transposed ? at % o.rows : at / o.cols, c = o.transposed ? at / o.rows : at % o.cols;
    const int64_t b = item / H, h = item % H;
    y[i] = float(load(x[(b * o.rows + r) * o.tokenStride + (h / o.group) * o.cols + c]));
  }
}

// The reverse: each token-major element the sum, in head order, over the
// `group` items that read it (the gradient of a shared key/value head).
template <typename T>
__global__ void scatterItems(const float *y, T *x, int64_t B, int64_t H, TokenMajorOperand o) {
  const int64_t n = B * o.rows * o.heads * o.cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % o.cols, hk = (i / o.cols) % o.heads, r = (i / (o.cols * o.heads)) % o.rows,
                  b = i / (o.cols * o.heads * o.rows);
    const int64_t at = o.transposed ? c * o.rows + r : r * o.cols + c;
    float sum = 0;
    for (int64_t j = 0; j < o.group; ++j) sum += y[(b * H + hk * o.group + j) * o.rows * o.cols + at];
    x[(b * o.rows + r) * o.tokenStride + hk * o.cols + c] = store<T>(Compute<T>(sum));
  }
}

// The step's q, kt, v (dy first for the gradient) and its results (y, or
// dq, dkt, dv) as device addresses. QkvAttention's are heads of its one qkv
// tensor, and its gradient's of its one result: each at its heads' offset.
struct Raw {
  const void *in[4] = {};
  void *out[3] = {};
};

Raw rawOperands(const AttnPrepared &a, const KernelContext &c) {
  Raw r;
  const size_t first = a.first, results = first == 0 ? 1 : 3;
  if (first == 1) r.in[0] = c.inputs[0].data;
  if (!a.at.qkv) {
    for (size_t i = first; i < first + 3; ++i) r.in[i] = c.inputs[i].data;
    for (size_t i = 0; i < results && i < c.outputs.size(); ++i) r.out[i] = c.outputs[i].data;
    return r;
  }
  const int64_t e = int64_t(dtypeSize(a.dtype)), kAt = a.g.H * a.g.d * e, vAt = (a.g.H + a.g.Hkv) * a.g.d * e;
  const char *qkv = static_cast<const char *>(c.inputs[first].data);
  r.in[first] = qkv, r.in[first + 1] = qkv + kAt, r.in[first + 2] = qkv + vAt;
  char *out = static_cast<char *>(c.outputs[0].data);
  r.out[0] = out;
  if (first == 1) r.out[1] = out + kAt, r.out[2] = out + vAt;
  return r;
}

// The f32 operands and results the kernels work on: the tensors themselves,
// or (mixed precision, layout bshd) the prepared f32 copies, the inputs
// widened (and gathered into items) here.
struct F32Operands {
  const void *in[4] = {};
  void *out[3] = {};
};

Status widen(const AttnPrepared &a, const KernelContext &c, const Raw &raw, F32Operands &f) {
  for (size_t i = 0; i < a.wideIn.size() || (a.wideIn.empty() && i < 4); ++i) {
    if (a.wideIn.empty()) {
      f.in[i] = raw.in[i];
      continue;
    }
    f.in[i] = a.wideIn[i];
    int64_t n = a.g.tokenMajor ? a.g.items * itemMatrix(a.g, a.first, i, false) : c.inputs[i].numElements();
    if (n == 0) continue;
    Status st = dispatchFloatStorage(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (a.g.tokenMajor)
        gatherItems<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(static_cast<const T *>(raw.in[i]), a.wideIn[i],
                                                                   a.g.items, a.g.H,
                                                                   tokenMajorOperand(a.g, a.first, i, false));
      else
        widenKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(static_cast<const T *>(raw.in[i]), a.wideIn[i], n);
      return launchStatus("Attention");
    });
    SD_RETURN_IF_ERROR(st);
  }
  const size_t results = a.first == 0 ? 1 : 3;
  for (size_t i = 0; i < results; ++i) f.out[i] = a.wideOut.empty() ? raw.out[i] : a.wideOut[i];
  return Status::ok();
}

Status narrow(const AttnPrepared &a, const KernelContext &c, const Raw &raw) {
  for (size_t i = 0; i < a.wideOut.size(); ++i) {
    const TokenMajorOperand o = tokenMajorOperand(a.g, a.first, i, true);
    const int64_t n = a.g.tokenMajor ? a.g.B * o.rows * o.heads * o.cols : c.outputs[i].numElements();
    if (n == 0 || !raw.out[i]) continue;
    Status st = dispatchFloatStorage(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (a.g.tokenMajor)
        scatterItems<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(a.wideOut[i], static_cast<T *>(raw.out[i]), a.g.B,
                                                                    a.g.H, o);
      else
        narrowKernel<T><<<blocksFor(n), kThreads, 0, streamOf(c)>>>(a.wideOut[i], static_cast<T *>(raw.out[i]), n);
      return launchStatus("Attention");
    });
    SD_RETURN_IF_ERROR(st);
  }
  return Status::ok();
}

// P for every item, in the prepared scratch.
Status probabilities(const AttnPrepared &a, const KernelContext &c, const F32Operands &f, size_t first) {
  const AttnGeometry &g = a.g;
  SD_RETURN_IF_ERROR(a.scores->run(f.in[first], f.in[first + 1], a.p, g.scale, 0.0, streamOf(c)));
  float *lse = first == 0 && a.writesStats ? c.outputs[1].as<float>() : nullptr;
  maskedSoftmax<<<rowBlocks(g.items * g.T), kRowThreads, 0, streamOf(c)>>>(g, maskOf(c, a.at.mask()),
                                                                           positionsOf(c, a.at.positions()), a.p, lse);
  return launchStatus("Attention");
}

// q, kt, v, mask?, positions? -> y (and row statistics); QkvAttention: qkv, mask?, positions?.
Status AttentionKernel(const KernelContext &c) {
  Status st = Status::ok();
  const AttnPrepared *a = preparedOf(c, st);
  if (!a) return st;
  if (a->g.items * a->g.T * a->g.dv == 0) return Status::ok();
  if (a->g.S == 0 || a->g.d == 0) return sdError("Attention on CUDA needs keys and a head dimension");
  const Raw raw = rawOperands(*a, c);
  if (a->sdpa) {
    const AttnGeometry &g = a->g;
    const void *k = raw.in[1]; // layout bshd: keys as rows already
    if (!g.tokenMajor) {
      SD_RETURN_IF_ERROR(transpose(a->dtype, raw.in[1], a->k, g.items, g.d, g.S, streamOf(c)));
      k = a->k;
    }
    SD_RETURN_IF_ERROR(fillBias(*a, c));
    return a->sdpa->forward(raw.in[0], k, raw.in[2], a->bias, raw.out[0],
                            a->writesStats ? c.outputs[1].as<float>() : nullptr, streamOf(c));
  }
  F32Operands f;
  SD_RETURN_IF_ERROR(widen(*a, c, raw, f));
  SD_RETURN_IF_ERROR(probabilities(*a, c, f, 0));
  SD_RETURN_IF_ERROR(a->output->run(a->p, f.in[2], f.out[0], 1.0, 0.0, streamOf(c)));
  return narrow(*a, c, raw);
}

// dy, q, kt, v, mask?, positions?, y?, lse? -> dq, dkt, dv; QkvAttentionGrad:
// dy, qkv, mask?, positions?, y?, lse? -> dqkv.
Status AttentionGradKernel(const KernelContext &c) {
  Status st = Status::ok();
  const AttnPrepared *a = preparedOf(c, st);
  if (!a) return st;
  const AttnGeometry &g = a->g;
  if (g.items * g.T * g.S == 0 || g.d == 0 || g.dv == 0) {
    for (const TensorView &o : c.outputs)
      if (o.data) SD_RETURN_IF_ERROR(cudaCheck(cudaMemsetAsync(o.data, 0, o.byteSize(), streamOf(c)), "AttentionGrad"));
    return Status::ok();
  }
  cudaStream_t s = streamOf(c);
  const Raw raw = rawOperands(*a, c);
  if (a->sdpa) { // the forward's output and statistics (taken or recomputed), then cuDNN's backward
    const void *q = raw.in[1], *v = raw.in[3], *k = raw.in[2];
    void *dk = raw.out[1];
    if (!g.tokenMajor) { // kt permuted into rows, dk back into dkt
      SD_RETURN_IF_ERROR(transpose(a->dtype, raw.in[2], a->k, g.items, g.d, g.S, s));
      k = a->k, dk = a->dk;
    }
    SD_RETURN_IF_ERROR(fillBias(*a, c));
    // The forward's output and statistics: the Attention step's (sd-attention-stats), else recomputed here.
    const void *o = a->o;
    const float *stats = a->stats;
    if (a->readsStats) {
      o = c.inputs[a->at.forwardY()].data;
      stats = c.inputs[a->at.forwardY() + 1].as<float>();
    } else {
      SD_RETURN_IF_ERROR(a->sdpa->forward(q, k, v, a->bias, a->o, a->stats, s));
    }
    SD_RETURN_IF_ERROR(a->sdpa->backward(q, k, v, a->bias, o, raw.in[0], stats, raw.out[0], dk, raw.out[2], s));
    return g.tokenMajor ? Status::ok() : transpose(a->dtype, a->dk, raw.out[1], g.items, g.S, g.d, s);
  }
  F32Operands f;
  SD_RETURN_IF_ERROR(widen(*a, c, raw, f));
  const void *dy = f.in[0], *q = f.in[1], *kt = f.in[2], *v = f.in[3];
  SD_RETURN_IF_ERROR(probabilities(*a, c, f, 1));
  SD_RETURN_IF_ERROR(a->gradV->run(a->p, dy, f.out[2], 1.0, 0.0, s));
  SD_RETURN_IF_ERROR(a->gradP->run(dy, v, a->ds, 1.0, 0.0, s));
  softmaxBackward<<<rowBlocks(g.items * g.T), kRowThreads, 0, s>>>(g, maskOf(c, a->at.mask()), a->p, a->ds);
  SD_RETURN_IF_ERROR(launchStatus("AttentionGrad"));
  SD_RETURN_IF_ERROR(a->gradQ->run(a->ds, kt, f.out[0], g.scale, 0.0, s));
  SD_RETURN_IF_ERROR(a->gradKt->run(q, a->ds, f.out[1], g.scale, 0.0, s));
  return narrow(*a, c, raw);
}

} // namespace

void registerAttentionKernels() {
  TypeSet t{DType::F32, DType::BF16, DType::F16};
  registerKernel("Attention", AttentionKernel, t, prepareForward);
  registerKernel("AttentionGrad", AttentionGradKernel, t, prepareGrad, 1);
  registerKernel("QkvAttention", AttentionKernel, t, prepareQkvForward);
  registerKernel("QkvAttentionGrad", AttentionGradKernel, t, prepareQkvGrad, 1);
}

} // namespace sd::cuda
