// Continuous batching of a served model's choices into the plan's rows.
#include "batcher.h"
#include <algorithm>

namespace sdrun {

Batcher::Batcher(sd::generate::Generator &gen, const TextCodec &codec, Events events, size_t speculate,
                 bool speculateAlways, sd::generate::DraftModel *draft)
    : gen_(gen), codec_(codec), events_(std::move(events)),
      speculator_(speculate, size_t(gen.batchSize()), speculateAlways, draft) {
  slots_.resize(size_t(gen.batchSize()));
  samplers_.resize(slots_.size());
  rowSlots_.assign(slots_.size(), 0);
}

void Batcher::serveAdapters(std::unique_ptr<sd::LoraSlots> slots, std::vector<sd::SlotAdapter> adapters) {
  loraSlots_ = std::move(slots);
  adapters_ = std::move(adapters);
  slotHolds_.assign(size_t(loraSlots_->count() + 1), SIZE_MAX);
  slotHolds_[0] = 0;
  slotUsed_.assign(slotHolds_.size(), 0);
}

sd::StatusOr<size_t> Batcher::addAdapter(const std::string &dir) {
  if (!loraSlots_) return sd::sdError("the plan has no adapter slots (sdc compile --max-loras)");
  auto adapter = loraSlots_->read(dir);
  if (!adapter.isOk()) return adapter.status();
  adapters_.push_back(std::move(adapter.value()));
  return adapters_.size() - 1;
}

void Batcher::dropAdapter(size_t index) {
  if (index == 0 || index >= adapters_.size()) return;
  adapters_[index] = sd::SlotAdapter();
  for (size_t k = 1; k < slotHolds_.size(); ++k)
    if (slotHolds_[k] == index) slotHolds_[k] = SIZE_MAX, slotUsed_[k] = 0; // empty: the next adapter goes here
}

sd::StatusOr<int64_t> Batcher::slotFor(size_t adapter) {
  if (adapter == 0 || !loraSlots_) return int64_t(0);
  auto inUse = [&](size_t k) {
    for (size_t b = 0; b < slots_.size(); ++b)
      if (slots_[b].first && rowSlots_[b] == int64_t(k)) return true;
    return false;
  };
  // Its own slot, else the one a row took longest ago (an empty one: never), none in use.
  int64_t best = -1;
  for (size_t k = 1; k < slotHolds_.size(); ++k) {
    if (slotHolds_[k] == adapter) return int64_t(k);
    if (!inUse(k) && (best < 0 || slotUsed_[k] < slotUsed_[size_t(best)])) best = int64_t(k);
  }
  if (best < 0) return best;
  slotHolds_[size_t(best)] = SIZE_MAX; // empty until written whole
  slotUsed_[size_t(best)] = 0;
  SD_RETURN_IF_ERROR(loraSlots_->write(best, adapters_[adapter]));
  gen_.adapterRewritten(best);
  slotHolds_[size_t(best)] = adapter;
  ++adapterLoads_;
  return best;
}

void Batcher::admit() {
  auto freeRow = [&] { return std::any_of(slots_.begin(), slots_.end(), [](const Slot &s) { return !s.first; }); };
  std::vector<Choice *> passed; // waiting ahead of the next one taken, for want of a slot
  for (auto it = waiting_.begin(); it != waiting_.end() && freeRow();) {
    const std::shared_ptr<Job> job = it->first;
    Choice &ch = job->choices[it->second];
    auto slot = slotFor(ch.adapter);
    if (!slot.isOk()) { // its adapter could not be written: this request fails, the others go on
      cancel(*job);
      events_.failed(*job, slot.status().message());
      passed.clear(); // (they may have been the cancelled job's)
      it = waiting_.begin();
      continue;
    }
    if (slot.value() < 0) { // every slot serves running rows of other adapters
      if (ch.passedOver >= 2 * slots_.size()) return; // it has waited long enough: its slot drains
      passed.push_back(&ch);
      ++it;
      continue;
    }
    for (Choice *p : passed) ++p->passedOver;
    // The free row whose cache holds most of the prompt (through this adapter).
    size_t best = SIZE_MAX, most = 0;
    for (size_t b = 0; b < slots_.size(); ++b) {
      if (slots_[b].first) continue;
      const size_t held = gen_.cachedPrefix(b, ch.row.tokens, slot.value());
      if (best == SIZE_MAX || held > most) best = b, most = held;
    }
    (void)gen_.setRowAdapter(best, slot.value()); // in range: slotFor gives the plan's slots
    rowSlots_[best] = slot.value();
    if (loraSlots_) slotUsed_[size_t(slot.value())] = ++clock_;
    slots_[best] = *it;
    samplers_[best] = ch.sampler;
    speculator_.restart(best);
    it = waiting_.erase(it);
  }
}

int64_t Batcher::context() const { return gen_.contextRoom(); }

void Batcher::add(const std::shared_ptr<Job> &job) {
  for (size_t i = 0; i < job->choices.size(); ++i) waiting_.emplace_back(job, i);
}

void Batcher::cancel(Job &job) {
  if (job.finished == job.choices.size()) return;
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), [&](const Slot &s) { return s.first.get() == &job; }),
                 waiting_.end());
  for (Slot &s : slots_)
    if (s.first.get() == &job) s = Slot();
  job.finished = job.choices.size();
}

bool Batcher::busy() const {
  return !waiting_.empty() || std::any_of(slots_.begin(), slots_.end(), [](const Slot &s) { return bool(s.first); });
}

size_t Batcher::waiting(size_t model) const {
  return size_t(std::count_if(waiting_.begin(), waiting_.end(),
                              [&](const Slot &s) { return model == SIZE_MAX || s.first->model == model; }));
}

size_t Batcher::running(size_t model) const {
  return size_t(std::count_if(slots_.begin(), slots_.end(), [&](const Slot &s) {
    return s.first && (model == SIZE_MAX || s.first->model == model);
  }));
}

// A token's log-probabilities as shown; `tokens[0:at]` are the tokens before it.
openai::LogprobEntry Batcher::entry(const sd::generate::TokenLogprobs &lp, const std::vector<int64_t> &tokens,
                                    size_t at) const {
  const std::vector<int64_t> before(tokens.begin() + long(at - std::min<size_t>(at, 4)), tokens.begin() + long(at));
  std::vector<int64_t> ids = {lp.token}; // the drawn token, then the likeliest
  for (const auto &top : lp.top) ids.push_back(top.first);
  const std::vector<std::string> texts = tokenTexts(codec_, before, ids);
  openai::LogprobEntry e;
  e.token = texts[0];
  e.logprob = lp.logprob;
  for (size_t k = 0; k < lp.top.size(); ++k) e.top.emplace_back(texts[k + 1], lp.top[k].second);
  return e;
}

void Batcher::endChoice(Job &job, size_t index, const std::string &reason, bool byStopText) {
  Choice &ch = job.choices[index];
  if (!byStopText) finishRow(ch.row, codec_); // text held back for a stop text that never came
  ch.row.done = true;
  ch.finish = reason;
  events_.text(job, index, ch.row.shown, reason);
  ch.row.shown.clear();
  if (++job.finished == job.choices.size()) events_.done(job);
}

void Batcher::step() {
  admit();
  std::vector<std::vector<int64_t>> rows(slots_.size());
  std::vector<size_t> rooms(slots_.size(), 0);
  for (size_t b = 0; b < slots_.size(); ++b)
    if (slots_[b].first) {
      const Choice &ch = slots_[b].first->choices[slots_[b].second];
      rows[b] = ch.row.tokens;
      rooms[b] = room(ch, samplers_[b]);
    }
  const auto guesses = speculator_.guess(rows, rooms, gen_.verifyCost(), gen_.decodeSeconds());
  auto next = guesses.isOk() ? gen_.nextBatch(rows, samplers_, guesses.value())
                             : sd::StatusOr<std::vector<std::vector<int64_t>>>(guesses.status());
  if (!next.isOk()) { // NaN logits, a device failure: every running request fails
    std::vector<std::shared_ptr<Job>> jobs;
    for (const Slot &s : slots_)
      if (s.first && std::find(jobs.begin(), jobs.end(), s.first) == jobs.end()) jobs.push_back(s.first);
    for (const auto &job : jobs) {
      cancel(*job);
      events_.failed(*job, next.status().message());
    }
    return;
  }
  speculator_.drawn(next.value());
  for (size_t b = 0; b < slots_.size(); ++b) {
    if (!slots_[b].first) continue;
    const Slot slot = slots_[b];
    Job &job = *slot.first;
    Choice &ch = job.choices[slot.second];
    const std::vector<int64_t> &drawn = next.value()[b];
    sd::generate::RowSampler &sampler = samplers_[b];
    if (job.logprobs >= 0 && job.echo && ch.generated == 0) { // the echoed prompt's scores, its first token none
      openai::LogprobEntry first;
      first.token = tokenTexts(codec_, {}, {ch.row.tokens[0]})[0];
      first.known = false;
      ch.logprobs.push_back(first);
      for (size_t i = 0; i < sampler.prompt.size(); ++i)
        ch.logprobs.push_back(entry(sampler.prompt[i], ch.row.tokens, i + 1));
      sampler.prompt.clear();
    }
    if (ch.maxNew == 0) { // the prompt only scored
      slots_[b] = Slot();
      endChoice(job, slot.second, "length", false);
      continue;
    }
    std::string reason;
    bool byStopText = false, failed = false;
    for (size_t i = 0; i < drawn.size() && reason.empty(); ++i) {
      if (drawn[i] == sd::generate::kNoAllowedToken) { // this request's schema is at a dead end; the others go on
        cancel(job);
        events_.failed(job, "no token of the model's vocabulary can continue the text as the request's schema "
                            "(response_format, or a tool's parameters) asks (after " +
                                std::to_string(ch.generated) + " generated tokens)");
        failed = true;
        break;
      }
      reason = take(job, ch, drawn[i], sampler, i, byStopText);
    }
    if (failed) continue;
    if (reason.empty()) {
      events_.text(job, slot.second, ch.row.shown, "");
      ch.row.shown.clear();
      continue;
    }
    slots_[b] = Slot();
    endChoice(job, slot.second, reason, byStopText);
  }
}

// How many tokens may be guessed after the choice's text: one less than it
// has left (the step draws one more); none while its prompt is scored.
size_t Batcher::room(const Choice &ch, const sd::generate::RowSampler &sampler) const {
  if (ch.maxNew == 0 || sampler.scorePrompt) return 0;
  const int64_t left = std::min(ch.maxNew - ch.generated, context() - int64_t(ch.row.tokens.size())) - 1;
  return left > 0 ? size_t(left) : 0;
}

std::string Batcher::take(Job &job, Choice &ch, int64_t t, const sd::generate::RowSampler &sampler, size_t drawn,
                          bool &byStopText) {
  ch.generated++;
  if (codec_.stopIds.count(t)) return "stop"; // an EOS: not in the text, nor in the logprobs
  if (job.logprobs >= 0) ch.logprobs.push_back(entry(sampler.drawn[drawn], ch.row.tokens, ch.row.tokens.size()));
  if (appendToken(ch.row, t, codec_, job.stop, StopText::Cut)) {
    byStopText = true;
    return "stop";
  }
  if (sampler.constraint && sampler.constraint->finished()) return "stop"; // its JSON document is whole
  if (ch.generated >= ch.maxNew || (gen_.cached() && int64_t(ch.row.tokens.size()) >= context())) return "length";
  return "";
}

} // namespace sdrun
