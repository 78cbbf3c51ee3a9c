// Broadcasting and axis normalization for the shape rules.
#include "shape_util.h"
#include <algorithm>

namespace sd {

Status broadcastDims(const std::vector<const TensorInfo *> &ins, TensorInfo &out) {
  out.rankKnown = true;
  out.dims.clear();
  int64_t rank = 0;
  for (auto *t : ins) {
    if (!t->rankKnown) {
      out.rankKnown = false;
      return Status::ok();
    }
    rank = std::max(rank, t->rank());
  }
  out.dims.assign(size_t(rank), 1);
  std::vector<bool> known(size_t(rank), true);
  for (int64_t i = 0; i < rank; ++i) {
    int64_t d = 1;
    bool unknown = false;
    for (auto *t : ins) {
      int64_t off = rank - t->rank();
      if (i < off) continue;
      int64_t v = t->dims[size_t(i - off)];
      if (v == kUnknownDim) { unknown = true; continue; }
      if (v == 1) continue;
      if (d != 1 && d != v)
        return sdError("shapes ", formatDims(ins[0]->dims), " and ",
                       formatDims(ins.size() > 1 ? ins[1]->dims : Dims{}),
                       " do not broadcast");
      d = v;
    }
    out.dims[size_t(i)] = (d == 1 && unknown) ? kUnknownDim : d;
  }
  return Status::ok();
}

Status normalizeAxis(int64_t &axis, int64_t rank, const char *what) {
  if (rank < 0) return sdError(what, " ", axis, " needs a known rank");
  if (axis < -rank || axis >= rank) return sdError(what, " ", axis, " out of range for rank ", rank);
  if (axis < 0) axis += rank;
  return Status::ok();
}

Status checkChoice(const AttrMap &attrs, const char *name, std::initializer_list<const char *> allowed) {
  std::string v = attrs.getString(name, *allowed.begin());
  for (const char *a : allowed)
    if (v == a) return Status::ok();
  std::string list;
  for (const char *a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  return sdError(name, " '", v, "' is not one of ", list);
}

Status checkAttentionPositions(const TensorInfo &q, const TensorInfo &kt, const TensorInfo &positions,
                               bool tokenMajor) {
  SD_CHECK_ARG(positions.dtype == DType::I64 && positions.rank() == 2, "Attention positions must be i64 [batch, seq]");
  SD_CHECK_ARG(q.rank() >= 3 && kt.rank() >= 2, "Attention with positions needs q [batch, ..., seq, d]");
  if (!q.isStatic() || !kt.isStatic() || !positions.isStatic()) return Status::ok();
  int64_t T = tokenMajor ? q.dims[1] : q.dims[q.dims.size() - 2], S = tokenMajor ? kt.dims[1] : kt.dims.back();
  if (positions.dims != Dims{q.dims[0], T} || S != T)
    return sdError("Attention positions ", formatDims(positions.dims), " do not fit queries ", formatDims(q.dims),
                   " and keys ", formatDims(kt.dims), " (self-attention [batch, seq] expected)");
  return Status::ok();
}

Status tokenMajorAttentionDims(const TensorInfo &q, const TensorInfo &k, const TensorInfo &v, Dims &scores, Dims &out) {
  SD_CHECK_ARG(q.rank() == 4 && k.rank() == 4 && v.rank() == 4,
               "Attention in layout bshd takes q [B, T, H, d], k [B, S, Hkv, d] and v [B, S, Hkv, dv]");
  if (!q.isStatic() || !k.isStatic() || !v.isStatic()) return sdError("Attention in layout bshd needs static shapes");
  const int64_t b = q.dims[0], t = q.dims[1], h = q.dims[2], d = q.dims[3], s = k.dims[1], hkv = k.dims[2];
  SD_CHECK_ARG(k.dims == Dims({b, s, hkv, d}) && v.dims[0] == b && v.dims[1] == s && v.dims[2] == hkv,
               "Attention in layout bshd: q ", formatDims(q.dims), ", k ", formatDims(k.dims), " and v ",
               formatDims(v.dims), " do not fit [B, T, H, d], [B, S, Hkv, d], [B, S, Hkv, dv]");
  SD_CHECK_ARG(hkv > 0 && h % hkv == 0, "Attention in layout bshd: ", h, " query heads are not a multiple of ", hkv,
               " key/value heads");
  scores = {b, h, t, s};
  out = {b, t, h, v.dims[3]};
  return Status::ok();
}

Dims attentionRowDims(const Dims &out, bool tokenMajor) {
  if (tokenMajor) return {out[0], out[2], out[1]}; // y [B, T, H, dv] -> [B, H, T]
  return Dims(out.begin(), out.end() - 1);         // y [..., T, dv] -> [..., T]
}

Status qkvAttentionParts(const TensorInfo &qkv, const AttrMap &attrs, TensorInfo &q, TensorInfo &k, TensorInfo &v) {
  SD_CHECK_ARG(qkv.rank() == 4 && qkv.isStatic(), "QkvAttention takes a static qkv [B, T, H + 2 Hkv, d], got ",
               formatDims(qkv.dims));
  const int64_t hkv = attrs.getInt("kv_heads", 0), heads = qkv.dims[2] - 2 * hkv;
  SD_CHECK_ARG(hkv > 0 && heads > 0 && heads % hkv == 0, "QkvAttention: qkv ", formatDims(qkv.dims), " with ",
               hkv, " key/value heads does not hold H + 2 Hkv heads, H a positive multiple of Hkv");
  q = k = v = qkv;
  q.dims[2] = heads;
  k.dims[2] = v.dims[2] = hkv;
  return Status::ok();
}

Status roundedResultType(const AttrMap &attrs, DType x, const char *op, DType &result) {
  const int64_t to = attrs.getInt("out_type", 0);
  result = to == 0 ? x : DType(to);
  if (to == 0) return Status::ok();
  const bool rounds = (to == int64_t(DType::BF16) || to == int64_t(DType::F16)) && x == DType::F32;
  const bool widens = to == int64_t(DType::F32) && dtypeIsHalf(x);
  if (!rounds && !widens)
    return sdError(op, ": out_type ", to, " is not bf16 (16) or f16 (10) for an f32 input, or f32 (1) for a half ",
                   "one; the input is ", dtypeName(x));
  return Status::ok();
}

} // namespace sd
