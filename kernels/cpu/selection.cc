// CPU kernels of NonZero, Compress and Unique (shapes/selection.h). Each
// recomputes its selection, writes it to the front of results the plan sized
// for the most it can select (exact where the compiler knew the values),
// zero-fills the rest and stores how many slices are real in its last
// result. A selection larger than the buffers is refused, never written.
#include "../shapes/selection.h"
#include "cpu_util.h"
#include <algorithm>
#include <cstring>

namespace sd::cpu {
namespace {

Status fits(int64_t got, int64_t planned, const char *op) {
  if (got > planned) return sdError(op, " selects ", got, " elements here; the plan holds at most ", planned);
  return Status::ok();
}

void zeroFill(const TensorView &t) { std::memset(t.data, 0, t.byteSize()); }

void storeCount(const KernelContext &c, int64_t n) { c.outputs.back().as<int64_t>()[0] = n; }

// Copies slices `index[k]` of x along `axis` (flattened elements when !hasAxis)
// into the first index.size() slices of y, which holds `capacity` of them.
void copySlices(const TensorView &x, const TensorView &y, bool hasAxis, int64_t axis, const std::vector<int64_t> &index) {
  size_t es = dtypeSize(x.dtype);
  auto [outer, extent, inner] = selection::slicesOf(x.dims, hasAxis, axis);
  int64_t capacity = hasAxis ? y.dims[size_t(axis)] : y.numElements();
  const uint8_t *src = x.as<uint8_t>();
  uint8_t *dst = y.as<uint8_t>();
  int64_t n = int64_t(index.size());
  zeroFill(y);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < n; ++k)
      std::memcpy(dst + size_t((o * capacity + k) * inner) * es,
                  src + size_t((o * extent + index[size_t(k)]) * inner) * es, size_t(inner) * es);
}

Status NonZeroKernel(const KernelContext &c) {
  std::vector<int64_t> flat;
  SD_RETURN_IF_ERROR(selection::nonzero(c.inputs[0], flat));
  const TensorView &y = c.outputs[0];
  int64_t capacity = y.dims[1], n = int64_t(flat.size());
  SD_RETURN_IF_ERROR(fits(n, capacity, "NonZero"));
  zeroFill(y);
  Dims strides = stridesOf(c.inputs[0].dims);
  for (size_t d = 0; d < strides.size(); ++d)
    for (int64_t k = 0; k < n; ++k)
      y.as<int64_t>()[int64_t(d) * capacity + k] = (flat[size_t(k)] / strides[d]) % c.inputs[0].dims[d];
  storeCount(c, n);
  return Status::ok();
}

Status CompressKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  bool hasAxis;
  int64_t axis;
  SD_RETURN_IF_ERROR(selection::optionalAxis(c.attrs, x.rank(), hasAxis, axis));
  std::vector<int64_t> kept;
  SD_RETURN_IF_ERROR(selection::compressed(c.inputs[1], hasAxis ? x.dims[size_t(axis)] : x.numElements(), kept));
  SD_RETURN_IF_ERROR(fits(int64_t(kept.size()), hasAxis ? c.outputs[0].dims[size_t(axis)] : c.outputs[0].numElements(),
                          "Compress"));
  copySlices(x, c.outputs[0], hasAxis, axis, kept);
  storeCount(c, int64_t(kept.size()));
  return Status::ok();
}

Status UniqueKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0];
  bool hasAxis;
  int64_t axis;
  SD_RETURN_IF_ERROR(selection::optionalAxis(c.attrs, x.rank(), hasAxis, axis));
  selection::Unique u;
  SD_RETURN_IF_ERROR(selection::unique(x, hasAxis, axis, c.attrs.getInt("sorted", 1) != 0, u));
  SD_RETURN_IF_ERROR(fits(int64_t(u.first.size()), c.outputs[0].dims[hasAxis ? size_t(axis) : 0], "Unique"));
  copySlices(x, c.outputs[0], hasAxis, axis, u.first);
  const std::vector<int64_t> *rest[] = {&u.first, &u.inverse, &u.counts};
  for (size_t k = 1; k < 4; ++k) {
    if (!c.outputs[k].data) continue;
    zeroFill(c.outputs[k]);
    std::memcpy(c.outputs[k].data, rest[k - 1]->data(), rest[k - 1]->size() * sizeof(int64_t));
  }
  storeCount(c, int64_t(u.first.size()));
  return Status::ok();
}

} // namespace

void registerSelectionKernels() {
  registerCpuKernel("NonZero", NonZeroKernel, TypeSet::all());
  registerCpuKernel("Compress", CompressKernel, TypeSet::all());
  registerCpuKernel("Unique", UniqueKernel, TypeSet::all());
}

} // namespace sd::cpu
