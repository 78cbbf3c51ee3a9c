// CPU kernel of MatMulNBits (onnxruntime's block-quantized weights, the int4
// models of onnxruntime-genai's builder): y = a W^T + bias with W [N, K]
// stored in 2, 4 or 8 bits a value, a scale and zero point per block of K.
//
// Decoding reads every weight once per token, so its speed is the weights'
// bytes: a 4-bit model moves an eighth of the f32 bytes. For a few rows of a
// (decode, a short verify) the weights are read packed and never widened to
// a whole f32 matrix: each block's codes are unpacked into a few registers'
// worth of floats and dotted with each row. A row of a is first laid out per
// block in the order the codes sit in their bytes (for 4 bits: the block's
// even elements, then its odd ones, since byte j holds elements 2j in its low
// and 2j+1 in its high half), so unpacking is a shift and a mask over
// consecutive bytes, which vectorizes. With z the block's zero point and s
// its scale, a block adds s * (sum_j a_j q_j - z * sum_j a_j), the row's block
// sums computed once. Many rows (a prompt) widen a few hundred weight rows at
// a time to f32 and multiply through the f32 GEMM.
#include "cpu_util.h"
#include "sgemm.h"
#include "simd_clones.h"
#include <algorithm>
#include <vector>

namespace sd::cpu {
namespace {

constexpr int64_t kFewRows = 8;      // up to this many rows of a: packed weights read in place
constexpr int64_t kWidenedRows = 256; // weight rows widened to f32 at a time for many rows

struct NBits {
  int64_t K = 0, N = 0, bits = 4, block = 32, blocks = 0, blob = 0, perByte = 2, zeroStride = 0;
  uint32_t mask = 15;
  const uint8_t *codes = nullptr;
  const float *scales = nullptr;
  const uint8_t *packedZeros = nullptr; // u8 zero points, `bits` each
  const float *floatZeros = nullptr;    // or float ones
  float defaultZero = 8;

  float zero(int64_t n, int64_t kb) const {
    if (floatZeros) return floatZeros[n * blocks + kb];
    if (!packedZeros) return defaultZero;
    const int64_t bit = kb * bits;
    return float((packedZeros[n * zeroStride + bit / 8] >> (bit % 8)) & mask);
  }
};

Status readOperands(const KernelContext &c, NBits &q) {
  q.K = c.attrs.getInt("K", 0);
  q.N = c.attrs.getInt("N", 0);
  q.bits = c.attrs.getInt("bits", 4);
  q.block = c.attrs.getInt("block_size", 0);
  if (q.K < 1 || q.N < 1 || (q.bits != 2 && q.bits != 4 && q.bits != 8) || q.block < 16 || (q.block & (q.block - 1)))
    return sdError("MatMulNBits: K, N, bits or block_size out of range");
  const TensorView &a = c.inputs[0];
  if (a.dtype != DType::F32 || a.rank() < 1 || a.dims.back() != q.K) return sdError("MatMulNBits: A must be f32 [..., K]");
  q.blocks = (q.K + q.block - 1) / q.block;
  q.blob = q.block * q.bits / 8;
  q.perByte = 8 / q.bits;
  q.mask = (1u << q.bits) - 1;
  q.zeroStride = (q.blocks * q.bits + 7) / 8;
  q.defaultZero = float(1 << (q.bits - 1));
  const TensorView &b = c.inputs[1], &s = c.inputs[2];
  if (b.dtype != DType::U8 || b.numElements() != q.N * q.blocks * q.blob)
    return sdError("MatMulNBits: B must hold ", q.N * q.blocks * q.blob, " bytes");
  if (s.dtype != DType::F32 || s.numElements() != q.N * q.blocks)
    return sdError("MatMulNBits: scales must hold ", q.N * q.blocks, " f32 values");
  q.codes = b.as<uint8_t>();
  q.scales = s.as<float>();
  if (c.inputs.size() > 3 && c.inputs[3].data) {
    const TensorView &z = c.inputs[3];
    if (z.dtype == DType::U8 && z.numElements() == q.N * q.zeroStride) q.packedZeros = z.as<uint8_t>();
    else if (z.dtype == DType::F32 && z.numElements() == q.N * q.blocks) q.floatZeros = z.as<float>();
    else return sdError("MatMulNBits: zero_points must be packed u8 [N, ", q.zeroStride, "] or f32 [N, ", q.blocks, "]");
  }
  if (c.inputs.size() > 4 && c.inputs[4].data &&
      (c.inputs[4].dtype != DType::F32 || c.inputs[4].numElements() != q.N))
    return sdError("MatMulNBits: bias must be f32 [N]");
  return Status::ok();
}

// Row r of a, per block in the codes' byte order (zero past K), and its block sums.
void layRows(const NBits &q, const float *a, int64_t rows, std::vector<float> &laid, std::vector<float> &sums) {
  const int64_t span = q.blocks * q.block, perBlob = q.blob;
  laid.assign(size_t(rows * span), 0.f);
  sums.assign(size_t(rows * q.blocks), 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      float *dst = laid.data() + r * span + kb * q.block, sum = 0;
      for (int64_t e = 0; e < q.block; ++e) {
        const int64_t k = kb * q.block + e;
        if (k >= q.K) break;
        const float v = a[r * q.K + k];
        // Element e sits in byte e / perByte at slot e % perByte: slot t's elements go together.
        dst[(e % q.perByte) * perBlob + e / q.perByte] = v;
        sum += v;
      }
      sums[size_t(r * q.blocks + kb)] = sum;
    }
}

// Few rows: y[r, n] for n in [n0, n1), the packed weights read in place.
SD_CLONES void fewRows(const NBits &q, const std::vector<float> &laid, const std::vector<float> &sums, int64_t rows,
             int64_t n0, int64_t n1, float *y) {
  std::vector<float> codes(size_t(q.block)); // one block's codes as floats, in byte order
  const int64_t span = q.blocks * q.block;
  for (int64_t n = n0; n < n1; ++n) {
    float acc[kFewRows] = {};
    const uint8_t *row = q.codes + n * q.blocks * q.blob;
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const uint8_t *bytes = row + kb * q.blob;
      for (int64_t t = 0; t < q.perByte; ++t) {
        float *out = codes.data() + t * q.blob;
        const int shift = int(t * q.bits);
#pragma omp simd
        for (int64_t j = 0; j < q.blob; ++j) out[j] = float((uint32_t(bytes[j]) >> shift) & q.mask);
      }
      const float s = q.scales[n * q.blocks + kb], z = q.zero(n, kb);
      for (int64_t r = 0; r < rows; ++r) {
        const float *x = laid.data() + r * span + kb * q.block;
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t e = 0; e < q.block; ++e) dot += x[e] * codes[size_t(e)];
        acc[r] += s * (dot - z * sums[size_t(r * q.blocks + kb)]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) y[r * q.N + n] = acc[r];
  }
}

// Weight rows [n0, n1) as f32 [n1 - n0, K].
SD_CLONES void widen(const NBits &q, int64_t n0, int64_t n1, float *w) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t *row = q.codes + n * q.blocks * q.blob;
    float *dst = w + (n - n0) * q.K;
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const float s = q.scales[n * q.blocks + kb], z = q.zero(n, kb);
      const int64_t end = std::min(q.block, q.K - kb * q.block);
      for (int64_t e = 0; e < end; ++e) {
        const int64_t bit = e * q.bits;
        const uint32_t code = (uint32_t(row[kb * q.blob + bit / 8]) >> (bit % 8)) & q.mask;
        dst[kb * q.block + e] = (float(code) - z) * s;
      }
    }
  }
}

Status MatMulNBitsKernel(const KernelContext &c) {
  NBits q;
  SD_RETURN_IF_ERROR(readOperands(c, q));
  const float *a = c.inputs[0].as<float>();
  float *y = c.outputs[0].as<float>();
  const int64_t rows = c.inputs[0].numElements() / q.K;
  if (rows <= kFewRows) {
    std::vector<float> laid, sums;
    layRows(q, a, rows, laid, sums);
    // Enough weight rows a task that each streams a few KiB of codes.
    const int64_t grain = std::max<int64_t>(8, 16384 / std::max<int64_t>(q.blocks * q.blob, 1));
    parallelFor(c.pool, q.N, grain, [&](int64_t n0, int64_t n1) { fewRows(q, laid, sums, rows, n0, n1, y); });
  } else {
    std::vector<float> w(size_t(std::min(kWidenedRows, q.N) * q.K));
    for (int64_t n0 = 0; n0 < q.N; n0 += kWidenedRows) {
      const int64_t n1 = std::min(q.N, n0 + kWidenedRows);
      parallelFor(c.pool, n1 - n0, 16, [&](int64_t b, int64_t e) { widen(q, n0 + b, n0 + e, w.data() + b * q.K); });
      sgemm(c.pool, false, true, rows, n1 - n0, q.K, 1.f, a, q.K, w.data(), q.K, 0.f, y + n0, q.N);
    }
  }
  if (c.inputs.size() > 4 && c.inputs[4].data) {
    const float *bias = c.inputs[4].as<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = 0; n < q.N; ++n) y[r * q.N + n] += bias[n];
  }
  return Status::ok();
}

} // namespace

void registerMatMulNBitsKernels() { registerCpuKernel("MatMulNBits", MatMulNBitsKernel, TypeSet{DType::F32}); }

} // namespace sd::cpu
