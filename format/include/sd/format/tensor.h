// Shapes and tensor views: what shape rules reason about and kernels compute on.
#pragma once
#include "sd/format/dtype.h"
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

using Dims = std::vector<int64_t>;
constexpr int64_t kUnknownDim = -1;

// A tensor's static description. rank < 0 means the rank is unknown.
struct TensorInfo {
  DType dtype = DType::Undefined;
  Dims dims;
  bool rankKnown = true;

  int64_t rank() const { return rankKnown ? int64_t(dims.size()) : -1; }
  bool isStatic() const;
  int64_t numElements() const; // -1 when not static
};

std::string formatDims(const Dims &d); // "2x3x?"
int64_t product(const Dims &d);
Dims stridesOf(const Dims &d);

// A contiguous, row-major tensor in memory. Kernels never own memory.
struct TensorView {
  void *data = nullptr;
  DType dtype = DType::Undefined;
  Dims dims;

  int64_t numElements() const { return product(dims); }
  size_t byteSize() const { return size_t(numElements()) * dtypeSize(dtype); }
  template <typename T> T *as() const { return static_cast<T *>(data); }
  int64_t rank() const { return int64_t(dims.size()); }
};

// Keeps the first `count` slices along `axis` of a row-major tensor's bytes
// (an output sized for the most its op can select, sd-bounded-extents): dims
// and bytes shrink in place. False when count is outside [0, dims[axis]].
bool keepPrefixAlong(std::vector<uint8_t> &bytes, Dims &dims, size_t elementSize, size_t axis, int64_t count);

// Reads an integer tensor (i32/i64/...) into int64 values; false on other dtypes.
bool readIntegers(const TensorView &t, std::vector<int64_t> &out);
bool readDoubles(const TensorView &t, std::vector<double> &out);

} // namespace sd
