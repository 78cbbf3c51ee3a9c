// CPU kernel of MatMulNBits (onnxruntime's block-quantized weights, the int4
// models of onnxruntime-genai's builder): y = a W^T + bias with W [N, K]
// stored in 2, 4 or 8 bits a value, a scale and zero point per block of K.
//
// Decoding reads every weight once per token, so its speed is the weights'
// bytes: a 4-bit model moves an eighth of the f32 bytes. For a few rows of a
// (decode, a short verify) the weights are read packed and never widened to
// a whole f32 matrix: each block's codes are unpacked into registers and
// dotted with each row, the rows laid out in the codes' byte order
// (matmul_nbits.h). With z the block's zero point and s its scale, a block
// adds s * (sum_j a_j q_j - z * sum_j a_j), the rows' block sums computed
// once. Many rows (a prompt) widen a few hundred weight rows at a time to f32
// in that order and multiply through the f32 GEMM. 4-bit codes in blocks of
// a multiple of 32 take the AVX-512 or AVX2 builds; the rest a portable loop.
// accuracy_level 4 says a may be quantized to int8 (onnxruntime-genai's CPU
// default, which onnxruntime computes so): there, on CPUs with AVX-512 VNNI,
// the rows of a take int8 per block of 32 and u8 x s8 dot products, four
// times the products an instruction of the f32 path makes (eight rows at a
// time over a few weight rows that stay in cache); elsewhere, and at levels
// 0 to 3, the f32 math.
#include "matmul_nbits.h"
#include "cpu_util.h"
#include "sgemm.h"
#include "sd/ops/cpu_info.h"
#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

namespace sd::cpu {
namespace {

using nbits::kFewRows;
using nbits::Weights;

constexpr int64_t kWidenedRows = 256; // weight rows widened to f32 at a time for many rows

Status readOperands(const KernelContext &c, Weights &q) {
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

// Rows of a in the codes' byte order (zero past K), and their block sums.
void layRows(const Weights &q, const float *a, int64_t rows, std::vector<float> &laid, std::vector<float> &sums) {
  const int64_t span = q.span();
  laid.assign(size_t(rows * span), 0.f);
  sums.assign(size_t(rows * q.blocks), 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      float *dst = laid.data() + r * span + kb * q.block, sum = 0;
      const int64_t end = std::min(q.block, q.K - kb * q.block);
      for (int64_t e = 0; e < end; ++e) {
        const float v = a[r * q.K + kb * q.block + e];
        dst[(e % q.perByte) * q.blob + e / q.perByte] = v; // element e: byte e / perByte, slot e % perByte
        sum += v;
      }
      sums[size_t(r * q.blocks + kb)] = sum;
    }
}

// The portable forms of the two paths, for every bits and block size.
void fewRowsPortable(const Weights &q, const float *laid, const float *sums, int64_t rows, int64_t n0, int64_t n1,
                     float *y) {
  std::vector<float> codes(size_t(q.block)); // one block's codes as floats, in byte order
  const int64_t span = q.span();
  for (int64_t n = n0; n < n1; ++n) {
    float acc[kFewRows] = {};
    const uint8_t *row = q.codes + n * q.blocks * q.blob;
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const uint8_t *bytes = row + kb * q.blob;
      for (int64_t t = 0; t < q.perByte; ++t)
        for (int64_t j = 0; j < q.blob; ++j)
          codes[size_t(t * q.blob + j)] = float((uint32_t(bytes[j]) >> (t * q.bits)) & q.mask);
      const float s = q.scales[n * q.blocks + kb], z = q.zero(n, kb);
      for (int64_t r = 0; r < rows; ++r) {
        const float *x = laid + r * span + kb * q.block;
        float dot = 0;
        for (int64_t e = 0; e < q.block; ++e) dot += x[e] * codes[size_t(e)];
        acc[r] += s * (dot - z * sums[r * q.blocks + kb]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) y[r * q.N + n] = acc[r];
  }
}

void widenPortable(const Weights &q, int64_t n0, int64_t n1, float *w) {
  const int64_t span = q.span();
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t *row = q.codes + n * q.blocks * q.blob;
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const float s = q.scales[n * q.blocks + kb], z = q.zero(n, kb);
      float *dst = w + (n - n0) * span + kb * q.block;
      for (int64_t t = 0; t < q.perByte; ++t)
        for (int64_t j = 0; j < q.blob; ++j)
          dst[t * q.blob + j] = (float((uint32_t(row[kb * q.blob + j]) >> (t * q.bits)) & q.mask) - z) * s;
    }
  }
}

// Rows of a as int8 per block (matmul_nbits.h's Int8Rows): each block's
// scale is its largest magnitude over 127, values rounded to nearest.
void quantizeRows(const Weights &q, const float *a, int64_t rows, nbits::Int8Rows &x) {
  x.groups = (q.blocks + 3) / 4;
  x.values.assign(size_t(rows * x.groups * 128), 0);
  x.scales.assign(size_t(rows * x.groups * 16), 0.f);
  x.zeroShare.assign(size_t(rows * x.groups * 16), 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kb = 0; kb < q.blocks; ++kb) {
      const float *v = a + r * q.K + kb * 32;
      const int64_t count = std::min<int64_t>(32, q.K - kb * 32);
      float most = 0;
      for (int64_t e = 0; e < count; ++e) most = std::max(most, std::fabs(v[e]));
      const float scale = most / 127.f, inverse = most > 0 ? 127.f / most : 0.f;
      const int64_t g = kb / 4, b = kb % 4, at = (r * x.groups + g);
      int8_t *out = x.values.data() + at * 128;
      int sum = 0;
      for (int64_t e = 0; e < count; ++e) {
        const int value = int(std::nearbyint(std::clamp(v[e] * inverse, -127.f, 127.f)));
        out[(e % 2) * 64 + b * 16 + e / 2] = int8_t(value); // even elements in the low plane, odd in the high
        sum += value;
      }
      for (int i = 0; i < 4; ++i) {
        x.scales[size_t(at * 16 + b * 4 + i)] = scale;
        x.zeroShare[size_t(at * 16 + b * 4 + i)] = q.defaultZero * float(sum) / 4.f;
      }
    }
}

// The paths for these weights on this CPU (the f32 GEMM's instruction set).
void pickPaths(const Weights &q, nbits::FewRowsFn &few, nbits::WidenFn &widen) {
  few = fewRowsPortable;
  widen = widenPortable;
  if (!q.vectorForm()) return;
  if (std::strcmp(sgemmIsa(), "avx512") == 0) few = nbits::fewRowsAvx512, widen = nbits::widenAvx512;
  else if (std::strcmp(sgemmIsa(), "avx2") == 0) few = nbits::fewRowsAvx2, widen = nbits::widenAvx2;
}

// The int8 path needs AVX-512 VNNI, and the f32 GEMM's instruction set not capped below AVX-512 (SD_CPU_ISA).
bool vnniAllowed() {
  static const bool vnni = cpuInfo().avx512vnni;
  return vnni && std::strcmp(sgemmIsa(), "avx512") == 0;
}

void addBias(const KernelContext &c, const Weights &q, int64_t rows, float *y) {
  if (c.inputs.size() <= 4 || !c.inputs[4].data) return;
  const float *bias = c.inputs[4].as<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < q.N; ++n) y[r * q.N + n] += bias[n];
}

Status MatMulNBitsKernel(const KernelContext &c) {
  Weights q;
  SD_RETURN_IF_ERROR(readOperands(c, q));
  nbits::FewRowsFn few;
  nbits::WidenFn widen;
  pickPaths(q, few, widen);
  const float *a = c.inputs[0].as<float>();
  float *y = c.outputs[0].as<float>();
  const int64_t rows = c.inputs[0].numElements() / q.K, span = q.span();
  // Enough weight rows a task that each streams a few KiB of codes.
  const int64_t grain = std::max<int64_t>(8, 16384 / std::max<int64_t>(q.blocks * q.blob, 1));
  if (c.attrs.getInt("accuracy_level", 0) == 4 && q.int8Form() && vnniAllowed()) {
    nbits::Int8Rows x;
    quantizeRows(q, a, rows, x);
    // Many rows: fewer weight rows a task, so a task's codes stay in cache over its rows.
    const int64_t tasks = rows <= kFewRows ? grain : std::max<int64_t>(4, grain * kFewRows / rows);
    parallelFor(c.pool, q.N, tasks, [&](int64_t n0, int64_t n1) { nbits::rowsVnni(q, x, rows, n0, n1, y); });
    return addBias(c, q, rows, y), Status::ok();
  }
  std::vector<float> laid, sums;
  layRows(q, a, rows, laid, sums);
  if (rows <= kFewRows) {
    parallelFor(c.pool, q.N, grain, [&](int64_t n0, int64_t n1) { few(q, laid.data(), sums.data(), rows, n0, n1, y); });
  } else {
    std::vector<float> w(size_t(std::min(kWidenedRows, q.N) * span));
    for (int64_t n0 = 0; n0 < q.N; n0 += kWidenedRows) {
      const int64_t n1 = std::min(q.N, n0 + kWidenedRows);
      parallelFor(c.pool, n1 - n0, 16, [&](int64_t b, int64_t e) { widen(q, n0 + b, n0 + e, w.data() + b * span); });
      sgemm(c.pool, false, true, rows, n1 - n0, span, 1.f, laid.data(), span, w.data(), span, 0.f, y + n0, q.N);
    }
  }
  addBias(c, q, rows, y);
  return Status::ok();
}

} // namespace

void registerMatMulNBitsKernels() { registerCpuKernel("MatMulNBits", MatMulNBitsKernel, TypeSet{DType::F32}); }

} // namespace sd::cpu
