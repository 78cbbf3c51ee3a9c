// The C API's generation: one text at a time (sd_generator_next/generate),
// many through the plan's rows (sd_generator_generate_batch, with adapter
// slots), and a draft model's guesses.
#include "handles.h"
#include "sd/generate/continue_rows.h"
#include <algorithm>

using namespace sd::capi;

namespace {

// The single-text calls go through row 0 with the plan's own adapter (a batch may have left another there).
sd_status *planOwnAdapter(sd_generator &g) {
  if (g.generator->adapterSlots() == 0) return nullptr;
  return fromStatus(g.generator->setRowAdapter(0, 0));
}

// Checks a batch's texts; an error names the first bad one (1-based).
sd_status *checkTexts(const sd::generate::Generator &g, const int64_t *tokens, const size_t *offsets, size_t n) {
  if (offsets[0] != 0) return invalid("offsets[0] is " + std::to_string(offsets[0]) + ", not 0");
  for (size_t i = 0; i < n; ++i) {
    if (offsets[i + 1] <= offsets[i])
      return invalid("text " + std::to_string(i + 1) + " has no tokens (offsets must increase)");
    const size_t length = offsets[i + 1] - offsets[i];
    if (!g.promptFits(length))
      return invalid("text " + std::to_string(i + 1) + " is " + std::to_string(length) +
                     " tokens, the plan's context is " + std::to_string(g.contextRoom()));
    for (size_t k = offsets[i]; k < offsets[i + 1]; ++k)
      if (tokens[k] < 0 || tokens[k] >= g.vocabSize())
        return invalid("text " + std::to_string(i + 1) + " has token " + std::to_string(tokens[k]) +
                       ", outside the vocabulary of " + std::to_string(g.vocabSize()));
  }
  return nullptr;
}

} // namespace

extern "C" {

sd_status *sd_generator_create(sd_session *session, double temperature, int64_t top_k, uint64_t seed,
                               sd_generator **out) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(session, "session");
    SD_REQUIRE(out, "out");
    *out = nullptr;
    sd::generate::SamplingOptions opts;
    opts.temperature = temperature;
    opts.topK = top_k;
    opts.seed = seed;
    auto g = sd::generate::Generator::create(*session->session, opts);
    if (!g.isOk()) return fromStatus(g.status(), SD_INVALID_ARGUMENT);
    *out = new sd_generator{std::move(g.value()), session->session.get(), opts, nullptr, nullptr};
    return nullptr;
  });
}
void sd_generator_free(sd_generator *generator) { delete generator; }
int64_t sd_generator_vocab_size(const sd_generator *generator) { return generator ? generator->generator->vocabSize() : 0; }

int64_t sd_generator_speculation(const sd_generator *generator) {
  return generator ? generator->generator->speculation() : 0;
}

sd_status *sd_generator_generate(sd_generator *generator, const int64_t *tokens, size_t n, size_t max_new,
                                 size_t speculate, int64_t *out) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(generator, "generator");
    if (n) SD_REQUIRE(tokens, "tokens");
    if (max_new) SD_REQUIRE(out, "out");
    std::vector<int64_t> all(tokens, tokens + n);
    if (sd_status *s = planOwnAdapter(*generator)) return s;
    sd::Status s = generator->generator->generate(all, int64_t(max_new), {}, speculate, generator->draft.get());
    if (!s.isOk()) return fromStatus(s, SD_INVALID_ARGUMENT);
    std::copy(all.begin() + long(n), all.end(), out);
    return nullptr;
  });
}

sd_status *sd_generator_next(sd_generator *generator, const int64_t *tokens, size_t n, int64_t *next) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(generator, "generator");
    SD_REQUIRE(next, "next");
    if (n) SD_REQUIRE(tokens, "tokens");
    if (sd_status *s = planOwnAdapter(*generator)) return s;
    auto t = generator->generator->next(std::vector<int64_t>(tokens, tokens + n));
    if (!t.isOk()) return fromStatus(t.status(), SD_INVALID_ARGUMENT);
    *next = t.value();
    return nullptr;
  });
}

int64_t sd_generator_batch_size(const sd_generator *generator) {
  return generator ? generator->generator->batchSize() : 0;
}

int64_t sd_generator_adapter_slots(const sd_generator *generator) {
  return generator ? generator->generator->adapterSlots() : 0;
}

sd_status *sd_generator_load_adapter(sd_generator *generator, int64_t slot, const char *dir) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(generator, "generator");
    SD_REQUIRE(dir, "dir");
    if (!generator->slots) {
      auto slots = sd::LoraSlots::create(*generator->session);
      if (!slots.isOk()) return fromStatus(slots.status(), SD_INVALID_ARGUMENT);
      generator->slots = std::move(slots.value());
    }
    if (slot < 0 || slot > generator->slots->count())
      return invalid("adapter slot " + std::to_string(slot) + " is outside the plan's 0 to " +
                     std::to_string(generator->slots->count()));
    auto adapter = generator->slots->read(dir);
    if (!adapter.isOk()) return fromStatus(adapter.status(), SD_INVALID_ARGUMENT);
    if (sd_status *s = fromStatus(generator->slots->write(slot, adapter.value()))) return s;
    generator->generator->adapterRewritten(slot);
    return nullptr;
  });
}

sd_status *sd_generator_set_draft(sd_generator *generator, sd_generator *draft) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(generator, "generator");
    if (draft == generator) return invalid("a generator cannot be its own draft (make a second one)");
    generator->draft.reset();
    if (!draft) return nullptr;
    if (generator->generator->speculation() == 0)
      return invalid("the plan has no verify entry to check a draft's guesses (compile it with sdc compile --speculate K)");
    auto d = sd::generate::DraftModel::create(*draft->generator, *generator->generator);
    if (!d.isOk()) return fromStatus(d.status(), SD_INVALID_ARGUMENT);
    generator->draft = std::move(d.value());
    return nullptr;
  });
}

void sd_generate_options_init(sd_generate_options *options) {
  if (!options) return;
  *options = sd_generate_options{};
  options->max_new = 64;
}

sd_status *sd_generator_generate_batch(sd_generator *generator, const int64_t *tokens, const size_t *offsets,
                                       size_t n_texts, const sd_generate_options *options, int64_t *out,
                                       size_t *counts) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(generator, "generator");
    SD_REQUIRE(offsets, "offsets");
    SD_REQUIRE(options, "options");
    if (!n_texts) return nullptr;
    SD_REQUIRE(tokens, "tokens");
    SD_REQUIRE(counts, "counts");
    if (options->max_new) SD_REQUIRE(out, "out");
    if (options->n_stop_ids) SD_REQUIRE(options->stop_ids, "options->stop_ids");
    sd::generate::Generator &g = *generator->generator;
    if (int64_t(options->speculate) > g.speculation())
      return invalid("speculation of " + std::to_string(options->speculate) + " tokens a step, but the plan checks " +
                     std::to_string(g.speculation()) + " (sdc compile --speculate)");
    if (sd_status *s = checkTexts(g, tokens, offsets, n_texts)) return s;
    sd::generate::RowsOptions rows;
    rows.maxNew = int64_t(options->max_new);
    rows.stopIds.insert(options->stop_ids, options->stop_ids + options->n_stop_ids);
    if (options->slots) rows.slots.assign(options->slots, options->slots + n_texts);
    std::vector<std::vector<int64_t>> texts(n_texts);
    std::vector<sd::generate::RowSampler> samplers;
    for (size_t i = 0; i < n_texts; ++i) {
      texts[i].assign(tokens + offsets[i], tokens + offsets[i + 1]);
      sd::generate::SamplingOptions o = generator->sampling;
      o.seed = generator->sampling.seed + i; // each text its own draws, as sdrun generate's --prompt rows
      samplers.emplace_back(o);
      counts[i] = 0;
    }
    sd::generate::Speculator speculator(options->speculate, size_t(g.batchSize()), false, generator->draft.get());
    sd::generate::RowCallbacks callbacks;
    callbacks.tokens = [&](size_t i) -> const std::vector<int64_t> & { return texts[i]; };
    callbacks.take = [&](size_t i, int64_t t) {
      texts[i].push_back(t);
      out[i * options->max_new + counts[i]++] = t;
      return false;
    };
    auto done = sd::generate::continueRows(g, n_texts, rows, samplers, speculator, callbacks);
    return done.isOk() ? nullptr : fromStatus(done.status(), SD_INVALID_ARGUMENT);
  });
}

} // extern "C"
