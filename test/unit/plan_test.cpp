// Plan verification: a compiled plan loads and runs; every single-byte flip and
// every truncation is refused with an error; with the checksum disabled the
// deeper checks still keep corrupt plans from crashing the runtime.
#include <functional>
#include "Driver.h"
#include "plan_generated.h"
#include "sd/format/crc32c.h"
#include "sd/ops/kernel.h"
#include "sd/runtime/device.h"
#include "sd/runtime/plan.h"
#include "sd/runtime/session.h"
#include "sd/train/trainer.h"
#include "temp_dir.h"
#include "test_device.h"
#include <algorithm>
#include <cstring>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>
#include <unistd.h>

using namespace sd;

namespace {

const char *kModel = R"(<
  ir_version: 8,
  opset_import: ["" : 17]
>
g (float[2, 4] x, int64[2] ids) => (float[2, 3] y, float[2, 4] e)
<float[4, 3] w = {1.,2.,3.,4.,5.,6.,7.,8.,9.,10.,11.,12.}, float[3] b = {0.5, 0.25, 0.125},
 float[5, 4] table = {1.,2.,3.,4.,5.,6.,7.,8.,9.,10.,11.,12.,13.,14.,15.,16.,17.,18.,19.,20.}>
{
  h = MatMul(x, w)
  z = Add(h, b)
  s = Softmax <axis = -1> (z)
  y = Relu(s)
  e = Gather <axis = 0> (table, ids)
}
)";

class PlanTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    TempDir tmp("sd_plan_test");
    std::ofstream(tmp.path() + "/m.onnxtxt") << kModel;
    CompileRequest req;
    req.model = tmp.path() + "/m.onnxtxt";
    req.output = tmp.path() + "/m.sdp";
    std::string err;
    ASSERT_TRUE(compileModel(req, err)) << err;
    std::ifstream f(req.output, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    bytes_.assign(s.begin(), s.end());
  }
  static std::vector<uint8_t> bytes_;

  static std::vector<HostTensor> inputs() {
    HostTensor x{"x", DType::F32, {2, 4}, std::vector<uint8_t>(32, 0)};
    HostTensor ids{"ids", DType::I64, {2}, std::vector<uint8_t>(16, 0)};
    int64_t idv[2] = {4, 1};
    std::memcpy(ids.data.data(), idv, 16);
    return {x, ids};
  }
};
std::vector<uint8_t> PlanTest::bytes_;

TEST_F(PlanTest, LoadsAndRuns) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto session = Session::create(p, SessionOptions{1});
  ASSERT_TRUE(session.isOk());
  auto in = inputs();
  std::vector<HostTensor> out;
  ASSERT_TRUE(session.value()->run(0, {&in[0], &in[1]}, out).isOk());
  ASSERT_EQ(out.size(), 2u);
  // Softmax of (x=0)·w + b: exp(b)/sum(exp(b)).
  const float *y = reinterpret_cast<const float *>(out[0].data.data());
  double z = std::exp(0.5) + std::exp(0.25) + std::exp(0.125);
  EXPECT_NEAR(y[0], std::exp(0.5) / z, 1e-6);
  const float *e = reinterpret_cast<const float *>(out[1].data.data());
  EXPECT_EQ(e[0], 17.f);
  EXPECT_EQ(e[4], 5.f);
}

TEST_F(PlanTest, EveryByteFlipIsRefused) {
  for (size_t i = 0; i < bytes_.size(); ++i) {
    std::vector<uint8_t> b = bytes_;
    b[i] ^= 0xff;
    auto plan = Plan::loadBytes(b.data(), b.size(), "flipped.sdp");
    ASSERT_FALSE(plan.isOk()) << "flip at byte " << i << " was accepted";
    EXPECT_EQ(plan.status().message().find('\n'), std::string::npos);
  }
}

// The fuzzer's plan whose Gemm bias shares part of the output's bytes
// (found with the checksum skipped): one line naming what overlaps.
TEST(PlanLoad, RefusesAnOutputOverlappingAnOperandInPart) {
  std::ifstream in(SD_FUZZ_REGRESSIONS "/plan-loader-bias-overlaps-output", std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(bytes.empty());
  PlanLoadOptions opts;
  opts.verifyChecksum = false;
  auto plan = Plan::loadBytes(bytes.data(), bytes.size(), "overlap.sdp", opts);
  ASSERT_FALSE(plan.isOk());
  const std::string &message = plan.status().message();
  EXPECT_NE(message.find("overlaps operand"), std::string::npos) << message;
  EXPECT_NE(message.find("in part"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST_F(PlanTest, EveryTruncationIsRefused) {
  for (size_t n = 0; n < bytes_.size(); ++n) {
    auto plan = Plan::loadBytes(bytes_.data(), n, "truncated.sdp");
    ASSERT_FALSE(plan.isOk()) << "truncation to " << n << " bytes was accepted";
  }
}

TEST_F(PlanTest, RunsOnADeviceTheHostCannotAddress) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-device", ""));
  SessionOptions opts{1, dev};
  auto onDevice = Session::create(p, opts);
  ASSERT_TRUE(onDevice.isOk()) << onDevice.status().message();
  auto onCpu = Session::create(p, SessionOptions{1});
  ASSERT_TRUE(onCpu.isOk());
  size_t weightBytes = 0;
  for (const GlobalDesc &g : p->globals) weightBytes += g.bytes;
  EXPECT_GE(dev->uploaded, weightBytes); // frozen weights went through copyFromHost
  EXPECT_EQ(onDevice.value()->device().name(), "test-device");

  auto in = inputs();
  std::vector<HostTensor> a, b;
  ASSERT_TRUE(onDevice.value()->run(0, {&in[0], &in[1]}, a).isOk());
  ASSERT_TRUE(onCpu.value()->run(0, {&in[0], &in[1]}, b).isOk());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].data, b[i].data) << a[i].name;
  size_t outBytes = 0;
  for (auto &t : a) outBytes += t.data.size();
  EXPECT_GE(dev->downloaded, outBytes);
}

// On a device the host cannot address, a run's inputs and outputs pass
// through a staging block (allocated at the first run, reused after): every
// copy is queued, and the run waits once, at its end.
TEST_F(PlanTest, RunsQueueTheirCopiesThroughStagingAndWaitOnce) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk());
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-device", ""));
  auto s = Session::create(p, SessionOptions{1, dev});
  ASSERT_TRUE(s.isOk()) << s.status().message();
  auto onCpu = Session::create(p, SessionOptions{1});
  ASSERT_TRUE(onCpu.isOk());
  auto in = inputs();
  std::vector<HostTensor> want;
  ASSERT_TRUE(onCpu.value()->run(0, {&in[0], &in[1]}, want).isOk());
  const size_t waiting = dev->waitingCopies, syncs = dev->syncs, waits = dev->waits;
  for (int run = 0; run < 3; ++run) {
    std::vector<HostTensor> got;
    ASSERT_TRUE(s.value()->run(0, {&in[0], &in[1]}, got).isOk());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].data, want[i].data) << "run " << run;
  }
  EXPECT_EQ(dev->stagingAllocations, 1u);
  EXPECT_EQ(dev->waitingCopies, waiting); // nothing copied through pageable memory
  EXPECT_EQ(dev->queuedCopies, 3 * (in.size() + want.size()));
  EXPECT_EQ(dev->waits - waits, 3u);     // one wait per run
  EXPECT_EQ(dev->syncs, syncs);
}

// Inputs and outputs already in device memory: the run copies them on the
// device only (nothing through the host), and gives the CPU's results.
TEST_F(PlanTest, RunsOnInputsAndOutputsAlreadyOnTheDevice) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk());
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-device", ""));
  auto session = Session::create(p, SessionOptions{1, dev});
  ASSERT_TRUE(session.isOk()) << session.status().message();
  auto onCpu = Session::create(p, SessionOptions{1});
  ASSERT_TRUE(onCpu.isOk());
  auto in = inputs();
  std::vector<HostTensor> want;
  ASSERT_TRUE(onCpu.value()->run(0, {&in[0], &in[1]}, want).isOk());

  std::vector<TensorView> devIn, devOut;
  std::vector<void *> owned;
  auto deviceTensor = [&](DType t, const Dims &dims) {
    TensorView v{nullptr, t, dims};
    auto mem = dev->allocate(std::max<size_t>(v.byteSize(), 1));
    EXPECT_TRUE(mem.isOk());
    v.data = mem.value();
    owned.push_back(v.data);
    return v;
  };
  for (auto &t : in) {
    devIn.push_back(deviceTensor(t.dtype, t.dims));
    ASSERT_TRUE(dev->copyFromHost(devIn.back().data, t.data.data(), t.data.size()).isOk());
  }
  for (auto &t : want) devOut.push_back(deviceTensor(t.dtype, t.dims));
  const size_t up = dev->uploaded, down = dev->downloaded;
  ASSERT_TRUE(session.value()->runOnDevice(0, devIn, devOut).isOk());
  ASSERT_TRUE(session.value()->synchronize().isOk());
  EXPECT_EQ(dev->uploaded, up);     // nothing went through the host
  EXPECT_EQ(dev->downloaded, down);
  EXPECT_GT(dev->onDevice, 0u);
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<uint8_t> got(want[i].data.size());
    ASSERT_TRUE(dev->copyToHost(got.data(), devOut[i].data, got.size()).isOk());
    EXPECT_EQ(got, want[i].data) << want[i].name;
  }
  // A wrong shape is an error naming the tensor, before anything runs.
  std::vector<TensorView> wrong = devOut;
  wrong[0].dims = {3, 3};
  Status s = session.value()->runOnDevice(0, devIn, wrong);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("output '"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("the plan has f32[2x3]"), std::string::npos) << s.message();
  for (void *m : owned) dev->release(m);
}

// Warm-up -> capture -> replay: run 1 is eager, run 2 captures and replays,
// later runs only replay, and every run gives the CPU's results. A device
// that cannot capture, or graphs turned off, keeps every run eager.
TEST_F(PlanTest, EntriesRunEagerOnceThenReplayACapturedGraph) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk());
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto onCpu = Session::create(p, SessionOptions{1});
  ASSERT_TRUE(onCpu.isOk());
  auto in = inputs();
  std::vector<HostTensor> want;
  ASSERT_TRUE(onCpu.value()->run(0, {&in[0], &in[1]}, want).isOk());
  struct Mode {
    bool canCapture, graphs;
    int attempts, replays;
  };
  for (Mode m : {Mode{true, true, 1, 3}, Mode{false, true, 1, 0}, Mode{true, false, 0, 0}}) {
    auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
    dev->canCapture = m.canCapture;
    SessionOptions opts{1, dev};
    opts.graphs = m.graphs;
    auto s = Session::create(p, opts);
    ASSERT_TRUE(s.isOk()) << s.status().message();
    for (int run = 0; run < 4; ++run) {
      std::vector<HostTensor> got;
      ASSERT_TRUE(s.value()->run(0, {&in[0], &in[1]}, got).isOk());
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].data, want[i].data) << "run " << run;
    }
    EXPECT_EQ(dev->captureAttempts, m.attempts) << m.canCapture << m.graphs;
    EXPECT_EQ(dev->replays, m.replays) << m.canCapture << m.graphs;
  }
}

// A plan larger than the device's free memory is refused before anything is
// allocated, saying how much it needs and how much is free.
TEST_F(PlanTest, PlanLargerThanFreeDeviceMemoryIsRefusedUpFront) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk());
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
  dev->free = 100;
  auto s = Session::create(p, SessionOptions{1, dev});
  ASSERT_FALSE(s.isOk());
  const std::string &msg = s.status().message();
  EXPECT_NE(msg.find("plan does not fit on device 'test-gpu': it needs "), std::string::npos) << msg;
  EXPECT_NE(msg.find("MiB free"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(dev->allocations, 0u);
  dev->free = size_t(1) << 40; // enough: the same plan runs
  EXPECT_TRUE(Session::create(p, SessionOptions{1, dev}).isOk());
}

TEST_F(PlanTest, MissingKernelFailsAtSessionCreationNamingOpAndDevice) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk());
  std::shared_ptr<Plan> p(std::move(plan.value()));
  const EntryDesc &e = p->entries[0];
  ASSERT_GE(e.steps.size(), 2u);
  const std::string op = e.steps[1].op;
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", op));
  SessionOptions opts{1, dev};
  opts.cpuFallback = false; // else the step runs the CPU's kernel (below)
  auto s = Session::create(p, opts);
  ASSERT_FALSE(s.isOk());
  const std::string &msg = s.status().message();
  EXPECT_NE(msg.find("entry '" + e.name + "' step 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("op '" + op + "' has no kernel on device 'test-gpu'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(dev->allocations, 0u); // refused before anything was allocated
}

TEST_F(PlanTest, ElementTypeTheKernelLacksFailsAtSessionCreation) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk());
  std::shared_ptr<Plan> p(std::move(plan.value()));
  const std::string op = p->entries[0].steps[0].op;
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", "", op));
  SessionOptions opts{1, dev};
  opts.cpuFallback = false;
  auto s = Session::create(p, opts);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.status().message().find("op '" + op + "' on device 'test-gpu' does not compute f32 (it takes f64)"),
            std::string::npos)
      << s.status().message();
}

// A step whose op the device has no kernel for (or not for its types) runs
// the CPU's kernel on host copies of its operands: the CPU's results, the
// copies go through the device interface, and the steps between such steps
// are captured and replayed as graphs of their own.
TEST_F(PlanTest, StepsWithoutADeviceKernelRunTheCpusOnHostCopies) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk());
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto onCpu = Session::create(p, SessionOptions{1});
  ASSERT_TRUE(onCpu.isOk());
  EXPECT_TRUE(onCpu.value()->stepsOnHost().empty());
  auto in = inputs();
  std::vector<HostTensor> want;
  ASSERT_TRUE(onCpu.value()->run(0, {&in[0], &in[1]}, want).isOk());
  const std::string dropped = p->entries[0].steps[1].op, retyped = p->entries[0].steps[0].op;
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", dropped, retyped));
  dev->canCapture = true;
  auto s = Session::create(p, SessionOptions{1, dev});
  ASSERT_TRUE(s.isOk()) << s.status().message();
  EXPECT_EQ(s.value()->stepsOnHost(), (std::map<std::string, size_t>{{dropped, 1}, {retyped, 1}}));
  // Steps 0 and 1 fall back; the steps after them are one captured segment.
  const int later = int(p->entries[0].steps.size()) > 2 ? 1 : 0;
  ASSERT_EQ(later, 1) << "the test plan needs a step after the two that fall back";
  for (int run = 0; run < 4; ++run) {
    const size_t down = dev->downloaded;
    std::vector<HostTensor> got;
    ASSERT_TRUE(s.value()->run(0, {&in[0], &in[1]}, got).isOk());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].data, want[i].data) << "run " << run;
    size_t outBytes = 0;
    for (auto &t : got) outBytes += t.data.size();
    EXPECT_GT(dev->downloaded - down, outBytes) << "the fallback steps' operands came through copyToHost";
  }
  EXPECT_EQ(dev->captureAttempts, 1); // run 2 captured the segment after the fallback steps
  EXPECT_EQ(dev->replays, 3);         // runs 2-4 replayed it
}

// SessionOptions::cpuOps (sdrun --cpu-ops) puts an op the device has a
// kernel for on the CPU's kernel the same way, to check one against the
// other; without the CPU fallback it changes nothing.
TEST_F(PlanTest, OpsNamedInCpuOpsRunTheCpusKernelOnADevice) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk());
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto in = inputs();
  std::vector<HostTensor> want;
  auto onCpu = Session::create(p, SessionOptions{1});
  ASSERT_TRUE(onCpu.isOk());
  ASSERT_TRUE(onCpu.value()->run(0, {&in[0], &in[1]}, want).isOk());
  const std::string op = p->entries[0].steps[1].op;
  size_t stepsOfOp = 0;
  for (const StepDesc &sd : p->entries[0].steps) stepsOfOp += sd.op == op;
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
  SessionOptions opts{1, dev};
  opts.cpuOps = {op};
  auto s = Session::create(p, opts);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  EXPECT_EQ(s.value()->stepsOnHost(), (std::map<std::string, size_t>{{op, stepsOfOp}}));
  std::vector<HostTensor> got;
  ASSERT_TRUE(s.value()->run(0, {&in[0], &in[1]}, got).isOk());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].data, want[i].data);
  opts.cpuFallback = false;
  auto strict = Session::create(p, opts);
  ASSERT_TRUE(strict.isOk()) << strict.status().message();
  EXPECT_TRUE(strict.value()->stepsOnHost().empty());
}

TEST(Devices, OpenByName) {
  auto cpu = openDevice("cpu");
  ASSERT_TRUE(cpu.isOk());
  EXPECT_EQ((*cpu)->name(), "cpu");
  auto best = openDevice("auto");
  ASSERT_TRUE(best.isOk());
  auto none = openDevice("tpu");
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("unknown device 'tpu' (devices: cpu, cuda, auto)"), std::string::npos);
}

// "cuda" opens GPU 0 where there is one; elsewhere (no CUDA in the build, no
// driver, no GPU) it is one line saying why, and "auto" falls back to the CPU.
TEST(Devices, CudaOpensOrSaysWhyNot) {
  auto gpu = openDevice("cuda");
  auto best = openDevice("auto");
  ASSERT_TRUE(best.isOk());
  if (gpu.isOk()) {
    EXPECT_EQ((*gpu)->name(), "cuda");
    EXPECT_FALSE((*gpu)->hostAddressable());
    EXPECT_EQ((*best)->name(), "cuda");
    return;
  }
  const std::string &msg = gpu.status().message();
  EXPECT_EQ(msg.rfind("device 'cuda': ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ((*best)->name(), "cpu");
}

// Without the CRC, corrupt plans reach the structural checks; whatever loads
// must run without touching memory outside its buffers (ASan in the fuzzer
// checks the same more strictly).
TEST_F(PlanTest, CorruptionPastTheChecksumNeverCrashes) {
  PlanLoadOptions noCrc;
  noCrc.verifyChecksum = false;
  size_t loaded = 0, ran = 0;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    for (uint8_t mask : {uint8_t(0xff), uint8_t(0x01), uint8_t(0x80)}) {
      std::vector<uint8_t> b = bytes_;
      b[i] ^= mask;
      auto plan = Plan::loadBytes(b.data(), b.size(), "corrupt.sdp", noCrc);
      if (!plan.isOk()) continue;
      ++loaded;
      std::shared_ptr<Plan> p(std::move(plan.value()));
      auto session = Session::create(p, SessionOptions{1});
      if (!session.isOk()) continue;
      for (size_t e = 0; e < p->entries.size(); ++e) {
        std::vector<HostTensor> in;
        for (auto &bind : p->entries[e].inputs) {
          const BufferDesc &bd = p->entries[e].buffers[size_t(bind.second)];
          in.push_back(HostTensor{bind.first, bd.dtype, bd.dims, std::vector<uint8_t>(bd.bytes, 0)});
        }
        std::vector<const HostTensor *> ptrs;
        for (auto &t : in) ptrs.push_back(&t);
        std::vector<HostTensor> out;
        Status st = session.value()->run(e, ptrs, out);
        if (!st.isOk()) { // a one-line error, as for any bad input
          EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
          continue;
        }
        // A run that succeeds returns what the loaded plan declares: every
        // output, with its element type and size.
        const EntryDesc &entry = p->entries[e];
        ASSERT_EQ(out.size(), entry.outputs.size()) << "flip at byte " << i;
        for (size_t k = 0; k < out.size(); ++k) {
          const BufferDesc &bd = entry.buffers[size_t(entry.outputs[k].second)];
          EXPECT_EQ(out[k].dtype, bd.dtype) << "flip at byte " << i;
          EXPECT_EQ(out[k].data.size(), size_t(bd.bytes)) << "flip at byte " << i;
        }
        ++ran;
      }
    }
  }
  EXPECT_GT(loaded, 0u); // some flips (weights, padding) load fine without the CRC
  EXPECT_GT(ran, 0u);
}

// Past the checksum, a flipped bit in a weight shows in exactly the outputs
// that read it: row 4 of the Gather table, element 0 (17.0), loses its
// lowest mantissa bit; the MatMul path and the other rows are unchanged.
TEST_F(PlanTest, AFlippedWeightBitShowsInExactlyTheResultsThatReadIt) {
  float table[20];
  for (int i = 0; i < 20; ++i) table[i] = float(i + 1);
  auto at = std::search(bytes_.begin(), bytes_.end(), reinterpret_cast<uint8_t *>(table),
                        reinterpret_cast<uint8_t *>(table) + sizeof table);
  ASSERT_NE(at, bytes_.end()) << "the table's bytes are not in the plan";
  std::vector<uint8_t> b = bytes_;
  b[size_t(at - bytes_.begin()) + 16 * 4] ^= 0x01; // element 16 (17.0), lowest mantissa bit
  PlanLoadOptions noCrc;
  noCrc.verifyChecksum = false;
  auto plan = Plan::loadBytes(b.data(), b.size(), "flipped.sdp", noCrc);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  auto session = Session::create(std::shared_ptr<Plan>(std::move(plan.value())), SessionOptions{1});
  ASSERT_TRUE(session.isOk());
  auto in = inputs();
  std::vector<HostTensor> out;
  ASSERT_TRUE(session.value()->run(0, {&in[0], &in[1]}, out).isOk());
  const float *e = reinterpret_cast<const float *>(out[1].data.data());
  float flipped = 17.f;
  uint32_t bits;
  std::memcpy(&bits, &flipped, 4);
  bits ^= 1;
  std::memcpy(&flipped, &bits, 4);
  EXPECT_EQ(e[0], flipped);
  EXPECT_EQ(e[1], 18.f);
  EXPECT_EQ(e[4], 5.f);
  const float *y = reinterpret_cast<const float *>(out[0].data.data());
  double z = std::exp(0.5) + std::exp(0.25) + std::exp(0.125);
  EXPECT_NEAR(y[0], std::exp(0.5) / z, 1e-6);
}

TEST_F(PlanTest, WrongSchemaVersionIsRefusedByName) {
  std::vector<uint8_t> b = bytes_;
  uint64_t fbSize;
  std::memcpy(&fbSize, b.data() + b.size() - kPlanFooterSize, 8);
  auto *plan = fb::GetMutablePlan(b.data());
  ASSERT_TRUE(plan->mutate_schema_major(kPlanSchemaMajor + 1));
  uint32_t crc = crc32c(b.data(), b.size() - kPlanFooterSize);
  std::memcpy(b.data() + b.size() - kPlanFooterSize + 8, &crc, 4);
  auto loaded = Plan::loadBytes(b.data(), b.size(), "future.sdp");
  ASSERT_FALSE(loaded.isOk());
  std::string want = "schema version " + std::to_string(kPlanSchemaMajor + 1) + "." +
                     std::to_string(kPlanSchemaMinor) + " is not supported";
  EXPECT_NE(loaded.status().message().find(want), std::string::npos) << loaded.status().message();
}

// `model` (ONNX text) compiled in a fresh temporary folder, `configure`
// setting flags; empty (and the test failed) when it does not compile.
std::vector<uint8_t> compileText(const std::string &model, const std::function<void(CompileRequest &)> &configure = {}) {
  TempDir tmp("sd_plan_test");
  std::ofstream(tmp.path() + "/m.onnxtxt") << model;
  CompileRequest req;
  req.model = tmp.path() + "/m.onnxtxt";
  req.output = tmp.path() + "/m.sdp";
  if (configure) configure(req);
  std::string err;
  if (!compileModel(req, err)) {
    ADD_FAILURE() << err;
    return {};
  }
  std::ifstream f(req.output, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// `good` changed by `mutate` (then given a fresh checksum) must fail to load
// with a message that contains `want`.
void expectRefused(const std::vector<uint8_t> &good, const std::function<bool(fb::Plan *)> &mutate,
                   const std::string &want) {
  std::vector<uint8_t> b = good;
  ASSERT_TRUE(mutate(fb::GetMutablePlan(b.data()))) << want;
  uint32_t crc = crc32c(b.data(), b.size() - kPlanFooterSize);
  std::memcpy(b.data() + b.size() - kPlanFooterSize + 8, &crc, 4);
  auto bad = Plan::loadBytes(b.data(), b.size(), "bad.sdp");
  ASSERT_FALSE(bad.isOk()) << want;
  EXPECT_NE(bad.status().message().find(want), std::string::npos) << bad.status().message();
}

// Attribute `name` of the first `op` step of entry `entry` (null: none).
fb::Attr *stepAttr(fb::Plan *p, flatbuffers::uoffset_t entry, const char *op, const char *name) {
  auto *steps = p->mutable_entries()->GetMutableObject(entry)->mutable_steps();
  for (flatbuffers::uoffset_t i = 0; i < steps->size(); ++i) {
    fb::Step *s = steps->GetMutableObject(i);
    if (s->op()->str() != op) continue;
    for (flatbuffers::uoffset_t k = 0; k < s->attrs()->size(); ++k)
      if (s->attrs()->Get(k)->name()->str() == name) return s->mutable_attrs()->GetMutableObject(k);
  }
  return nullptr;
}

// A corrupt counted-output binding (NonZero's result, counted along dim 1):
// a count buffer that is not one int64, out of range, or an axis past the
// output's rank is refused by name when the plan loads.
TEST(CountedOutputs, CorruptExtentBindingsAreRefused) {
  std::vector<uint8_t> good = compileText(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[3] x) => (int64[1, 3] y) { y = NonZero (x) })");
  ASSERT_FALSE(good.empty());
  auto loaded = Plan::loadBytes(good.data(), good.size(), "good.sdp");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  ASSERT_EQ(loaded.value()->entries[0].outputExtents.size(), 1u);
  EXPECT_EQ(loaded.value()->entries[0].outputExtents[0].axis, 1);
  auto corrupt = [&](const std::function<bool(fb::Binding *)> &mutate, const std::string &want) {
    expectRefused(good, [&](fb::Plan *p) {
      return mutate(p->mutable_entries()->GetMutableObject(0)->mutable_outputs()->GetMutableObject(0));
    }, want);
  };
  corrupt([](fb::Binding *bd) { return bd->mutate_extent_buffer(bd->buffer()); }, "not one int64");
  corrupt([](fb::Binding *bd) { return bd->mutate_extent_buffer(1 << 20); }, "counts its extent in buffer");
  corrupt([](fb::Binding *bd) { return bd->mutate_extent_axis(2); }, "extent axis 2 out of range");
}

// A Loop past --max-unroll: one Loop step over a body entry. It runs, and a
// plan whose step and body disagree is refused at load, naming the step.
// A fused elementwise chain runs to the unfused chain's bits, and a corrupt
// program (an operand index past the values computed so far, an unknown
// opcode) is refused by name when the plan loads, never run.
TEST(FusedElementwise, RunsAndCorruptProgramsAreRefused) {
  std::vector<uint8_t> good = compileText(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[3] x, float[3] y) => (float[3] z) {
  s = Add (x, y)
  p = Mul (s, x)
  z = Sub (p, y)
})");
  ASSERT_FALSE(good.empty());
  auto loaded = Plan::loadBytes(good.data(), good.size(), "good.sdp");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  std::shared_ptr<Plan> plan(std::move(loaded.value()));
  ASSERT_EQ(plan->entries[0].steps.size(), 1u);
  EXPECT_EQ(plan->entries[0].steps[0].op, "FusedElementwise");
  auto session = Session::create(plan, SessionOptions{1});
  ASSERT_TRUE(session.isOk()) << session.status().message();
  HostTensor x{"x", DType::F32, {3}, std::vector<uint8_t>(12)}, y{"y", DType::F32, {3}, std::vector<uint8_t>(12)};
  const float xv[3] = {0.1f, -2.5f, 3e38f}, yv[3] = {0.2f, 1.25f, 3e38f};
  std::memcpy(x.data.data(), xv, 12);
  std::memcpy(y.data.data(), yv, 12);
  std::vector<HostTensor> out;
  ASSERT_TRUE(session.value()->run(0, {&x, &y}, out).isOk());
  const float *z = reinterpret_cast<const float *>(out[0].data.data());
  for (int i = 0; i < 3; ++i) {
    volatile float sum = xv[i] + yv[i], product = sum * xv[i]; // one rounding per step, as unfused
    EXPECT_EQ(z[i], product - yv[i]) << i;
  }
  auto program = [](fb::Plan *p) { return stepAttr(p, 0, "FusedElementwise", "program"); };
  auto setProgram = [&](flatbuffers::uoffset_t at, int64_t value) {
    return [=](fb::Plan *p) {
      fb::Attr *a = program(p);
      if (!a || !a->ints() || a->ints()->size() <= at) return false;
      a->mutable_ints()->Mutate(at, value);
      return true;
    };
  };
  expectRefused(good, setProgram(1, 7), "reads value 7");
  expectRefused(good, setProgram(0, 14), "opcode 14");
}

TEST(LoopSteps, RunAndCorruptOnesAreRefused) {
  std::vector<uint8_t> good = compileText(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, float[2] w) => (float[2] y, float[3, 2] steps)
{
  m = Constant <value = int64 {3}> ()
  t = Constant <value = bool {1}> ()
  y, steps = Loop (m, t, x) <body = b (int64 i, bool c, float[2] acc) => (bool go, float[2] next, float[2] seen) {
    f = Cast <to = 1> (i)
    scaled = Mul (acc, f)
    next = Add (scaled, w)
    seen = Identity (next)
    go = Identity (c)
  }>
})", [](CompileRequest &req) { req.maxUnroll = 1; });
  ASSERT_FALSE(good.empty());
  auto loaded = Plan::loadBytes(good.data(), good.size(), "good.sdp");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  std::shared_ptr<Plan> plan(std::move(loaded.value()));
  ASSERT_EQ(plan->entries.size(), 2u);
  ASSERT_TRUE(plan->entries[1].isBody);
  auto session = Session::create(plan, SessionOptions{1});
  ASSERT_TRUE(session.isOk()) << session.status().message();
  HostTensor x{"x", DType::F32, {2}, std::vector<uint8_t>(8)}, w{"w", DType::F32, {2}, std::vector<uint8_t>(8)};
  const float xv[2] = {7, 9}, wv[2] = {1, -1};
  std::memcpy(x.data.data(), xv, 8);
  std::memcpy(w.data.data(), wv, 8);
  std::vector<HostTensor> out;
  ASSERT_TRUE(session.value()->run(0, {&x, &w}, out).isOk());
  // acc = acc * i + w: w, 2w, 5w (x only reaches iteration 0, times 0).
  const float *y = reinterpret_cast<const float *>(out[0].data.data());
  const float *steps = reinterpret_cast<const float *>(out[1].data.data());
  EXPECT_EQ(y[0], 5.f);
  EXPECT_EQ(y[1], -5.f);
  const float want[6] = {1, -1, 2, -2, 5, -5};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(steps[k], want[k]) << k;

  auto corrupt = [&](const std::function<bool(fb::Plan *)> &mutate, const std::string &want) {
    expectRefused(good, mutate, want);
  };
  auto loopAttr = [](fb::Plan *p, const char *name) { return stepAttr(p, 0, "Loop", name); };
  corrupt([](fb::Plan *p) { return p->mutable_entries()->GetMutableObject(1)->mutate_body(false); },
          "names no body entry 'loop_body_0'");
  corrupt([&](fb::Plan *p) { return loopAttr(p, "max_trips")->mutate_i(4); }, "result 1 is f32[3x2], its body gives f32[2] per iteration");
  corrupt([&](fb::Plan *p) { return loopAttr(p, "carried")->mutate_i(2); }, "Loop");
  corrupt([](fb::Plan *p) {
    auto *body = p->mutable_entries()->GetMutableObject(1);
    return body->mutable_inputs()->GetMutableObject(2)->mutate_buffer(body->inputs()->Get(0)->buffer());
  }, "operand 2 does not match its body's input 'carried_0'");
}

// On a device that captures graphs, the steps before and after a loop step
// are captured as two graphs and replayed around the loop, which the host
// runs: every run equals the CPU's for its own inputs.
TEST(LoopSteps, StepsAroundALoopReplayFromGraphs) {
  std::vector<uint8_t> bytes = compileText(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, float[2] w) => (float[2] z)
{
  sq = Mul (x, x)
  m = Constant <value = int64 {3}> ()
  t = Constant <value = bool {1}> ()
  y = Loop (m, t, sq) <body = b (int64 i, bool c, float[2] acc) => (bool go, float[2] next) {
    f = Cast <to = 1> (i)
    scaled = Mul (acc, f)
    next = Add (scaled, w)
    go = Identity (c)
  }>
  s = Add (y, w)
  z = Relu (s)
})", [](CompileRequest &req) { req.maxUnroll = 1; });
  ASSERT_FALSE(bytes.empty());
  auto loaded = Plan::loadBytes(bytes.data(), bytes.size(), "loop.sdp");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  std::shared_ptr<Plan> plan(std::move(loaded.value()));
  auto onCpu = Session::create(plan, SessionOptions{1});
  ASSERT_TRUE(onCpu.isOk()) << onCpu.status().message();
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
  dev->canCapture = true;
  auto onDevice = Session::create(plan, SessionOptions{1, dev});
  ASSERT_TRUE(onDevice.isOk()) << onDevice.status().message();
  for (int run = 0; run < 4; ++run) {
    HostTensor x{"x", DType::F32, {2}, std::vector<uint8_t>(8)}, w{"w", DType::F32, {2}, std::vector<uint8_t>(8)};
    const float xv[2] = {float(run) + 1.5f, -2.0f * float(run)}, wv[2] = {0.5f, float(run) - 1.0f};
    std::memcpy(x.data.data(), xv, 8);
    std::memcpy(w.data.data(), wv, 8);
    std::vector<HostTensor> want, got;
    ASSERT_TRUE(onCpu.value()->run(0, {&x, &w}, want).isOk());
    ASSERT_TRUE(onDevice.value()->run(0, {&x, &w}, got).isOk());
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].data, want[0].data) << "run " << run;
  }
  EXPECT_EQ(dev->captureAttempts, 2); // the steps before the loop, and after it
  EXPECT_EQ(dev->replays, 6);         // runs 2-4, both graphs
}

// Ifs on run-time data above --max-select: If steps over two body entries,
// here nested (the then branch holds another If). Each way runs the taken
// branch only; a plan whose step and bodies disagree, or whose body runs
// itself, is refused at load.
TEST(IfSteps, RunNestedAndCorruptOnesAreRefused) {
  std::vector<uint8_t> good = compileText(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, float p, float q) => (float[2] y)
{
  zero = Constant <value = float {0}> ()
  a = Greater (p, zero)
  b = Greater (q, zero)
  y = If (a) <then_branch = t () => (float[2] ty) {
      ty = If (b) <then_branch = tt () => (float[2] u) { u = Add (x, x) },
                   else_branch = te () => (float[2] v) { v = Mul (x, x) }>
    }, else_branch = e () => (float[2] ey) { ey = Neg (x) }>
})", [](CompileRequest &req) { req.maxSelect = 0; });
  ASSERT_FALSE(good.empty());
  auto loaded = Plan::loadBytes(good.data(), good.size(), "good.sdp");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  std::shared_ptr<Plan> plan(std::move(loaded.value()));
  ASSERT_EQ(plan->entries.size(), 5u); // infer and two pairs of branches
  auto session = Session::create(plan, SessionOptions{1});
  ASSERT_TRUE(session.isOk()) << session.status().message();
  auto scalar = [](const char *name, float v) {
    HostTensor t{name, DType::F32, {}, std::vector<uint8_t>(4)};
    std::memcpy(t.data.data(), &v, 4);
    return t;
  };
  HostTensor x{"x", DType::F32, {2}, std::vector<uint8_t>(8)};
  const float xv[2] = {3, -2};
  std::memcpy(x.data.data(), xv, 8);
  const float want[3][2] = {{6, -4}, {9, 4}, {-3, 2}}; // x + x, x * x, -x
  const float pq[3][2] = {{1, 1}, {1, -1}, {-1, 1}};
  for (int c = 0; c < 3; ++c) {
    HostTensor p = scalar("p", pq[c][0]), q = scalar("q", pq[c][1]);
    std::vector<HostTensor> out;
    ASSERT_TRUE(session.value()->run(0, {&x, &p, &q}, out).isOk());
    const float *y = reinterpret_cast<const float *>(out[0].data.data());
    EXPECT_EQ(y[0], want[c][0]) << c;
    EXPECT_EQ(y[1], want[c][1]) << c;
  }
  std::vector<HostTensor> none;
  Status body = session.value()->run(1, {}, none);
  EXPECT_NE(body.message().find("runs only from that step"), std::string::npos) << body.message();

  auto corrupt = [&](const std::function<bool(fb::Plan *)> &mutate, const std::string &want) {
    expectRefused(good, mutate, want);
  };
  auto ifAttr = [](fb::Plan *p, flatbuffers::uoffset_t e, const char *name) { return stepAttr(p, e, "If", name); };
  corrupt([&](fb::Plan *p) { return ifAttr(p, 0, "then_inputs")->mutate_i(0); }, "its bodies take");
  corrupt([](fb::Plan *p) { return p->mutable_entries()->GetMutableObject(1)->mutate_body(false); },
          "names no body entry");
  corrupt([&](fb::Plan *p) { // the If's result: f32[3] instead of f32[2]
    auto *infer = p->mutable_entries()->GetMutableObject(0);
    for (flatbuffers::uoffset_t i = 0; i < infer->steps()->size(); ++i)
      if (infer->steps()->Get(i)->op()->str() == "If") {
        infer->mutable_buffers()->GetMutableObject(infer->steps()->Get(i)->outputs()->Get(0))->mutable_dims()->Mutate(0, 3);
        return true;
      }
    return false;
  }, "result 0 does not match output 'out_0'");
  // The nested If's body names its own entry: a body that runs itself.
  corrupt([&](fb::Plan *p) {
    for (flatbuffers::uoffset_t e = 1; e < p->entries()->size(); ++e) {
      fb::Attr *then = ifAttr(p, e, "then_body");
      const flatbuffers::String *self = p->entries()->Get(e)->name();
      if (!then || then->s()->size() != self->size()) continue;
      auto *s = then->mutable_s();
      for (flatbuffers::uoffset_t k = 0; k < self->size(); ++k) s->Mutate(k, char(self->Get(k)));
      return true;
    }
    return false;
  }, "runs itself");
}

} // namespace


// The capture audit: training plans replayed from a captured graph must give
// the eager CPU run's losses and state bit for bit. Replay re-runs the very
// launches recorded in step 2 with later steps' inputs, so this fails if any
// per-step value (lr, step counter, clipping, RNG state, the batch) reached a
// kernel other than through device memory written before launch.
TEST(CaptureAudit, TrainingPlansReplayBitForBit) {
  TempDir tmp("sd_capture_audit");
  const std::string &dir = tmp.path();
  // fp16 adds the loss scale and the skip flag: per-step values that must
  // live in device memory too (a first scale of 2^20 makes the first steps skip).
  struct Variant {
    std::string peft, optimizer, precision;
  };
  for (const Variant &variant : {Variant{"none", "adamw", "fp32"}, Variant{"none", "sgd", "fp32"},
                                 Variant{"lora", "adamw", "fp32"}, Variant{"lora", "sgd", "fp32"},
                                 Variant{"none", "adamw", "fp16"}}) {
    const std::string &peft = variant.peft, &optimizer = variant.optimizer;
    {
      std::shared_ptr<const Plan> plan =
          compileLanguageModel(dir, "lm-" + peft + "-" + optimizer + "-" + variant.precision, [&](CompileRequest &req) {
            req.pipeline.peft = peft;
            req.pipeline.optimizer = optimizer;
            req.pipeline.precision = variant.precision;
            req.pipeline.lossScaleInit = 1048576.0;
            req.pipeline.momentum = optimizer == "sgd" ? 0.9 : 0.0;
            if (peft == "lora") req.pipeline.targetModules = ".*";
          });
      ASSERT_TRUE(plan) << peft << "/" << optimizer;
      TrainRun eager = trainOn(plan, SessionOptions{1}, dir + "/train.jsonl");
      auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
      dev->canCapture = true;
      TrainRun replayed = trainOn(plan, SessionOptions{1, dev}, dir + "/train.jsonl");
      ASSERT_EQ(eager.losses.size(), 8u) << peft << "/" << optimizer;
      EXPECT_EQ(replayed.losses, eager.losses) << peft << "/" << optimizer;
      ASSERT_EQ(replayed.state.size(), eager.state.size());
      for (size_t i = 0; i < eager.state.size(); ++i)
        EXPECT_EQ(replayed.state[i].data, eager.state[i].data) << peft << "/" << optimizer << " " << eager.state[i].name;
      EXPECT_GT(dev->replays, 0) << "no entry was replayed from a graph";
      bool sawScale = false;
      for (const HostTensor &t : eager.state)
        if (t.name == "loss_scale") {
          float scale = 0;
          std::memcpy(&scale, t.data.data(), sizeof scale);
          EXPECT_LT(scale, 1048576.0f) << "fp16: no step was skipped, the audit misses the skip path";
          sawScale = true;
        }
      EXPECT_EQ(sawScale, variant.precision == "fp16");
      EXPECT_NE(eager.losses.front(), eager.losses.back()) << "training did not move";
    }
  }
}

// A training step whose optimizer update (in place: the parameter and its
// moments are operands and results at once) and embedding gather fall back
// to the CPU trains to the CPU's losses and state, bit for bit, with the
// steps between them replayed from captured graphs.
TEST(CpuFallback, TrainingStepsMatchTheCpuBitForBit) {
  TempDir tmp("sd_cpu_fallback");
  const std::string &dir = tmp.path();
  std::shared_ptr<const Plan> plan = compileLanguageModel(dir);
  ASSERT_TRUE(plan);
  TrainRun eager = trainOn(plan, SessionOptions{1}, dir + "/train.jsonl");
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", "AdamW", "Gather"));
  dev->canCapture = true;
  TrainRun fellBack = trainOn(plan, SessionOptions{1, dev}, dir + "/train.jsonl");
  ASSERT_EQ(eager.losses.size(), 8u);
  EXPECT_EQ(fellBack.losses, eager.losses);
  ASSERT_EQ(fellBack.state.size(), eager.state.size());
  for (size_t i = 0; i < eager.state.size(); ++i)
    EXPECT_EQ(fellBack.state[i].data, eager.state[i].data) << eager.state[i].name;
  EXPECT_NE(eager.losses.front(), eager.losses.back()) << "training did not move";
  EXPECT_GT(dev->replays, 0) << "no segment between the fallback steps was replayed";
}

// A bf16 plan on the CPU: the kernels compute in f32, so the session widens
// each half operand into an f32 stand-in it laid out when it was created — a
// frozen weight once (then packed, shared by both products that read it),
// activations through one scratch block. Results equal products of the
// bf16-rounded operands to bf16's rounding, and stay the same run after run
// and whatever the thread count.
TEST(HalfOperands, WidenedOnceWhenTheSessionIsCreated) {
  constexpr int kRows = 4, kDim = 64;
  std::string w;
  for (int i = 0; i < kDim * kDim; ++i) w += (i ? ", " : "") + std::to_string(((i * 37) % 101 - 50) / 64.0);
  std::vector<uint8_t> bytes = compileText("<ir_version: 8, opset_import: [\"\" : 17]>\n"
                                           "g (float[4, 64] x) => (float[4, 64] y, float[4, 64] z) <float[64, 64] w = {" +
                                               w + "}> {\n  y = MatMul (x, w)\n  z = MatMul (y, w)\n}",
                                           [](CompileRequest &req) { req.pipeline.precision = "bf16"; });
  ASSERT_FALSE(bytes.empty());
  auto loaded = Plan::loadBytes(bytes.data(), bytes.size(), "bf16.sdp");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  std::shared_ptr<Plan> plan(std::move(loaded.value()));
  const GlobalDesc *weight = nullptr;
  for (const GlobalDesc &g : plan->globals)
    if (g.dtype == DType::BF16) weight = &g;
  ASSERT_NE(weight, nullptr) << "the frozen weight was not folded into a bf16 global";

  HostTensor x{"x", DType::F32, {kRows, kDim}, std::vector<uint8_t>(kRows * kDim * 4)};
  float *xv = reinterpret_cast<float *>(x.data.data());
  for (int i = 0; i < kRows * kDim; ++i) xv[i] = float((i * 13) % 29 - 14) / 7.0f;
  auto runWith = [&](int threads, std::vector<HostTensor> &out, uint64_t &bytesHeld) {
    auto session = Session::create(plan, SessionOptions{threads});
    ASSERT_TRUE(session.isOk()) << session.status().message();
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<HostTensor> again;
      ASSERT_TRUE(session.value()->run(0, {&x}, rep ? again : out).isOk());
      if (rep) EXPECT_EQ(again[0].data, out[0].data) << "a second run differs";
      if (rep) EXPECT_EQ(again[1].data, out[1].data) << "a second run differs";
    }
    bytesHeld = session.value()->deviceBytes();
  };
  std::vector<HostTensor> one, two;
  uint64_t bytesOne = 0, bytesTwo = 0;
  runWith(1, one, bytesOne);
  runWith(2, two, bytesTwo);
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(one[0].data, two[0].data);
  EXPECT_EQ(one[1].data, two[1].data);
  // Both products read the weight packed for the GEMM, so its widened copy
  // was released: the session holds its arena and the activations' scratch.
  EXPECT_GT(bytesOne, plan->maxArenaSize());
  EXPECT_LT(bytesOne, plan->maxArenaSize() + uint64_t(kDim * kDim * 4));

  const uint16_t *wb = reinterpret_cast<const uint16_t *>(weight->data);
  auto round = [](float v) { return bf16ToFloat(floatToBf16(v)); };
  auto check = [&](const float *a, const HostTensor &got, const char *what) {
    const float *g = reinterpret_cast<const float *>(got.data.data());
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kDim; ++c) {
        double ref = 0, mag = 0;
        for (int k = 0; k < kDim; ++k) {
          double p = double(round(a[r * kDim + k])) * double(bf16ToFloat(wb[k * kDim + c]));
          ref += p;
          mag += std::abs(p);
        }
        // One bf16 rounding of the result, plus f32 accumulation.
        EXPECT_NEAR(g[r * kDim + c], ref, std::abs(ref) / 256 + mag * 1e-6) << what << " [" << r << "," << c << "]";
      }
  };
  check(xv, one[0], "y");
  check(reinterpret_cast<const float *>(one[0].data.data()), one[1], "z");
}

// A frozen bf16 weight no GEMM packs (a batch of matrices) keeps its widened
// copy for the session's life, counted in deviceBytes, and gives the same
// products as the one packed above.
TEST(HalfOperands, AWeightNothingPacksKeepsItsWidenedCopy) {
  std::string v;
  for (int i = 0; i < 2 * 8 * 8; ++i) v += (i ? ", " : "") + std::to_string((i % 13 - 6) / 8.0);
  std::vector<uint8_t> bytes = compileText("<ir_version: 8, opset_import: [\"\" : 17]>\n"
                                           "g (float[2, 4, 8] a) => (float[2, 4, 8] b) <float[2, 8, 8] v = {" + v +
                                               "}> {\n  b = MatMul (a, v)\n}",
                                           [](CompileRequest &req) { req.pipeline.precision = "bf16"; });
  ASSERT_FALSE(bytes.empty());
  auto loaded = Plan::loadBytes(bytes.data(), bytes.size(), "bf16.sdp");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  std::shared_ptr<Plan> plan(std::move(loaded.value()));
  auto session = Session::create(plan, SessionOptions{2});
  ASSERT_TRUE(session.isOk()) << session.status().message();
  EXPECT_GE(session.value()->deviceBytes(), plan->maxArenaSize() + uint64_t(2 * 8 * 8 * 4));
  HostTensor a{"a", DType::F32, {2, 4, 8}, std::vector<uint8_t>(2 * 4 * 8 * 4)};
  float *av = reinterpret_cast<float *>(a.data.data());
  for (int i = 0; i < 64; ++i) av[i] = float(i % 7 - 3) / 4.0f; // exact in bf16
  std::vector<HostTensor> out;
  ASSERT_TRUE(session.value()->run(0, {&a}, out).isOk());
  const float *b = reinterpret_cast<const float *>(out[0].data.data());
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 8; ++c) {
        double ref = 0; // every operand and partial sum is exact: a multiple of 1/32 below 2^8
        for (int k = 0; k < 8; ++k) ref += double(av[m * 32 + r * 8 + k]) * double(((m * 64 + k * 8 + c) % 13 - 6) / 8.0);
        EXPECT_EQ(b[m * 32 + r * 8 + c], float(ref)) << m << "," << r << "," << c;
      }
}
