// compareGemmsWithCublasLt (sd/ops/cuda_gemm_compare.h).
#include "gemm_lt.h"
#include "sd/ops/cuda_gemm_compare.h"
#include <algorithm>
#include <map>
#include <tuple>

namespace sd::cuda {
namespace {

// The median of `runs` timed launches of `launch` (after two untimed), in ms; -1 when one fails.
template <typename Launch> double medianMs(cudaStream_t stream, int runs, Launch launch) {
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) return -1;
  if (cudaEventCreate(&stop) != cudaSuccess) return cudaEventDestroy(start), -1;
  std::vector<float> times;
  for (int i = 0; i < runs + 2; ++i) {
    cudaEventRecord(start, stream);
    if (!launch()) break;
    cudaEventRecord(stop, stream);
    float ms = 0;
    if (cudaEventSynchronize(stop) != cudaSuccess) break;
    if (i >= 2 && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();
  if (times.size() != size_t(runs)) return -1;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Device memory freed at the end of the comparison.
struct Buffers {
  std::vector<void *> held;
  ~Buffers() {
    for (void *p : held) cudaFree(p);
  }
  void *take(const TensorView &v) {
    void *p = nullptr;
    size_t bytes = std::max<size_t>(v.byteSize(), 1);
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0, bytes) != cudaSuccess) return cudaGetLastError(), nullptr;
    held.push_back(p);
    return p;
  }
};

} // namespace

StatusOr<std::vector<GemmTiming>> compareGemmsWithCublasLt(const std::vector<GemmStep> &steps, int iterations,
                                                           int algorithms, std::string &device) {
  int count = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    return sdError("no usable CUDA GPU");
  }
  device = prop.name;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return sdError("cannot create a CUDA stream");
  std::shared_ptr<void> streamHolder(stream, [](void *s) { cudaStreamDestroy(static_cast<cudaStream_t>(s)); });
  Buffers buffers;
  std::map<std::string, std::shared_ptr<const void>> shared;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int, bool>, size_t> seen;
  std::vector<GemmTiming> out;
  for (const GemmStep &step : steps) {
    const bool linear = step.op == "Linear" || step.op == "LinearAdd" || step.op == "LinearGelu";
    if (!linear && step.op != "Gemm" && step.op != "GemmDGelu") continue;
    if (step.inputs.size() < 2 || step.outputs.empty()) return sdError(step.op, " step without its operands");
    // The product alone: Gemm's C, LinearAdd's and LinearGelu's addend, GemmDGelu's pre and c, and the second
    // results are left out.
    KernelContext ctx{*step.attrs, {step.inputs[0], step.inputs[1]}, {step.outputs[0]}};
    const bool bias = linear && step.inputs.size() > 2 && step.inputs[2].dtype != DType::Undefined;
    if (bias) ctx.inputs.push_back(step.inputs[2]);
    GemmShape probe = linear ? linearShapeOf(ctx) : gemmShapeOf(ctx);
    auto key = std::make_tuple(probe.m, probe.n, probe.k, probe.transA, probe.transB, int(probe.dtype), bias);
    if (auto it = seen.find(key); it != seen.end()) {
      ++out[it->second].steps;
      continue;
    }
    for (TensorView &v : ctx.inputs)
      if (!(v.data = buffers.take(v))) return sdError("cannot allocate a GEMM operand on the GPU");
    if (!(ctx.outputs[0].data = buffers.take(ctx.outputs[0]))) return sdError("cannot allocate a GEMM result on the GPU");
    GemmShape shape = linear ? linearShapeOf(ctx) : gemmShapeOf(ctx); // now with the bias's address
    PrepareContext prep{ctx, {}, {}, shared};
    std::shared_ptr<LtGemm> ours = planGemm(prep, shape);
    if (ours->builtin) return sdError("cuBLASLt could not be loaded");
    GemmTiming t;
    t.op = step.op;
    t.m = shape.m, t.n = shape.n, t.k = shape.k, t.transA = shape.transA, t.transB = shape.transB, t.bias = bias;
    t.dtype = shape.dtype;
    t.steps = 1;
    seen[key] = out.size();
    if (!ours->error.empty()) { // no plan: reported as not timed
      out.push_back(t);
      continue;
    }
    const void *a = ctx.inputs[0].data, *b = ctx.inputs[1].data;
    void *c = ctx.outputs[0].data;
    t.oursMs = medianMs(stream, iterations, [&] { return ours->run(a, b, c, 1.0, 0.0, stream).isOk(); });
    // Raw cuBLASLt: the same descriptors, every algorithm its heuristic lists.
    t.tuningKey = tuningKey(ours->shape);
    double chosenMs = -1;
    for (const cublasLtMatmulAlgo_t &algo : ours->offered(algorithms)) {
      double ms = medianMs(stream, iterations, [&] { return ours->runWith(algo, a, b, c, 1.0, 0.0, stream).isOk(); });
      if (ms > 0 && (t.bestMs < 0 || ms < t.bestMs)) t.bestMs = ms;
      // The tuning choice: a later algorithm must be 1% faster, so timing noise does not move it.
      if (ms > 0 && (chosenMs < 0 || ms < 0.99 * chosenMs)) chosenMs = ms, t.bestIndex = t.algorithms;
      ++t.algorithms;
    }
    out.push_back(t);
  }
  return out;
}

} // namespace sd::cuda
