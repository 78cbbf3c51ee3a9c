// Runs from and to the host: launch() queues a run, collect() waits for the
// oldest queued one, run() is the two at once. On a device the host cannot
// address, a run's inputs and outputs pass through a page-locked staging
// block of its own, so the host fills the next run's block and queues it
// while the device still works on the one before (a trainer reads a step's
// loss one step behind, and the GPU never waits for the host in between).
#include "session_impl.h"
#include <cstring>

namespace sd {
namespace {

size_t roundUp64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Where each input, each output, then each counted output's count sits in
// an entry's staging block (64-byte aligned), and the block's size.
std::vector<size_t> stagingLayout(const EntryDesc &e, const std::vector<TensorView> &views, size_t &bytes) {
  std::vector<size_t> at;
  bytes = 0;
  auto place = [&](size_t size) {
    at.push_back(bytes);
    bytes += roundUp64(size);
  };
  for (const auto &in : e.inputs) place(views[size_t(in.second)].byteSize());
  for (const auto &out : e.outputs) place(views[size_t(out.second)].byteSize());
  for (size_t i = 0; i < e.outputs.size() && i < e.outputExtents.size(); ++i)
    if (e.outputExtents[i].buffer >= 0) place(sizeof(int64_t));
  return at;
}

// An output sized for the most its op can select (NonMaxSuppression) holds
// `count` real slices along `axis`: the caller gets those, never the padding.
Status keepCountedPrefix(int64_t count, int32_t axis, HostTensor &t) {
  int64_t bound = t.dims[size_t(axis)];
  if (!keepPrefixAlong(t.data, t.dims, dtypeSize(t.dtype), size_t(axis), count))
    return sdError("output '", t.name, "' counts ", count, " slices along dim ", axis, ", outside its bound ", bound);
  return Status::ok();
}

HostTensor emptyLike(const std::string &name, DType dtype, const Dims &dims, size_t bytes) {
  HostTensor t;
  t.name = name;
  t.dtype = dtype;
  t.dims = dims;
  t.data.resize(bytes);
  return t;
}

} // namespace

// The smallest spare block that holds `bytes`, or a new one.
StatusOr<Session::Impl::StagingBlock> Session::Impl::takeStaging(size_t bytes) {
  auto best = spareStaging.end();
  for (auto it = spareStaging.begin(); it != spareStaging.end(); ++it)
    if (it->bytes >= bytes && (best == spareStaging.end() || it->bytes < best->bytes)) best = it;
  if (best != spareStaging.end()) {
    StagingBlock b = *best;
    spareStaging.erase(best);
    return b;
  }
  StatusOr<void *> p = device->allocateStaging(bytes);
  if (!p.isOk()) return p.status();
  return StagingBlock{static_cast<uint8_t *>(*p), bytes};
}

Status Session::launch(size_t entry, const std::vector<const HostTensor *> &inputs, const std::vector<size_t> &alsoRead) {
  if (entry >= plan_->entries.size()) return sdError("entry index ", entry, " out of range");
  const EntryDesc &e = plan_->entries[entry];
  if (e.isBody) return sdError("entry '", e.name, "' is the body of a Loop or If step and runs only from that step");
  Impl &im = *impl_;
  Impl::PreparedEntry &pe = im.entries[entry];
  Device &dev = *im.device;
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
  }
  size_t globalBytes = 0;
  for (size_t g : alsoRead) {
    if (g >= plan_->globals.size()) return sdError("global index ", g, " out of range");
    if (!holdsGlobal(g)) return sdError("global '", plan_->globals[g].name, "' is not held whole by this rank");
    globalBytes += roundUp64(plan_->globals[g].bytes);
  }
  Impl::QueuedRun run;
  run.entry = entry;
  run.alsoRead = alsoRead;
  const bool staged = !dev.hostAddressable();
  if (staged) {
    if (pe.stagedBytes == 0) // laid out at the entry's first run
      pe.stagedAt = stagingLayout(e, pe.views, pe.stagedBytes);
    StatusOr<Impl::StagingBlock> block = im.takeStaging(pe.stagedBytes + globalBytes);
    if (!block.isOk()) return block.status().withContext("entry '" + e.name + "': ");
    run.block = *block;
    if (im.timesRuns) {
      StatusOr<std::shared_ptr<void>> started = dev.fence();
      if (!started.isOk()) return started.status();
      run.started = *started;
    }
  }
  // On failure the block goes back once the device is done with it.
  auto fail = [&](Status st) {
    if (run.block.data) {
      (void)dev.synchronize();
      im.spareStaging.push_back(run.block);
    }
    return st;
  };
  const std::vector<size_t> &at = pe.stagedAt;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorView &dst = pe.views[size_t(e.inputs[i].second)];
    const HostTensor &src = *inputs[i];
    Status st = Status::ok();
    if (!staged) st = dev.copyFromHost(dst.data, src.data.data(), src.data.size());
    else {
      if (!src.data.empty()) std::memcpy(run.block.data + at[i], src.data.data(), src.data.size());
      st = dev.copyFromStaging(dst.data, run.block.data + at[i], src.data.size());
    }
    if (!st.isOk()) return fail(st);
  }
  if (Status st = runSteps(entry); !st.isOk()) return fail(st);
  if (staged) { // queued behind the steps: outputs, counts, then the globals
    size_t slot = inputs.size();
    auto stage = [&](size_t offset, const void *src, size_t bytes) {
      return dev.copyToStaging(run.block.data + offset, src, bytes);
    };
    for (const auto &out : e.outputs) {
      const TensorView &v = pe.views[size_t(out.second)];
      if (Status st = stage(at[slot++], v.data, v.byteSize()); !st.isOk()) return fail(st);
    }
    for (size_t i = 0; i < e.outputs.size() && i < e.outputExtents.size(); ++i)
      if (int32_t b = e.outputExtents[i].buffer; b >= 0)
        if (Status st = stage(at[slot++], pe.views[size_t(b)].data, sizeof(int64_t)); !st.isOk()) return fail(st);
    size_t offset = pe.stagedBytes;
    for (size_t g : alsoRead) {
      if (Status st = stage(offset, im.globalData[g], plan_->globals[g].bytes); !st.isOk()) return fail(st);
      offset += roundUp64(plan_->globals[g].bytes);
    }
    StatusOr<std::shared_ptr<void>> f = dev.fence();
    if (!f.isOk()) return fail(f.status());
    run.fence = *f;
  } else { // the run is done: read everything now, before a later run overwrites it
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      const TensorView &v = pe.views[size_t(e.outputs[i].second)];
      HostTensor t = emptyLike(e.outputs[i].first, v.dtype, v.dims, v.byteSize());
      SD_RETURN_IF_ERROR(dev.copyToHost(t.data.data(), v.data, v.byteSize()));
      if (i < e.outputExtents.size() && e.outputExtents[i].buffer >= 0) {
        int64_t count = 0;
        SD_RETURN_IF_ERROR(dev.copyToHost(&count, pe.views[size_t(e.outputExtents[i].buffer)].data, sizeof count));
        SD_RETURN_IF_ERROR(keepCountedPrefix(count, e.outputExtents[i].axis, t));
      }
      run.outputs.push_back(std::move(t));
    }
    for (size_t g : alsoRead) {
      auto t = readGlobal(g);
      if (!t.isOk()) return t.status();
      run.outputs.push_back(std::move(t.value()));
    }
  }
  im.queued.push_back(std::move(run));
  return Status::ok();
}

Status Session::collect(std::vector<HostTensor> &outputs) {
  Impl &im = *impl_;
  if (im.queued.empty()) return sdError("no launched run is waiting to be collected");
  Impl::QueuedRun run = std::move(im.queued.front());
  im.queued.pop_front();
  outputs.clear();
  if (!run.block.data) {
    outputs = std::move(run.outputs);
    return Status::ok();
  }
  struct Spare { // the block is reused whatever happens below
    Impl &im;
    Impl::StagingBlock block;
    ~Spare() { im.spareStaging.push_back(block); }
  } spare{im, run.block};
  SD_RETURN_IF_ERROR(im.device->waitFor(run.fence.get()));
  if (im.timesRuns && run.started) {
    std::optional<double> busy = im.device->elapsedMs(run.started.get(), run.fence.get());
    if (!im.timedFrom) im.timedFrom = run.started;
    std::optional<double> span = im.device->elapsedMs(im.timedFrom.get(), run.fence.get());
    if (busy && span) {
      im.timed.busyMs += *busy;
      im.timed.spanMs = *span;
      ++im.timed.runs;
    } else {
      im.timesRuns = false; // fences without times: stop asking
    }
  }
  const EntryDesc &e = plan_->entries[run.entry];
  const Impl::PreparedEntry &pe = im.entries[run.entry];
  const std::vector<size_t> &at = pe.stagedAt;
  size_t countSlot = e.inputs.size() + e.outputs.size();
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    const TensorView &v = pe.views[size_t(e.outputs[i].second)];
    HostTensor t = emptyLike(e.outputs[i].first, v.dtype, v.dims, v.byteSize());
    if (!t.data.empty()) std::memcpy(t.data.data(), run.block.data + at[e.inputs.size() + i], t.data.size());
    if (i < e.outputExtents.size() && e.outputExtents[i].buffer >= 0) {
      int64_t count = 0;
      std::memcpy(&count, run.block.data + at[countSlot++], sizeof count);
      SD_RETURN_IF_ERROR(keepCountedPrefix(count, e.outputExtents[i].axis, t));
    }
    outputs.push_back(std::move(t));
  }
  size_t offset = pe.stagedBytes;
  for (size_t g : run.alsoRead) {
    const GlobalDesc &d = plan_->globals[g];
    HostTensor t = emptyLike(d.name, d.dtype, d.dims, d.bytes);
    if (d.bytes) std::memcpy(t.data.data(), run.block.data + offset, d.bytes);
    offset += roundUp64(d.bytes);
    outputs.push_back(std::move(t));
  }
  return Status::ok();
}

size_t Session::launchedRuns() const { return impl_->queued.size(); }

std::optional<Session::DeviceTime> Session::deviceTime() const {
  if (!impl_->timesRuns || impl_->timed.runs == 0) return std::nullopt;
  return impl_->timed;
}

void Session::resetDeviceTime() {
  impl_->timed = DeviceTime{};
  impl_->timedFrom.reset();
}

Status Session::run(size_t entry, const std::vector<const HostTensor *> &inputs, std::vector<HostTensor> &outputs) {
  if (!impl_->queued.empty())
    return sdError(impl_->queued.size(), " launched run(s) not collected yet: collect them before run()");
  SD_RETURN_IF_ERROR(launch(entry, inputs));
  return collect(outputs);
}

} // namespace sd
