#include "selection.h"
#include <algorithm>
#include <numeric>

namespace sd::selection {

namespace {

// Element values comparable exactly: integers as int64, the rest as double.
Status readValues(const TensorView &x, std::vector<long double> &out) {
  out.clear();
  if (dtypeIsInteger(x.dtype)) {
    std::vector<int64_t> v;
    if (!readIntegers(x, v)) return sdError("cannot read ", dtypeName(x.dtype), " values");
    out.assign(v.begin(), v.end());
    return Status::ok();
  }
  std::vector<double> v;
  if (!readDoubles(x, v)) return sdError("cannot read ", dtypeName(x.dtype), " values");
  out.assign(v.begin(), v.end());
  return Status::ok();
}

} // namespace

Status optionalAxis(const AttrMap &attrs, int64_t rank, bool &hasAxis, int64_t &axis) {
  hasAxis = attrs.has("axis");
  axis = attrs.getInt("axis", 0);
  if (!hasAxis) return Status::ok();
  SD_CHECK_ARG(axis >= -rank && axis < rank, "axis ", axis, " is out of range for rank ", rank);
  if (axis < 0) axis += rank;
  return Status::ok();
}

Status nonzero(const TensorView &x, std::vector<int64_t> &flat) {
  std::vector<long double> v;
  SD_RETURN_IF_ERROR(readValues(x, v));
  flat.clear();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != 0) flat.push_back(int64_t(i));
  return Status::ok();
}

Status compressed(const TensorView &condition, int64_t extent, std::vector<int64_t> &kept) {
  SD_CHECK_ARG(condition.rank() == 1, "Compress condition must be 1-D, got ", formatDims(condition.dims));
  std::vector<long double> v;
  SD_RETURN_IF_ERROR(readValues(condition, v));
  kept.clear();
  for (int64_t i = 0; i < std::min<int64_t>(int64_t(v.size()), extent); ++i)
    if (v[size_t(i)] != 0) kept.push_back(i);
  return Status::ok();
}

Status unique(const TensorView &x, bool hasAxis, int64_t axis, bool sorted, Unique &out) {
  std::vector<long double> v;
  SD_RETURN_IF_ERROR(readValues(x, v));
  auto [outer, slices, inner] = slicesOf(x.dims, hasAxis, axis);
  // Slice s: outer blocks o, inner positions i -> v[(o * slices + s) * inner + i].
  auto less = [&](int64_t a, int64_t b) {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        long double p = v[size_t((o * slices + a) * inner + i)], q = v[size_t((o * slices + b) * inner + i)];
        if (p != q) return p < q;
      }
    return false;
  };
  std::vector<int64_t> order(static_cast<size_t>(slices));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), less); // ties keep input order: the first occurrence leads
  std::vector<int64_t> groupOf(static_cast<size_t>(slices));
  std::vector<int64_t> firsts, counts;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k == 0 || less(order[k - 1], order[k])) firsts.push_back(order[k]), counts.push_back(0);
    groupOf[size_t(order[k])] = int64_t(firsts.size()) - 1;
    ++counts.back();
  }
  std::vector<int64_t> rank(firsts.size());
  std::iota(rank.begin(), rank.end(), 0);
  if (!sorted) // output in order of first occurrence
    std::sort(rank.begin(), rank.end(), [&](int64_t a, int64_t b) { return firsts[size_t(a)] < firsts[size_t(b)]; });
  std::vector<int64_t> position(firsts.size());
  for (size_t k = 0; k < rank.size(); ++k) position[size_t(rank[k])] = int64_t(k);
  out.first.resize(firsts.size()), out.counts.resize(firsts.size()), out.inverse.resize(size_t(slices));
  for (size_t g = 0; g < firsts.size(); ++g) {
    out.first[size_t(position[g])] = firsts[g];
    out.counts[size_t(position[g])] = counts[g];
  }
  for (int64_t s = 0; s < slices; ++s) out.inverse[size_t(s)] = position[size_t(groupOf[size_t(s)])];
  return Status::ok();
}

} // namespace sd::selection
