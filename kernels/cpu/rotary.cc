// CPU kernel of Rotary, the fused rotary position embedding (see SDOps.td):
// each row of D features is rotated pairwise by the angles of its position,
// whose cos and sin come from the row's [Bc, S, W] slice or, with positions,
// from the table row its position names. Gradient = the same rotation
// transposed (attribute `transposed`), so one kernel serves both directions.
// With rotated_heads, heads past the rotated ones (a fused q|k|v's values)
// are copied as they are.
#include "cpu_util.h"
#include "half_convert.h"

namespace sd::cpu {
namespace {

// The pairs (p, q) rotated together and where their cos/sin sit in a row of
// width w: rotate-half pairs feature j with j + D/2, interleaved pairs 2i
// with 2i + 1; a half-width row holds one angle per pair.
struct PairLayout {
  int64_t d, half;
  bool interleaved, halfWidth;
  int64_t p(int64_t i) const { return interleaved ? 2 * i : i; }
  int64_t q(int64_t i) const { return interleaved ? 2 * i + 1 : i + half; }
  int64_t cp(int64_t i) const { return halfWidth ? i : p(i); }
  int64_t cq(int64_t i) const { return halfWidth ? i : q(i); }
};

template <typename T>
void rotateRow(const T *x, const T *c, const T *s, T *y, const PairLayout &l, bool transposed, bool rotated = true) {
  if (!rotated) { // a head rotated_heads leaves as it is (a value head of a fused q|k|v)
    std::copy(x, x + l.d, y);
    return;
  }
  for (int64_t i = 0; i < l.half; ++i) {
    const int64_t p = l.p(i), q = l.q(i), cp = l.cp(i), cq = l.cq(i);
    const T xp = x[p], xq = x[q];
    if (!transposed) {
      y[p] = xp * c[cp] - xq * s[cp];
      y[q] = xq * c[cq] + xp * s[cq];
    } else {
      y[p] = xp * c[cp] + xq * s[cq];
      y[q] = xq * c[cq] - xp * s[cp];
    }
  }
}

Status RotaryKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &cosT = c.inputs[1], &sinT = c.inputs[2];
  const bool hasPositions = c.hasInput(3) && c.inputs[3].data;
  const int64_t rank = int64_t(x.dims.size());
  if (rank < 3) return sdError("Rotary takes an input [B, ..., S, D]");
  const int64_t seqAxis = c.attrs.getInt("seq_axis", rank - 2);
  if (seqAxis < 1 || seqAxis > rank - 2)
    return sdError("Rotary: seq_axis ", seqAxis, " is not an axis of ", formatDims(x.dims),
                   " between the batch and the features");
  const int64_t d = x.dims[size_t(rank - 1)], seq = x.dims[size_t(seqAxis)], batch = x.dims[0];
  int64_t rowsPerToken = 1; // rows of one token (token-major x [B, S, H, D]: H)
  for (int64_t a = seqAxis + 1; a < rank - 1; ++a) rowsPerToken *= x.dims[size_t(a)];
  const int64_t w = cosT.dims.back();
  // rotated_heads: row r is head r % rowsPerToken of its token; heads from it on pass through.
  const int64_t rotatedHeads = c.attrs.getInt("rotated_heads", 0);
  auto rotates = [&](int64_t r) { return rotatedHeads <= 0 || r % rowsPerToken < rotatedHeads; };
  PairLayout l{d, d / 2, c.attrs.getInt("interleaved", 0) != 0, 2 * w == d};
  const bool transposed = c.attrs.getInt("transposed", 0) != 0;
  const int64_t rows = d ? x.numElements() / d : 0;
  const int64_t perBatch = batch ? rows / batch : 0; // rows of one batch item: [..., S]
  const int64_t tableRows = cosT.dims[0];
  const int64_t *pos = hasPositions ? c.inputs[3].as<int64_t>() : nullptr;
  if (pos) {
    for (int64_t i = 0; i < batch * seq; ++i)
      if (pos[i] < 0 || pos[i] >= tableRows)
        return sdError("Rotary: position ", pos[i], " (row ", i / seq, ", token ", i % seq,
                       ") is outside the cos/sin table of ", tableRows, " positions");
  }
  // Row r of x is batch item b = r / perBatch at sequence index (r / rowsPerToken) % seq.
  auto angleRow = [&](int64_t r) -> int64_t {
    const int64_t b = r / perBatch, t = (r / rowsPerToken) % seq;
    if (pos) return pos[b * seq + t];
    return (tableRows == 1 ? 0 : b) * seq + t;
  };
  if (dtypeIsHalf(x.dtype)) {
    // A half x with f32 tables (sd-half-elementwise): each row widened, the
    // f32 rotation, rounded as Cast rounds: the bits of the f32 step between casts.
    SD_CHECK_ARG(cosT.dtype == DType::F32, "Rotary on ", dtypeName(x.dtype), " takes f32 cos and sin");
    const float *pc = cosT.as<float>(), *ps = sinT.as<float>();
    parallelFor(c.pool, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)), [&](int64_t b, int64_t e) {
      std::vector<float> in(static_cast<size_t>(d)), out(static_cast<size_t>(d));
      for (int64_t r = b; r < e; ++r) {
        const int64_t a = angleRow(r);
        widenHalf(x.dtype, x.as<uint16_t>() + r * d, in.data(), d);
        rotateRow(in.data(), pc + a * w, ps + a * w, out.data(), l, transposed, rotates(r));
        narrowHalf(x.dtype, out.data(), c.outputs[0].as<uint16_t>() + r * d, d);
      }
    });
    return Status::ok();
  }
  return dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>(), *pc = cosT.as<T>(), *ps = sinT.as<T>();
    T *py = c.outputs[0].as<T>();
    parallelFor(c.pool, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t a = angleRow(r);
        rotateRow(px + r * d, pc + a * w, ps + a * w, py + r * d, l, transposed, rotates(r));
      }
    });
    return Status::ok();
  });
}

} // namespace

void registerRotaryKernels() { registerCpuKernel("Rotary", RotaryKernel, TypeSet::floats() | TypeSet::halves()); }

} // namespace sd::cpu
