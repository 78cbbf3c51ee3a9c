// sdrun train: flags, metrics file and progress around the runtime's trainer
// (sd/train/trainer.h), which owns the loop.
#include "commands.h"
#include "flags.h"
#include "trace.h"
#include "sd/format/file_io.h"
#include "sd/format/json.h"
#include "sd/runtime/adapter.h"
#include "sd/comm/world.h"
#include "sd/train/trainer.h"
#include <chrono>
#include <unistd.h>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <sys/stat.h>

namespace sdrun {
namespace {

// Two paths naming one existing file (hard links and symlinks included).
bool sameFile(const std::string &a, const std::string &b) {
  struct stat sa, sb;
  return !a.empty() && !b.empty() && ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

std::string formatDuration(double s) {
  char buf[32];
  int64_t t = int64_t(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  return buf;
}


const char *kTrainUsage =
    "usage: sdrun train PLAN.sdp --data FILE.jsonl|DIR [options]\n"
    "\n"
    "Trains with the plan's train_step (or accumulate + apply) entries. Data lines\n"
    "hold {\"input_ids\": [...], \"labels\": [...]} (labels optional, -100 = not\n"
    "trained on), {\"text\": \"...\"}, {\"prompt\": \"...\", \"completion\": \"...\"}\n"
    "(loss on the completion only), or {\"messages\": [{\"role\", \"content\"}, ...]}\n"
    "(rendered with the chat template of --tokenizer, loss on assistant turns only).\n"
    "Text is tokenized with --tokenizer (BOS from its post-processor, EOS from its\n"
    "tokenizer_config.json), else with the tokenizer the plan carries (sdc compile\n"
    "--tokenizer), or taken as bytes by byte-level (256-token) models.\n"
    "A plan with its own loss (sdc compile --loss-output) trains on a folder DIR\n"
    "holding NAME.npy for each of its inputs (images and classes; a transformers\n"
    "model's input_ids and labels), the examples along the first axis (--eval-data\n"
    "likewise); its micro-batch is the plan's batch, and eval takes whole batches.\n"
    "A preference plan (sdc compile --recipe dpo, simpo, orpo) trains on pairs: {\"prompt\": ...,\n"
    "\"chosen\": ..., \"rejected\": ...} texts, or TRL's tokenized {\"prompt_ids\",\n"
    "\"chosen_ids\", \"rejected_ids\"}; each pair fills two rows, and --batch counts pairs.\n"
    "A KTO plan (--recipe kto) trains on unpaired examples: {\"prompt\": ..., \"completion\": ...,\n"
    "\"label\": true|false} (true: desirable), or {\"prompt_ids\", \"completion_ids\", \"label\"}; each\n"
    "example fills two rows (itself, and its prompt with the previous example's completion for\n"
    "the KL estimate), and --batch counts examples.\n"    "A GRPO plan (--recipe grpo) trains on groups of scored completions: {\"prompt\": ...,\n"
    "\"completions\": [...], \"rewards\": [...]} or {\"prompt_ids\", \"completion_ids\", \"rewards\"};\n"
    "each completion fills a row, and --batch counts prompts. With --reward-cmd the data\n"
    "holds prompts ({\"prompt\": ...} or {\"prompt_ids\": [...]}) and each step samples their\n"
    "completions with the plan itself (compiled with --kv-cache) and scores them.\n"
    "\n"
    "options:\n"
    "  --steps N              optimizer steps (default: --epochs worth)\n"
    "  --epochs E             passes over the data when --steps is not given (1)\n"
    "  --batch B              rows per micro-batch (default: the plan's batch); a row holds\n"
    "                         one sequence, or several if the plan was compiled --packing\n"
    "  --grad-accum N         micro-batches per optimizer step (1)\n"
    "  --lr X                 peak learning rate (1e-4)\n"
    "  --lr-schedule S        constant | cosine (linear warm-up, then cosine to 0)\n"
    "  --warmup-steps N       warm-up steps (0)\n"
    "  --weight-decay X       decoupled weight decay on weights, not biases/norms (0)\n"
    "  --clip-norm X          clip the global gradient norm to X (0: off)\n"
    "  --seed S               seed of data shuffling and of dropout masks (0)\n"
    "  --no-shuffle           take the data in file order\n"
    "  --truncate             cut sequences longer than the largest bucket\n"
    "  --eval-data FILE       held-out data; --eval-every N steps (and at the end)\n"
    "  --checkpoint-dir DIR   write checkpoints there, every --checkpoint-every N steps\n"
    "  --resume               continue from the newest valid checkpoint in DIR\n"
    "  --save-weights FILE    write the trained parameters and running statistics (safetensors) at the end\n"
    "  --adapter DIR          start from an adapter of the plan's method (HF PEFT layout;\n"
    "                         AdapterHub's for bottleneck adapters)\n"
    "  --tokenizer DIR        a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json)\n"
    "  --save-adapter DIR     write the trained adapter (HF PEFT layout: LoRA, DoRA, IA3, LoHa, LoKr, DyLoRA,\n"
    "                         VeRA, OSF or prompt tuning, as the plan was compiled; AdapterHub's\n"
    "                         layout for bottleneck adapters)\n"
    "  --metrics FILE.jsonl   one JSON object per optimizer step (and per eval)\n"
    "  --profile FILE.json    a Chrome trace of every kernel run (chrome://tracing, Perfetto);\n"
    "                         steps then run eagerly, and each GPU kernel is waited for\n"
    "  --threads N            worker threads (default: all cores)\n"
    "  --device cpu|cuda|auto where the plan runs (default: cpu; auto: the GPU when there is one)\n"
    "  --verify-replicas      under mpirun: check after every step that all ranks hold\n"
    "                         bitwise equal parameters (stops at the first difference)\n"
    "  --no-cuda-graphs       run every GPU step eagerly instead of replaying a captured CUDA graph\n"
    "  --sync-steps           on a GPU, wait for each step before queuing the next (default: the\n"
    "                         next step is queued first, and losses are read one step behind)\n"
    "  --no-cpu-fallback      refuse a plan with a step the GPU has no kernel for (default: it runs the CPU's)\n"
    "  --cpu-ops OP,...       on a GPU, run these ops' steps with the CPU's kernel too (copies each way),\n"
    "                         to check a GPU kernel against the CPU's\n"
    "  --reward-cmd CMD       GRPO: sample each step's groups with the plan and score them with\n"
    "                         `sh -c CMD`, started once: for each completion it reads a JSON line\n"
    "                         {\"prompt\", \"completion\", \"prompt_ids\", \"completion_ids\"} and writes\n"
    "                         one line back, the reward (a number; flush after each)\n"
    "  --temperature T, --top-k K, --top-p P  --reward-cmd's sampling (1, 0: all, 1: TRL's)\n"
    "  --max-new-tokens N     --reward-cmd: the longest completion (default: the rest of the row)\n"
    "  --reward-timeout SECONDS  how long --reward-cmd may take for one completion (600)\n"
    "  --comm-timeout SECONDS ranks on GPUs (NCCL): how long the start waits for every rank, and\n"
    "                         how long one step may run before its collectives are aborted (300)\n"
    "\n"
    "Data-parallel: `mpirun -np N sdrun train ...` trains on N ranks. --batch stays\n"
    "rows per rank; each global micro-batch holds batch x N rows, split in rank order,\n"
    "so N ranks train as one rank with --batch batch x N. Rank 0 alone prints, writes\n"
    "metrics, checkpoints, weights and adapters; --resume works with another N as\n"
    "long as batch x N stays the same. With --device cuda the ranks talk over NCCL, one GPU\n"
    "per process, launched by mpirun or torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "MASTER_ADDR, MASTER_PORT).\n";

} // namespace

namespace {

struct TrainOutputs {
  std::string saveWeights, adapterOut, metricsPath, tracePath;
};

// The metrics file (one JSON object per step and per eval) and the progress
// line: a bar on a TTY, ten plain lines otherwise.
class Progress {
public:
  explicit Progress(const char *rateUnit) : unit_(rateUnit) {}
  ~Progress() {
    if (metrics_) std::fclose(metrics_);
  }
  // A resumed run first drops the lines of steps after its checkpoint (the
  // killed run wrote them, and this run writes them again).
  sd::Status open(const std::string &path, bool resumed, int64_t resumedStep) {
    if (path.empty()) return sd::Status::ok();
    path_ = path;
    if (resumed) {
      if (auto old = sd::readWholeFile(path); old.isOk()) {
        std::string kept;
        size_t start = 0;
        const std::string &t = old.value();
        while (start < t.size()) {
          size_t end = t.find('\n', start);
          std::string line = t.substr(start, end == std::string::npos ? std::string::npos : end - start);
          start = end == std::string::npos ? t.size() : end + 1;
          auto doc = sd::parseJson(line, path);
          const sd::Json *step = doc.isOk() ? doc.value().get("step") : nullptr;
          if (step && step->isInteger() && int64_t(step->num) <= resumedStep) kept += line + "\n";
        }
        SD_RETURN_IF_ERROR(sd::writeFileAtomic(path, kept));
      }
    }
    metrics_ = std::fopen(path.c_str(), resumed ? "ab" : "wb");
    if (!metrics_) return sd::sdError(path, ": cannot write");
    return sd::Status::ok();
  }
  sd::Status report(const sd::train::StepReport &r, int64_t firstStep) {
    if (metrics_) {
      // JSON has no Inf or NaN: a non-finite norm (an fp16 step skipped) is null.
      char norm[32] = "null", scaling[64] = "";
      if (std::isfinite(r.gradNorm)) std::snprintf(norm, sizeof norm, "%.8g", r.gradNorm);
      if (r.lossScale > 0)
        std::snprintf(scaling, sizeof scaling, ",\"loss_scale\":%.8g,\"skipped\":%s", r.lossScale,
                      r.skipped ? "true" : "false");
      char reward[48] = "";
      if (std::isfinite(r.meanReward)) std::snprintf(reward, sizeof reward, ",\"reward\":%.8g", r.meanReward);
      std::fprintf(metrics_,
                   "{\"step\":%lld,\"epoch\":%lld,\"loss\":%.8g,\"lr\":%.8g,\"grad_norm\":%s,\"tokens\":%.0f,"
                   "\"tokens_per_s\":%.1f,\"elapsed_s\":%.3f%s%s}\n",
                   (long long)r.step, (long long)r.epoch, r.loss, r.lr, norm, r.tokens, r.tokens / r.seconds,
                   r.elapsedSeconds, scaling, reward);
      SD_RETURN_IF_ERROR(flushMetrics());
    }
    int64_t done = r.step - firstStep, left = r.total - r.step;
    double eta = r.elapsedSeconds / double(done) * double(left);
    if (tty_) {
      int width = 24, filled = int(double(r.step) / double(r.total) * width);
      std::fprintf(stderr, "\rstep %lld/%lld [%s%s] loss %.4f  %.0f %s  ETA %s   ", (long long)r.step,
                   (long long)r.total, std::string(size_t(filled), '#').c_str(),
                   std::string(size_t(width - filled), '.').c_str(), r.loss, r.tokens / r.seconds, unit_,
                   formatDuration(eta).c_str());
    } else if (r.step == r.total || r.step % std::max<int64_t>(1, r.total / 10) == 0) {
      std::fprintf(stderr, "step %lld/%lld loss %.4f lr %.3g %.0f %s elapsed %s", (long long)r.step,
                   (long long)r.total, r.loss, r.lr, r.tokens / r.seconds, unit_, formatDuration(r.elapsedSeconds).c_str());
      if (std::isfinite(r.meanReward)) std::fprintf(stderr, " reward %.4f", r.meanReward);
      std::fputc('\n', stderr);
    }
    skipped_ += r.skipped;
    lossScale_ = r.lossScale;
    if (r.evaluated) {
      if (metrics_) {
        std::fprintf(metrics_, "{\"step\":%lld,\"eval_loss\":%.8g}\n", (long long)r.step, r.evalLoss);
        SD_RETURN_IF_ERROR(flushMetrics());
      }
      std::fprintf(stderr, "%sstep %lld eval loss %.4f\n", tty_ ? "\n" : "", (long long)r.step, r.evalLoss);
    }
    return sd::Status::ok();
  }
  void finish() {
    if (tty_) std::fputc('\n', stderr);
    if (lossScale_ > 0)
      std::fprintf(stderr, "fp16: %lld step(s) skipped for an Inf/NaN gradient; loss scale now %g\n",
                   (long long)skipped_, lossScale_);
  }

private:
  sd::Status flushMetrics() {
    if (std::fflush(metrics_) == 0 && !std::ferror(metrics_)) return sd::Status::ok();
    return sd::sdError(path_, ": cannot write metrics: ", sd::writeErrorReason(errno));
  }
  std::string path_;
  int64_t skipped_ = 0;   // fp16 steps not taken (an Inf/NaN gradient)
  double lossScale_ = 0;  // fp16: the loss scale after the last step
  FILE *metrics_ = nullptr;
  bool tty_ = ::isatty(2);
  const char *unit_; // what the rate counts: tokens, or a classifier's examples
};

sd::Status runTraining(const std::string &planPath, const sd::train::TrainConfig &cfg, const sd::SessionOptions &sopts,
                       const TrainOutputs &out) {
  auto loaded = sd::Plan::loadFile(planPath);
  if (!loaded.isOk()) return loaded.status();
  std::shared_ptr<const sd::Plan> plan(std::move(loaded.value()));
  if (!out.adapterOut.empty())
    if (auto lora = sd::loraConfigOf(*plan); !lora.isOk()) return lora.status().withContext(planPath + ": ");
  auto session = sd::Session::create(plan, sopts);
  if (!session.isOk()) return session.status();
  auto made = sd::train::Trainer::create(*session.value(), cfg);
  for (const std::string &n : made.isOk() ? made.value()->notes() : std::vector<std::string>{})
    std::fprintf(stderr, "sdrun: note: %s\n", n.c_str());
  if (!made.isOk()) return made.status();
  sd::train::Trainer &trainer = *made.value();
  if (trainer.rank() != 0) { // rank 0 reports and writes; the others take part in gathering what it saves
    SD_RETURN_IF_ERROR(sd::train::trainToEnd(trainer, nullptr));
    if (!out.saveWeights.empty()) SD_RETURN_IF_ERROR(trainer.saveWeights(out.saveWeights));
    if (!out.adapterOut.empty()) SD_RETURN_IF_ERROR(trainer.saveAdapter(out.adapterOut));
    return sd::Status::ok();
  }
  if (sd::Communicator *comm = session.value()->communicator()) {
    int64_t perRank = trainer.rowsPerRank();
    std::fprintf(stderr,
                 "sdrun: world of %d ranks over %s; global batch %lld rows = %lld per rank x %d ranks x %lld "
                 "micro-batches; rank 0 holds %.1f MiB of arena and training state (--shard %s)\n",
                 comm->size(), comm->describe().c_str(), (long long)(perRank * comm->size() * cfg.gradAccum),
                 (long long)perRank, comm->size(), (long long)cfg.gradAccum,
                 double(session.value()->deviceBytes()) / double(1 << 20), sd::shardMode(*plan).c_str());
  }
  if (!trainer.resumedFrom().empty())
    std::fprintf(stderr, "sdrun: resuming from %s (step %lld)\n", trainer.resumedFrom().c_str(), (long long)trainer.step());
  if (trainer.done() && !trainer.resumedFrom().empty())
    std::fprintf(stderr, "sdrun: nothing left to train: the run finished at step %lld\n", (long long)trainer.step());
  Progress progress(trainer.countsExamples() ? "examples/s" : "tok/s");
  SD_RETURN_IF_ERROR(progress.open(out.metricsPath, cfg.resume, trainer.step()));
  startTrace(*session.value(), out.tracePath);
  int64_t firstStep = trainer.step();
  sd::Session &sess = *session.value();
  SD_RETURN_IF_ERROR(sd::train::trainToEnd(trainer, [&](const sd::train::StepReport &r) {
    if (r.step == firstStep + 2) sess.resetDeviceTime(); // past the eager warm-up and the graph capture
    return progress.report(r, firstStep);
  }));
  progress.finish();
  // On a GPU: how much of the steps' time it waited for the host (packing
  // batches, launching, and eval and checkpoints where they ran).
  if (auto t = sess.deviceTime(); t && t->spanMs > 0)
    std::fprintf(stderr, "sdrun: from step %lld on, the GPU was busy %.1f%% of the time (waited %.3f ms per run for the host)\n",
                 (long long)(firstStep + 3), 100.0 * t->busyMs / t->spanMs, t->idleMsPerRun());
  SD_RETURN_IF_ERROR(writeTrace(*session.value(), out.tracePath));
  if (!out.saveWeights.empty()) SD_RETURN_IF_ERROR(trainer.saveWeights(out.saveWeights));
  if (!out.adapterOut.empty()) SD_RETURN_IF_ERROR(trainer.saveAdapter(out.adapterOut));
  return sd::Status::ok();
}

} // namespace

int trainCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args,
                  {"--data", "--steps", "--epochs", "--batch", "--grad-accum", "--lr", "--lr-schedule",
                   "--warmup-steps", "--weight-decay", "--clip-norm", "--seed", "--eval-data", "--eval-every",
                   "--checkpoint-dir", "--checkpoint-every", "--save-weights", "--metrics", "--threads", "--device",
                   "--profile", "--comm-timeout", "--reward-cmd", "--temperature", "--top-k", "--top-p",
                   "--max-new-tokens", "--reward-timeout",
                   "--adapter", "--save-adapter", "--tokenizer", "--cpu-ops"},
                  f, err, {"--no-shuffle", "--truncate", "--resume", "--no-cuda-graphs", "--no-cpu-fallback", "--verify-replicas",
                      "--sync-steps"})) {
    if (!f.help) return fail(err + " (see sdrun train --help)");
  }
  if (f.help) return std::fputs(kTrainUsage, stdout), 0;
  sd::train::TrainConfig o;
  TrainOutputs out;
  o.planName = f.plan;
  o.dataPath = flagValue(f, "--data");
  if (o.dataPath.empty()) return fail("--data FILE.jsonl is required (see sdrun train --help)");
  o.evalPath = flagValue(f, "--eval-data");
  o.checkpointDir = flagValue(f, "--checkpoint-dir");
  out.saveWeights = flagValue(f, "--save-weights");
  out.metricsPath = flagValue(f, "--metrics");
  out.tracePath = flagValue(f, "--profile");
  o.adapterIn = flagValue(f, "--adapter");
  o.tokenizerPath = flagValue(f, "--tokenizer");
  out.adapterOut = flagValue(f, "--save-adapter");
  std::string schedule = flagValue(f, "--lr-schedule", "constant");
  o.shuffle = !hasFlag(f, "--no-shuffle");
  o.truncate = hasFlag(f, "--truncate");
  o.resume = hasFlag(f, "--resume");
  o.verifyReplicas = hasFlag(f, "--verify-replicas");
  o.runAhead = hasFlag(f, "--sync-steps") ? sd::train::TrainConfig::RunAhead::Never : sd::train::TrainConfig::RunAhead::WhenAsync;
  int64_t seed = 0;
  sd::SessionOptions sopts;
  sd::WorldOptions worldOpts;
  if (!intFlag(f, "--steps", 0, 1, int64_t(1) << 40, o.steps, err) ||
      !intFlag(f, "--epochs", 1, 1, 1000000, o.epochs, err) || !intFlag(f, "--batch", 0, 1, 1 << 20, o.batch, err) ||
      !intFlag(f, "--grad-accum", 1, 1, 1 << 20, o.gradAccum, err) ||
      !intFlag(f, "--warmup-steps", 0, 0, int64_t(1) << 40, o.schedule.warmupSteps, err) ||
      !intFlag(f, "--seed", 0, 0, INT64_MAX, seed, err) ||
      !intFlag(f, "--eval-every", 0, 0, int64_t(1) << 40, o.evalEvery, err) ||
      !intFlag(f, "--checkpoint-every", 0, 0, int64_t(1) << 40, o.checkpointEvery, err) ||
      !sessionFlags(f, sopts, err) ||
      !numberFlag(f, "--lr", 1e-4, 0, 1e3, o.schedule.peak, err) ||
      !numberFlag(f, "--weight-decay", 0, 0, 1e3, o.weightDecay, err) ||
      !numberFlag(f, "--clip-norm", 0, 0, 1e12, o.clipNorm, err) ||
      !numberFlag(f, "--comm-timeout", 300, 1, 1e6, worldOpts.commTimeoutSeconds, err) ||
      !numberFlag(f, "--temperature", 1.0, 0, 100, o.rollout.temperature, err) ||
      !intFlag(f, "--top-k", 0, 0, 1 << 20, o.rollout.topK, err) ||
      !numberFlag(f, "--top-p", 1.0, 1e-9, 1.0, o.rollout.topP, err) ||
      !intFlag(f, "--max-new-tokens", 0, 1, 1 << 20, o.rollout.maxNewTokens, err) ||
      !numberFlag(f, "--reward-timeout", 600, 0.001, 1e6, o.rollout.rewardTimeoutSeconds, err))
    return fail(err);
  o.rollout.rewardCommand = flagValue(f, "--reward-cmd");
  if (hasFlag(f, "--reward-cmd") && o.rollout.rewardCommand.empty()) return fail("--reward-cmd needs a command");
  for (const char *sampling : {"--temperature", "--top-k", "--top-p", "--max-new-tokens", "--reward-timeout"})
    if (hasFlag(f, sampling) && !hasFlag(f, "--reward-cmd"))
      return fail(std::string(sampling) + " is for sampling GRPO groups: it needs --reward-cmd CMD");
  o.seed = uint64_t(seed);
  auto kind = sd::train::parseScheduleKind(schedule);
  if (!kind.isOk()) return fail("--lr-schedule takes 'constant' or 'cosine', got '" + schedule + "'");
  o.schedule.kind = kind.value();
  if (o.resume && o.checkpointDir.empty()) return fail("--resume needs --checkpoint-dir DIR");
  if (hasFlag(f, "--checkpoint-every") && o.checkpointDir.empty()) return fail("--checkpoint-every needs --checkpoint-dir");
  if (hasFlag(f, "--eval-every") && o.evalPath.empty()) return fail("--eval-every needs --eval-data FILE");
  // Outputs must not overwrite inputs (opening --metrics truncates it).
  for (const std::string &written : {out.metricsPath, out.saveWeights, out.tracePath})
    for (auto [flag, in] : {std::pair{"--data", o.dataPath}, {"--eval-data", o.evalPath}, {"the plan", f.plan}})
      if (!written.empty() && sameFile(written, in))
        return fail(written + " is both an output and " + flag + ": it would be overwritten");
  // Every output is checked before the first step: a typo must not cost a run.
  for (auto [flag, path] :
       {std::pair{"--save-weights", out.saveWeights}, {"--metrics", out.metricsPath}, {"--profile", out.tracePath}})
    if (sd::Status s = sd::checkOutputFile(path, flag); !s.isOk()) return fail(s.message());
  if (sd::Status s = sd::checkOutputFolder(out.adapterOut, "--save-adapter"); !s.isOk()) return fail(s.message());
  if (sd::Status s = sd::checkOutputFolder(o.checkpointDir, "--checkpoint-dir"); !s.isOk()) return fail(s.message());
  worldOpts.cudaDevices = !sopts.device->hostAddressable();
  auto world = sd::openWorld(worldOpts);
  if (!world.isOk()) return fail(world.status().message());
  sopts.comm = world.value();
  sd::Status s = runTraining(f.plan, o, sopts, out);
  if (!s.isOk()) {
    int code = fail(s.message());
    if (sopts.comm && sopts.comm->size() > 1) sopts.comm->abort(code); // the other ranks must not wait for this one
    return code;
  }
  return 0;
}

} // namespace sdrun
