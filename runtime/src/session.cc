// Session: one device arena for activations, device copies of mutable state,
// and per-step kernel contexts bound and prepared once so a run is a flat loop.
#include "session_impl.h"
#include "host_fallback.h"
#include <system_error>
#include "sd/ops/kernel.h"
#include "sd/format/json.h"
#include "sd/format/training_abi.h"
#include "sd/ops/threadpool.h"
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <cstring>
#include <cstdio>
#include <optional>
#include <thread>

namespace sd {

Status configureCpuBackend(int threads);


Session::~Session() = default;

const KernelDef *bodyStepKernel(const std::string &op) {
  static const KernelDef loop{"Loop", nullptr, nullptr, TypeSet::all(), 0, false, {}};
  static const KernelDef branch{"If", nullptr, nullptr, TypeSet::all(), 0, false, {}};
  return op == "Loop" ? &loop : op == "If" ? &branch : nullptr;
}

StatusOr<const KernelDef *> bindStep(const EntryDesc &e, size_t index, const KernelRegistry &kernels) {
  const StepDesc &sd = e.steps[index];
  if (const KernelDef *k = bodyStepKernel(sd.op)) return k;
  std::vector<DType> ins, outs;
  for (int32_t b : sd.inputs) ins.push_back(b >= 0 ? e.buffers[size_t(b)].dtype : DType::Undefined);
  for (int32_t b : sd.outputs) outs.push_back(e.buffers[size_t(b)].dtype);
  StatusOr<const KernelDef *> k = kernels.bind(sd.op, ins, outs);
  if (!k.isOk())
    return k.status().withContext("entry '" + e.name + "' step " + std::to_string(index) +
                                  (sd.location.empty() ? "" : " at " + sd.location) + ": ");
  return k;
}

StatusOr<const KernelDef *> bindStepOrCpu(const EntryDesc &e, size_t index, const KernelRegistry &kernels,
                                          bool cpuFallback, bool &onCpu, const std::set<std::string> &cpuOps) {
  onCpu = false;
  if (cpuFallback && cpuOps.count(e.steps[index].op)) {
    StatusOr<const KernelDef *> cpu = bindStep(e, index, cpuKernels());
    if (cpu.isOk()) {
      onCpu = true;
      return cpu;
    }
  }
  StatusOr<const KernelDef *> k = bindStep(e, index, kernels);
  if (k.isOk() || !cpuFallback) return k;
  StatusOr<const KernelDef *> cpu = bindStep(e, index, cpuKernels());
  if (!cpu.isOk()) return k;
  onCpu = true;
  return cpu;
}

static double mib(uint64_t bytes) { return double(bytes) / double(1 << 20); }

// What a session holds on its device: the arena, all mutable globals in one
// block (each 64-byte aligned), and the frozen weights when the host cannot
// address the device (otherwise they stay in the mapped plan).
struct Footprint {
  uint64_t arena = 0, state = 0, weights = 0;
  uint64_t total() const { return arena + state + weights; }
};

static uint64_t rowBytes(const GlobalDesc &g) { return g.dims.empty() || g.dims[0] <= 0 ? 0 : g.bytes / uint64_t(g.dims[0]); }

uint64_t globalBytesOnRank(const Plan &plan, size_t index, int rank, int ranks, const std::vector<int> &owner,
                           const std::vector<bool> &rowSharded) {
  const GlobalDesc &g = plan.globals[index];
  if (owner[index] >= 0 && owner[index] != rank) return 0;
  if (index < rowSharded.size() && rowSharded[index])
    return rowBytes(g) * uint64_t(rowBlock(g.dims.empty() ? 0 : g.dims[0], rank, ranks).count);
  return g.bytes;
}

// `owner[i]`: the rank that alone holds global i, or -1 (every rank);
// `rowSharded[i]`: global i is split by rows.
static Footprint footprintOf(const Plan &plan, const Device &dev, const std::vector<int> &owner,
                             const std::vector<bool> &rowSharded, int rank, int ranks) {
  Footprint f;
  f.arena = plan.maxArenaSize();
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    const uint64_t bytes = globalBytesOnRank(plan, i, rank, ranks, owner, rowSharded);
    if (isMutableRole(plan.globals[i].role)) f.state += (bytes + 63) / 64 * 64;
    else if (!dev.hostAddressable()) f.weights += bytes;
  }
  return f;
}

// The plan's shard mode (sdc compile --shard, recorded in its config).
std::string shardMode(const Plan &plan) {
  if (plan.config.empty()) return "none";
  auto cfg = parseJson(plan.config, "the plan's config");
  const Json *s = cfg.isOk() ? cfg.value().get("shard") : nullptr;
  return s && s->type == Json::Type::String ? s->str : "none";
}

StatusOr<std::vector<bool>> rowShardedGlobals(const Plan &plan) {
  std::vector<bool> rows(plan.globals.size(), false);
  if (plan.config.empty()) return rows;
  auto cfg = parseJson(plan.config, "the plan's config");
  const Json *list = cfg.isOk() ? cfg.value().get(abi::kRowShardedConfigKey) : nullptr;
  if (!list) return rows;
  if (list->type != Json::Type::Array) return sdError("the plan's config: ", abi::kRowShardedConfigKey, " is not a list");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < plan.globals.size(); ++i) index[plan.globals[i].name] = i;
  for (const Json &n : list->arr) {
    auto it = n.type == Json::Type::String ? index.find(n.str) : index.end();
    if (it == index.end())
      return sdError("the plan's config: ", abi::kRowShardedConfigKey, " names '", n.str, "', which is not a global");
    if (plan.globals[it->second].dims.empty())
      return sdError("the plan's config: ", abi::kRowShardedConfigKey, " names scalar '", n.str, "', which has no rows");
    rows[it->second] = true;
  }
  return rows;
}

// --shard optimizer|grads: every trainable parameter gets an owner rank,
// largest first to the least loaded rank (ties: the lower rank, then plan
// order), so all ranks compute the same table from the plan and the world
// size. Its optimizer state (adamw.exp_avg/<p>, ...), and with grads its
// gradient (grad/<p>) too, is held there only.
std::vector<int> globalHolders(const Plan &plan, int ranks, std::map<std::string, int> *paramOwnerOut) {
  std::map<std::string, int> local;
  std::map<std::string, int> &paramOwner = paramOwnerOut ? *paramOwnerOut : local;
  const std::string mode = shardMode(plan);
  std::vector<int> owner(plan.globals.size(), -1);
  if (mode != "optimizer" && mode != "grads") return owner;
  std::vector<size_t> params;
  for (size_t i = 0; i < plan.globals.size(); ++i)
    if (plan.globals[i].role == GlobalRole::Trainable) params.push_back(i);
  std::stable_sort(params.begin(), params.end(),
                   [&](size_t a, size_t b) { return plan.globals[a].bytes > plan.globals[b].bytes; });
  std::vector<uint64_t> load(size_t(std::max(ranks, 1)), 0);
  for (size_t p : params) {
    size_t k = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    load[k] += plan.globals[p].bytes;
    paramOwner[plan.globals[p].name] = int(k);
  }
  std::vector<const char *> prefixes = {abi::kAdamExpAvgPrefix, abi::kAdamExpAvgSqPrefix, abi::kSgdMomentumPrefix};
  if (mode == "grads") prefixes.push_back(abi::kGradPrefix);
  for (size_t i = 0; i < plan.globals.size(); ++i)
    for (const char *prefix : prefixes) {
      const std::string &n = plan.globals[i].name;
      if (n.rfind(prefix, 0) != 0) continue;
      auto it = paramOwner.find(n.substr(std::string_view(prefix).size()));
      if (it != paramOwner.end()) owner[i] = it->second;
    }
  return owner;
}

// Refuses a footprint the device has no room for, before allocating any of it.
static Status checkFootprint(const Footprint &f, const Device &dev) {
  std::optional<size_t> free = dev.freeBytes();
  if (!free || f.total() <= *free) return Status::ok();
  char buf[256];
  std::snprintf(buf, sizeof buf, "needs %.1f MiB (arena %.1f, training state %.1f, weights %.1f), %.1f MiB free",
                mib(f.total()), mib(f.arena), mib(f.state), mib(f.weights), mib(*free));
  return sdError("plan does not fit on device '", dev.name(), "': it ", buf);
}


const Device &Session::device() const { return *impl_->device; }
Communicator *Session::communicator() const { return impl_->comm.get(); }
uint64_t Session::deviceBytes() const {
  return footprintOf(*plan_, *impl_->device, impl_->globalOwner, impl_->rowSharded, impl_->comm ? impl_->comm->rank() : 0,
                     impl_->comm ? impl_->comm->size() : 1)
      .total() + impl_->halfBytes;
}
int Session::globalOwner(size_t index) const { return index < impl_->globalOwner.size() ? impl_->globalOwner[index] : -1; }
bool Session::holdsGlobal(size_t index) const {
  if (index >= impl_->globalData.size()) return false;
  if (rowSharded(index)) return impl_->rows[index].count == plan_->globals[index].dims[0];
  return impl_->globalData[index] || !plan_->globals[index].bytes;
}
bool Session::rowSharded(size_t index) const { return index < impl_->rowSharded.size() && impl_->rowSharded[index]; }
RowBlock Session::globalRows(size_t index) const {
  if (rowSharded(index)) return impl_->rows[index];
  const Dims &d = plan_->globals[index].dims;
  return {0, d.empty() ? 1 : d[0]};
}

// Points the stand-ins of `h` that are converted at every run into the
// scratch block at `scratch`, one after another, each 64-byte aligned (with
// scratch null, only counts). Returns the floats they take.
static int64_t placeInScratch(HalfOperands &h, float *scratch) {
  int64_t floats = 0;
  auto place = [&](TensorView &t) {
    if (scratch) t.data = scratch + floats;
    floats += (t.numElements() + 15) / 16 * 16;
  };
  for (size_t i : h.widenInputs) place(h.wide.inputs[i]);
  for (size_t o : h.roundOutputs) place(h.wide.outputs[o]);
  return floats;
}

// Gives each f16/bf16 operand of `ps` an f32 stand-in: a constant input is
// widened now (once per weight, shared by every step that reads it); the
// others go into the scratch block (placeInScratch, once it is allocated).
// Returns the floats they take there.
StatusOr<int64_t> Session::Impl::layOutHalves(PreparedStep &ps, const std::vector<bool> &constant) {
  HalfOperands &h = ps.half.emplace(halfOperandsOf(ps.ctx));
  std::vector<size_t> converted; // at every run: the inputs that are not constants
  for (size_t i : h.widenInputs) {
    if (!constant[i]) {
      converted.push_back(i);
      continue;
    }
    const TensorView &t = ps.ctx.inputs[i];
    Widened &wide = widenedConstants[t.data];
    if (!wide.data) {
      wide.data.reset(new (std::nothrow) float[size_t(t.numElements())]);
      if (!wide.data) return sdError("out of memory widening a ", dtypeName(t.dtype), " weight of ", t.numElements(), " elements");
      SD_RETURN_IF_ERROR(convertHalf(pool.get(), t, TensorView{wide.data.get(), DType::F32, t.dims}));
      wide.bytes = uint64_t(t.numElements()) * 4;
      halfBytes += wide.bytes;
    }
    h.wide.inputs[i].data = wide.data.get();
  }
  h.widenInputs = std::move(converted);
  return placeInScratch(h, nullptr);
}

// Releases the widened weights no step reads any more: each step that read
// one holds a packed copy instead (PrepareContext::superseded).
void Session::Impl::releaseUnreadWidenings() {
  std::set<const void *> read;
  for (const PreparedEntry &pe : entries)
    for (const PreparedStep &ps : pe.steps)
      if (ps.half)
        for (const TensorView &t : ps.half->wide.inputs) read.insert(t.data);
  for (auto it = widenedConstants.begin(); it != widenedConstants.end();) {
    if (read.count(it->second.data.get())) {
      ++it;
      continue;
    }
    halfBytes -= it->second.bytes;
    it = widenedConstants.erase(it);
  }
}

StatusOr<std::unique_ptr<Session>> Session::create(std::shared_ptr<const Plan> plan, const SessionOptions &opts) {
  std::unique_ptr<Session> s(new Session());
  s->plan_ = plan;
  s->impl_ = std::make_unique<Impl>();
  Impl &im = *s->impl_;
  int threads = opts.threads > 0 ? opts.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  im.device = opts.device ? opts.device : cpuDevice();
  im.comm = opts.comm;
  if (im.comm && im.comm->size() > 1 && !im.device->hostAddressable() && !im.comm->onStreams())
    return sdError("training on ", im.comm->size(), " ranks on device '", im.device->name(), "' needs the NCCL backend (",
                   im.comm->describe(), " works on host memory); open the world for CUDA devices, or run the ranks on the CPU (--device cpu)");
  if (im.comm && im.comm->onStreams() && im.device->hostAddressable())
    return sdError(im.comm->describe(), " works on device memory; the session's device '", im.device->name(), "' is host memory");
  im.graphs = opts.graphs && !im.device->hostAddressable(); // the CPU has nothing to capture
  Device &dev = *im.device;
  try {
    im.pool = std::make_unique<ThreadPool>(threads);
  } catch (const std::system_error &e) { // a thread or memory limit
    return sdError("cannot start ", threads, " worker threads (", e.what(), "); try --threads 1");
  }

  // Bind every step before allocating anything: a plan this device cannot run
  // is refused at once, naming the step, op and device.
  // A step the device has no kernel for runs the CPU's (on a device the
  // host cannot address, where the options allow it).
  std::vector<std::vector<const KernelDef *>> kernels;
  std::vector<std::vector<bool>> onHost;
  for (const EntryDesc &e : plan->entries) {
    kernels.emplace_back();
    onHost.emplace_back();
    for (size_t i = 0; i < e.steps.size(); ++i) {
      bool fallback = false;
      StatusOr<const KernelDef *> k =
          bindStepOrCpu(e, i, dev.kernels(), !dev.hostAddressable() && opts.cpuFallback, fallback, opts.cpuOps);
      if (!k.isOk()) return k.status();
      kernels.back().push_back(*k);
      onHost.back().push_back(fallback);
      if (fallback) ++im.stepsOnHost[e.steps[i].op];
    }
  }

  const int rank = im.comm ? im.comm->rank() : 0, ranks = im.comm ? im.comm->size() : 1;
  std::map<std::string, int> paramOwner;
  im.globalOwner = globalHolders(*plan, ranks, &paramOwner);
  StatusOr<std::vector<bool>> rowSharded = rowShardedGlobals(*plan);
  if (!rowSharded.isOk()) return rowSharded.status();
  im.rowSharded = std::move(rowSharded.value());
  for (size_t gi = 0; gi < plan->globals.size(); ++gi)
    im.rows.push_back(im.rowSharded[gi] ? rowBlock(plan->globals[gi].dims[0], rank, ranks) : RowBlock{});
  const Footprint footprint = footprintOf(*plan, dev, im.globalOwner, im.rowSharded, rank, ranks);
  SD_RETURN_IF_ERROR(checkFootprint(footprint, dev));
  if (footprint.arena) {
    StatusOr<void *> p = dev.allocate(footprint.arena);
    if (!p.isOk()) return p.status().withContext("arena: ");
    im.arena = static_cast<uint8_t *>(*p);
  }
  if (footprint.state) {
    StatusOr<void *> p = dev.allocate(footprint.state);
    if (!p.isOk()) return p.status().withContext("training state: ");
    im.state = static_cast<uint8_t *>(*p);
    // Padding between globals too: a collective over a run of adjacent
    // gradients reduces it along with them.
    SD_RETURN_IF_ERROR(dev.zero(im.state, footprint.state));
  }
  size_t stateOffset = 0;
  for (size_t gi = 0; gi < plan->globals.size(); ++gi) {
    const GlobalDesc &g = plan->globals[gi];
    if (im.globalOwner[gi] >= 0 && im.globalOwner[gi] != rank) { // another rank's shard
      im.globalData.push_back(nullptr);
      continue;
    }
    // A row-sharded global keeps this rank's rows of the plan's value.
    const uint64_t first = im.rowSharded[gi] ? rowBytes(g) * uint64_t(im.rows[gi].begin) : 0;
    const uint64_t bytes = globalBytesOnRank(*plan, gi, rank, ranks, im.globalOwner, im.rowSharded);
    if (!isMutableRole(g.role)) {
      uint8_t *data = g.data ? const_cast<uint8_t *>(g.data) + first : nullptr;
      if (!dev.hostAddressable() && bytes) {
        StatusOr<void *> p = dev.allocate(bytes);
        if (!p.isOk()) return p.status().withContext("global '" + g.name + "': ");
        im.uploaded.push_back(static_cast<uint8_t *>(*p));
        SD_RETURN_IF_ERROR(dev.copyFromHost(*p, g.data + first, bytes));
        data = im.uploaded.back();
      }
      im.globalData.push_back(data);
      continue;
    }
    uint8_t *dst = im.state + stateOffset;
    if (g.data && bytes) SD_RETURN_IF_ERROR(dev.copyFromHost(dst, g.data + first, bytes)); // else zero, as the whole block
    im.globalData.push_back(dst);
    stateOffset += (bytes + 63) / 64 * 64;
  }
  int64_t scratchFloats = 0; // the most any one step's half operands need
  for (size_t ei = 0; ei < plan->entries.size(); ++ei) {
    const EntryDesc &e = plan->entries[ei];
    Impl::PreparedEntry pe;
    for (const BufferDesc &b : e.buffers) {
      TensorView v{nullptr, b.dtype, b.dims};
      switch (b.kind) {
      case BufferKind::Arena: v.data = im.arena + e.arenaBase + b.offset; break;
      case BufferKind::Global: {
        const size_t gi = size_t(b.offset);
        v.data = im.globalData[gi];
        if (im.rowSharded[gi]) { // the steps that read it see this rank's rows
          if (b.dims != plan->globals[gi].dims)
            return sdError("entry '", e.name, "': row-sharded global '", plan->globals[gi].name, "' is viewed as [",
                           formatDims(b.dims), "], not its own shape");
          v.dims[0] = im.rows[gi].count;
        }
        break;
      }
      case BufferKind::Alias: {
        const BufferDesc &target = e.buffers[size_t(b.offset)];
        if (target.kind == BufferKind::Global && im.rowSharded[size_t(target.offset)])
          return sdError("entry '", e.name, "': an alias of row-sharded global '", plan->globals[size_t(target.offset)].name,
                         "' (only shard-aware steps may read its rows)");
        v.data = pe.views[size_t(b.offset)].data;
        break;
      }
      }
      pe.views.push_back(v);
    }
    for (size_t si = 0; si < e.steps.size(); ++si) {
      const StepDesc &sd = e.steps[si];
      const KernelDef *kernel = kernels[ei][si];
      Impl::PreparedStep ps{&sd, kernel, KernelContext{sd.attrs, {}, {}, im.pool.get()}, false, std::nullopt, nullptr};
      ps.ctx.stream = dev.stream();
      ps.ctx.comm = im.comm.get();
      if (std::string p = sd.attrs.getString("shard_param", ""); !p.empty()) {
        auto it = paramOwner.find(p);
        if (it == paramOwner.end())
          return sdError("entry '", e.name, "' step ", si, ": shard_param '", p, "' is not a trainable parameter");
        ps.ctx.shardOwner = it->second;
      }
      ps.elsewhere = !sd.outputs.empty();
      for (int32_t o : sd.outputs) {
        const BufferDesc &b = e.buffers[size_t(o)];
        ps.elsewhere &= b.kind == BufferKind::Global && !im.globalData[size_t(b.offset)] && b.bytes > 0;
      }
      for (int32_t i : sd.inputs) ps.ctx.inputs.push_back(i >= 0 ? pe.views[size_t(i)] : TensorView{});
      for (int32_t o : sd.outputs) ps.ctx.outputs.push_back(pe.views[size_t(o)]);
      std::vector<bool> constant;
      std::vector<const void *> planValue; // a constant's value in host memory (the plan's copy)
      for (int32_t i : sd.inputs) {
        const BufferDesc *b = i >= 0 ? &e.buffers[size_t(i)] : nullptr;
        const GlobalDesc *g = b && b->kind == BufferKind::Global ? &plan->globals[size_t(b->offset)] : nullptr;
        // A row-sharded weight is not its plan value here (rows only).
        constant.push_back(g && !isMutableRole(g->role) && !im.rowSharded[size_t(b->offset)]);
        planValue.push_back(constant.back() ? g->data : nullptr);
      }
      if (onHost[ei][si]) {
        StatusOr<std::unique_ptr<HostCopies>> copies = stageOnHost(ps.ctx, planValue);
        if (!copies.isOk()) return copies.status().withContext("entry '" + e.name + "' step " + std::to_string(si) + ": ");
        ps.onHost = std::move(*copies);
      }
      if (dev.hostAddressable() && widensHalves(*kernel, ps.ctx)) {
        StatusOr<int64_t> scratch = im.layOutHalves(ps, constant);
        if (!scratch.isOk()) return scratch.status().withContext("entry '" + e.name + "' step " + std::to_string(si) + ": ");
        scratchFloats = std::max(scratchFloats, *scratch);
      }
      KernelContext &seen = ps.half ? ps.half->wide : ps.ctx; // what the kernel runs with
      if (kernel->prepare) {
        std::vector<bool> superseded(constant.size(), false);
        PrepareContext pc{seen, constant, {}, im.preparedShared, &superseded};
        // On the host the kernel's own operand (a widened copy, say); on a
        // GPU its operands are device addresses, so the plan's copy.
        const bool hostOperands = dev.hostAddressable() || ps.onHost;
        for (size_t i = 0; i < constant.size(); ++i)
          pc.hostInputs.push_back(!constant[i] ? nullptr : hostOperands ? static_cast<const void *>(seen.inputs[i].data) : planValue[i]);
        if (std::shared_ptr<const void> prepared = kernel->prepare(pc)) {
          ps.ctx.prepared = seen.prepared = prepared.get();
          im.preparedSteps.push_back(std::move(prepared));
          // A widened weight the prepared value stands in for is not read:
          // once no step reads it, it is released (below).
          if (ps.half)
            for (size_t i = 0; i < superseded.size(); ++i)
              if (superseded[i] && constant[i] && ps.ctx.inputs[i].dtype != seen.inputs[i].dtype) seen.inputs[i].data = nullptr;
        }
      }
      const bool hostStep = ps.onHost || !sd.bodies.empty();
      if (hostStep || pe.segments.empty() || pe.segments.back().onHost) {
        Impl::PreparedEntry::Segment segment;
        segment.begin = segment.end = si;
        segment.onHost = hostStep;
        pe.segments.push_back(std::move(segment));
      }
      pe.segments.back().end = si + 1;
      pe.steps.push_back(std::move(ps));
    }
    im.entries.push_back(std::move(pe));
  }
  im.releaseUnreadWidenings();
  if (scratchFloats > 0) { // now that every step's need is known
    im.halfScratch.reset(new (std::nothrow) float[size_t(scratchFloats)]);
    if (!im.halfScratch)
      return sdError("out of memory for ", scratchFloats * 4, " bytes of f32 stand-ins for half operands");
    im.halfBytes += uint64_t(scratchFloats) * 4;
    for (Impl::PreparedEntry &pe : im.entries)
      for (Impl::PreparedStep &ps : pe.steps)
        if (ps.half) placeInScratch(*ps.half, im.halfScratch.get());
  }
  if (!im.stepsOnHost.empty()) {
    std::string ops;
    size_t steps = 0;
    for (auto &[op, n] : im.stepsOnHost) {
      ops += (ops.empty() ? "" : ", ") + op + (n > 1 ? " x" + std::to_string(n) : "");
      steps += n;
    }
    std::fprintf(stderr, "sd: %zu step%s with no kernel on '%s'%s run%s on the CPU, with copies each way (%s); "
                 "the rest of their entries is captured around them\n", steps, steps == 1 ? "" : "s", dev.name().c_str(),
                 opts.cpuOps.empty() ? "" : " (or named by --cpu-ops)", steps == 1 ? "s" : "", ops.c_str());
  }
  SD_RETURN_IF_ERROR(configureCpuBackend(threads)); // last: it checks what memory is left
  return s;
}

// Every step of the entry, eagerly (timed per op when profiling).
Status Session::runEager(size_t entry) { return runEager(entry, 0, impl_->entries[entry].steps.size()); }

// Steps [begin, end) of the entry, eagerly.
Status Session::runEager(size_t entry, size_t begin, size_t end) {
  Impl &im = *impl_;
  std::map<std::string, OpProfile> &profile = im.profile;
  for (size_t si = begin; si < end; ++si) {
    Impl::PreparedStep &ps = im.entries[entry].steps[si];
    if (ps.elsewhere) continue;
    auto t0 = im.profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    const std::vector<size_t> &bodies = ps.desc->bodies; // resolved by Plan::parse
    Status st = bodies.empty() ? ps.onHost ? runOnHost(*im.device, *ps.kernel, ps.ctx, *ps.onHost)
                               : ps.half   ? runWidened(*ps.kernel, ps.ctx, *ps.half)
                                           : runKernel(*ps.kernel, ps.ctx)
                : ps.desc->op == "Loop" ? runLoop(ps.ctx, bodies[0])
                                        : runIf(ps.ctx, bodies[0], bodies[1]);
    // A GPU kernel only starts when launched: wait for it, so the time is the op's.
    if (im.profiling && st.isOk() && !im.device->hostAddressable()) st = im.device->synchronize();
    if (im.profiling) {
      auto t1 = std::chrono::steady_clock::now();
      OpProfile &p = profile[ps.desc->op];
      p.op = ps.desc->op;
      p.ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
      ++p.calls;
      if (im.trace.size() < kMaxTraceEvents)
        im.trace.push_back({ps.desc->op, ps.desc->location, uint32_t(entry),
                            std::chrono::duration<double, std::micro>(t0 - im.profileStart).count(),
                            std::chrono::duration<double, std::micro>(t1 - t0).count()});
      else
        ++im.droppedTrace;
    }
    if (!st.isOk())
      return st.withContext(ps.desc->op + (ps.desc->location.empty() ? "" : " at " + ps.desc->location) + ": ");
    // Reductions a step started (async AllReduce) advance between steps.
    if (im.comm && im.comm->hasDeferred()) im.comm->advanceDeferred();
  }
  // A segment is captured whole: what runs beside the stream joins it first.
  if (StreamCollectives *sc = im.comm ? im.comm->onStreams() : nullptr)
    SD_RETURN_IF_ERROR(sc->join(im.device->stream()).withContext("joining the collectives beside the stream: "));
  return Status::ok();
}

// A device-to-device copy between a step's buffers and its body's, skipped
// where they are the same memory (a body that passes a value through).
static Status copyBetween(Device &dev, void *dst, const void *src, size_t bytes) {
  return dst == src || !bytes ? Status::ok() : dev.copyOnDevice(dst, src, bytes);
}

// A Loop step: the body entry once per iteration while the iteration number
// is below min(M, max_trips) and the condition holds. Its results hold the
// carried values from the start (the initial ones) and take the body's after
// each iteration; the outer-scope operands are copied into the body once, as
// its inputs stay live for its whole run (the compiler's liveness).
Status Session::runLoop(const KernelContext &c, size_t bodyIndex) {
  Impl &im = *impl_;
  Device &dev = *im.device;
  const EntryDesc &body = plan_->entries[bodyIndex];
  const std::vector<TensorView> &views = im.entries[bodyIndex].views;
  auto in = [&](size_t k) { return views[size_t(body.inputs[k].second)]; };
  auto out = [&](size_t k) { return views[size_t(body.outputs[k].second)]; };
  const size_t carried = size_t(c.attrs.getInt("carried", 0));
  const int64_t maxTrips = c.attrs.getInt("max_trips", 0);
  int64_t trips = 0;
  uint8_t cond = 0;
  SD_RETURN_IF_ERROR(dev.copyToHost(&trips, c.inputs[0].data, sizeof trips));
  SD_RETURN_IF_ERROR(dev.copyToHost(&cond, c.inputs[1].data, 1));
  for (size_t k = 0; k < carried; ++k)
    SD_RETURN_IF_ERROR(copyBetween(dev, c.outputs[k].data, c.inputs[2 + k].data, c.outputs[k].byteSize()));
  for (size_t k = 2 + carried; k < c.inputs.size(); ++k)
    SD_RETURN_IF_ERROR(copyBetween(dev, in(k).data, c.inputs[k].data, in(k).byteSize()));
  const int64_t limit = std::clamp<int64_t>(trips, 0, maxTrips);
  int64_t i = 0;
  for (; i < limit && cond; ++i) {
    const uint8_t yes = 1;
    SD_RETURN_IF_ERROR(dev.copyFromHost(in(0).data, &i, sizeof i));
    SD_RETURN_IF_ERROR(dev.copyFromHost(in(1).data, &yes, 1));
    for (size_t k = 0; k < carried; ++k) SD_RETURN_IF_ERROR(copyBetween(dev, in(2 + k).data, c.outputs[k].data, in(2 + k).byteSize()));
    SD_RETURN_IF_ERROR(runEager(bodyIndex).withContext("iteration " + std::to_string(i) + ": "));
    SD_RETURN_IF_ERROR(dev.copyToHost(&cond, out(0).data, 1));
    for (size_t k = 0; k < carried; ++k) SD_RETURN_IF_ERROR(copyBetween(dev, c.outputs[k].data, out(1 + k).data, c.outputs[k].byteSize()));
    for (size_t k = carried; k < c.outputs.size(); ++k) {
      const TensorView slice = out(1 + k);
      SD_RETURN_IF_ERROR(copyBetween(dev, static_cast<uint8_t *>(c.outputs[k].data) + size_t(i) * slice.byteSize(), slice.data,
                              slice.byteSize()));
    }
  }
  if (cond && i == maxTrips && trips > maxTrips) return sdError(c.attrs.getString("message", "the loop needs more iterations"));
  if (i < maxTrips && c.outputs.size() > carried)
    return sdError("the loop stopped after ", i, " of ", maxTrips, " iterations; its scan outputs need every one");
  return Status::ok();
}

// An If step: the condition is read on the host, then the taken body entry
// runs with its share of the operands copied in, and its outputs are copied
// to the step's results.
Status Session::runIf(const KernelContext &c, size_t thenIndex, size_t elseIndex) {
  Impl &im = *impl_;
  Device &dev = *im.device;
  uint8_t cond = 0;
  SD_RETURN_IF_ERROR(dev.copyToHost(&cond, c.inputs[0].data, 1));
  const size_t body = cond ? thenIndex : elseIndex;
  const size_t first = cond ? 1 : 1 + size_t(c.attrs.getInt("then_inputs", 0));
  const EntryDesc &e = plan_->entries[body];
  const std::vector<TensorView> &views = im.entries[body].views;
  for (size_t k = 0; k < e.inputs.size(); ++k) {
    const TensorView &in = views[size_t(e.inputs[k].second)];
    SD_RETURN_IF_ERROR(copyBetween(dev, in.data, c.inputs[first + k].data, in.byteSize()));
  }
  SD_RETURN_IF_ERROR(runEager(body).withContext(cond ? "then branch: " : "else branch: "));
  for (size_t k = 0; k < c.outputs.size(); ++k)
    SD_RETURN_IF_ERROR(copyBetween(dev, c.outputs[k].data, views[size_t(e.outputs[k].second)].data, c.outputs[k].byteSize()));
  return Status::ok();
}

// Warm-up -> capture -> replay, per segment (an entry with no step the host
// runs is one segment): the first run is eager (it also reports any kernel
// error with its step), the second is captured into a graph and replayed,
// later runs only replay; the host's steps run between the graphs. A failed
// capture says so once and its segment stays eager; profiling always runs
// eagerly (per-op times).
Status Session::runSteps(size_t entry) {
  Impl &im = *impl_;
  Impl::PreparedEntry &pe = im.entries[entry];
  const EntryDesc &e = plan_->entries[entry];
  if (!im.graphs || im.profiling) return runEager(entry);
  for (Impl::PreparedEntry::Segment &seg : pe.segments) {
    if (seg.onHost || seg.captureFailed || seg.eagerRuns == 0) {
      ++seg.eagerRuns;
      SD_RETURN_IF_ERROR(runEager(entry, seg.begin, seg.end));
      continue;
    }
    if (!seg.graph) {
      // By value: a device may keep the recorded work past this call.
      StatusOr<std::shared_ptr<void>> g = im.device->capture([this, entry, b = seg.begin, end = seg.end] {
        return runEager(entry, b, end);
      });
      if (!g.isOk()) {
        seg.captureFailed = true;
        const std::string steps = pe.segments.size() == 1 ? "" : " (steps " + std::to_string(seg.begin) + "-" +
                                                                     std::to_string(seg.end - 1) + ")";
        std::fprintf(stderr, "sd: entry '%s'%s runs without a CUDA graph: %s\n", e.name.c_str(), steps.c_str(),
                     g.status().message().c_str());
        SD_RETURN_IF_ERROR(runEager(entry, seg.begin, seg.end));
        continue;
      }
      seg.graph = *g;
    }
    SD_RETURN_IF_ERROR(im.device->replay(seg.graph.get()));
  }
  return Status::ok();
}

Status Session::runOnDevice(size_t entry, const std::vector<TensorView> &inputs, const std::vector<TensorView> &outputs) {
  if (entry >= plan_->entries.size()) return sdError("entry index ", entry, " out of range");
  const EntryDesc &e = plan_->entries[entry];
  if (e.isBody) return sdError("entry '", e.name, "' is the body of a Loop or If step and runs only from that step");
  Impl::PreparedEntry &pe = impl_->entries[entry];
  if (inputs.size() != e.inputs.size() || outputs.size() != e.outputs.size())
    return sdError("entry '", e.name, "' takes ", e.inputs.size(), " inputs and gives ", e.outputs.size(),
                   " outputs, got ", inputs.size(), " and ", outputs.size());
  for (const auto &x : e.outputExtents)
    if (x.buffer >= 0)
      return sdError("entry '", e.name, "' has outputs counted at run time; run it with Session::run, which trims them");
  auto check = [&](const TensorView &given, const TensorView &want, const std::string &what) -> Status {
    if (given.dtype != want.dtype || given.dims != want.dims)
      return sdError(what, " is ", dtypeName(given.dtype), "[", formatDims(given.dims), "], the plan has ",
                     dtypeName(want.dtype), "[", formatDims(want.dims), "]");
    if (!given.data && given.byteSize()) return sdError(what, " has no memory");
    return Status::ok();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorView &dst = pe.views[size_t(e.inputs[i].second)];
    SD_RETURN_IF_ERROR(check(inputs[i], dst, "input '" + e.inputs[i].first + "'"));
    SD_RETURN_IF_ERROR(impl_->device->copyOnDevice(dst.data, inputs[i].data, dst.byteSize()));
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    SD_RETURN_IF_ERROR(check(outputs[i], pe.views[size_t(e.outputs[i].second)], "output '" + e.outputs[i].first + "'"));
  SD_RETURN_IF_ERROR(runSteps(entry));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const TensorView &v = pe.views[size_t(e.outputs[i].second)];
    SD_RETURN_IF_ERROR(impl_->device->copyOnDevice(outputs[i].data, v.data, v.byteSize()));
  }
  return Status::ok();
}

Status Session::synchronize() { return impl_->device->synchronize(); }

const std::map<std::string, size_t> &Session::stepsOnHost() const { return impl_->stepsOnHost; }

static Status notHeld(const Session &s, size_t index) {
  const GlobalDesc &g = s.plan().globals[index];
  if (s.rowSharded(index))
    return sdError("global '", g.name, "' is split by rows over the ranks (sdc compile --shard params); this rank holds rows ",
                   s.globalRows(index).begin, "..", s.globalRows(index).begin + s.globalRows(index).count, " of ",
                   g.dims[0]);
  return sdError("global '", g.name, "' is held by rank ", s.globalOwner(index), " (sdc compile --shard)");
}

Status Session::readGlobal(size_t index, void *dst, size_t bytes) const {
  if (index >= plan_->globals.size()) return sdError("global index ", index, " out of range");
  const GlobalDesc &g = plan_->globals[index];
  if (bytes != g.bytes) return sdError("global '", g.name, "' has ", g.bytes, " bytes, the buffer ", bytes);
  if (!holdsGlobal(index)) return notHeld(*this, index);
  return impl_->device->copyToHost(dst, impl_->globalData[index], bytes);
}

Status Session::readGlobalRows(size_t index, std::vector<uint8_t> &rows) const {
  if (index >= plan_->globals.size()) return sdError("global index ", index, " out of range");
  if (!rowSharded(index)) {
    rows.resize(plan_->globals[index].bytes);
    return readGlobal(index, rows.data(), rows.size());
  }
  rows.resize(rowBytes(plan_->globals[index]) * uint64_t(impl_->rows[index].count));
  return rows.empty() ? Status::ok() : impl_->device->copyToHost(rows.data(), impl_->globalData[index], rows.size());
}

// Whether entries may write global `index` (a mutable role), and so callers too.
static Status checkWritable(const Plan &plan, size_t index) {
  if (index >= plan.globals.size()) return sdError("global index ", index, " out of range");
  const GlobalDesc &g = plan.globals[index];
  if (!isMutableRole(g.role)) return sdError("global '", g.name, "' is ", globalRoleName(g.role), " and cannot be written");
  return Status::ok();
}

Status Session::writeGlobal(size_t index, const void *src, size_t bytes) {
  SD_RETURN_IF_ERROR(checkWritable(*plan_, index));
  const GlobalDesc &g = plan_->globals[index];
  if (bytes != g.bytes) return sdError("global '", g.name, "' has ", g.bytes, " bytes, the data ", bytes);
  if (rowSharded(index)) { // the whole value in, this rank's rows kept
    const uint64_t row = rowBytes(g), keep = row * uint64_t(impl_->rows[index].count);
    if (!keep) return Status::ok();
    return impl_->device->copyFromHost(impl_->globalData[index],
                                       static_cast<const uint8_t *>(src) + row * uint64_t(impl_->rows[index].begin), keep);
  }
  if (!holdsGlobal(index)) return notHeld(*this, index);
  return impl_->device->copyFromHost(impl_->globalData[index], src, bytes);
}

Status Session::writeGlobalPart(size_t index, size_t offset, const void *src, size_t bytes) {
  SD_RETURN_IF_ERROR(checkWritable(*plan_, index));
  const GlobalDesc &g = plan_->globals[index];
  if (offset > g.bytes || bytes > g.bytes - offset)
    return sdError("global '", g.name, "' has ", g.bytes, " bytes; bytes ", offset, " to ", offset + bytes, " are outside it");
  if (rowSharded(index) || !holdsGlobal(index)) return notHeld(*this, index);
  return bytes ? impl_->device->copyFromHost(impl_->globalData[index] + offset, src, bytes) : Status::ok();
}

Status Session::writeGlobalRows(size_t index, const void *rows, size_t bytes) {
  SD_RETURN_IF_ERROR(checkWritable(*plan_, index));
  if (!rowSharded(index)) return writeGlobal(index, rows, bytes);
  const GlobalDesc &g = plan_->globals[index];
  const uint64_t keep = rowBytes(g) * uint64_t(impl_->rows[index].count);
  if (bytes != keep) return sdError("global '", g.name, "': this rank keeps ", keep, " bytes of rows, the data has ", bytes);
  return keep ? impl_->device->copyFromHost(impl_->globalData[index], rows, keep) : Status::ok();
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
  impl_->trace.clear();
  impl_->droppedTrace = 0;
  impl_->profileStart = std::chrono::steady_clock::now();
}

const std::vector<Session::TraceEvent> &Session::trace() const { return impl_->trace; }
size_t Session::droppedTraceEvents() const { return impl_->droppedTrace; }

std::vector<Session::OpProfile> Session::profile() const {
  std::vector<OpProfile> v;
  for (auto &[k, p] : impl_->profile) v.push_back(p);
  std::sort(v.begin(), v.end(), [](const OpProfile &a, const OpProfile &b) { return a.ms > b.ms; });
  return v;
}

} // namespace sd
