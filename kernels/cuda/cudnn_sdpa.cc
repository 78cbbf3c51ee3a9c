// cuDNN SDPA graphs (cudnn_sdpa.h). Every frontend call is wrapped: it
// reports errors through error_t and, with dynamic loading, throws when a
// library cannot be loaded; neither may escape into the session.
#include "cudnn_sdpa.h"
#include <cstdlib>
#include <dlfcn.h>
#include <mutex>
#if SD_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#endif

#if SD_HAVE_CUDNN_FRONTEND
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr; // set below: the frontend resolves cuDNN's symbols through it
}
#endif

namespace sd::cuda {

#if SD_HAVE_CUDNN_FRONTEND
namespace {

namespace fe = cudnn_frontend;

// libcudnn.so.9, once per process: SD_CUDNN_LIBRARY names a path, else the
// loader's search path. Empty on success, else why not.
std::string loadCudnn() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    const char *path = std::getenv("SD_CUDNN_LIBRARY");
    void *h = dlopen(path && *path ? path : "libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      const char *e = dlerror();
      error = std::string("cuDNN could not be loaded (") + (e ? e : "libcudnn.so.9 not found") + ")";
      return;
    }
    fe::cudnn_dlhandle = h;
  });
  return error;
}

struct Handle {
  cudnnHandle_t handle = nullptr;
  ~Handle() {
    if (handle) fe::detail::destroy_handle(handle);
  }
};

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kBias };

// [n, h, rows, cols] with the strides of its layout: heads after the rows
// (token-major; rows `tokenStride` elements apart, h * cols unless they
// are heads of a wider tensor) or before them.
void place(fe::graph::Tensor_attributes &t, int64_t n, int64_t h, int64_t rows, int64_t cols, bool tokenMajor,
           int64_t tokenStride = 0) {
  if (!tokenStride) tokenStride = h * cols;
  t.set_dim({n, h, rows, cols});
  t.set_stride(tokenMajor ? std::vector<int64_t>{rows * tokenStride, cols, tokenStride, 1}
                          : std::vector<int64_t>{h * rows * cols, rows * cols, cols, 1});
}

std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph &g, const char *name, int64_t uid, int64_t n,
                                                     int64_t h, int64_t rows, int64_t cols, bool tokenMajor,
                                                     int64_t tokenStride = 0) {
  fe::graph::Tensor_attributes t;
  t.set_name(name).set_uid(uid);
  place(t, n, h, rows, cols, tokenMajor, tokenStride);
  return g.tensor(t);
}

// Rows of q, k, v and their gradients: the one qkv tensor's (QkvAttention), else their own.
int64_t qkvStride(const SdpaShape &s) { return s.qkvHeads * s.d; }

// The operands of a shape: queries and outputs (q, o, dO), keys, values.
struct Operands {
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v;
};
Operands operands(fe::graph::Graph &g, const SdpaShape &s) {
  return {tensor(g, "q", kQ, s.batch, s.heads, s.T, s.d, s.tokenMajor, qkvStride(s)),
          tensor(g, "k", kK, s.batch, s.kvHeads, s.S, s.d, s.tokenMajor, qkvStride(s)),
          tensor(g, "v", kV, s.batch, s.kvHeads, s.S, s.dv, s.tokenMajor, qkvStride(s))};
}

// The additive bias [biasBatch, biasHeads, T, S], broadcast over the batch or
// the heads where that count is 1.
std::shared_ptr<fe::graph::Tensor_attributes> biasTensor(fe::graph::Graph &g, const SdpaShape &s) {
  const int64_t matrix = s.T * s.S;
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("bias")
                      .set_uid(kBias)
                      .set_dim({s.biasBatch, s.biasHeads, s.T, s.S})
                      .set_stride({s.biasHeads * matrix, matrix, s.S, 1}));
}

void common(fe::graph::Graph &g, DType t) {
  g.set_io_data_type(t == DType::F16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

class Sdpa final : public CudnnSdpa {
public:
  std::shared_ptr<Handle> handle;
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  bool withBias = false, fwdStats = false;
  void *workspace = nullptr;
  ~Sdpa() override { cudaFree(workspace); }

  Status forward(const void *q, const void *k, const void *v, const void *bias, void *y, float *stats,
                 cudaStream_t stream) const override {
    std::unordered_map<int64_t, void *> pack = {{kQ, const_cast<void *>(q)}, {kK, const_cast<void *>(k)},
                                                {kV, const_cast<void *>(v)}, {kO, y}};
    if (!fwd) return sdError("cuDNN SDPA: this step has no forward graph");
    if (fwdStats) pack[kStats] = stats; // the training forward writes the stats
    if (withBias) pack[kBias] = const_cast<void *>(bias);
    return run(*fwd, pack, stream, "forward");
  }
  Status backward(const void *q, const void *k, const void *v, const void *bias, const void *y, const void *dy,
                  const float *stats, void *dq, void *dk, void *dv, cudaStream_t stream) const override {
    if (!bwd) return sdError("cuDNN SDPA: this plan has no backward graph");
    std::unordered_map<int64_t, void *> pack = {
        {kQ, const_cast<void *>(q)},   {kK, const_cast<void *>(k)},          {kV, const_cast<void *>(v)},
        {kO, const_cast<void *>(y)},   {kDO, const_cast<void *>(dy)},        {kStats, const_cast<float *>(stats)},
        {kDQ, dq},                     {kDK, dk},                            {kDV, dv}};
    if (withBias) pack[kBias] = const_cast<void *>(bias);
    return run(*bwd, pack, stream, "backward");
  }

private:
  Status run(const fe::graph::Graph &g, std::unordered_map<int64_t, void *> &pack, cudaStream_t stream,
             const char *what) const {
    try {
      if (fe::detail::set_stream(handle->handle, stream) != CUDNN_STATUS_SUCCESS)
        return sdError("cuDNN SDPA ", what, ": cannot set the stream");
      fe::error_t e = g.execute(handle->handle, pack, workspace);
      if (!e.is_good()) return sdError("cuDNN SDPA ", what, ": ", e.get_message());
    } catch (const std::exception &ex) {
      return sdError("cuDNN SDPA ", what, ": ", ex.what());
    }
    return Status::ok();
  }
};

std::shared_ptr<fe::graph::Graph> forwardGraph(const SdpaShape &s, bool stats) {
  auto g = std::make_shared<fe::graph::Graph>();
  common(*g, s.dtype);
  auto [q, k, v] = operands(*g, s);
  auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(stats).set_attn_scale(s.scale);
  if (s.bias) options.set_bias(biasTensor(*g, s));
  if (s.causal) options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  auto [o, lse] = g->sdpa(q, k, v, options);
  o->set_output(true).set_uid(kO);
  place(*o, s.batch, s.heads, s.T, s.dv, s.tokenMajor);
  if (stats) lse->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> backwardGraph(const SdpaShape &s) {
  auto g = std::make_shared<fe::graph::Graph>();
  common(*g, s.dtype);
  auto [q, k, v] = operands(*g, s);
  auto o = tensor(*g, "o", kO, s.batch, s.heads, s.T, s.dv, s.tokenMajor);
  auto dO = tensor(*g, "do", kDO, s.batch, s.heads, s.T, s.dv, s.tokenMajor);
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("stats")
                             .set_uid(kStats)
                             .set_dim({s.batch, s.heads, s.T, 1})
                             .set_stride({s.heads * s.T, s.T, 1, 1})
                             .set_data_type(fe::DataType_t::FLOAT));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(s.scale)
                     .set_deterministic_algorithm(true); // replay must equal eager bit for bit
  if (s.bias) options.set_bias(biasTensor(*g, s));
  if (s.causal) options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dO, stats, options);
  dq->set_output(true).set_uid(kDQ);
  dk->set_output(true).set_uid(kDK);
  dv->set_output(true).set_uid(kDV);
  place(*dq, s.batch, s.heads, s.T, s.d, s.tokenMajor, qkvStride(s));
  place(*dk, s.batch, s.kvHeads, s.S, s.d, s.tokenMajor, qkvStride(s));
  place(*dv, s.batch, s.kvHeads, s.S, s.dv, s.tokenMajor, qkvStride(s));
  return g;
}

// Validates, lowers and builds `g` (heuristics' first plan cuDNN supports).
std::string build(fe::graph::Graph &g, cudnnHandle_t h) {
  fe::error_t e = g.validate();
  if (e.is_good()) e = g.build_operation_graph(h);
  if (e.is_good()) e = g.create_execution_plans({fe::HeurMode_t::A});
  if (e.is_good()) e = g.check_support(h);
  if (e.is_good()) e = g.build_plans(h);
  return e.is_good() ? std::string() : e.get_message();
}

} // namespace

std::shared_ptr<CudnnSdpa> planCudnnSdpa(const SdpaShape &s, const SdpaGraphs &graphs, cudaStream_t stream,
                                         std::map<std::string, std::shared_ptr<const void>> &shared,
                                         std::string &why) {
  if (s.dtype != DType::BF16 && s.dtype != DType::F16) return why = "cuDNN SDPA takes bf16 and f16", nullptr;
  if (s.d % 8 || s.dv % 8 || s.d > 256 || s.dv > 256)
    return why = "cuDNN SDPA takes head sizes that are multiples of 8, at most 256", nullptr;
  if (std::string e = loadCudnn(); !e.empty()) return why = e, nullptr;
  try {
    std::shared_ptr<const void> &slot = shared["cuda.cudnn"];
    if (!slot) {
      auto h = std::make_shared<Handle>();
      if (fe::detail::create_handle(&h->handle) != CUDNN_STATUS_SUCCESS) return why = "cuDNN handle", nullptr;
      slot = h;
    }
    auto plan = std::make_shared<Sdpa>();
    plan->handle = std::const_pointer_cast<Handle>(std::static_pointer_cast<const Handle>(slot));
    if (fe::detail::set_stream(plan->handle->handle, stream) != CUDNN_STATUS_SUCCESS)
      return why = "cuDNN cannot use the session's stream", nullptr;
    plan->withBias = s.bias;
    plan->fwdStats = graphs.forwardStats;
    int64_t bytes = 0, more = 0;
    if (graphs.forward) {
      plan->fwd = forwardGraph(s, graphs.forwardStats);
      if (std::string e = build(*plan->fwd, plan->handle->handle); !e.empty()) return why = "forward: " + e, nullptr;
      if (!plan->fwd->get_workspace_size(bytes).is_good()) return why = "forward workspace size", nullptr;
    }
    if (graphs.backward) {
      plan->bwd = backwardGraph(s);
      if (std::string e = build(*plan->bwd, plan->handle->handle); !e.empty()) return why = "backward: " + e, nullptr;
      if (!plan->bwd->get_workspace_size(more).is_good()) return why = "backward workspace size", nullptr;
    }
    if (cudaMalloc(&plan->workspace, size_t(std::max<int64_t>({bytes, more, 1}))) != cudaSuccess) {
      cudaGetLastError();
      return why = "cannot allocate cuDNN's workspace", nullptr;
    }
    return plan;
  } catch (const std::exception &ex) {
    return why = ex.what(), nullptr;
  }
}

#else

std::shared_ptr<CudnnSdpa> planCudnnSdpa(const SdpaShape &, const SdpaGraphs &, cudaStream_t,
                                         std::map<std::string, std::shared_ptr<const void>> &, std::string &why) {
  why = "this build has no cudnn-frontend headers (pip's nvidia-cudnn-frontend, requirements.txt)";
  return nullptr;
}

#endif

} // namespace sd::cuda
