// Test helpers shared by the plan and run-ahead tests: a device the host
// cannot address (its kernels the CPU's), and a tiny language model trained
// for a few steps.
#pragma once
#include "Driver.h"
#include "sd/ops/kernel.h"
#include "sd/runtime/device.h"
#include "sd/runtime/plan.h"
#include "sd/runtime/session.h"
#include "sd/train/trainer.h"
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <gtest/gtest.h>
#include <string>
#include <vector>

namespace sd {

// A device for tests: host memory the session may not address directly (so
// every weight is uploaded and every value copied through the interface), and
// a kernel registry derived from the CPU's.
class TestDevice final : public Device {
public:
  explicit TestDevice(KernelRegistry kernels) : kernels_(std::move(kernels)) {}
  const std::string &name() const override { return kernels_.backend(); }
  const KernelRegistry &kernels() const override { return kernels_; }
  bool hostAddressable() const override { return false; }
  StatusOr<void *> allocate(size_t bytes) override {
    ++allocations;
    return cpuDevice()->allocate(bytes);
  }
  void release(void *p) override { cpuDevice()->release(p); }
  Status copyFromHost(void *dst, const void *src, size_t n) override {
    uploaded += n, ++waitingCopies;
    return cpuDevice()->copyFromHost(dst, src, n);
  }
  Status copyToHost(void *dst, const void *src, size_t n) override {
    downloaded += n, ++waitingCopies;
    return cpuDevice()->copyToHost(dst, src, n);
  }
  // Staging copies are queued on a GPU; here they count apart.
  StatusOr<void *> allocateStaging(size_t bytes) override {
    ++stagingAllocations;
    return Device::allocateStaging(bytes);
  }
  Status copyFromStaging(void *dst, const void *src, size_t n) override {
    uploaded += n, ++queuedCopies;
    return cpuDevice()->copyFromHost(dst, src, n);
  }
  // A queued read lands in staging memory only when the host waits for it
  // (a fence after it, or synchronize), as on a GPU: a session that reads a
  // run's outputs without waiting reads stale bytes. The device's value is
  // taken when the copy is queued, the order the device would copy in.
  Status copyToStaging(void *dst, const void *src, size_t n) override {
    downloaded += n, ++queuedCopies;
    const uint8_t *from = static_cast<const uint8_t *>(src);
    pendingReads.push_back({dst, std::vector<uint8_t>(from, from + n)});
    return Status::ok();
  }
  // A fence remembers the reads queued before it and, on a timed device,
  // the emulated clock (one ms per queued copy, plus what a test adds).
  struct Fence {
    size_t reads;
    double ms;
  };
  StatusOr<std::shared_ptr<void>> fence() override {
    return std::shared_ptr<void>(new Fence{landedReads + pendingReads.size(), double(queuedCopies) + idleMs},
                                 [](void *p) { delete static_cast<Fence *>(p); });
  }
  Status waitFor(void *fence) override {
    ++waits;
    if (fence) land(static_cast<Fence *>(fence)->reads);
    return Status::ok();
  }
  std::optional<double> elapsedMs(void *from, void *to) const override {
    if (!timed) return std::nullopt;
    return static_cast<Fence *>(to)->ms - static_cast<Fence *>(from)->ms;
  }
  bool timed = false;
  double idleMs = 0; // time the emulated device waited for the host
  Status zero(void *dst, size_t n) override { return cpuDevice()->zero(dst, n); }
  Status copyOnDevice(void *dst, const void *src, size_t n) override {
    onDevice += n;
    return cpuDevice()->copyOnDevice(dst, src, n);
  }
  Status synchronize() override {
    ++syncs;
    land(landedReads + pendingReads.size());
    return Status::ok();
  }
  std::optional<size_t> freeBytes() const override { return free; }
  // Graph capture, emulated: the "graph" is the recorded work itself, run on replay.
  StatusOr<std::shared_ptr<void>> capture(const std::function<Status()> &enqueue) override {
    ++captureAttempts;
    if (!canCapture) return sdError("test device: capture refused");
    return std::shared_ptr<void>(new std::function<Status()>(enqueue),
                                 [](void *f) { delete static_cast<std::function<Status()> *>(f); });
  }
  Status replay(void *graph) override {
    ++replays;
    return (*static_cast<std::function<Status()> *>(graph))();
  }
  size_t allocations = 0, uploaded = 0, downloaded = 0, onDevice = 0;
  size_t waitingCopies = 0, queuedCopies = 0, syncs = 0, waits = 0, stagingAllocations = 0;
  std::optional<size_t> free; // unset: unknown, as on the CPU
  bool canCapture = false;
  int captureAttempts = 0, replays = 0;

private:
  // Lands the queued reads up to the `upTo`-th since the device was made.
  void land(size_t upTo) {
    for (; landedReads < upTo && !pendingReads.empty(); ++landedReads) {
      std::memcpy(pendingReads.front().first, pendingReads.front().second.data(), pendingReads.front().second.size());
      pendingReads.pop_front();
    }
  }
  std::deque<std::pair<void *, std::vector<uint8_t>>> pendingReads;
  size_t landedReads = 0;
  KernelRegistry kernels_;
};

// The CPU kernels under another backend name, with `drop` left out and
// `retype`'s kernel limited to f64.
inline KernelRegistry derivedKernels(const std::string &name, const std::string &drop, const std::string &retype = "") {
  KernelRegistry r(name);
  for (const KernelDef *k : cpuKernels().all()) {
    if (k->op == drop) continue;
    KernelDef d = *k;
    if (k->op == retype) {
      d.types = TypeSet{DType::F64};
      d.halfViaF32 = false;
    }
    r.add(d);
  }
  return r;
}

// A tiny causal LM (embedding, LayerNorm, Relu, head) for the capture audit.
inline const char *kLanguageModel = R"(<
  ir_version: 8,
  opset_import: ["" : 17]
>
lm (int64[2, 6] input_ids) => (float[2, 6, 8] logits)
<float[8, 4] emb = {0.1,-0.2,0.3,0.05,-0.4,0.2,0.1,-0.1,0.25,0.3,-0.15,0.2,-0.05,0.1,0.4,-0.3,
                    0.2,0.1,-0.2,0.35,-0.25,0.05,0.15,0.3,0.3,-0.3,0.2,-0.1,0.05,0.25,-0.35,0.1},
 float[4] ln_s = {1.0, 0.9, 1.1, 1.0}, float[4] ln_b = {0.0, 0.1, -0.1, 0.05},
 float[4, 8] head = {0.2,-0.1,0.05,0.3,-0.2,0.1,0.15,-0.25,0.1,0.2,-0.3,0.05,0.25,-0.15,0.1,0.2,
                     -0.05,0.3,0.2,-0.1,0.1,0.05,-0.2,0.15,0.3,-0.25,0.1,0.2,-0.1,0.15,0.05,-0.3}>
{
  h = Gather <axis = 0> (emb, input_ids)
  n = LayerNormalization <axis = -1> (h, ln_s, ln_b)
  a = Relu(n)
  logits = MatMul(a, head)
}
)";

// kLanguageModel as dir/lm.onnxtxt and 12 rows of token ids as dir/train.jsonl.
inline void writeLanguageModel(const std::string &dir) {
  std::ofstream(dir + "/lm.onnxtxt") << kLanguageModel;
  std::ofstream data(dir + "/train.jsonl");
  for (int i = 0; i < 12; ++i)
    data << "{\"input_ids\": [" << (i % 8) << ", " << ((i * 3 + 1) % 8) << ", " << ((i * 5 + 2) % 8) << ", "
         << ((i + 4) % 8) << "]}\n";
}

// ONNX text `text` compiled as dir/NAME.sdp (`configure` sets the options);
// null (with a test failure) when it does not compile or load.
inline std::shared_ptr<const Plan> compilePlanText(const std::string &dir, const std::string &text,
                                                   const std::string &name,
                                                   const std::function<void(CompileRequest &)> &configure = nullptr) {
  std::ofstream(dir + "/" + name + ".onnxtxt") << text;
  CompileRequest req;
  req.model = dir + "/" + name + ".onnxtxt";
  req.output = dir + "/" + name + ".sdp";
  if (configure) configure(req);
  std::string err;
  EXPECT_TRUE(compileModel(req, err)) << err;
  auto loaded = Plan::loadFile(req.output);
  EXPECT_TRUE(loaded.isOk()) << loaded.status().message();
  return loaded.isOk() ? std::shared_ptr<const Plan>(std::move(loaded.value())) : nullptr;
}

// kLanguageModel and its data (writeLanguageModel) compiled for training as
// dir/NAME.sdp: full fine-tuning unless `configure` says otherwise.
inline std::shared_ptr<const Plan> compileLanguageModel(const std::string &dir, const std::string &name = "lm",
                                                        const std::function<void(CompileRequest &)> &configure = nullptr) {
  writeLanguageModel(dir);
  return compilePlanText(dir, kLanguageModel, name, [&](CompileRequest &req) {
    req.pipeline.peft = "none";
    if (configure) configure(req);
  });
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<train::StepReport> reports;
  std::vector<size_t> launchedAfter; // runs still launched when each step was reported
  std::vector<HostTensor> state;     // every mutable global after the run
};

// 8 steps of 2 rows, AdamW-style settings; `configure` changes the rest.
inline TrainRun trainOn(std::shared_ptr<const Plan> plan, SessionOptions opts, const std::string &data,
                        const std::function<void(train::TrainConfig &)> &configure = nullptr) {
  TrainRun r;
  auto s = Session::create(plan, opts);
  EXPECT_TRUE(s.isOk()) << s.status().message();
  if (!s.isOk()) return r;
  train::TrainConfig cfg;
  cfg.dataPath = data;
  cfg.steps = 8;
  cfg.batch = 2;
  cfg.shuffle = false;
  cfg.weightDecay = 0.01;
  cfg.clipNorm = 1.0;
  cfg.schedule.peak = 0.05;
  if (configure) configure(cfg);
  auto t = train::Trainer::create(*s.value(), cfg);
  EXPECT_TRUE(t.isOk()) << t.status().message();
  if (!t.isOk()) return r;
  Status st = train::trainToEnd(*t.value(), [&](const train::StepReport &rep) {
    r.losses.push_back(rep.loss);
    r.reports.push_back(rep);
    r.launchedAfter.push_back(s.value()->launchedRuns());
    return Status::ok();
  });
  EXPECT_TRUE(st.isOk()) << st.message();
  for (size_t g = 0; g < plan->globals.size(); ++g)
    if (isMutableRole(plan->globals[g].role)) r.state.push_back(*s.value()->readGlobal(g));
  return r;
}

} // namespace sd
