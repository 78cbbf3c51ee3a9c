// sdrun train: runs a training plan's entries over JSON Lines data. The loop
// is branch-free on the plan side: the host picks a bucket, pads the batch,
// feeds lr/weight decay/clip as inputs, and counts optimizer steps.
#include "commands.h"
#include "flags.h"
#include "trainer.h"
#include <cmath>
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

} // namespace

namespace {

const char *kTrainUsage =
    "usage: sdrun train PLAN.sdp --data FILE.jsonl [options]\n"
    "\n"
    "Trains with the plan's train_step (or accumulate + apply) entries. Data lines\n"
    "hold {\"input_ids\": [...], \"labels\": [...]} (labels optional, -100 = not\n"
    "trained on) or {\"text\": \"...\"} for byte-level (256-token) models.\n"
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
    "  --save-weights FILE    write the trained parameters (safetensors) at the end\n"
    "  --adapter DIR          start from a LoRA adapter (HF PEFT layout)\n"
    "  --save-adapter DIR     write the trained LoRA adapter (HF PEFT layout)\n"
    "  --metrics FILE.jsonl   one JSON object per optimizer step (and per eval)\n"
    "  --threads N            worker threads (default: all cores)\n";

} // namespace

int trainCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args,
                  {"--data", "--steps", "--epochs", "--batch", "--grad-accum", "--lr", "--lr-schedule",
                   "--warmup-steps", "--weight-decay", "--clip-norm", "--seed", "--eval-data", "--eval-every",
                   "--checkpoint-dir", "--checkpoint-every", "--save-weights", "--metrics", "--threads",
                   "--adapter", "--save-adapter"},
                  f, err, {"--no-shuffle", "--truncate", "--resume"})) {
    if (!f.help) return fail(err + " (see sdrun train --help)");
  }
  if (f.help) return std::fputs(kTrainUsage, stdout), 0;
  TrainOptions o;
  o.planPath = f.plan;
  o.dataPath = flagValue(f, "--data");
  if (o.dataPath.empty()) return fail("--data FILE.jsonl is required (see sdrun train --help)");
  o.evalPath = flagValue(f, "--eval-data");
  o.checkpointDir = flagValue(f, "--checkpoint-dir");
  o.saveWeights = flagValue(f, "--save-weights");
  o.metricsPath = flagValue(f, "--metrics");
  o.adapterIn = flagValue(f, "--adapter");
  o.adapterOut = flagValue(f, "--save-adapter");
  o.schedule = flagValue(f, "--lr-schedule", "constant");
  o.shuffle = !hasFlag(f, "--no-shuffle");
  o.truncate = hasFlag(f, "--truncate");
  o.resume = hasFlag(f, "--resume");
  int64_t seed = 0;
  if (!intFlag(f, "--steps", 0, 1, int64_t(1) << 40, o.steps, err) ||
      !intFlag(f, "--epochs", 1, 1, 1000000, o.epochs, err) || !intFlag(f, "--batch", 0, 1, 1 << 20, o.batch, err) ||
      !intFlag(f, "--grad-accum", 1, 1, 1 << 20, o.gradAccum, err) ||
      !intFlag(f, "--warmup-steps", 0, 0, int64_t(1) << 40, o.warmupSteps, err) ||
      !intFlag(f, "--seed", 0, 0, INT64_MAX, seed, err) ||
      !intFlag(f, "--eval-every", 0, 0, int64_t(1) << 40, o.evalEvery, err) ||
      !intFlag(f, "--checkpoint-every", 0, 0, int64_t(1) << 40, o.checkpointEvery, err) ||
      !intFlag(f, "--threads", 0, 0, 1024, o.threads, err) || !numberFlag(f, "--lr", 1e-4, 0, 1e3, o.lr, err) ||
      !numberFlag(f, "--weight-decay", 0, 0, 1e3, o.weightDecay, err) ||
      !numberFlag(f, "--clip-norm", 0, 0, 1e12, o.clipNorm, err))
    return fail(err);
  o.seed = uint64_t(seed);
  if (o.schedule != "constant" && o.schedule != "cosine")
    return fail("--lr-schedule takes 'constant' or 'cosine', got '" + o.schedule + "'");
  if (o.resume && o.checkpointDir.empty()) return fail("--resume needs --checkpoint-dir DIR");
  if (hasFlag(f, "--checkpoint-every") && o.checkpointDir.empty()) return fail("--checkpoint-every needs --checkpoint-dir");
  if (hasFlag(f, "--eval-every") && o.evalPath.empty()) return fail("--eval-every needs --eval-data FILE");
  // Outputs must not overwrite inputs (opening --metrics truncates it).
  for (const std::string &out : {o.metricsPath, o.saveWeights})
    for (auto [flag, in] : {std::pair{"--data", o.dataPath}, {"--eval-data", o.evalPath}, {"the plan", f.plan}})
      if (!out.empty() && sameFile(out, in))
        return fail(out + " is both an output and " + flag + ": it would be overwritten");
  sd::Status s = runTraining(o);
  if (!s.isOk()) return fail(s.message());
  return 0;
}

} // namespace sdrun
