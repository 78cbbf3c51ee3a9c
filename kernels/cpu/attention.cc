// CPU kernels of fused scaled-dot-product attention and its gradient.
// Attention(q [..., T, d], kt [..., d, S], v [..., S, dv], mask) computes
// P = softmax(q kt * scale, with mask_value where mask is true) and y = P v
// one (batch, head) item at a time, P in a per-thread T x S scratch that
// never reaches memory as a tensor. The gradient recomputes P from q and kt
// (one extra T x S x d product) instead of keeping [..., T, S] alive from
// the forward, then
//   dv = P^T dy,  dP = dy v^T,  dS = P * (dP - rowsum(dP * P)) (0 where masked),
//   dq = scale dS kt^T,  dkt = scale q^T dS.
// Packed sequences (optional positions [B, T]): query i of batch row b sees
// keys j >= i - positions[b, i] only, i.e. the keys of its own sequence; the
// excluded scores are -inf, so their probabilities and gradients are 0.
// Work is done in blocks of query rows that share a key range: rows of one
// packed sequence start at its first key, and under a causal mask a block of
// rows ends at its last row's key, so neither other sequences' keys nor the
// masked upper triangle are ever multiplied.
// Layout bshd (token-major operands, keys as rows, grouped key/value heads)
// runs the same products on strided rows of the tensors as they are, and
// QkvAttention the same on q, k and v heads side by side in one tensor.
#include "cpu_util.h"
#include "sd/ops/attention_mask.h"
#include "gemm.h"
#include "vecmath.h"
#include <algorithm>
#include <cmath>

namespace sd::cpu {
namespace {

// Offset of each item (a flat index over `batch`) in an operand whose leading
// dims broadcast to `batch` and whose last two dims hold `matrix` elements.
std::vector<int64_t> itemOffsets(const Dims &operand, const Dims &batch, int64_t matrix) {
  Dims strides = broadcastStrides(Dims(operand.begin(), operand.end() - 2), batch);
  std::vector<int64_t> offsets(size_t(product(batch)));
  for (size_t item = 0; item < offsets.size(); ++item) {
    int64_t rem = int64_t(item), off = 0;
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
      off += (rem % batch[size_t(d)]) * strides[size_t(d)];
      rem /= batch[size_t(d)];
    }
    offsets[item] = off * matrix;
  }
  return offsets;
}

// Each item's q [T, d], keys, v [S, dv] and y [T, dv] are matrices at an
// offset with a row stride (ld): packed matrices in the default layout,
// rows of token-major tensors in layout bshd, whose keys are rows [S, d]
// (kRows) where the default layout has them transposed [d, S].
struct Geometry {
  Dims batch; // the items' dims: the scores' [..., T, S] batch
  int64_t T = 0, S = 0, d = 0, dv = 0;
  std::vector<int64_t> q, kt, v, y, mask; // per-item offsets
  int64_t ldq = 0, ldk = 0, ldv = 0, ldy = 0;
  bool kRows = false;
  int64_t group = 1; // query heads per key/value head (bshd): items item..item+group-1 share keys
  int64_t maskRowStride = 0, maskColStride = 0; // 0 where the mask broadcasts
  const bool *maskData = nullptr;
  const int64_t *positions = nullptr; // [B, T]; item / itemsPerRow = b
  int64_t itemsPerRow = 1;
  bool causal = false; // every item's mask hides exactly the keys after the query
  float scale = 1, maskValue = -INFINITY;
  bool zeroMaskedRows = false; // a row with every key at -inf: probabilities 0, not NaN
};

// A block of query rows [r0, r1) that see only keys [c0, c1).
struct Block {
  int64_t r0, r1, c0, c1;
};
// Rows per block under a causal mask: smaller skips more of the masked
// triangle, larger makes longer GEMMs.
constexpr int64_t kCausalRows = 32;

bool masked(const Geometry &g, size_t item, int64_t i, int64_t j) {
  return g.maskData && g.maskData[g.mask[item] + i * g.maskRowStride + j * g.maskColStride];
}

// A causal mask with a fill that underflows softmax to exactly 0, so skipping
// the masked keys changes nothing. Checked once per distinct mask matrix.
bool isCausal(const Geometry &g) {
  if (g.T != g.S || !(g.maskValue <= kFillThatZeroes)) return false;
  std::vector<int64_t> seen;
  for (size_t item = 0; item < g.mask.size(); ++item) {
    if (std::find(seen.begin(), seen.end(), g.mask[item]) != seen.end()) continue;
    seen.push_back(g.mask[item]);
    if (!hidesLaterKeys(g.maskData + g.mask[item], g.maskRowStride, g.maskColStride, g.T, g.S)) return false;
  }
  return true;
}

// Layout bshd: item (b, h) of q [B, T, H, d] starts at b T H d + h d, rows H d
// apart; its keys and values are those of head h / group.
void tokenMajorGeometry(const Dims &q, const Dims &k, const Dims &v, Geometry &g) {
  const int64_t B = q[0], H = q[2], Hkv = k[2];
  g.T = q[1], g.d = q[3], g.S = k[1], g.dv = v[3];
  g.group = H / Hkv;
  g.kRows = true;
  g.ldq = H * g.d, g.ldk = Hkv * g.d, g.ldv = Hkv * g.dv, g.ldy = H * g.dv;
  g.batch = {B, H};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      g.q.push_back(b * g.T * g.ldq + h * g.d);
      g.kt.push_back(b * g.S * g.ldk + (h / g.group) * g.d);
      g.v.push_back(b * g.S * g.ldv + (h / g.group) * g.dv);
      g.y.push_back(b * g.T * g.ldy + h * g.dv);
    }
}

// Where a step's operands sit: q, kt, v at `first` (dy before them for the
// gradient), then mask and positions; QkvAttention's qkv at `first`
// holds all three, so its mask and positions come right after it.
struct Slots {
  size_t first = 0;
  bool qkv = false; // QkvAttention(Grad)
  size_t mask() const { return first + (qkv ? 1 : 3); }
  size_t positions() const { return mask() + 1; }
};

// QkvAttention: qkv [B, T, H + 2 Hkv, d] holds every token's q heads,
// then its key heads, then its value heads: layout bshd's items, each
// matrix's rows (H + 2 Hkv) d apart, all three at offsets in one tensor.
void qkvGeometry(const Dims &qkv, int64_t kvHeads, Geometry &g) {
  const int64_t B = qkv[0], P = qkv[2], H = P - 2 * kvHeads;
  g.T = g.S = qkv[1], g.d = g.dv = qkv[3];
  g.group = H / kvHeads;
  g.kRows = true;
  g.ldq = g.ldk = g.ldv = P * g.d, g.ldy = H * g.d;
  g.batch = {B, H};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t token0 = b * g.T * g.ldq;
      g.q.push_back(token0 + h * g.d);
      g.kt.push_back(token0 + (H + h / g.group) * g.d);
      g.v.push_back(token0 + (H + kvHeads + h / g.group) * g.d);
      g.y.push_back(b * g.T * g.ldy + h * g.d);
    }
}

Status geometryOf(const KernelContext &c, Slots at, Geometry &g) {
  const size_t first = at.first;
  if (at.qkv) {
    const TensorView &qkv = c.inputs[first];
    const int64_t kvHeads = c.attrs.getInt("kv_heads", 0);
    SD_CHECK_ARG(qkv.dtype == DType::F32, "QkvAttention needs f32");
    SD_CHECK_ARG(qkv.rank() == 4 && kvHeads > 0 && qkv.dims[2] > 2 * kvHeads &&
                     (qkv.dims[2] - 2 * kvHeads) % kvHeads == 0,
                 "QkvAttention takes qkv [B, T, H + 2 Hkv, d], H a positive multiple of kv_heads");
    qkvGeometry(qkv.dims, kvHeads, g);
  } else {
    const TensorView &q = c.inputs[first], &kt = c.inputs[first + 1], &v = c.inputs[first + 2];
    SD_CHECK_ARG(q.dtype == DType::F32 && kt.dtype == DType::F32 && v.dtype == DType::F32, "Attention needs f32");
    if (c.attrs.getString("layout", "bhtd") == "bshd") {
      SD_CHECK_ARG(q.rank() == 4 && kt.rank() == 4 && v.rank() == 4 && kt.dims[2] > 0 && q.dims[2] % kt.dims[2] == 0,
                   "Attention in layout bshd takes q [B, T, H, d], k [B, S, Hkv, d], v [B, S, Hkv, dv]");
      tokenMajorGeometry(q.dims, kt.dims, v.dims, g);
    } else {
      size_t r = q.dims.size();
      g.T = q.dims[r - 2];
      g.d = q.dims[r - 1];
      g.S = kt.dims.back();
      g.dv = v.dims.back();
      SD_CHECK_ARG(kt.dims[kt.dims.size() - 2] == g.d && v.dims[v.dims.size() - 2] == g.S,
                   "Attention shapes inconsistent");
      const TensorView &out = c.outputs[0];
      g.batch.assign(out.dims.begin(), out.dims.end() - 2);
      if (first == 1) g.batch.assign(q.dims.begin(), q.dims.end() - 2); // the gradient: outputs are dq, dkt, dv
      g.q = itemOffsets(q.dims, g.batch, g.T * g.d);
      g.kt = itemOffsets(kt.dims, g.batch, g.d * g.S);
      g.v = itemOffsets(v.dims, g.batch, g.S * g.dv);
      for (size_t item = 0; item < g.q.size(); ++item) g.y.push_back(int64_t(item) * g.T * g.dv);
      g.ldq = g.d, g.ldk = g.S, g.ldv = g.dv, g.ldy = g.dv;
    }
  }
  g.scale = float(c.attrs.getFloat("scale", 1.0));
  g.maskValue = float(c.attrs.getFloat("mask_value", -INFINITY));
  g.zeroMaskedRows = c.attrs.getInt("zero_masked_rows", 0) != 0;
  if (c.hasInput(at.mask()) && c.inputs[at.mask()].data) {
    const TensorView &m = c.inputs[at.mask()];
    SD_CHECK_ARG(m.dtype == DType::Bool && m.rank() >= 2, "Attention mask must be bool of rank >= 2");
    int64_t mr = m.dims[m.dims.size() - 2], mc = m.dims.back();
    SD_CHECK_ARG((mr == g.T || mr == 1) && (mc == g.S || mc == 1), "Attention mask does not broadcast");
    g.maskColStride = mc == 1 ? 0 : 1;
    g.maskRowStride = mr == 1 ? 0 : mc;
    g.mask = itemOffsets(m.dims, g.batch, mr * mc);
    g.maskData = m.as<bool>();
    g.causal = isCausal(g);
  }
  if (c.hasInput(at.positions()) && c.inputs[at.positions()].data) {
    const TensorView &pos = c.inputs[at.positions()];
    SD_CHECK_ARG(pos.dtype == DType::I64 && pos.rank() == 2 && !g.batch.empty() && pos.dims[0] == g.batch[0] &&
                     pos.dims[1] == g.T && g.S == g.T,
                 "Attention positions must be i64 [batch, seq] of a self-attention");
    g.positions = pos.as<int64_t>();
    g.itemsPerRow = g.batch[0] ? product(g.batch) / g.batch[0] : 1;
  }
  return Status::ok();
}

// First key query i of `item` may see: the start of its packed sequence.
int64_t keyStart(const Geometry &g, size_t item, int64_t i) {
  if (!g.positions) return 0;
  int64_t p = g.positions[(int64_t(item) / g.itemsPerRow) * g.T + i];
  return i - std::clamp<int64_t>(p, 0, i);
}


// The item's blocks: runs of rows with one sequence start (all rows without
// positions), cut every kCausalRows rows under a causal mask.
void blocksOf(const Geometry &g, size_t item, std::vector<Block> &out) {
  out.clear();
  for (int64_t i = 0; i < g.T;) {
    int64_t start = keyStart(g, item, i), end = i + 1;
    while (end < g.T && keyStart(g, item, end) == start && (!g.causal || end - i < kCausalRows)) ++end;
    out.push_back({i, end, start, g.causal ? end : g.S});
    i = end;
  }
}

// P = softmax(q kt * scale, masked) inside the blocks (T x S with row
// stride S; entries outside the blocks are never read); with `lse`, each
// row's log-sum-exp there too (the optional second result).
void probabilities(const Geometry &g, size_t item, const std::vector<Block> &blocks, const float *q,
                   const float *kt, float *p, float *lse = nullptr) {
  for (const Block &b : blocks) {
    int64_t rows = b.r1 - b.r0, cols = b.c1 - b.c0;
    float *pb = p + b.r0 * g.S + b.c0;
    const float *qb = q + g.q[item] + b.r0 * g.ldq;
    if (g.kRows)
      gemm<float>(false, true, rows, cols, g.d, g.scale, qb, g.ldq, kt + g.kt[item] + b.c0 * g.ldk, g.ldk, 0.0f, pb,
                  g.S);
    else
      gemm<float>(false, false, rows, cols, g.d, g.scale, qb, g.ldq, kt + g.kt[item] + b.c0, g.ldk, 0.0f, pb, g.S);
    for (int64_t i = b.r0; i < b.r1; ++i) {
      float *row = p + i * g.S;
      if (g.maskData && !g.causal)
        for (int64_t j = b.c0; j < b.c1; ++j)
          if (masked(g, item, i, j)) row[j] = g.maskValue;
      // Under a causal mask the keys after the query get probability 0
      // exactly (their exp underflows): the softmax runs over the rest only.
      int64_t end = g.causal ? std::min(b.c1, i + 1) : b.c1;
      if (g.zeroMaskedRows && std::all_of(row + b.c0, row + end, [](float s) { return s == -INFINITY; })) {
        std::fill(row + b.c0, row + b.c1, 0.0f);
        if (lse) lse[i] = -INFINITY;
        continue;
      }
      vsoftmaxRow(row + b.c0, row + b.c0, end - b.c0, lse ? lse + i : nullptr);
      std::fill(row + end, row + b.c1, 0.0f);
    }
  }
}

Status attentionOn(const KernelContext &c, bool qkv) {
  Geometry g;
  SD_RETURN_IF_ERROR(geometryOf(c, Slots{0, qkv}, g));
  // QkvAttention: the items' offsets reach into the one qkv tensor.
  const float *q = c.inputs[0].as<float>(), *kt = qkv ? q : c.inputs[1].as<float>(),
              *v = qkv ? q : c.inputs[2].as<float>();
  float *y = c.outputs[0].as<float>();
  // The rows' log-sum-exp, item after item ([..., T]; layout bshd: [B, H, T], the items' order).
  float *lse = c.outputs.size() > 1 && c.outputs[1].data ? c.outputs[1].as<float>() : nullptr;
  parallelFor(c.pool, int64_t(g.q.size()), 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(size_t(g.T * g.S));
    std::vector<Block> blocks;
    for (int64_t item = i0; item < i1; ++item) {
      size_t it = size_t(item);
      blocksOf(g, it, blocks);
      probabilities(g, it, blocks, q, kt, p.data(), lse ? lse + item * g.T : nullptr);
      for (const Block &b : blocks)
        gemm<float>(false, false, b.r1 - b.r0, g.dv, b.c1 - b.c0, 1.0f, p.data() + b.r0 * g.S + b.c0, g.S,
                    v + g.v[it] + b.c0 * g.ldv, g.ldv, 0.0f, y + g.y[it] + b.r0 * g.ldy, g.ldy);
    }
  });
  return Status::ok();
}

// AttentionGrad(dy, q, kt, v, mask, positions, y, lse) -> dq, dkt, dv (q, kt,
// v share batch dims). The forward's y and lse (sd-attention-stats) are not
// read: the blocks recompute P, which costs what reading it back would save.
// Blocks partition the query rows, so each dq row is written once; blocks
// may share keys, so key and value gradients accumulate. Query heads that
// share a key/value head (layout bshd) write theirs apart, every item in
// parallel, and the shared head's gradient is their sum in head order: the
// same bits on any number of threads.
Status attentionGradOn(const KernelContext &c, bool qkv) {
  Geometry g;
  SD_RETURN_IF_ERROR(geometryOf(c, Slots{1, qkv}, g));
  // QkvAttentionGrad: dq, dk and dv at q's, k's and v's offsets in one dqkv.
  const float *dy = c.inputs[0].as<float>(), *q = c.inputs[1].as<float>(), *kt = qkv ? q : c.inputs[2].as<float>(),
              *v = qkv ? q : c.inputs[3].as<float>();
  float *dq = c.outputs[0].as<float>(), *dkt = qkv ? dq : c.outputs[1].as<float>(),
        *dv = qkv ? dq : c.outputs[2].as<float>();
  const int64_t items = int64_t(g.q.size());
  const bool shared = g.group > 1;
  // Shared heads: each item's dk [S, d] and dv [S, dv] rows, summed below.
  std::vector<float> apart(shared ? size_t(items * g.S * (g.d + g.dv)) : 0);
  parallelFor(c.pool, items, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(size_t(g.T * g.S)), ds(size_t(g.T * g.S));
    std::vector<Block> blocks;
    for (int64_t item = i0; item < i1; ++item) {
      size_t it = size_t(item);
      const float *dyi = dy + g.y[it], *ki = kt + g.kt[it], *qi = q + g.q[it];
      float *dqi = dq + g.q[it];
      float *dkti = shared ? apart.data() + item * g.S * (g.d + g.dv) : dkt + g.kt[it];
      float *dvi = shared ? dkti + g.S * g.d : dv + g.v[it];
      const int64_t ldk = shared ? g.d : g.ldk, ldv = shared ? g.dv : g.ldv;
      if (g.kRows) {
        for (int64_t j = 0; j < g.S; ++j) {
          std::fill(dkti + j * ldk, dkti + j * ldk + g.d, 0.0f);
          std::fill(dvi + j * ldv, dvi + j * ldv + g.dv, 0.0f);
        }
      } else {
        std::fill(dkti, dkti + g.d * g.S, 0.0f);
        std::fill(dvi, dvi + g.S * g.dv, 0.0f);
      }
      blocksOf(g, it, blocks);
      probabilities(g, it, blocks, q, kt, p.data());
      for (const Block &b : blocks) {
        int64_t rows = b.r1 - b.r0, cols = b.c1 - b.c0;
        const float *pb = p.data() + b.r0 * g.S + b.c0, *dyb = dyi + b.r0 * g.ldy;
        float *dsb = ds.data() + b.r0 * g.S + b.c0;
        gemm<float>(true, false, cols, g.dv, rows, 1.0f, pb, g.S, dyb, g.ldy, 1.0f, dvi + b.c0 * ldv, ldv);
        gemm<float>(false, true, rows, cols, g.dv, 1.0f, dyb, g.ldy, v + g.v[it] + b.c0 * g.ldv, g.ldv, 0.0f, dsb,
                    g.S);
        for (int64_t i = 0; i < rows; ++i) {
          float *dsr = dsb + i * g.S;
          const float *pr = pb + i * g.S;
          // Causal: the keys after the query have P = 0 and no gradient.
          int64_t end = g.causal ? std::min(cols, b.r0 + i + 1 - b.c0) : cols;
          double dot = 0;
          for (int64_t j = 0; j < end; ++j) dot += double(dsr[j]) * double(pr[j]);
          if (g.causal) {
            for (int64_t j = 0; j < end; ++j) dsr[j] = pr[j] * (dsr[j] - float(dot));
            std::fill(dsr + end, dsr + cols, 0.0f);
          } else {
            for (int64_t j = 0; j < cols; ++j)
              dsr[j] = masked(g, it, b.r0 + i, b.c0 + j) ? 0.0f : pr[j] * (dsr[j] - float(dot));
          }
        }
        if (g.kRows) { // dq = scale dS k, dk += scale dSᵀ q
          gemm<float>(false, false, rows, g.d, cols, g.scale, dsb, g.S, ki + b.c0 * g.ldk, g.ldk, 0.0f,
                      dqi + b.r0 * g.ldq, g.ldq);
          gemm<float>(true, false, cols, g.d, rows, g.scale, dsb, g.S, qi + b.r0 * g.ldq, g.ldq, 1.0f,
                      dkti + b.c0 * ldk, ldk);
        } else { // dq = scale dS ktᵀ, dkt += scale qᵀ dS
          gemm<float>(false, true, rows, g.d, cols, g.scale, dsb, g.S, ki + b.c0, g.ldk, 0.0f, dqi + b.r0 * g.ldq,
                      g.ldq);
          gemm<float>(true, false, g.d, cols, rows, g.scale, qi + b.r0 * g.ldq, g.ldq, dsb, g.S, 1.0f, dkti + b.c0,
                      g.ldk);
        }
      }
    }
  });
  if (!shared) return Status::ok();
  // A shared head's row j: the sum over its query heads, in order.
  const int64_t keyHeads = items / g.group;
  parallelFor(c.pool, keyHeads * g.S, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t kh = r / g.S, j = r % g.S, first = kh * g.group;
      float *dkr = dkt + g.kt[size_t(first)] + j * g.ldk, *dvr = dv + g.v[size_t(first)] + j * g.ldv;
      std::fill(dkr, dkr + g.d, 0.0f);
      std::fill(dvr, dvr + g.dv, 0.0f);
      for (int64_t item = first; item < first + g.group; ++item) {
        const float *own = apart.data() + item * g.S * (g.d + g.dv); // this item's dk [S, d], then dv [S, dv]
        const float *dki = own + j * g.d, *dvi = own + g.S * g.d + j * g.dv;
        for (int64_t e = 0; e < g.d; ++e) dkr[e] += dki[e];
        for (int64_t e = 0; e < g.dv; ++e) dvr[e] += dvi[e];
      }
    }
  });
  return Status::ok();
}

Status AttentionKernel(const KernelContext &c) { return attentionOn(c, false); }
Status AttentionGradKernel(const KernelContext &c) { return attentionGradOn(c, false); }
Status QkvAttentionKernel(const KernelContext &c) { return attentionOn(c, true); }
Status QkvAttentionGradKernel(const KernelContext &c) { return attentionGradOn(c, true); }

} // namespace

void registerAttentionKernels() {
  registerCpuKernel("Attention", AttentionKernel, TypeSet{DType::F32});
  registerCpuKernel("AttentionGrad", AttentionGradKernel, TypeSet{DType::F32});
  registerCpuKernel("QkvAttention", QkvAttentionKernel, TypeSet{DType::F32});
  registerCpuKernel("QkvAttentionGrad", QkvAttentionGradKernel, TypeSet{DType::F32});
}

} // namespace sd::cpu
