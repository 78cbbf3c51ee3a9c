// CPU session: one arena for activations, writable copies of mutable state,
// and per-step kernel contexts prepared once so a run is a flat loop.
#include "sd/runtime/session.h"
#include "sd/ops/threadpool.h"
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <cstring>
#include <thread>

namespace sd {

void configureCpuBackend(int threads);

struct Session::Impl {
  struct PreparedStep {
    const StepDesc *desc;
    KernelContext ctx;
  };
  // Values the kernels' prepare functions derived (packed weights), shared
  // between steps; the steps' contexts point into them.
  std::map<std::string, std::shared_ptr<const void>> preparedShared;
  std::vector<std::shared_ptr<const void>> preparedSteps;
  struct PreparedEntry {
    std::vector<TensorView> views; // one per buffer
    std::vector<PreparedStep> steps;
  };
  std::unique_ptr<ThreadPool> pool;
  uint8_t *arena = nullptr;
  // All mutable globals in one 64-byte-aligned block, in plan order, so the
  // gradients (created together by the compiler) are one contiguous range.
  uint8_t *state = nullptr;
  std::vector<uint8_t *> globalData;
  std::vector<PreparedEntry> entries;
  bool profiling = false;
  std::map<std::string, Session::OpProfile> profile;
  ~Impl() {
    std::free(arena);
    std::free(state);
  }
};

Session::~Session() = default;

StatusOr<std::unique_ptr<Session>> Session::create(std::shared_ptr<const Plan> plan, const SessionOptions &opts) {
  std::unique_ptr<Session> s(new Session());
  s->plan_ = plan;
  s->impl_ = std::make_unique<Impl>();
  Impl &im = *s->impl_;
  int threads = opts.threads > 0 ? opts.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  im.pool = std::make_unique<ThreadPool>(threads);
  configureCpuBackend(threads);

  uint64_t arenaSize = plan->maxArenaSize();
  if (arenaSize) {
    im.arena = static_cast<uint8_t *>(std::aligned_alloc(64, (arenaSize + 63) / 64 * 64));
    if (!im.arena) return sdError("cannot allocate a ", arenaSize, "-byte arena");
  }
  size_t stateBytes = 0;
  for (const GlobalDesc &g : plan->globals)
    if (isMutableRole(g.role)) stateBytes += (g.bytes + 63) / 64 * 64;
  if (stateBytes) {
    im.state = static_cast<uint8_t *>(std::aligned_alloc(64, stateBytes));
    if (!im.state) return sdError("cannot allocate ", stateBytes, " bytes of training state");
  }
  size_t stateOffset = 0;
  for (const GlobalDesc &g : plan->globals) {
    if (!isMutableRole(g.role)) {
      im.globalData.push_back(const_cast<uint8_t *>(g.data));
      continue;
    }
    uint8_t *dst = im.state + stateOffset;
    if (g.data) std::memcpy(dst, g.data, g.bytes);
    else std::memset(dst, 0, g.bytes);
    im.globalData.push_back(dst);
    stateOffset += (g.bytes + 63) / 64 * 64;
  }
  for (const EntryDesc &e : plan->entries) {
    Impl::PreparedEntry pe;
    for (const BufferDesc &b : e.buffers) {
      TensorView v{nullptr, b.dtype, b.dims};
      switch (b.kind) {
      case BufferKind::Arena: v.data = im.arena + b.offset; break;
      case BufferKind::Global: v.data = im.globalData[size_t(b.offset)]; break;
      case BufferKind::Alias: v.data = pe.views[size_t(b.offset)].data; break;
      }
      pe.views.push_back(v);
    }
    for (const StepDesc &sd : e.steps) {
      Impl::PreparedStep ps{&sd, KernelContext{sd.attrs, {}, {}, im.pool.get()}};
      for (int32_t i : sd.inputs) ps.ctx.inputs.push_back(i >= 0 ? pe.views[size_t(i)] : TensorView{});
      for (int32_t o : sd.outputs) ps.ctx.outputs.push_back(pe.views[size_t(o)]);
      if (sd.def->prepare) {
        PrepareContext pc{ps.ctx, {}, im.preparedShared};
        for (int32_t i : sd.inputs) {
          const BufferDesc *b = i >= 0 ? &e.buffers[size_t(i)] : nullptr;
          pc.constantInputs.push_back(b && b->kind == BufferKind::Global &&
                                      !isMutableRole(plan->globals[size_t(b->offset)].role));
        }
        if (std::shared_ptr<const void> prepared = sd.def->prepare(pc)) {
          ps.ctx.prepared = prepared.get();
          im.preparedSteps.push_back(std::move(prepared));
        }
      }
      pe.steps.push_back(std::move(ps));
    }
    im.entries.push_back(std::move(pe));
  }
  return s;
}

Status Session::run(size_t entry, const std::vector<const HostTensor *> &inputs, std::vector<HostTensor> &outputs) {
  if (entry >= plan_->entries.size()) return sdError("entry index ", entry, " out of range");
  const EntryDesc &e = plan_->entries[entry];
  Impl::PreparedEntry &pe = impl_->entries[entry];
  if (inputs.size() != e.inputs.size())
    return sdError("entry '", e.name, "' takes ", e.inputs.size(), " inputs, got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorView &dst = pe.views[size_t(e.inputs[i].second)];
    const HostTensor &src = *inputs[i];
    if (src.dtype != dst.dtype)
      return sdError("input '", e.inputs[i].first, "' has dtype ", dtypeName(src.dtype), ", the plan expects ",
                     dtypeName(dst.dtype));
    if (src.dims != dst.dims)
      return sdError("input '", e.inputs[i].first, "' has shape ", formatDims(src.dims), ", the plan expects ",
                     formatDims(dst.dims));
    if (!src.data.empty()) std::memcpy(dst.data, src.data.data(), src.data.size());
  }
  for (auto &ps : pe.steps) {
    auto t0 = impl_->profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    Status st = runKernel(*ps.desc->def, ps.ctx);
    if (impl_->profiling) {
      OpProfile &p = impl_->profile[ps.desc->op];
      p.op = ps.desc->op;
      p.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ++p.calls;
    }
    if (!st.isOk())
      return st.withContext(ps.desc->op + (ps.desc->location.empty() ? "" : " at " + ps.desc->location) + ": ");
  }
  outputs.clear();
  for (auto &o : e.outputs) {
    const TensorView &v = pe.views[size_t(o.second)];
    HostTensor t;
    t.name = o.first;
    t.dtype = v.dtype;
    t.dims = v.dims;
    if (v.byteSize()) t.data.assign(static_cast<uint8_t *>(v.data), static_cast<uint8_t *>(v.data) + v.byteSize());
    outputs.push_back(std::move(t));
  }
  return Status::ok();
}

Status Session::readGlobal(size_t index, void *dst, size_t bytes) const {
  if (index >= plan_->globals.size()) return sdError("global index ", index, " out of range");
  const GlobalDesc &g = plan_->globals[index];
  if (bytes != g.bytes) return sdError("global '", g.name, "' has ", g.bytes, " bytes, the buffer ", bytes);
  if (bytes) std::memcpy(dst, impl_->globalData[index], bytes);
  return Status::ok();
}

Status Session::writeGlobal(size_t index, const void *src, size_t bytes) {
  if (index >= plan_->globals.size()) return sdError("global index ", index, " out of range");
  const GlobalDesc &g = plan_->globals[index];
  if (!isMutableRole(g.role)) return sdError("global '", g.name, "' is ", globalRoleName(g.role), " and cannot be written");
  if (bytes != g.bytes) return sdError("global '", g.name, "' has ", g.bytes, " bytes, the data ", bytes);
  if (bytes) std::memcpy(impl_->globalData[index], src, bytes);
  return Status::ok();
}

StatusOr<HostTensor> Session::readGlobal(size_t index) const {
  if (index >= plan_->globals.size()) return sdError("global index ", index, " out of range");
  const GlobalDesc &g = plan_->globals[index];
  HostTensor t{g.name, g.dtype, g.dims, std::vector<uint8_t>(g.bytes)};
  SD_RETURN_IF_ERROR(readGlobal(index, t.data.data(), t.data.size()));
  return t;
}

int64_t Session::findEntry(const std::string &name) const {
  for (size_t i = 0; i < plan_->entries.size(); ++i)
    if (plan_->entries[i].name == name) return int64_t(i);
  return -1;
}

int64_t Session::findGlobal(const std::string &name) const {
  for (size_t i = 0; i < plan_->globals.size(); ++i)
    if (plan_->globals[i].name == name) return int64_t(i);
  return -1;
}

void Session::setProfiling(bool on) {
  impl_->profiling = on;
  impl_->profile.clear();
}

std::vector<Session::OpProfile> Session::profile() const {
  std::vector<OpProfile> v;
  for (auto &[k, p] : impl_->profile) v.push_back(p);
  std::sort(v.begin(), v.end(), [](const OpProfile &a, const OpProfile &b) { return a.ms > b.ms; });
  return v;
}

} // namespace sd
