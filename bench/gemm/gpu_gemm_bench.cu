// Our GEMMs against raw cuBLASLt on the same shapes (the CUDA issue's "GEMMs
// within 5% of raw cuBLASLt"). For every distinct GEMM an entry of a plan
// runs (Linear, Gemm, LinearGelu, GemmDGelu steps; their GEMM alone, with
// Linear's bias), it times the plan sdrun builds (kernels/cuda/gemm_lt.h: the
// heuristic's first algorithm, pinned at session creation) and every
// algorithm cuBLASLt's heuristic offers for the same descriptors, each the
// median of --iterations runs timed with CUDA events, and prints both with
// their ratio, then the totals weighted by how many steps run each shape.
// The last line is JSON.
//
//   sd_gpu_gemm_bench PLAN.sdp [--entry train_step] [--iterations 20] [--algos 16]
#include "gemm_lt.h"
#include "sd/runtime/plan.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>
#include <cuda_runtime_api.h>

using namespace sd;
using cuda::GemmShape;

namespace {

int fail(const std::string &message) {
  std::fprintf(stderr, "sd_gpu_gemm_bench: error: %s\n", message.c_str());
  return 1;
}

bool cudaOk(cudaError_t e, const char *what, std::string &error) {
  if (e == cudaSuccess) return true;
  error = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}

// The median of `runs` timed launches of `launch` on `stream`, in ms.
template <typename Launch> double medianMs(cudaStream_t stream, int runs, Launch launch, std::string &error) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int i = 0; i < runs + 2 && error.empty(); ++i) { // two warm-up launches
    cudaEventRecord(start, stream);
    if (!launch()) break;
    cudaEventRecord(stop, stream);
    float ms = 0;
    if (cudaOk(cudaEventSynchronize(stop), "timing", error) && i >= 2) {
      cudaEventElapsedTime(&ms, start, stop);
      times.push_back(ms);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (times.empty()) return -1;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Measured {
  GemmShape shape;
  int steps = 0;
  double oursMs = -1, bestMs = -1;
  int algos = 0;
};

using ShapeKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, bool, int64_t>;

} // namespace

int main(int argc, char **argv) {
  std::string planPath, entryName = "train_step";
  int iterations = 20, algoCount = 16;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char * { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "-h" || a == "--help") {
      std::puts("usage: sd_gpu_gemm_bench PLAN.sdp [--entry train_step] [--iterations 20] [--algos 16]");
      return 0;
    } else if (a == "--entry") {
      const char *v = next();
      if (!v) return fail("--entry needs a name");
      entryName = v;
    } else if (a == "--iterations" || a == "--algos") {
      const char *v = next();
      int n = v ? std::atoi(v) : 0;
      if (n < 1 || n > 100000) return fail(a + " needs a positive count");
      (a == "--iterations" ? iterations : algoCount) = n;
    } else if (planPath.empty() && a[0] != '-') {
      planPath = a;
    } else {
      return fail("unknown argument '" + a + "' (see --help)");
    }
  }
  if (planPath.empty()) return fail("give a plan (see --help)");
  auto plan = Plan::loadFile(planPath);
  if (!plan.isOk()) return fail(plan.status().message());
  const EntryDesc *entry = nullptr;
  for (const EntryDesc &e : plan.value()->entries)
    if (e.name == entryName && !entry) entry = &e;
  if (!entry) return fail(planPath + " has no entry '" + entryName + "'");
  std::string error;
  int devices = 0;
  if (!cudaOk(cudaGetDeviceCount(&devices), "no usable CUDA GPU", error) || devices == 0)
    return fail(error.empty() ? "no CUDA GPU" : error);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaStream_t stream;
  cudaStreamCreate(&stream);

  // The entry's GEMMs, by shape. Operands get device memory of their own
  // (values do not change a GEMM's speed), so the plans see 256-byte alignment.
  std::map<ShapeKey, Measured> shapes;
  std::vector<void *> allocations;
  auto deviceBuffer = [&](const BufferDesc &b) -> void * {
    void *p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(b.bytes, 1)) != cudaSuccess) return nullptr;
    cudaMemset(p, 0, std::max<size_t>(b.bytes, 1));
    allocations.push_back(p);
    return p;
  };
  std::map<std::string, std::shared_ptr<const void>> shared;
  for (const StepDesc &step : entry->steps) {
    const bool linear = step.op == "Linear" || step.op == "LinearGelu";
    if (!linear && step.op != "Gemm" && step.op != "GemmDGelu") continue;
    KernelContext ctx{step.attrs, {}, {}};
    for (int32_t b : step.inputs) {
      TensorView v;
      if (b >= 0) v = TensorView{nullptr, entry->buffers[size_t(b)].dtype, entry->buffers[size_t(b)].dims};
      ctx.inputs.push_back(v);
    }
    for (int32_t b : step.outputs)
      ctx.outputs.push_back(TensorView{nullptr, entry->buffers[size_t(b)].dtype, entry->buffers[size_t(b)].dims});
    if (step.op == "GemmDGelu") ctx.inputs.resize(2); // its GEMM alone
    if (step.op == "Gemm" && ctx.inputs.size() > 2) ctx.inputs.resize(2);
    ctx.outputs.resize(1);
    const bool bias = linear && ctx.inputs.size() > 2 && ctx.inputs[2].dtype != DType::Undefined;
    GemmShape probe = linear ? cuda::linearShapeOf(ctx) : cuda::gemmShapeOf(ctx);
    ShapeKey key{probe.m, probe.n, probe.k, probe.transA, probe.transB, int(probe.dtype), bias, probe.batch};
    if (auto it = shapes.find(key); it != shapes.end()) {
      ++it->second.steps;
      continue;
    }
    for (size_t i = 0; i < ctx.inputs.size(); ++i)
      if (ctx.inputs[i].dtype != DType::Undefined &&
          !(ctx.inputs[i].data = deviceBuffer(entry->buffers[size_t(step.inputs[i])])))
        return fail("cannot allocate an operand");
    if (!(ctx.outputs[0].data = deviceBuffer(entry->buffers[size_t(step.outputs[0])])))
      return fail("cannot allocate a result");
    Measured m;
    m.shape = linear ? cuda::linearShapeOf(ctx) : cuda::gemmShapeOf(ctx); // with the bias pointer
    m.steps = 1;
    PrepareContext prep{ctx, {}, {}, shared};
    std::shared_ptr<cuda::LtGemm> ours = cuda::planGemm(prep, m.shape);
    if (!ours->error.empty() || ours->builtin)
      return fail(step.op + " " + std::to_string(m.shape.m) + "x" + std::to_string(m.shape.n) + "x" +
                  std::to_string(m.shape.k) + ": " + (ours->builtin ? "cuBLASLt is not loaded" : ours->error));
    const void *a = ctx.inputs[0].data, *b = ctx.inputs[1].data;
    void *c = ctx.outputs[0].data;
    m.oursMs = medianMs(stream, iterations, [&] { return ours->run(a, b, c, 1.0, 0.0, stream).isOk(); }, error);
    // Raw cuBLASLt: the same descriptors, every algorithm its heuristic lists.
    const cuda::LtApi &lt = *ours->res->api;
    cublasLtMatmulPreference_t pref = nullptr;
    std::vector<cublasLtMatmulHeuristicResult_t> found(static_cast<size_t>(algoCount));
    int count = 0;
    if (lt.preferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
      size_t ws = ours->res->workspaceBytes;
      lt.preferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      if (lt.algoGetHeuristic(ours->res->handle, ours->op, ours->layoutB, ours->layoutA, ours->layoutC,
                              ours->layoutC, pref, algoCount, found.data(), &count) != CUBLAS_STATUS_SUCCESS)
        count = 0;
      lt.preferenceDestroy(pref);
    }
    // alpha 1, beta 0 in the compute type's scalar type (f64 products: double).
    const float one = 1, zero = 0;
    const double oneD = 1, zeroD = 0;
    const bool f64 = m.shape.dtype == DType::F64;
    const void *alpha = f64 ? static_cast<const void *>(&oneD) : &one, *beta = f64 ? static_cast<const void *>(&zeroD) : &zero;
    for (int i = 0; i < count; ++i) {
      if (found[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
      std::string algoError;
      double ms = medianMs(stream, iterations, [&] {
        return lt.matmul(ours->res->handle, ours->op, alpha, b, ours->layoutB, a, ours->layoutA, beta, c, ours->layoutC,
                         c, ours->layoutC, &found[size_t(i)].algo, ours->res->workspace, ours->res->workspaceBytes,
                         stream) == CUBLAS_STATUS_SUCCESS;
      }, algoError);
      if (ms > 0 && (m.bestMs < 0 || ms < m.bestMs)) m.bestMs = ms;
      ++m.algos;
    }
    if (!error.empty()) return fail(error);
    shapes.emplace(key, m);
  }
  if (shapes.empty()) return fail("entry '" + entryName + "' of " + planPath + " runs no GEMM step");
  std::printf("device: %s; entry %s of %s; median of %d runs per algorithm (CUDA events)\n", prop.name,
              entryName.c_str(), planPath.c_str(), iterations);
  std::printf("%8s %8s %8s %5s %6s %5s %10s %10s %6s %6s\n", "m", "n", "k", "trans", "dtype", "steps", "ours ms",
              "best ms", "ratio", "algos");
  double ours = 0, best = 0;
  std::string json = "[";
  for (auto &[key, m] : shapes) {
    const GemmShape &s = m.shape;
    double ratio = m.bestMs > 0 ? m.oursMs / m.bestMs : -1;
    std::printf("%8lld %8lld %8lld %2s%-3s %6s %5d %10.4f %10.4f %6.3f %6d\n", (long long)s.m, (long long)s.n,
                (long long)s.k, s.transA ? "T" : "N", s.transB ? "T" : "N", dtypeName(s.dtype), m.steps, m.oursMs,
                m.bestMs, ratio, m.algos);
    if (m.bestMs > 0) {
      ours += m.oursMs * m.steps;
      best += m.bestMs * m.steps;
    }
    char row[256];
    std::snprintf(row, sizeof row, "%s{\"m\":%lld,\"n\":%lld,\"k\":%lld,\"steps\":%d,\"ours_ms\":%.5f,\"best_ms\":%.5f}",
                  json.size() > 1 ? "," : "", (long long)s.m, (long long)s.n, (long long)s.k, m.steps, m.oursMs,
                  m.bestMs);
    json += row;
  }
  json += "]";
  std::printf("per step of %s: ours %.3f ms, raw cuBLASLt's best %.3f ms: %.1f%% slower\n", entryName.c_str(), ours,
              best, best > 0 ? 100.0 * (ours / best - 1) : 0.0);
  std::printf("{\"device\":\"%s\",\"entry\":\"%s\",\"ours_ms\":%.4f,\"best_ms\":%.4f,\"shapes\":%s}\n", prop.name,
              entryName.c_str(), ours, best, json.c_str());
  for (void *p : allocations) cudaFree(p);
  cudaStreamDestroy(stream);
  return 0;
}
