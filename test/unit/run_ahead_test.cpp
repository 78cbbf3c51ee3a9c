// Runs launched ahead: Session::launch/collect, and the trainer queuing step
// k+1 before it reads step k's loss (TrainConfig::runAhead).
#include "Driver.h"
#include "temp_dir.h"
#include "test_device.h"
#include <cstdlib>
#include <gtest/gtest.h>
#include <unistd.h>

using namespace sd;

namespace {

// y = x * w + b over [2, 3]; the loss-free entry gives each run's own result.
const char *kAffine = R"(<
  ir_version: 8,
  opset_import: ["" : 17]
>
g (float[2, 3] x) => (float[2, 3] y)
<float[3, 3] w = {1., 2., 0., 0., 1., 3., 2., 0., 1.}, float[3] b = {0.5, -1., 0.25}>
{
  h = MatMul(x, w)
  y = Add(h, b)
}
)";

HostTensor filled(float start) {
  HostTensor x{"x", DType::F32, {2, 3}, std::vector<uint8_t>(24)};
  float *v = reinterpret_cast<float *>(x.data.data());
  for (int i = 0; i < 6; ++i) v[i] = start + float(i);
  return x;
}

// Whatever the device, collect() gives each launched run its own outputs, in
// launch order, and only after waiting for them.
TEST(SessionLaunch, CollectGivesEachRunItsOwnOutputsInOrder) {
  TempDir tmp("sd_launch");
  const std::string &dir = tmp.path();
  auto plan = compilePlanText(dir, kAffine, "affine");
  ASSERT_TRUE(plan);
  auto cpu = Session::create(plan, SessionOptions{1});
  ASSERT_TRUE(cpu.isOk());
  HostTensor a = filled(0), b = filled(10), c = filled(-5);
  std::vector<std::vector<HostTensor>> want(3);
  ASSERT_TRUE(cpu.value()->run(0, {&a}, want[0]).isOk());
  ASSERT_TRUE(cpu.value()->run(0, {&b}, want[1]).isOk());
  ASSERT_TRUE(cpu.value()->run(0, {&c}, want[2]).isOk());
  ASSERT_NE(want[0][0].data, want[1][0].data);
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
  dev->canCapture = true;
  for (bool onDevice : {false, true}) {
    auto s = Session::create(plan, onDevice ? SessionOptions{1, dev} : SessionOptions{1});
    ASSERT_TRUE(s.isOk()) << s.status().message();
    Session &session = *s.value();
    std::vector<HostTensor> out;
    EXPECT_NE(session.collect(out).message().find("no launched run"), std::string::npos);
    // Two runs out, a third after the first came back: blocks are reused.
    ASSERT_TRUE(session.launch(0, {&a}).isOk());
    ASSERT_TRUE(session.launch(0, {&b}).isOk());
    EXPECT_EQ(session.launchedRuns(), 2u);
    Status refused = session.run(0, {&a}, out);
    EXPECT_NE(refused.message().find("2 launched run(s) not collected"), std::string::npos) << refused.message();
    ASSERT_TRUE(session.collect(out).isOk());
    EXPECT_EQ(out[0].data, want[0][0].data) << (onDevice ? "device" : "cpu");
    ASSERT_TRUE(session.launch(0, {&c}).isOk());
    ASSERT_TRUE(session.collect(out).isOk());
    EXPECT_EQ(out[0].data, want[1][0].data) << (onDevice ? "device" : "cpu");
    ASSERT_TRUE(session.collect(out).isOk());
    EXPECT_EQ(out[0].data, want[2][0].data) << (onDevice ? "device" : "cpu");
    EXPECT_EQ(session.launchedRuns(), 0u);
    ASSERT_TRUE(session.run(0, {&a}, out).isOk()); // nothing queued: run() works again
    EXPECT_EQ(out[0].data, want[0][0].data);
    HostTensor wrong{"x", DType::F32, {3, 2}, std::vector<uint8_t>(24)};
    EXPECT_FALSE(session.launch(0, {&wrong}).isOk());
    EXPECT_EQ(session.launchedRuns(), 0u) << "a refused launch queued something";
  }
  EXPECT_EQ(dev->stagingAllocations, 2u) << "two runs in flight need two staging blocks, no more";
}

// A global read with a run comes back as the run left it, even when a later
// run (launched before the first is collected) changes it again.
TEST(SessionLaunch, GlobalsReadWithARunAreItsValues) {
  TempDir tmp("sd_launch_state");
  const std::string &dir = tmp.path();
  std::shared_ptr<const Plan> plan = compileLanguageModel(dir);
  ASSERT_TRUE(plan);
  std::vector<HostTensor> inputs;
  const int64_t entry = [&] {
    for (size_t i = 0; i < plan->entries.size(); ++i)
      if (plan->entries[i].name == "train_step") return int64_t(i);
    return int64_t(-1);
  }();
  ASSERT_GE(entry, 0);
  ASSERT_TRUE(train::trainInputsFromData(*plan, size_t(entry), dir + "/train.jsonl", 0, inputs).isOk());
  std::vector<const HostTensor *> in;
  for (const HostTensor &t : inputs) in.push_back(&t);
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
  dev->canCapture = true;
  auto s = Session::create(plan, SessionOptions{1, dev});
  ASSERT_TRUE(s.isOk()) << s.status().message();
  Session &session = *s.value();
  int64_t param = -1;
  for (size_t g = 0; g < plan->globals.size(); ++g)
    if (plan->globals[g].role == GlobalRole::Trainable) param = int64_t(g);
  ASSERT_GE(param, 0);
  auto before = session.readGlobal(size_t(param));
  ASSERT_TRUE(before.isOk());
  ASSERT_TRUE(session.launch(size_t(entry), in, {size_t(param)}).isOk());
  ASSERT_TRUE(session.launch(size_t(entry), in, {size_t(param)}).isOk());
  std::vector<HostTensor> first, second;
  ASSERT_TRUE(session.collect(first).isOk());
  ASSERT_TRUE(session.collect(second).isOk());
  auto after = session.readGlobal(size_t(param));
  ASSERT_TRUE(after.isOk());
  const size_t outputs = plan->entries[size_t(entry)].outputs.size();
  ASSERT_EQ(first.size(), outputs + 1);
  EXPECT_EQ(first.back().name, plan->globals[size_t(param)].name);
  EXPECT_NE(first.back().data, before.value().data) << "the first step did not move the parameter";
  EXPECT_NE(first.back().data, second.back().data) << "the first run's read saw the second step";
  EXPECT_EQ(second.back().data, after.value().data);
  EXPECT_FALSE(session.launch(size_t(entry), in, {plan->globals.size()}).isOk());
}

// A timed device's runs add up to the busy time; gaps between them (the
// device waiting for the host) are the span's rest. Untimed devices say nothing.
TEST(SessionLaunch, DeviceTimeSplitsBusyFromWaiting) {
  TempDir tmp("sd_launch_time");
  const std::string &dir = tmp.path();
  auto plan = compilePlanText(dir, kAffine, "affine");
  ASSERT_TRUE(plan);
  auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
  dev->timed = true;
  auto s = Session::create(plan, SessionOptions{1, dev});
  ASSERT_TRUE(s.isOk());
  Session &session = *s.value();
  HostTensor a = filled(0);
  std::vector<HostTensor> out;
  EXPECT_FALSE(session.deviceTime().has_value()) << "no run collected yet";
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(session.run(0, {&a}, out).isOk());
    dev->idleMs += 5; // the host takes 5 ms before the next run
  }
  auto t = session.deviceTime();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->runs, 3);
  EXPECT_EQ(t->busyMs, 6.0);  // one input and one output copy per run, 1 ms each
  EXPECT_EQ(t->spanMs, 16.0); // and two 5 ms waits between the three runs
  session.resetDeviceTime();
  EXPECT_FALSE(session.deviceTime().has_value());
  ASSERT_TRUE(session.launch(0, {&a}).isOk());
  ASSERT_TRUE(session.launch(0, {&a}).isOk()); // queued behind: no wait between
  ASSERT_TRUE(session.collect(out).isOk());
  ASSERT_TRUE(session.collect(out).isOk());
  t = session.deviceTime();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->busyMs, 4.0);
  EXPECT_EQ(t->spanMs, 4.0);
  auto untimed = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
  auto u = Session::create(plan, SessionOptions{1, untimed});
  ASSERT_TRUE(u.isOk());
  ASSERT_TRUE(u.value()->run(0, {&a}, out).isOk());
  EXPECT_FALSE(u.value()->deviceTime().has_value());
}

bool sameReport(const train::StepReport &a, const train::StepReport &b) {
  auto same = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
  return a.step == b.step && a.total == b.total && a.epoch == b.epoch && same(a.loss, b.loss) && a.lr == b.lr &&
         same(a.gradNorm, b.gradNorm) && a.tokens == b.tokens && a.evaluated == b.evaluated &&
         a.checkpointed == b.checkpointed && same(a.evalLoss, b.evalLoss) && a.skipped == b.skipped &&
         a.lossScale == b.lossScale;
}

// The trainer running ahead (step k+1 queued before step k's loss is read)
// reports what the synchronous trainer reports, bit for bit, and leaves the
// same state; eval, checkpoints and the last step see the state right after
// their step (nothing runs ahead past them). fp16 adds skipped steps and a
// loss scale read with its step; accumulation, several runs per step.
TEST(RunAhead, ReportsAndStateMatchTheSynchronousTrainer) {
  TempDir tmp("sd_run_ahead");
  const std::string &dir = tmp.path();
  const std::string data = dir + "/train.jsonl";
  struct Variant {
    std::string precision;
    int64_t accumulate;
  };
  for (const Variant &v : {Variant{"fp32", 1}, Variant{"fp16", 1}, Variant{"fp32", 2}}) {
    const std::string name = "lm-" + v.precision + "-" + std::to_string(v.accumulate);
    std::shared_ptr<const Plan> plan = compileLanguageModel(dir, name, [&](CompileRequest &req) {
      req.pipeline.precision = v.precision;
      req.pipeline.lossScaleInit = 1048576.0; // the first fp16 steps skip
    });
    ASSERT_TRUE(plan) << name;
    int run = 0;
    auto with = [&](train::TrainConfig::RunAhead mode) {
      return [&, mode](train::TrainConfig &c) {
        c.gradAccum = v.accumulate;
        c.evalPath = data;
        c.evalEvery = 3;
        c.checkpointDir = dir + "/" + name + "-ckpt" + std::to_string(run++);
        c.checkpointEvery = 5;
        c.runAhead = mode;
      };
    };
    using RA = train::TrainConfig::RunAhead;
    TrainRun sync = trainOn(plan, SessionOptions{1}, data, with(RA::Never));
    auto dev = std::make_shared<TestDevice>(derivedKernels("test-gpu", ""));
    dev->canCapture = true;
    TrainRun ahead = trainOn(plan, SessionOptions{1}, data, with(RA::Always));
    TrainRun onDevice = trainOn(plan, SessionOptions{1, dev}, data, with(RA::WhenAsync));
    TrainRun cpuWhenAsync = trainOn(plan, SessionOptions{1}, data, with(RA::WhenAsync));
    ASSERT_EQ(sync.reports.size(), 8u) << name;
    for (const TrainRun *r : {&ahead, &onDevice, &cpuWhenAsync}) {
      ASSERT_EQ(r->reports.size(), sync.reports.size()) << name;
      for (size_t i = 0; i < sync.reports.size(); ++i)
        EXPECT_TRUE(sameReport(r->reports[i], sync.reports[i])) << name << " step " << i + 1 << ": loss "
                                                                 << r->reports[i].loss << " vs " << sync.reports[i].loss;
      ASSERT_EQ(r->state.size(), sync.state.size());
      for (size_t i = 0; i < sync.state.size(); ++i) EXPECT_EQ(r->state[i].data, sync.state[i].data) << name << " " << sync.state[i].name;
    }
    // Ran ahead after every step but those with a hook (3, 5, 6: eval or
    // checkpoint; 8: the last); never on the CPU unless asked.
    for (size_t i = 0; i < 8; ++i) {
      const bool hook = i + 1 == 3 || i + 1 == 5 || i + 1 == 6 || i + 1 == 8;
      EXPECT_EQ(ahead.launchedAfter[i], hook ? 0u : size_t(v.accumulate)) << name << " step " << i + 1;
      EXPECT_EQ(onDevice.launchedAfter[i], ahead.launchedAfter[i]) << name << " step " << i + 1;
      EXPECT_EQ(cpuWhenAsync.launchedAfter[i], 0u);
      EXPECT_EQ(sync.launchedAfter[i], 0u);
    }
    EXPECT_TRUE(sync.reports[2].evaluated && sync.reports[4].checkpointed) << name;
    if (v.precision == "fp16") {
      EXPECT_TRUE(sync.reports[0].skipped) << "the first scale should overflow";
      EXPECT_LT(sync.reports.back().lossScale, 1048576.0);
    }
    EXPECT_GT(dev->replays, 0) << name;
  }
}

// While a step runs ahead, what needs the state right after the reported
// step is refused, not answered with the next step's state.
TEST(RunAhead, SavingWhileAStepRunsAheadIsRefused) {
  TempDir tmp("sd_run_ahead_save");
  const std::string &dir = tmp.path();
  std::shared_ptr<const Plan> plan = compileLanguageModel(dir);
  ASSERT_TRUE(plan);
  auto s = Session::create(plan, SessionOptions{1});
  ASSERT_TRUE(s.isOk());
  train::TrainConfig cfg;
  cfg.dataPath = dir + "/train.jsonl";
  cfg.evalPath = cfg.dataPath;
  cfg.steps = 4;
  cfg.batch = 2;
  cfg.runAhead = train::TrainConfig::RunAhead::Always;
  auto t = train::Trainer::create(*s.value(), cfg);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_TRUE(t.value()->runStep().isOk());
  EXPECT_EQ(s.value()->launchedRuns(), 1u);
  auto eval = t.value()->evaluate();
  ASSERT_FALSE(eval.isOk());
  EXPECT_NE(eval.status().message().find("step 2 runs ahead"), std::string::npos) << eval.status().message();
  EXPECT_FALSE(t.value()->saveWeights(dir + "/w.safetensors").isOk());
  EXPECT_NE(access((dir + "/w.safetensors").c_str(), F_OK), 0) << "a refused save wrote a file";
  while (!t.value()->done()) ASSERT_TRUE(t.value()->runStep().isOk());
  EXPECT_EQ(s.value()->launchedRuns(), 0u);
  EXPECT_TRUE(t.value()->saveWeights(dir + "/w.safetensors").isOk());
}

} // namespace
