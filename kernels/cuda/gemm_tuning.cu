// GEMM tuning files (gemm_lt.h): which of cuBLASLt's heuristic algorithms
// runs each GEMM shape, measured once on a GPU and then read by every
// session, so runs stay bit for bit the same (a GEMM's bits depend on its
// algorithm) while taking the fastest algorithm instead of the heuristic's
// first guess, as TensorRT's timing cache does.
#include "gemm_lt.h"
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace sd::cuda {

std::string tuningKey(const GemmShape &s) {
  std::ostringstream k;
  k << dtypeName(s.dtype) << ' ' << s.m << 'x' << s.n << 'x' << s.k << ' ' << (s.transA ? 'T' : 'N')
    << (s.transB ? 'T' : 'N') << " ld " << s.lda << ',' << s.ldb << ',' << s.ldc << " batch " << s.batch << ' '
    << s.strideA << ',' << s.strideB << ',' << s.strideC << " epilogue " << int(s.epilogue) << (s.bias ? "+bias" : "")
    << (s.aux ? "+aux" : "") << (s.biasGrad ? "+biasgrad" : "") << " align " << s.alignBytes;
  return k.str();
}

std::string currentGpuName() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return prop.name;
}

namespace {

// SD_GEMM_TUNING's lines for this process's GPU: key -> algorithm index.
const std::map<std::string, int> &tuningTable() {
  static std::map<std::string, int> table;
  static std::once_flag once;
  std::call_once(once, [] {
    const char *path = std::getenv("SD_GEMM_TUNING");
    if (!path || !*path) return;
    std::ifstream in(path);
    if (!in) {
      std::fprintf(stderr, "sdrun: SD_GEMM_TUNING=%s cannot be read; GEMMs keep cuBLASLt's first choice\n", path);
      return;
    }
    const std::string gpu = currentGpuName();
    std::string line;
    int used = 0, skipped = 0;
    while (std::getline(in, line)) {
      // GPU name <TAB> shape key <TAB> algorithm index
      size_t t1 = line.find('\t'), t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
      if (line.empty() || line[0] == '#') continue;
      char *end = nullptr;
      long index = t2 == std::string::npos ? -1 : std::strtol(line.c_str() + t2 + 1, &end, 10);
      if (index < 0 || index > 64 || !end || *end) {
        ++skipped;
        continue;
      }
      if (line.compare(0, t1, gpu) != 0 || t1 != gpu.size()) continue; // another GPU's measurements
      table[line.substr(t1 + 1, t2 - t1 - 1)] = int(index);
      ++used;
    }
    if (skipped)
      std::fprintf(stderr, "sdrun: SD_GEMM_TUNING=%s: %d malformed lines ignored (GPU<TAB>shape<TAB>index)\n", path,
                   skipped);
    if (!used) std::fprintf(stderr, "sdrun: SD_GEMM_TUNING=%s has no line for this GPU (%s)\n", path, gpu.c_str());
  });
  return table;
}

} // namespace

int tunedAlgorithm(const GemmShape &s) {
  const std::map<std::string, int> &table = tuningTable();
  auto it = table.find(tuningKey(s));
  return it == table.end() ? -1 : it->second;
}

} // namespace sd::cuda
