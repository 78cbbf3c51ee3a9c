// The training loop: buckets, batches, schedule, hooks at optimizer steps.
#include "trainer.h"
#include "sd/runtime/adapter.h"
#include "sd/runtime/checkpoint.h"
#include "sd/runtime/dataset.h"
#include "sd/format/json.h"
#include "sd/format/safetensors.h"
#include "sd/runtime/session.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <unistd.h>

namespace sdrun {
namespace {

using sd::Example;
using sd::HostTensor;
using sd::Status;

// One shape bucket's entries; the token input is [batch, seq].
struct Bucket {
  int64_t batch = 0, seq = 0;
  int64_t trainStep = -1, accumulate = -1, evalStep = -1;
};

struct PlanEntries {
  std::vector<Bucket> buckets; // by increasing seq
  int64_t apply = -1;
  int64_t vocab = 0;
  bool packed = false; // training entries take position_ids (sdc compile --packing)
  std::string tokenInput = "input_ids"; // the model's token input (plan config "token_input")
};

Status findEntries(const sd::Plan &plan, PlanEntries &out) {
  // Plans compiled before the token input was recorded call it input_ids.
  if (!plan.config.empty()) {
    auto cfg = sd::parseJson(plan.config, "the plan's config");
    if (!cfg.isOk()) return cfg.status();
    if (const sd::Json *t = cfg.value().get("token_input"); t && t->type == sd::Json::Type::String) out.tokenInput = t->str;
  }
  std::map<std::pair<int64_t, int64_t>, Bucket> byShape;
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const sd::EntryDesc &e = plan.entries[i];
    if (e.name == "apply") out.apply = int64_t(i);
    if (e.name == "infer" && !e.outputs.empty() && !out.vocab) {
      const sd::Dims &d = e.buffers[size_t(e.outputs[0].second)].dims;
      if (!d.empty()) out.vocab = d.back();
    }
    if (e.name != "train_step" && e.name != "accumulate" && e.name != "eval_step") continue;
    const sd::BufferDesc *labels = nullptr;
    for (auto &[n, b] : e.inputs) {
      if (n == "labels") labels = &e.buffers[size_t(b)];
      if (n == "position_ids") out.packed = true;
    }
    if (!labels || labels->dims.size() != 2) return sd::sdError("entry '", e.name, "' has no [batch, seq] labels input");
    Bucket &b = byShape[{labels->dims[1], labels->dims[0]}];
    b.batch = labels->dims[0];
    b.seq = labels->dims[1];
    (e.name == "train_step" ? b.trainStep : e.name == "accumulate" ? b.accumulate : b.evalStep) = int64_t(i);
  }
  for (auto &[k, b] : byShape) out.buckets.push_back(b);
  if (out.buckets.empty() || out.buckets[0].trainStep < 0)
    return sd::sdError("the plan has no train_step entry; compile it with --peft");
  if (out.apply < 0) return sd::sdError("the plan has no apply entry");
  if (out.vocab <= 0) return sd::sdError("cannot tell the vocabulary size from the plan's infer entry");
  return Status::ok();
}

HostTensor scalar(const std::string &name, float v) {
  HostTensor t;
  t.name = name;
  t.dtype = sd::DType::F32;
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

// The examples of each row of a micro-batch: one per row when padding,
// several when the plan packs (compiled with --packing).
using Rows = std::vector<std::vector<const Example *>>;

// Token inputs of `rows` as [batch, seq] tensors: ids (pad 0), labels (pad
// -100) and position_ids (each example's own 0, 1, ...). Each packed example
// after a row's first gets label -100 at its first token: that label would be
// predicted from the previous example's last token (labels shift inside the
// plan), so a packed row counts exactly the tokens its examples count alone.
struct TokenBatch {
  HostTensor ids, labels, positions;
  TokenBatch(const Rows &rows, int64_t batch, int64_t seq, const std::string &tokenInput) {
    for (auto [t, name] : {std::pair{&ids, tokenInput.c_str()}, {&labels, "labels"}, {&positions, "position_ids"}}) {
      t->name = name;
      t->dtype = sd::DType::I64;
      t->dims = {batch, seq};
      t->data.assign(size_t(batch * seq) * 8, 0);
    }
    auto *pi = reinterpret_cast<int64_t *>(ids.data.data());
    auto *pl = reinterpret_cast<int64_t *>(labels.data.data());
    auto *pp = reinterpret_cast<int64_t *>(positions.data.data());
    std::fill(pl, pl + batch * seq, sd::kIgnoreLabel);
    for (size_t r = 0; r < rows.size(); ++r) {
      int64_t at = int64_t(r) * seq, end = at + seq;
      for (const Example *e : rows[r]) {
        for (size_t j = 0; j < e->ids.size(); ++j, ++at) {
          pi[at] = e->ids[j];
          pl[at] = j == 0 && at != int64_t(r) * seq ? sd::kIgnoreLabel : e->labels[j];
          pp[at] = int64_t(j);
        }
      }
      for (int64_t j = 0; at < end; ++at, ++j) pp[at] = j; // padding: a sequence of its own
    }
  }
  std::map<std::string, const HostTensor *> inputs() const {
    return {{ids.name, &ids}, {"labels", &labels}, {"position_ids", &positions}};
  }
};

// Runs entry `index` with inputs matched by name.
Status runEntry(sd::Session &s, int64_t index, const std::map<std::string, const HostTensor *> &byName,
                std::vector<HostTensor> &outs) {
  const sd::EntryDesc &e = s.plan().entries[size_t(index)];
  std::vector<const HostTensor *> ins;
  for (auto &[n, b] : e.inputs) {
    auto it = byName.find(n);
    if (it == byName.end())
      return sd::sdError("entry '", e.name, "' needs input '", n, "', which sdrun train does not provide (it feeds the token ",
                         "input, labels and position_ids; if '", n, "' is the token input, recompile with sdc compile ",
                         "--token-input ", n, ")");
    ins.push_back(it->second);
  }
  return s.run(size_t(index), ins, outs);
}

// First-fit decreasing: `examples` into at most `rows` rows of `seq` tokens
// (longest first, each into the first row with room; ties keep data order).
// False if they do not fit.
bool firstFitDecreasing(std::vector<const Example *> examples, int64_t rows, int64_t seq, Rows &out) {
  std::stable_sort(examples.begin(), examples.end(),
                   [](const Example *a, const Example *b) { return a->ids.size() > b->ids.size(); });
  out.clear();
  std::vector<size_t> used;
  for (const Example *e : examples) {
    size_t r = 0;
    while (r < out.size() && used[r] + e->ids.size() > size_t(seq)) ++r;
    if (r == out.size()) {
      if (int64_t(r) == rows) return false;
      out.emplace_back();
      used.push_back(0);
    }
    out[r].push_back(e);
    used[r] += e->ids.size();
  }
  return true;
}

// Up to `rows` rows of at most `seq` tokens from a stream (peek: the next
// example or null at the end; take: consume it). Without packing, one example
// per row. Packing takes the longest run of next examples that first-fit
// decreasing fits into the rows: a micro-batch is a function of where it
// starts in the stream, so a checkpoint's data position resumes exactly.
template <class Peek, class Take>
Rows packRows(int64_t rows, int64_t seq, bool pack, Peek peek, Take take) {
  Rows out;
  if (!pack) {
    while (int64_t(out.size()) < rows && peek()) out.push_back({take()});
    return out;
  }
  std::vector<const Example *> taken;
  Rows trial;
  while (peek()) {
    taken.push_back(peek());
    if (!firstFitDecreasing(taken, rows, seq, trial)) break;
    take();
    out.swap(trial);
  }
  return out;
}

// Walks the data in (seeded) epoch orders; position = (epoch, index).
struct DataCursor {
  const std::vector<Example> *data = nullptr;
  bool shuffle = true;
  uint64_t seed = 0;
  int64_t epoch = 0, index = 0;
  std::vector<size_t> order;

  void reorder() {
    if (shuffle) order = sd::shuffledOrder(data->size(), seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch));
    else {
      order.resize(data->size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    }
  }
  const Example *peek() {
    if (index >= int64_t(data->size())) {
      ++epoch;
      index = 0;
      reorder();
    }
    return &(*data)[order[size_t(index)]];
  }
  const Example *take() {
    const Example *e = peek();
    ++index;
    return e;
  }
  Rows next(int64_t rows, int64_t seq, bool pack) {
    return packRows(rows, seq, pack, [&] { return peek(); }, [&] { return take(); });
  }
};

// The smallest bucket whose rows hold every row of `rows` (packed rows were
// filled to the largest bucket's length, but a short last batch may fit less).
const Bucket *bucketFor(const PlanEntries &pe, const Rows &rows) {
  size_t longest = 0;
  for (const auto &row : rows) {
    size_t used = 0;
    for (const Example *e : row) used += e->ids.size();
    longest = std::max(longest, used);
  }
  for (const Bucket &b : pe.buckets)
    if (b.seq >= int64_t(longest)) return &b;
  return nullptr;
}

std::string formatDuration(double s) {
  char buf[32];
  int64_t t = int64_t(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

} // namespace

sd::Status trainInputsFromData(const sd::Plan &plan, size_t entry, const std::string &dataPath, int64_t batch,
                               std::vector<HostTensor> &inputs) {
  PlanEntries pe;
  SD_RETURN_IF_ERROR(findEntries(plan, pe));
  const sd::EntryDesc &e = plan.entries[entry];
  int64_t seq = pe.buckets.back().seq, rowsInBucket = pe.buckets.back().batch;
  for (auto &[n, b] : e.inputs)
    if (n == "labels") seq = e.buffers[size_t(b)].dims[1], rowsInBucket = e.buffers[size_t(b)].dims[0];
  auto data = sd::loadJsonl(dataPath, sd::DatasetOptions{pe.vocab, seq, true});
  if (!data.isOk()) return data.status();
  int64_t n = batch ? std::min(batch, rowsInBucket) : rowsInBucket;
  DataCursor cursor{&data.value(), false};
  cursor.reorder();
  TokenBatch tb(cursor.next(n, seq, pe.packed), rowsInBucket, seq, pe.tokenInput);
  std::map<std::string, HostTensor> byName = {{pe.tokenInput, tb.ids}, {"labels", tb.labels},
                                              {"position_ids", tb.positions}, {"lr", scalar("lr", 1e-4f)},
                                              {"weight_decay", scalar("weight_decay", 0)},
                                              {"max_grad_norm", scalar("max_grad_norm", 0)}};
  inputs.clear();
  for (auto &[name, b] : e.inputs) {
    auto it = byName.find(name);
    if (it == byName.end()) return sd::sdError("entry '", e.name, "' needs input '", name, "', which --data does not give");
    inputs.push_back(it->second);
  }
  return Status::ok();
}

double learningRate(const TrainOptions &o, int64_t step, int64_t total) {
  if (o.warmupSteps > 0 && step < o.warmupSteps) return o.lr * double(step) / double(o.warmupSteps);
  if (o.schedule != "cosine") return o.lr;
  double progress = double(step - o.warmupSteps) / double(std::max<int64_t>(1, total - o.warmupSteps));
  return o.lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
}

Status runTraining(const TrainOptions &o) {
  auto loaded = sd::Plan::loadFile(o.planPath);
  if (!loaded.isOk()) return loaded.status();
  std::shared_ptr<const sd::Plan> plan(std::move(loaded.value()));
  PlanEntries pe;
  SD_RETURN_IF_ERROR(findEntries(*plan, pe).withContext(o.planPath + ": "));
  int64_t batch = o.batch ? o.batch : pe.buckets[0].batch;
  if (batch > pe.buckets[0].batch)
    return sd::sdError("--batch ", batch, " is larger than the plan's batch ", pe.buckets[0].batch,
                       "; compile the plan with a larger batch");
  if (o.gradAccum > 1 && pe.buckets[0].accumulate < 0) return sd::sdError("the plan has no accumulate entry");
  sd::DatasetOptions dopts{pe.vocab, pe.buckets.back().seq, o.truncate};
  auto data = sd::loadJsonl(o.dataPath, dopts);
  if (!data.isOk()) return data.status();
  std::vector<Example> evalData;
  if (!o.evalPath.empty()) {
    auto ev = sd::loadJsonl(o.evalPath, dopts);
    if (!ev.isOk()) return ev.status();
    evalData = std::move(ev.value());
  }
  sd::SessionOptions sopts;
  sopts.threads = int(o.threads);
  auto session = sd::Session::create(plan, sopts);
  if (!session.isOk()) return session.status();
  sd::Session &s = *session.value();

  sd::LoraConfig lora;
  if (!o.adapterIn.empty() || !o.adapterOut.empty()) {
    auto cfg = sd::loraConfigOf(*plan);
    if (!cfg.isOk()) return cfg.status().withContext(o.planPath + ": ");
    lora = cfg.value();
  }
  if (!o.adapterIn.empty() && !o.resume) SD_RETURN_IF_ERROR(sd::loadAdapter(o.adapterIn, s, lora));
  // Dropout masks are keyed by [seed, counter]; a resumed run restores both.
  if (int64_t rng = s.findGlobal(sd::kDropoutRngGlobal); rng >= 0 && !o.resume) {
    int64_t *state = s.global(size_t(rng)).as<int64_t>();
    state[0] = int64_t(o.seed);
    state[1] = 0;
  }
  int64_t seq = pe.buckets.back().seq;
  DataCursor cursor{&data.value(), o.shuffle, o.seed};
  cursor.reorder();
  int64_t total = o.steps;
  if (!total) { // --epochs: packing decides how many examples a step takes, so count by packing
    DataCursor dry = cursor;
    int64_t micro = 0;
    auto consumed = [&] { return dry.epoch * int64_t(data.value().size()) + dry.index; };
    while (consumed() < o.epochs * int64_t(data.value().size())) dry.next(batch, seq, pe.packed), ++micro;
    total = (micro + o.gradAccum - 1) / o.gradAccum;
  }
  int64_t step = 0;
  if (o.resume) {
    std::string used;
    std::vector<std::string> notes;
    auto meta = sd::restoreLatestCheckpoint(o.checkpointDir, s, used, notes);
    for (auto &n : notes) std::fprintf(stderr, "sdrun: note: %s\n", n.c_str());
    if (!meta.isOk()) return meta.status();
    if (meta.value().seed != o.seed)
      return sd::sdError(used, " was trained with --seed ", meta.value().seed, "; resume with the same seed");
    step = meta.value().step;
    cursor.epoch = meta.value().epoch;
    cursor.index = meta.value().position;
    cursor.reorder();
    std::fprintf(stderr, "sdrun: resuming from %s (step %lld)\n", used.c_str(), (long long)step);
  }

  FILE *metrics = nullptr;
  if (!o.metricsPath.empty()) {
    metrics = std::fopen(o.metricsPath.c_str(), o.resume ? "ab" : "wb");
    if (!metrics) return sd::sdError(o.metricsPath, ": cannot write");
  }
  auto closeMetrics = [&] {
    if (metrics) std::fclose(metrics);
    metrics = nullptr;
  };
  bool tty = ::isatty(2);
  HostTensor lrT, wdT = scalar("weight_decay", float(o.weightDecay)), clipT = scalar("max_grad_norm", float(o.clipNorm));
  std::vector<HostTensor> outs;

  auto evaluate = [&](double &loss) -> Status {
    double sum = 0, tokens = 0;
    for (size_t i = 0; i < evalData.size();) {
      Rows rows = packRows(batch, seq, pe.packed, [&] { return i < evalData.size() ? &evalData[i] : nullptr; },
                           [&] { return &evalData[i++]; });
      const Bucket *b = bucketFor(pe, rows);
      TokenBatch tb(rows, b->batch, b->seq, pe.tokenInput);
      SD_RETURN_IF_ERROR(runEntry(s, b->evalStep, tb.inputs(), outs));
      sum += scalarOut(outs, "loss_sum");
      tokens += scalarOut(outs, "tokens");
    }
    loss = sum / std::max(tokens, 1.0);
    return Status::ok();
  };

  auto started = std::chrono::steady_clock::now();
  int64_t firstStep = step;
  for (; step < total; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    double lr = learningRate(o, step, total);
    lrT = scalar("lr", float(lr));
    double lossSum = 0, tokens = 0, gradNorm = NAN;
    for (int64_t micro = 0; micro < o.gradAccum; ++micro) {
      Rows rows = cursor.next(batch, seq, pe.packed);
      const Bucket *b = bucketFor(pe, rows);
      TokenBatch tb(rows, b->batch, b->seq, pe.tokenInput);
      std::map<std::string, const HostTensor *> in = tb.inputs();
      in.insert({{"lr", &lrT}, {"weight_decay", &wdT}, {"max_grad_norm", &clipT}});
      bool fused = o.gradAccum == 1;
      SD_RETURN_IF_ERROR(runEntry(s, fused ? b->trainStep : b->accumulate, in, outs).withContext(
          "step " + std::to_string(step + 1) + ": "));
      lossSum += scalarOut(outs, "loss_sum");
      tokens += scalarOut(outs, "tokens");
      if (fused) gradNorm = scalarOut(outs, "grad_norm");
    }
    if (o.gradAccum > 1) {
      SD_RETURN_IF_ERROR(runEntry(s, pe.apply, {{"lr", &lrT}, {"weight_decay", &wdT}, {"max_grad_norm", &clipT}}, outs));
      gradNorm = scalarOut(outs, "grad_norm");
    }
    double loss = lossSum / std::max(tokens, 1.0);
    if (!std::isfinite(loss)) {
      closeMetrics();
      return sd::sdError("step ", step + 1, ": loss is ", loss, "; stopped",
                         o.checkpointDir.empty() ? "" : " (the last checkpoint in " + o.checkpointDir + " is kept)");
    }
    auto now = std::chrono::steady_clock::now();
    double dt = std::chrono::duration<double>(now - t0).count();
    double elapsed = std::chrono::duration<double>(now - started).count();
    if (metrics) {
      std::fprintf(metrics,
                   "{\"step\":%lld,\"epoch\":%lld,\"loss\":%.8g,\"lr\":%.8g,\"grad_norm\":%.8g,\"tokens\":%.0f,"
                   "\"tokens_per_s\":%.1f,\"elapsed_s\":%.3f}\n",
                   (long long)(step + 1), (long long)cursor.epoch, loss, lr, gradNorm, tokens, tokens / dt, elapsed);
      std::fflush(metrics);
    }
    int64_t done = step + 1 - firstStep, left = total - step - 1;
    double eta = elapsed / double(done) * double(left);
    if (tty) {
      int width = 24, filled = int(double(step + 1) / double(total) * width);
      std::fprintf(stderr, "\rstep %lld/%lld [%s%s] loss %.4f  %.0f tok/s  ETA %s   ", (long long)(step + 1),
                   (long long)total, std::string(size_t(filled), '#').c_str(),
                   std::string(size_t(width - filled), '.').c_str(), loss, tokens / dt, formatDuration(eta).c_str());
    } else if (step + 1 == total || (step + 1) % std::max<int64_t>(1, total / 10) == 0) {
      std::fprintf(stderr, "step %lld/%lld loss %.4f lr %.3g %.0f tok/s elapsed %s\n", (long long)(step + 1),
                   (long long)total, loss, lr, tokens / dt, formatDuration(elapsed).c_str());
    }
    bool last = step + 1 == total;
    if (!evalData.empty() && ((o.evalEvery && (step + 1) % o.evalEvery == 0) || last)) {
      double evalLoss;
      SD_RETURN_IF_ERROR(evaluate(evalLoss));
      if (metrics) std::fprintf(metrics, "{\"step\":%lld,\"eval_loss\":%.8g}\n", (long long)(step + 1), evalLoss), std::fflush(metrics);
      std::fprintf(stderr, "%sstep %lld eval loss %.4f\n", tty ? "\n" : "", (long long)(step + 1), evalLoss);
    }
    if (!o.checkpointDir.empty() && ((o.checkpointEvery && (step + 1) % o.checkpointEvery == 0) || last)) {
      sd::CheckpointMeta meta{step + 1, cursor.epoch, cursor.index, o.seed};
      Status cs = sd::saveCheckpoint(o.checkpointDir, s, meta);
      if (!cs.isOk()) return closeMetrics(), cs;
    }
  }
  if (tty) std::fputc('\n', stderr);
  closeMetrics();
  if (!o.saveWeights.empty()) {
    std::vector<sd::NamedTensor> params;
    for (size_t i = 0; i < plan->globals.size(); ++i) {
      const sd::GlobalDesc &g = plan->globals[i];
      if (g.role != sd::GlobalRole::Trainable) continue;
      sd::TensorView v = s.global(i);
      params.push_back({g.name, g.dtype, g.dims, v.data, v.byteSize()});
    }
    SD_RETURN_IF_ERROR(sd::writeSafetensors(o.saveWeights, params));
  }
  if (!o.adapterOut.empty()) SD_RETURN_IF_ERROR(sd::saveAdapter(o.adapterOut, s, lora));
  return Status::ok();
}

} // namespace sdrun
