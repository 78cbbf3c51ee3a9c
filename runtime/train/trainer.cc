// The training loop: buckets, micro-batches, schedule, hooks at optimizer steps.
#include "sd/train/trainer.h"
#include "sd/generate/generator.h"
#include "sd/format/file_io.h"
#include "sd/format/json.h"
#include "sd/format/safetensors.h"
#include "sd/format/training_abi.h"
#include "sd/runtime/adapter.h"
#include "sd/tokenize/tokenizer.h"
#include "sd/train/checkpoint.h"
#include "sd/train/ranks.h"
#include "sd/train/tensor_data.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <sys/stat.h>

namespace sd::train {
namespace {

// One shape bucket's entries; the token input is [batch, seq].
struct Bucket {
  int64_t batch = 0, seq = 0;
  int64_t trainStep = -1, accumulate = -1, evalStep = -1;
};

struct PlanEntries {
  std::vector<Bucket> buckets; // by increasing seq
  int64_t vocab = 0;
  bool packed = false; // training entries take position_ids (sdc compile --packing)
  int64_t numLabels = 0; // classification plans (sdc compile --recipe classify): labels are [batch]
  bool pairs = false;    // preference plans (sdc compile --recipe dpo, simpo, orpo, kto): two rows per example
  bool unpaired = false; // kto: an example and its KL row, not a (chosen, rejected) pair
  int64_t groupSize = 0; // grpo: a prompt's group of completions, one row each
  bool samplingLogProbs = false; // grpo --sampling-log-probs: the data gives the sampling policy's log-probabilities
  RowLayout layout() const {
    return numLabels ? RowLayout::Classes
           : groupSize ? RowLayout::Groups
           : unpaired ? RowLayout::Unpaired
           : pairs    ? RowLayout::Pairs
                      : RowLayout::Sequences;
  }
  int64_t rowsPerExample() const { return groupSize ? groupSize : pairs ? 2 : 1; }
  std::string tokenInput = abi::kDefaultTokenInput; // the model's token input (plan config "token_input")
  // A plan that computes its own loss (sdc compile --loss-output) from
  // inputs other than tokens and labels, or from any inputs when the data is
  // a folder of arrays: the data gives these, one row per example
  // (tensor_data.h). Empty for token plans.
  std::vector<TensorInput> tensorInputs;
};

bool isStepScalar(const std::string &name) {
  return name == abi::kLr || name == abi::kWeightDecay || name == abi::kMaxGradNorm;
}

// Records entry `index` as its bucket's train_step, accumulate or eval_step.
void setEntry(Bucket &b, const std::string &name, size_t index) {
  (name == abi::kTrainStep ? b.trainStep : name == abi::kAccumulate ? b.accumulate : b.evalStep) = int64_t(index);
}

// A tensor-data plan's entry: its data inputs, each [batch, ...] with one batch.
Status tensorInputsOf(const EntryDesc &e, std::vector<TensorInput> &out, int64_t &batch) {
  std::vector<TensorInput> found;
  for (auto &[n, b] : e.inputs) {
    if (isStepScalar(n)) continue;
    const BufferDesc &d = e.buffers[size_t(b)];
    if (d.dims.empty() || d.dims[0] < 1 || (!found.empty() && d.dims[0] != found[0].dims[0]))
      return sdError("entry '", e.name, "' has no [batch, seq] labels input, and its input '", n, "' (",
                     formatDims(d.dims), ") is not a batch of rows like its others: sdrun train cannot feed it");
    found.push_back({n, d.dtype, d.dims});
  }
  if (found.empty()) return sdError("entry '", e.name, "' takes no data inputs");
  if (!out.empty()) {
    bool same = out.size() == found.size();
    for (size_t i = 0; same && i < found.size(); ++i)
      same = found[i].name == out[i].name && found[i].dtype == out[i].dtype && found[i].dims == out[i].dims;
    if (!same) return sdError("entry '", e.name, "' takes other data inputs than the plan's other training entries");
  }
  out = found;
  batch = found[0].dims[0];
  return Status::ok();
}

// `dataPath` decides for a plan that computes its own loss from inputs
// named like the token plans' (a Hugging Face model's input_ids and labels,
// exported with its loss): a folder of arrays feeds each input by name, a
// JSON Lines file feeds tokens.
Status findEntries(const Plan &plan, PlanEntries &out, const std::string &dataPath) {
  bool modelLoss = false;
  // Plans compiled before the token input was recorded call it input_ids.
  if (!plan.config.empty()) {
    auto cfg = parseJson(plan.config, "the plan's config");
    if (!cfg.isOk()) return cfg.status();
    if (const Json *t = cfg.value().get("token_input"); t && t->type == Json::Type::String) out.tokenInput = t->str;
    modelLoss = cfg.value().get("loss_output") != nullptr;
    if (const Json *pref = cfg.value().get("preference")) {
      const Json *method = pref->get("method");
      const std::string m = method && method->type == Json::Type::String ? method->str : "";
      if (m == "grpo") {
        const Json *n = pref->get("num_generations");
        if (!n || !n->isInteger() || n->num < 2 || n->num > 4096)
          return sdError("the plan's GRPO configuration has no valid num_generations");
        out.groupSize = int64_t(n->num);
      } else {
        out.pairs = true;
        out.unpaired = m == "kto";
      }
    }
    if (const Json *c = cfg.value().get("classify")) {
      const Json *n = c->get("num_labels"), *v = c->get("vocab");
      if (!n || !n->isInteger() || n->num < 2 || !v || !v->isInteger() || v->num < 1)
        return sdError("the plan's classification configuration is malformed");
      out.numLabels = int64_t(n->num);
      out.vocab = int64_t(v->num); // infer's output is the classes, not the vocabulary
    }
  }
  struct stat st;
  const bool folderData = modelLoss && ::stat(dataPath.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  std::map<std::pair<int64_t, int64_t>, Bucket> byShape;
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const EntryDesc &e = plan.entries[i];
    if (e.name == abi::kInfer && !e.outputs.empty() && !out.vocab) {
      const Dims &d = e.buffers[size_t(e.outputs[0].second)].dims;
      if (!d.empty()) out.vocab = d.back();
    }
    if (e.name != abi::kTrainStep && e.name != abi::kAccumulate && e.name != abi::kEvalStep) continue;
    const BufferDesc *labels = nullptr, *tokens = nullptr;
    for (auto &[n, b] : e.inputs) {
      if (n == abi::kLabels) labels = &e.buffers[size_t(b)];
      if (n == out.tokenInput) tokens = &e.buffers[size_t(b)];
      if (n == abi::kPositionIds) out.packed = true;
      if (n == abi::kOldLogProbs) out.samplingLogProbs = true;
    }
    if (!out.numLabels && (!labels || folderData)) { // the model's own loss over its own inputs: tensor data
      int64_t batch = 0;
      SD_RETURN_IF_ERROR(tensorInputsOf(e, out.tensorInputs, batch));
      Bucket &b = byShape[{0, batch}];
      b.batch = batch;
      setEntry(b, e.name, i);
      continue;
    }
    if (out.numLabels) {
      if (!labels || labels->dims.size() != 1 || !tokens || tokens->dims.size() != 2 || tokens->dims[0] != labels->dims[0])
        return sdError("entry '", e.name, "' has no [batch] labels and [batch, seq] '", out.tokenInput, "' inputs");
      labels = tokens; // the bucket's shape
    }
    if (!labels || labels->dims.size() != 2) return sdError("entry '", e.name, "' has no [batch, seq] labels input");
    Bucket &b = byShape[{labels->dims[1], labels->dims[0]}];
    b.batch = labels->dims[0];
    b.seq = labels->dims[1];
    setEntry(b, e.name, i);
  }
  for (auto &[k, b] : byShape) out.buckets.push_back(b);
  if (out.buckets.empty() || out.buckets[0].trainStep < 0) {
    auto lora = loraConfigFromPlanConfig(plan.config);
    if (lora.isOk() && lora.value().maxLoras > 0)
      return sdError("the plan serves LoRA adapters in slots (sdc compile --max-loras) and has no training entries; "
                     "train with a plan compiled with --peft lora, and load its --save-adapter folder into this one");
    return sdError("the plan has no ", abi::kTrainStep, " entry; compile it with --peft");
  }
  if (out.buckets.size() > 1 && !out.tensorInputs.empty())
    return sdError("the plan mixes token and tensor training entries");
  for (const Bucket &b : out.buckets)
    if (out.groupSize && b.batch % out.groupSize)
      return sdError("the plan's batch ", b.batch, " is not a whole number of groups of ", out.groupSize,
                     " completions (its num_generations)");
  for (const Bucket &b : out.buckets)
    if (out.pairs && b.batch % 2)
      return sdError("the plan's batch ", b.batch, " is odd, but a preference plan's rows come two per ",
                     out.unpaired ? "example (the example, its KL row)" : "pair (chosen, rejected)");
  if (out.vocab <= 0 && out.tensorInputs.empty())
    return sdError("cannot tell the vocabulary size from the plan's infer entry");
  return Status::ok();
}

// A preference plan's reference model is the model training starts from:
// after an adapter is loaded, its `reference/` copies take the parameters'
// values (a plan without copies is left alone).
Status refreshReference(Session &s) {
  const Plan &plan = s.plan();
  const std::string prefix = abi::kReferencePrefix;
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    const std::string &name = plan.globals[i].name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    int64_t param = s.findGlobal(name.substr(prefix.size()));
    if (param < 0) return sdError("'", name, "' is the copy of no parameter of the plan");
    // Under --shard params the copy is split as its parameter is: this rank's
    // rows to its rows (the row calls take whole values for unsplit globals).
    if (s.rowSharded(size_t(param)) != s.rowSharded(i))
      return sdError("'", name, "' is not split by rows as its parameter is");
    std::vector<uint8_t> rows;
    SD_RETURN_IF_ERROR(s.readGlobalRows(size_t(param), rows));
    SD_RETURN_IF_ERROR(s.writeGlobalRows(i, rows.data(), rows.size()));
  }
  return Status::ok();
}

HostTensor scalar(const std::string &name, float v) {
  HostTensor t;
  t.name = name;
  t.dtype = DType::F32;
  t.data.resize(4);
  std::memcpy(t.data.data(), &v, 4);
  return t;
}

float scalarOut(const std::vector<HostTensor> &outs, const std::string &name) {
  for (const HostTensor &t : outs)
    if (t.name == name && t.data.size() == 4) {
      float v;
      std::memcpy(&v, t.data.data(), 4);
      return v;
    }
  return NAN;
}

// The inputs of entry `index` matched by name, in its input order.
StatusOr<std::vector<const HostTensor *>> entryInputs(const Session &s, int64_t index,
                                                      const std::map<std::string, const HostTensor *> &byName) {
  const EntryDesc &e = s.plan().entries[size_t(index)];
  std::vector<const HostTensor *> ins;
  for (auto &[n, b] : e.inputs) {
    auto it = byName.find(n);
    if (it == byName.end())
      return sdError("entry '", e.name, "' needs input '", n, "', which the trainer does not provide (it feeds the token ",
                     "input, labels, position_ids and attention_mask; if '", n, "' is the token input, recompile with sdc compile ",
                     "--token-input ", n, ")");
    ins.push_back(it->second);
  }
  return ins;
}

Status runEntry(Session &s, int64_t index, const std::map<std::string, const HostTensor *> &byName,
                std::vector<HostTensor> &outs) {
  auto ins = entryInputs(s, index, byName);
  return ins.isOk() ? s.run(size_t(index), ins.value(), outs) : ins.status();
}

// The smallest bucket whose rows hold every row of `rows` (packed rows were
// filled to the largest bucket's length, but a short last batch may fit less).
const Bucket *bucketFor(const PlanEntries &pe, const Rows &rows) {
  size_t longest = 0;
  for (const auto &row : rows) {
    size_t used = 0;
    for (const Example *e : row) used += e->length();
    longest = std::max(longest, used);
  }
  for (const Bucket &b : pe.buckets)
    if (b.seq >= int64_t(longest)) return &b;
  return nullptr;
}

// One micro-batch's data inputs: a token plan's [batch, seq] tensors, or
// rows of a tensor-data plan's arrays.
struct FedBatch {
  std::optional<TokenBatch> tokens;
  std::optional<TensorBatch> tensors;
  FedBatch(const PlanEntries &pe, const TensorData &td, const Rows &rows, const Bucket &b) {
    if (pe.tensorInputs.empty()) tokens.emplace(rows, b.batch, b.seq, pe.tokenInput, pe.layout());
    else tensors.emplace(rows, td);
  }
  std::map<std::string, const HostTensor *> inputs() const { return tokens ? tokens->inputs() : tensors->inputs(); }
};

// Names the running step to the communicator (its watchdog's message and
// timeout, on NCCL) until end() or the end of the scope.
class PhaseNote {
public:
  PhaseNote(Communicator *comm, const std::string &phase) : comm_(comm) {
    if (comm_) comm_->notePhase(phase);
  }
  ~PhaseNote() { end(); }
  void end() {
    if (comm_) comm_->notePhase("");
    comm_ = nullptr;
  }

private:
  Communicator *comm_;
};

} // namespace

struct Trainer::Impl {
  std::unique_ptr<Tokenizer> tokenizer; // --tokenizer: text lines are tokenized with it
  Session &session;
  TrainConfig config;
  PlanEntries entries;
  std::vector<Example> data, evalData;
  TensorData tensors, evalTensors; // a tensor-data plan's arrays (data and evalData index them)
  DataCursor cursor;
  int64_t batch = 0, seq = 0, step = 0, total = 0;
  std::string resumedFrom;
  std::vector<std::string> notes;
  std::optional<CheckpointFolder> checkpoints; // locked by rank 0 while the trainer lives
  std::string runId;
  std::map<std::string, std::string> runParams; // what the data position depends on
  LoraConfig lora;
  bool hasLora = false;
  bool started = false;
  std::chrono::steady_clock::time_point startTime;
  std::vector<HostTensor> outs;
  Communicator *comm = nullptr; // null: alone
  int rank = 0, world = 1;
  int64_t dropoutRng = -1, dropoutRngSize = 0; // the dropout state global, if the plan has dropout
  int64_t dropoutRows[2] = {-1, -1};            // [row offset, rows] last written into it
  int64_t lossScale = -1;                       // fp16 plans: the dynamic loss scale's global
  // Steps launched and not yet reported, oldest first: their micro-batches'
  // runs wait on the session (Session::launch), one per micro-batch.
  struct LaunchedStep {
    int64_t number = 0, epoch = 0; // epoch: the data cursor's after the step's micro-batches
    double lr = 0;
    double rewardSum = 0, rewards = 0; // sampled GRPO groups: this rank's
    double completionTokens = 0;       // GRPO: this rank's counted completion tokens (what the rate counts)
    std::chrono::steady_clock::time_point launched;
  };
  std::deque<LaunchedStep> launched;
  std::chrono::steady_clock::time_point lastReport; // when runStep last returned a report

  // GRPO groups sampled each step (TrainConfig::rollout): the reward
  // command, and the step's groups, which its micro-batches' rows point into.
  std::unique_ptr<RewardCommand> rewardCommand;
  RewardFunction reward;
  std::vector<Example> sampled;
  bool samples() const { return !config.rollout.rewardCommand.empty() || config.rollout.rewardFunction; }
  Status sampleStep(std::vector<Rows> &micro, LaunchedStep &ls);

  Impl(Session &s, const TrainConfig &c) : session(s), config(c) {}
  Status launchStep();
  Status collectStep(StepReport &r);
  bool runsAhead() const;
  bool hookAfter(int64_t stepNumber) const;
  // Whether eval / a checkpoint runs after step `n` (every N steps and after the last).
  bool evalAfter(int64_t n) const {
    return !evalData.empty() && ((config.evalEvery && n % config.evalEvery == 0) || n == total);
  }
  bool checkpointAfter(int64_t n) const {
    return !config.checkpointDir.empty() && ((config.checkpointEvery && n % config.checkpointEvery == 0) || n == total);
  }
  Status discardLaunched(Status why);
  Status requireNothingLaunched(const char *what) const {
    if (launched.empty()) return Status::ok();
    return sdError("cannot ", what, " while step ", launched.back().number, " runs ahead; call runStep() first");
  }
  Status resume();
  Status agreeOnStart();
  Status setDropoutRows(int64_t bucketRows);
  // This rank's rows of a global micro-batch: rows [rank * batch, (rank + 1) * batch).
  Rows localRows(Rows global) const {
    Rows out;
    for (size_t i = size_t(rank * batch); i < global.size() && i < size_t((rank + 1) * batch); ++i)
      out.push_back(std::move(global[i]));
    return out;
  }
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;
int Trainer::rank() const { return impl_->rank; }
int Trainer::worldSize() const { return impl_->world; }
int64_t Trainer::rowsPerRank() const { return impl_->batch; }
bool Trainer::countsExamples() const {
  return impl_->entries.numLabels > 0 || impl_->entries.pairs || !impl_->entries.tensorInputs.empty();
}
int64_t Trainer::step() const { return impl_->step; }
int64_t Trainer::totalSteps() const { return impl_->total; }
const std::string &Trainer::resumedFrom() const { return impl_->resumedFrom; }
const std::vector<std::string> &Trainer::notes() const { return impl_->notes; }

StatusOr<std::unique_ptr<Trainer>> Trainer::create(Session &session, const TrainConfig &config) {
  auto im = std::make_unique<Impl>(session, config);
  const TrainConfig &o = im->config;
  const Plan &plan = session.plan();
  PlanEntries &pe = im->entries;
  const std::string planContext = o.planName.empty() ? "" : o.planName + ": ";
  SD_RETURN_IF_ERROR(findEntries(plan, pe, o.dataPath).withContext(planContext));
  if ((im->comm = session.communicator())) im->rank = im->comm->rank(), im->world = im->comm->size();
  // A preference plan's batch counts rows and --batch pairs, as TRL's per-device batch does.
  const int64_t planBatch = pe.buckets[0].batch / pe.rowsPerExample();
  im->batch = o.batch ? o.batch : planBatch;
  if (im->batch > planBatch)
    return sdError("--batch ", im->batch, " is larger than the plan's batch ", planBatch,
                   pe.unpaired ? " examples" : pe.pairs ? " pairs" : pe.groupSize ? " groups" : "",
                   "; compile the plan with a larger batch");
  const bool tensorData = !pe.tensorInputs.empty();
  // The model's loss is its own (a mean, say): rows added to fill a batch would count in it.
  if (tensorData && im->batch != pe.buckets[0].batch)
    return sdError("--batch ", im->batch, ": this plan computes its own loss, so each micro-batch is the plan's ",
                   pe.buckets[0].batch, " rows; compile the plan for the batch you want");
  if (o.gradAccum < 1) return sdError("gradient accumulation must be at least 1 micro-batch, got ", o.gradAccum);
  if (o.gradAccum > 1 && pe.buckets[0].accumulate < 0) return sdError("the plan has no ", abi::kAccumulate, " entry");
  if (o.resume && o.checkpointDir.empty()) return sdError("resuming needs a checkpoint folder");
  DatasetOptions dopts{pe.vocab, pe.buckets.back().seq, o.truncate};
  dopts.numLabels = pe.numLabels;
  dopts.pairs = pe.pairs;
  dopts.unpaired = pe.unpaired;
  dopts.groupSize = pe.groupSize;
  dopts.samplingLogProbs = pe.samplingLogProbs;
  if (im->samples()) {
    if (!pe.groupSize)
      return sdError("a reward (--reward-cmd) scores completions the plan samples: it needs a GRPO plan (sdc "
                     "compile --recipe grpo --kv-cache MAX_LENGTH)");
    if (pe.samplingLogProbs)
      return sdError("a reward (--reward-cmd) samples with the policy being trained, which is then the sampling "
                     "policy: compile the plan without --sampling-log-probs");
    // Sampling needs the prefill and decode entries: said before the reward command starts.
    auto probe = generate::Generator::create(session, generate::SamplingOptions{});
    if (!probe.isOk() || !probe.value()->cached())
      return sdError(planContext, "a reward (--reward-cmd) samples each step's completions with the plan, which has no "
                     "decode entries: compile it with --kv-cache MAX_LENGTH (and --kv-batch ROWS)");
    dopts.promptsOnly = true;
    im->config.runAhead = TrainConfig::RunAhead::Never; // each step samples with the weights the last one left
  }
  if (tensorData && !o.tokenizerPath.empty())
    return sdError("--tokenizer: this plan computes its own loss from tensors, it takes no text");
  TokenizerFiles carried; // without --tokenizer, the one the plan carries (sdc compile --tokenizer) reads text
  if (!o.tokenizerPath.empty()) {
    auto tok = Tokenizer::load(o.tokenizerPath);
    if (!tok.isOk()) return tok.status().withContext("--tokenizer: ");
    im->tokenizer = std::move(tok.value());
    dopts.tokenizer = im->tokenizer.get();
  } else if (!tensorData && TokenizerFiles::carried([&](const std::string &n) { return plan.file(n); },
                                                     o.planName.empty() ? "the plan" : o.planName, carried)) {
    auto tok = Tokenizer::fromFiles(carried);
    if (!tok.isOk()) return tok.status();
    im->tokenizer = std::move(tok.value());
    dopts.tokenizer = im->tokenizer.get();
  }
  if (tensorData) {
    auto loaded = loadTensorFolder(o.dataPath, pe.tensorInputs);
    if (!loaded.isOk()) return loaded.status();
    im->tensors = std::move(loaded.value());
    im->data = std::move(im->tensors.examples);
    if (!o.evalPath.empty()) {
      auto ev = loadTensorFolder(o.evalPath, pe.tensorInputs);
      if (!ev.isOk()) return ev.status().withContext("--eval-data: ");
      im->evalTensors = std::move(ev.value());
      im->evalData = std::move(im->evalTensors.examples);
      // Whole global batches only: the plan's loss cannot leave out filler rows.
      const size_t global = size_t(im->batch * im->world), used = im->evalData.size() / global * global;
      if (!used)
        return sdError("--eval-data: ", im->evalData.size(), " examples, fewer than one global batch of ", global);
      if (used < im->evalData.size())
        im->notes.push_back("eval uses the first " + std::to_string(used) + " of the " +
                            std::to_string(im->evalData.size()) + " eval examples (whole batches of " +
                            std::to_string(global) + ")");
      im->evalData.resize(used);
    }
  } else {
    auto data = loadJsonl(o.dataPath, dopts);
    if (!data.isOk()) return data.status();
    im->data = std::move(data.value());
    if (!o.evalPath.empty()) {
      DatasetOptions evalOpts = dopts; // scored groups, also when the training data is prompts
      evalOpts.promptsOnly = false;
      auto ev = loadJsonl(o.evalPath, evalOpts);
      if (!ev.isOk()) return ev.status();
      im->evalData = std::move(ev.value());
    }
  }
  auto lora = loraConfigOf(plan);
  im->hasLora = lora.isOk();
  if (lora.isOk()) im->lora = lora.value();
  else if (!o.adapterIn.empty()) return lora.status().withContext(planContext);
  if (im->hasLora)
    for (const GlobalDesc &g : plan.globals)
      if (g.role == GlobalRole::Statistics) {
        im->notes.push_back("training updates BatchNormalization running statistics ('" + g.name +
                            "', ...), which a LoRA adapter does not hold: --save-weights writes them");
        break;
      }
  // Rank 0 reads the adapter and the others take it from there, except where
  // weights are split by rows (--shard params): there each rank keeps its rows of what it reads.
  if (!o.adapterIn.empty() && !o.resume && (im->rank == 0 || shardMode(session.plan()) == "params")) {
    SD_RETURN_IF_ERROR(loadAdapter(o.adapterIn, session, im->lora));
    SD_RETURN_IF_ERROR(refreshReference(session).withContext(planContext));
  }
  // fp16 plans: the loss scale, reported after each step.
  if (int64_t scale = session.findGlobal(abi::kLossScale); scale >= 0) {
    const GlobalDesc &g = plan.globals[size_t(scale)];
    if (g.dtype != DType::F32 || g.bytes != 4) return sdError(planContext, abi::kLossScale, " must be an f32 scalar");
    im->lossScale = scale;
  }
  // Dropout masks are keyed by [seed, counter, row offset, rows]; a fresh run
  // sets the seed, a resumed run restores seed and counter, and the rows are
  // set before each micro-batch (setDropoutRows).
  if (int64_t rng = session.findGlobal(abi::kDropoutRng); rng >= 0) {
    const GlobalDesc &g = plan.globals[size_t(rng)];
    if (g.dtype != DType::I64 || (g.bytes != 16 && g.bytes != 8 * abi::kDropoutRngSize))
      return sdError(planContext, abi::kDropoutRng, " must be int64[", abi::kDropoutRngSize, "] or int64[2]");
    im->dropoutRng = rng;
    im->dropoutRngSize = int64_t(g.bytes / 8);
    if (!o.resume) {
      std::vector<int64_t> state(size_t(im->dropoutRngSize), 0);
      state[0] = int64_t(o.seed);
      SD_RETURN_IF_ERROR(session.writeGlobal(size_t(rng), state.data(), g.bytes));
    }
  }
  if (!o.rollout.rewardCommand.empty()) {
    auto command = RewardCommand::start(o.rollout.rewardCommand, o.rollout.rewardTimeoutSeconds);
    if (!command.isOk()) return command.status();
    im->rewardCommand = std::move(command.value());
    im->reward = [c = im->rewardCommand.get()](const std::vector<std::string> &requests) { return c->score(requests); };
  } else if (o.rollout.rewardFunction) {
    im->reward = o.rollout.rewardFunction;
  }
  im->seq = pe.buckets.back().seq;
  im->cursor = DataCursor{&im->data, o.shuffle, o.seed, 0, 0, {}};
  im->cursor.reorder();
  im->total = o.steps;
  if (!im->total) { // epochs: packing decides how many examples a step takes, so count by packing
    DataCursor dry = im->cursor;
    int64_t micro = 0;
    while (dry.consumed() < o.epochs * int64_t(im->data.size())) dry.next(im->batch * im->world, im->seq, pe.packed), ++micro;
    im->total = (micro + o.gradAccum - 1) / o.gradAccum;
  }
  auto fingerprint = tensorData ? tensorFolderFingerprint(o.dataPath, pe.tensorInputs) : fileFingerprint(o.dataPath);
  if (!fingerprint.isOk()) return fingerprint.status();
  im->runParams = {{"seed", std::to_string(o.seed)}, {"data", fingerprint.value()}, {"batch", std::to_string(im->batch * im->world)},
                   {"grad_accum", std::to_string(o.gradAccum)}, {"shuffle", std::string(o.shuffle ? "true" : "false")},
                   {"truncate", std::string(o.truncate ? "true" : "false")}};
  if (!o.checkpointDir.empty()) {
    auto folder = CheckpointFolder::open(o.checkpointDir, im->comm);
    if (!folder.isOk()) return folder.status();
    im->checkpoints.emplace(std::move(folder.value()));
    if (!o.resume && im->rank == 0) SD_RETURN_IF_ERROR(im->checkpoints->requireNoCheckpoints());
  }
  im->runId = newRunId();
  if (o.resume) SD_RETURN_IF_ERROR(im->resume()); // every rank reads its share
  SD_RETURN_IF_ERROR(im->agreeOnStart());
  return std::unique_ptr<Trainer>(new Trainer(std::move(im)));
}

Status Trainer::Impl::resume() {
  auto restored = checkpoints->restoreLatest(session, resumedFrom, notes);
  if (!restored.isOk()) return restored.status();
  const CheckpointMeta &meta = restored.value();
  for (auto &[key, value] : runParams) {
    auto it = meta.run.find(key);
    std::string was = it == meta.run.end() ? "(not recorded)" : it->second;
    if (was != value)
      return sdError(resumedFrom, " was trained with ", key == "batch" ? "a global batch" : key, " = ", was,
                     key == "batch" ? " rows" : "", "; this run has ", value,
                     key == "batch" ? " (--batch x ranks): resume with the same --batch x ranks"
                                    : ": resume with the same " + std::string(key == "data" ? "data file" : key));
  }
  if (meta.step > total)
    return sdError(resumedFrom, " is at step ", meta.step, ", past this run's ", total,
                   " steps; give the run's --steps (", meta.totalSteps, ") to finish it, or start a new run in another folder");
  if (meta.position > int64_t(data.size()) || meta.epoch > (int64_t(1) << 40))
    return sdError(resumedFrom, ": its data position (epoch ", meta.epoch, ", example ", meta.position,
                   ") is outside the ", data.size(), " examples of the data");
  runId = meta.runId;
  step = meta.step;
  cursor.epoch = meta.epoch;
  cursor.index = meta.position;
  cursor.reorder();
  return Status::ok();
}

// Dropout masks are keyed by global row: this rank's micro-batch starts at
// global row rank * batch, and the entry's tensors hold `bucketRows` rows.
// Only the trainer writes them (the plan advances the counter), so they are
// rewritten, with a device round trip, only when the bucket changes.
Status Trainer::Impl::setDropoutRows(int64_t bucketRows) {
  if (dropoutRng < 0 || dropoutRngSize < 4) return Status::ok();
  const int64_t offset = int64_t(rank) * batch * entries.rowsPerExample();
  if (dropoutRows[0] == offset && dropoutRows[1] == bucketRows) return Status::ok();
  int64_t state[4];
  SD_RETURN_IF_ERROR(session.readGlobal(size_t(dropoutRng), state, sizeof state));
  state[2] = offset;
  state[3] = bucketRows;
  SD_RETURN_IF_ERROR(session.writeGlobal(size_t(dropoutRng), state, sizeof state));
  dropoutRows[0] = offset;
  dropoutRows[1] = bucketRows;
  return Status::ok();
}

// Every rank starts from rank 0's state and loop position: a fresh run from
// the adapter rank 0 read (a resumed one has read its share of the checkpoint).
Status Trainer::Impl::agreeOnStart() {
  if (world == 1) return Status::ok();
  if (!config.resume) SD_RETURN_IF_ERROR(broadcastState(session, comm));
  int64_t position[3] = {step, cursor.epoch, cursor.index};
  SD_RETURN_IF_ERROR(broadcastBytes(comm, position, sizeof position));
  runId.resize(16, '0');
  SD_RETURN_IF_ERROR(broadcastBytes(comm, runId.data(), runId.size()));
  step = position[0];
  cursor.epoch = position[1];
  cursor.index = position[2];
  cursor.reorder();
  return Status::ok();
}

StatusOr<double> Trainer::evaluate() {
  Impl &im = *impl_;
  SD_RETURN_IF_ERROR(im.requireNothingLaunched("evaluate"));
  if (im.evalData.empty()) return sdError("no eval data was given");
  double sum = 0, tokens = 0;
  for (size_t i = 0; i < im.evalData.size();) {
    Rows rows = im.localRows(packRows(im.batch * im.world, im.seq, im.entries.packed,
                                      [&] { return i < im.evalData.size() ? &im.evalData[i] : nullptr; },
                                      [&] { return &im.evalData[i++]; }));
    if (rows.empty()) continue; // the last global micro-batch may not reach this rank
    const Bucket *b = bucketFor(im.entries, rows);
    FedBatch fed(im.entries, im.evalTensors, rows, *b);
    SD_RETURN_IF_ERROR(runEntry(im.session, b->evalStep, fed.inputs(), im.outs));
    sum += scalarOut(im.outs, abi::kLossSum);
    tokens += scalarOut(im.outs, abi::kTokens);
  }
  double sums[2] = {sum, tokens};
  SD_RETURN_IF_ERROR(sumOverRanks(im.comm, sums, 2).withContext("eval: "));
  return sums[0] / std::max(sums[1], 1.0);
}

Status Trainer::saveCheckpoint() {
  Impl &im = *impl_;
  SD_RETURN_IF_ERROR(im.requireNothingLaunched("save a checkpoint"));
  if (!im.checkpoints) return sdError("no checkpoint folder was given");
  CheckpointMeta meta{im.runId, im.step, im.total, im.cursor.epoch, im.cursor.index, im.runParams};
  return im.checkpoints->save(im.session, meta, im.config.checkpointsKept); // every rank writes its share
}

bool Trainer::Impl::runsAhead() const {
  if (config.runAhead == TrainConfig::RunAhead::Never) return false;
  const bool async = !session.device().hostAddressable();
  if (world > 1 && async) return false;
  return config.runAhead == TrainConfig::RunAhead::Always || async;
}

// Whether something after step `stepNumber` needs the state right after it.
bool Trainer::Impl::hookAfter(int64_t n) const {
  return n >= total || config.verifyReplicas || evalAfter(n) || checkpointAfter(n);
}

// The step's groups: each prompt of its micro-batches sampled (every
// micro-batch with the weights the step starts from, as TRL generates a
// whole accumulation window at once) and scored; the rows then point at
// them. Seeded by the run's seed, the step and the rank, so a resumed run
// samples what the straight one did.
Status Trainer::Impl::sampleStep(std::vector<Rows> &micros, LaunchedStep &ls) {
  size_t count = 0;
  for (const Rows &rows : micros)
    for (const auto &row : rows) count += row.size();
  sampled.clear();
  sampled.reserve(count); // the rows point into it
  for (Rows &rows : micros)
    for (auto &row : rows)
      for (const Example *&e : row) {
        sampled.push_back(*e);
        e = &sampled.back();
      }
  uint64_t seed = config.seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(ls.number) << 20) ^ uint64_t(rank);
  SD_RETURN_IF_ERROR(sampleGroups(session, config.rollout, seed, entries.groupSize, seq, tokenizer.get(), reward,
                                  sampled, ls.rewardSum));
  ls.rewards = double(sampled.size() * size_t(entries.groupSize));
  return Status::ok();
}

// Queues the micro-batches of the step after the last launched one.
Status Trainer::Impl::launchStep() {
  const TrainConfig &o = config;
  LaunchedStep ls;
  ls.number = step + int64_t(launched.size()) + 1;
  ls.lr = learningRate(o.schedule, ls.number - 1, total);
  ls.launched = std::chrono::steady_clock::now();
  HostTensor lrT = scalar(abi::kLr, float(ls.lr)), wdT = scalar(abi::kWeightDecay, float(o.weightDecay)),
             clipT = scalar(abi::kMaxGradNorm, float(o.clipNorm));
  const std::string where = "step " + std::to_string(ls.number) + ": ";
  std::vector<Rows> micros;
  for (int64_t micro = 0; micro < o.gradAccum; ++micro)
    micros.push_back(localRows(cursor.next(batch * world, seq, entries.packed)));
  if (samples()) SD_RETURN_IF_ERROR(sampleStep(micros, ls).withContext(where));
  if (entries.groupSize) // a GRPO loss may count completions or micro-batches; the rate counts tokens
    for (const Rows &rows : micros)
      for (const auto &row : rows)
        for (const Example *e : row)
          for (const auto &labels : e->groupLabels)
            for (size_t j = 1; j < labels.size(); ++j) ls.completionTokens += labels[j] != kIgnoreLabel;
  for (int64_t micro = 0; micro < o.gradAccum; ++micro) {
    const Rows &rows = micros[size_t(micro)];
    const Bucket *b = bucketFor(entries, rows);
    FedBatch fed(entries, tensors, rows, *b);
    std::map<std::string, const HostTensor *> in = fed.inputs();
    in.insert({{abi::kLr, &lrT}, {abi::kWeightDecay, &wdT}, {abi::kMaxGradNorm, &clipT}});
    // The last micro-batch runs train_step (accumulate, then the optimizer
    // step on the window's sums): its gradient buckets are reduced across
    // ranks while its backward runs, as DDP's no_sync windows end. fp16: the
    // loss scale comes back with it, as the step left it.
    const bool fused = micro == o.gradAccum - 1;
    const int64_t entry = fused ? b->trainStep : b->accumulate;
    SD_RETURN_IF_ERROR(setDropoutRows(b->batch).withContext(where));
    auto ins = entryInputs(session, entry, in);
    if (!ins.isOk()) return ins.status().withContext(where);
    std::vector<size_t> alsoRead;
    if (fused && lossScale >= 0) alsoRead.push_back(size_t(lossScale));
    SD_RETURN_IF_ERROR(session.launch(size_t(entry), ins.value(), alsoRead).withContext(where));
  }
  ls.epoch = cursor.epoch;
  launched.push_back(ls);
  return Status::ok();
}

// Waits for the oldest launched step and sums its micro-batches' results.
Status Trainer::Impl::collectStep(StepReport &r) {
  const LaunchedStep ls = launched.front();
  launched.pop_front();
  const std::string where = "step " + std::to_string(ls.number) + ": ";
  r.total = total;
  r.lr = ls.lr;
  r.epoch = ls.epoch;
  double lossSum = 0;
  for (int64_t micro = 0; micro < config.gradAccum; ++micro) {
    SD_RETURN_IF_ERROR(session.collect(outs).withContext(where));
    lossSum += scalarOut(outs, abi::kLossSum);
    r.tokens += scalarOut(outs, abi::kTokens);
  }
  r.gradNorm = scalarOut(outs, abi::kGradNorm); // the last micro-batch is the optimizer step
  double sums[5] = {lossSum, r.tokens, ls.rewardSum, ls.rewards, ls.completionTokens}; // over the ranks
  SD_RETURN_IF_ERROR(sumOverRanks(comm, sums, 5).withContext(where));
  r.tokens = sums[1];
  r.loss = sums[0] / std::max(r.tokens, 1.0);
  if (samples() && sums[3] > 0) r.meanReward = sums[2] / sums[3];
  if (entries.groupSize) r.tokens = sums[4];
  // A plan with its own loss counts one "token" per micro-batch (its loss is
  // already a mean); the step's rate counts its examples instead.
  if (!entries.tensorInputs.empty()) r.tokens = double(batch * world * config.gradAccum);
  // fp16: the plan skipped the update exactly when the gradient norm (global
  // over the ranks) is Inf or NaN, and moved the loss scale.
  if (lossScale >= 0) {
    r.skipped = !std::isfinite(r.gradNorm);
    r.lossScale = scalarOut(outs, abi::kLossScale);
  }
  return Status::ok();
}

// A failed step leaves nothing queued behind it: what was launched is
// waited for and dropped, so the session can run other entries.
Status Trainer::Impl::discardLaunched(Status why) {
  std::vector<HostTensor> dropped;
  while (session.launchedRuns()) (void)session.collect(dropped);
  launched.clear();
  return why;
}

StatusOr<StepReport> Trainer::runStep() {
  Impl &im = *impl_;
  const TrainConfig &o = im.config;
  if (im.step >= im.total) return sdError("training is done (", im.total, " steps)");
  const int64_t number = im.step + 1;
  PhaseNote phase(im.comm, "step " + std::to_string(number));
  if (im.launched.empty())
    if (Status st = im.launchStep(); !st.isOk()) return im.discardLaunched(st);
  if (!im.started) im.startTime = im.launched.front().launched, im.started = true;
  // Run ahead: the next step is queued before this one is waited for.
  if (im.launched.size() == 1 && im.runsAhead() && !im.hookAfter(number))
    if (Status st = im.launchStep(); !st.isOk()) return im.discardLaunched(st);
  StepReport r;
  const auto launchedAt = im.launched.front().launched;
  if (Status st = im.collectStep(r); !st.isOk()) return im.discardLaunched(st);
  phase.end(); // eval and checkpoints may take longer than one step
  if (!std::isfinite(r.loss))
    return im.discardLaunched(sdError("step ", number, ": loss is ", r.loss, "; stopped",
                                      o.checkpointDir.empty() ? "" : " (the last checkpoint in " + o.checkpointDir + " is kept)"));
  ++im.step;
  if (o.verifyReplicas) SD_RETURN_IF_ERROR(checkReplicas(im.session, im.comm, im.step));
  r.step = im.step;
  // A step that ran ahead started while the one before was reported: its
  // time runs from that report (a GPU runs one step at a time).
  auto now = std::chrono::steady_clock::now();
  r.seconds = std::chrono::duration<double>(now - std::max(launchedAt, im.lastReport)).count();
  r.elapsedSeconds = std::chrono::duration<double>(now - im.startTime).count();
  if (im.evalAfter(im.step)) {
    auto loss = evaluate();
    if (!loss.isOk()) return loss.status();
    r.evaluated = true;
    r.evalLoss = loss.value();
  }
  if (im.checkpointAfter(im.step)) {
    SD_RETURN_IF_ERROR(saveCheckpoint());
    r.checkpointed = true;
  }
  im.lastReport = std::chrono::steady_clock::now();
  return r;
}

namespace {
// The plan config's tied parameters, each mapped to its other names.
StatusOr<std::map<std::string, std::vector<std::string>>> tiedNames(const Plan &plan) {
  std::map<std::string, std::vector<std::string>> tied;
  if (plan.config.empty()) return tied;
  auto cfg = parseJson(plan.config, "the plan's config");
  if (!cfg.isOk()) return cfg.status();
  const Json *map = cfg.value().get(abi::kTiedNamesConfigKey);
  if (!map) return tied;
  auto malformed = [] { return sdError("the plan's config has a malformed '", abi::kTiedNamesConfigKey, "'"); };
  if (map->type != Json::Type::Object) return malformed();
  for (const auto &[param, names] : map->obj) {
    if (names.type != Json::Type::Array) return malformed();
    for (const Json &n : names.arr) {
      if (n.type != Json::Type::String || n.str.empty()) return malformed();
      tied[param].push_back(n.str);
    }
  }
  return tied;
}
} // namespace

Status Trainer::saveWeights(const std::string &path) const {
  SD_RETURN_IF_ERROR(impl_->requireNothingLaunched("save weights"));
  GlobalValues gathered; // --shard params: the weights split by rows, whole on rank 0
  SD_RETURN_IF_ERROR(gatherToRankZero(impl_->session, impl_->comm, gathered).withContext("saving weights: "));
  if (impl_->rank != 0) return Status::ok();
  const Plan &plan = impl_->session.plan();
  std::vector<HostTensor> values;
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    // The running statistics training updated belong with the weights (PyTorch's state_dict keeps its buffers).
    if (plan.globals[i].role != GlobalRole::Trainable && plan.globals[i].role != GlobalRole::Statistics) continue;
    if (auto it = gathered.find(i); it != gathered.end() && impl_->session.rowSharded(i)) {
      const GlobalDesc &g = plan.globals[i];
      values.push_back(HostTensor{g.name, g.dtype, g.dims, it->second});
      continue;
    }
    auto v = impl_->session.readGlobal(i);
    if (!v.isOk()) return v.status();
    values.push_back(std::move(v.value()));
  }
  auto tied = tiedNames(plan);
  if (!tied.isOk()) return tied.status();
  std::set<std::string> saved;
  for (const HostTensor &v : values) saved.insert(v.name);
  std::vector<NamedTensor> params;
  for (const HostTensor &v : values) {
    params.push_back({v.name, v.dtype, v.dims, v.data.data(), v.byteSize()});
    // A tied parameter is in PyTorch's state_dict under each of its names.
    if (auto it = tied.value().find(v.name); it != tied.value().end())
      for (const std::string &other : it->second)
        if (saved.insert(other).second) params.push_back({other, v.dtype, v.dims, v.data.data(), v.byteSize()});
  }
  return writeSafetensors(path, params);
}

Status Trainer::saveAdapter(const std::string &dir) const {
  SD_RETURN_IF_ERROR(impl_->requireNothingLaunched("save the adapter"));
  GlobalValues gathered; // --shard params: the adapter's tensors split by rows, whole on rank 0
  SD_RETURN_IF_ERROR(gatherToRankZero(impl_->session, impl_->comm, gathered).withContext("saving the adapter: "));
  if (impl_->rank != 0) return Status::ok();
  if (!impl_->hasLora) return loraConfigOf(impl_->session.plan()).status().withContext(impl_->config.planName.empty() ? "" : impl_->config.planName + ": ");
  return sd::saveAdapter(dir, impl_->session, impl_->lora, &gathered);
}

Status trainToEnd(Trainer &trainer, const std::function<Status(const StepReport &)> &onStep) {
  while (!trainer.done()) {
    auto r = trainer.runStep();
    if (!r.isOk()) return r.status();
    if (onStep) SD_RETURN_IF_ERROR(onStep(r.value()));
  }
  return Status::ok();
}

namespace {
// `byName`'s tensors in the entry's input order.
Status namedInputs(const EntryDesc &e, const std::map<std::string, HostTensor> &byName, std::vector<HostTensor> &inputs) {
  inputs.clear();
  for (auto &[name, b] : e.inputs) {
    auto it = byName.find(name);
    if (it == byName.end()) return sdError("entry '", e.name, "' needs input '", name, "', which --data does not give");
    inputs.push_back(it->second);
  }
  return Status::ok();
}
} // namespace

Status trainInputsFromData(const Plan &plan, size_t entry, const std::string &dataPath, int64_t batch,
                           std::vector<HostTensor> &inputs) {
  PlanEntries pe;
  SD_RETURN_IF_ERROR(findEntries(plan, pe, dataPath));
  const EntryDesc &e = plan.entries[entry];
  std::map<std::string, HostTensor> byName = {{abi::kLr, scalar(abi::kLr, 1e-4f)},
                                              {abi::kWeightDecay, scalar(abi::kWeightDecay, 0)},
                                              {abi::kMaxGradNorm, scalar(abi::kMaxGradNorm, 0)}};
  if (!pe.tensorInputs.empty()) { // the data's first batch (a tensor-data plan has one batch size)
    auto data = loadTensorFolder(dataPath, pe.tensorInputs);
    if (!data.isOk()) return data.status();
    DataCursor cursor{&data.value().examples, false, 0, 0, 0, {}};
    cursor.reorder();
    for (const HostTensor &t : TensorBatch(cursor.next(pe.buckets[0].batch, 0, false), data.value()).tensors)
      byName[t.name] = t;
    return namedInputs(e, byName, inputs);
  }
  int64_t seq = pe.buckets.back().seq, rowsInBucket = pe.buckets.back().batch;
  for (auto &[n, b] : e.inputs)
    if (n == pe.tokenInput && e.buffers[size_t(b)].dims.size() == 2)
      seq = e.buffers[size_t(b)].dims[1], rowsInBucket = e.buffers[size_t(b)].dims[0];
  DatasetOptions dopts{pe.vocab, seq, true};
  dopts.numLabels = pe.numLabels;
  dopts.pairs = pe.pairs;
  dopts.unpaired = pe.unpaired;
  dopts.samplingLogProbs = pe.samplingLogProbs;
  dopts.groupSize = pe.groupSize;
  auto data = loadJsonl(dataPath, dopts);
  if (!data.isOk()) return data.status();
  const int64_t examplesInBucket = rowsInBucket / pe.rowsPerExample();
  int64_t n = batch ? std::min(batch, examplesInBucket) : examplesInBucket;
  DataCursor cursor{&data.value(), false, 0, 0, 0, {}};
  cursor.reorder();
  TokenBatch tb(cursor.next(n, seq, pe.packed), rowsInBucket, seq, pe.tokenInput, pe.layout());
  for (auto &[name, t] : tb.inputs()) byName[name] = *t;
  return namedInputs(e, byName, inputs);
}

} // namespace sd::train
