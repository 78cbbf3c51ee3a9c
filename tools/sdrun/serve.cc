// sdrun serve: the OpenAI API's completions and chat completions over HTTP,
// around the runtime's generator (server.h), batching the requests of all
// clients into the plan's rows (sdc compile --kv-batch) as rows free up
// (continuous batching).
#include "commands.h"
#include "server.h"
#include <algorithm>
#include <cstdio>
#include <unistd.h>

namespace sdrun {
namespace {

const char *kServeUsage =
    "usage: sdrun serve PLAN.sdp [--tokenizer DIR] [--chat-template FILE] [--host ADDR] [--port N] [--served-model-name NAME] [--api-key KEY]\n"
    "                  [--lora-modules NAME=ADAPTER_DIR]... [--allow-runtime-lora-updating] [--tool-call-parser NAME]\n"
    "                  [--seed S] [--request-timeout SECONDS] [--keep-alive SECONDS] [--speculate N [--speculate-always] [--draft PLAN]]\n"
    "                  [--adapter DIR] [--adapter-rank K]\n"
    "                  [--threads N]\n"
    "                  [--device cpu|cuda|auto] [--no-cuda-graphs] [--no-cpu-fallback] [--cpu-ops OP,...]\n"
    "\n"
    "Serves the plan's model with the OpenAI API, as vLLM and llama.cpp's server do:\n"
    "  POST /v1/completions        prompt (text, texts, or token ids), max_tokens (16),\n"
    "                              temperature (1), top_p (1), top_k (vLLM's; all), seed,\n"
    "                              stop, n, echo, stream, presence_penalty, frequency_penalty,\n"
    "                              logit_bias, repetition_penalty (vLLM's),\n"
    "                              logprobs K (echo with max_tokens 0 scores the prompt),\n"
    "                              response_format (vLLM's, as chat's); vLLM's guided_json,\n"
    "                              guided_regex, guided_choice, structured_outputs (both routes)\n"
    "  POST /v1/chat/completions   messages rendered with the tokenizer's chat template;\n"
    "                              max_tokens / max_completion_tokens (the room left in the\n"
    "                              context), logprobs / top_logprobs, response_format\n"
    "                              (text, json_object, json_schema), tools and tool_choice\n"
    "                              (none; auto with --tool-call-parser; required; a named\n"
    "                              function: generated under its parameters' schema),\n"
    "                              parallel_tool_calls, and the sampling fields\n"
    "  POST /v1/embeddings         input (text, texts, or token ids), encoding_format\n"
    "                              float|base64: served for an encoder plan, one whose infer\n"
    "                              entry gives a vector per row (examples/export_minilm.py)\n"
    "  GET  /v1/models, /health, /metrics (Prometheus: responses by status, prompt and\n"
    "                              generated tokens, choices running and waiting)\n"    "  POST /v1/load_lora_adapter, /v1/unload_lora_adapter  with --allow-runtime-lora-updating\n"
    "Streams are server-sent events ending in `data: [DONE]`. A stop text ends a\n"
    "choice and is left out of its text (finish_reason \"stop\", as at the\n"
    "tokenizer's EOS); max_tokens or a full context ends it with \"length\". A\n"
    "field the server does not implement is a 400 error naming it, never\n"
    "silently ignored. response_format json_object or json_schema constrains the\n"
    "text to compact JSON (any object, or one that follows the JSON Schema: its\n"
    "properties in order; a keyword the server cannot follow is a 400 naming it);\n"
    "a choice ends when its document is whole. Log-probabilities are\n"
    "the model's own: the softmax of its raw logits, before penalties, a logit\n"
    "bias, temperature, top-k or top-p.\n"
    "\n"
    "Requests from every client share the plan's rows: a plan compiled with\n"
    "--kv-cache L --kv-batch B generates for B choices at once and starts the next\n"
    "waiting one when a row frees (a new prompt goes to the row whose cache\n"
    "already holds most of it, so a continued chat re-reads only its new turn).\n"
    "Other plans generate one choice at a time over the infer entry's window.\n"
    "\n"
    "  --tokenizer DIR           a Hugging Face tokenizer.json (and its chat template);\n"
    "                            by default the one the plan carries (sdc compile\n"
    "                            --tokenizer), else the model must be byte-level (256 logits)\n"
    "  --chat-template FILE      a Jinja chat template instead of the tokenizer's\n"
    "  --host ADDR               the address to listen on (127.0.0.1; 0.0.0.0 for all)\n"
    "  --port N                  the port (8000; 0 picks a free one, printed at start)\n"
    "  --served-model-name NAME  the model id clients name (the plan's file name)\n"
    "  --lora-modules NAME=DIR   also serve the plan with this adapter as model NAME, as\n"
    "                            vLLM does (repeatable); each in its own session: its own\n"
    "                            rows and cache, the frozen weights shared; with a plan of\n"
    "                            adapter slots (sdc compile --max-loras N), all in one batch,\n"
    "                            each row with its own adapter (any rank up to the plan's),\n"
    "                            N at a time, swapped into slots as requests need them\n"
    "  --tool-call-parser NAME   how tool_choice \"auto\" (the default with tools) reads\n"
    "                            calls from a reply, as vLLM's parsers of those names do:\n"
    "                            hermes (<tool_call>{...}</tool_call>: Qwen2.5, Hermes),\n"
    "                            llama3_json (Llama 3.1's {\"name\", \"parameters\"}),\n"
    "                            mistral ([TOOL_CALLS][...]), granite (<|tool_call|>[...]),\n"
    "                            pythonic (Llama 3.2/4's [f(a=1), g()]); without it, auto\n"
    "                            is refused\n"
    "                            (\"required\" and a named function are generated under\n"
    "                            their schemas)\n"
    "  --allow-runtime-lora-updating  a plan of adapter slots: POST /v1/load_lora_adapter\n"
    "                            {\"lora_name\", \"lora_path\"} adds an adapter from a folder on this\n"
    "                            machine as a model, /v1/unload_lora_adapter {\"lora_name\"} removes\n"
    "                            one no request is using (vLLM's API; the API key applies)\n"
    "  --api-key KEY             requests must carry Authorization: Bearer KEY (not /health,\n"
    "                            /metrics)\n"
    "  --seed S                  draws of requests without a seed come from S (0)\n"
    "  --request-timeout S       a client that sends no whole request in S seconds\n"
    "                            gets 408 (30)\n"
    "  --keep-alive S            a connection waits this long for the client's next\n"
    "                            request, as HTTP/1.1 clients expect (5; 0: each response\n"
    "                            closes it); streams are sent chunked so it can stay\n"
    "  --speculate N             guess up to N tokens a step from the text so far (prompt\n"
    "                            lookup) and check them in the same call, for a plan\n"
    "                            compiled with --speculate K (default K; 0: off), when the\n"
    "                            guesses that held and the measured costs say it pays: the\n"
    "                            same tokens, more of them a step when the text repeats\n"
    "  --speculate-always        check every guess, whatever the costs say (to compare)\n"    "  --draft PLAN              guess with a smaller model's greedy tokens instead (a plan\n"
    "                            compiled with --kv-cache from a model of the same tokenizer,\n"
    "                            as many --kv-batch rows and as long a cache)\n"
    "Ctrl-C (SIGINT) or SIGTERM stops the server.\n";

} // namespace

int openServed(const Flags &f, const sd::SessionOptions &so, ServedSetup &s) {
  std::string err;
  GenerationSetup &g = s.g;
  std::string model = flagValue(f, "--served-model-name");
  if (model.empty()) {
    model = f.plan.substr(f.plan.find_last_of('/') + 1);
    if (model.size() > 4 && model.compare(model.size() - 4, 4, ".sdp") == 0) model.resize(model.size() - 4);
  }
  sd::generate::SamplingOptions sampling;
  auto planFile = sd::Plan::loadFile(f.plan);
  if (!planFile.isOk()) return fail(planFile.status().message());
  g.plan = std::move(planFile.value());
  // An encoder (no decode entries; its infer entry gives one vector per row,
  // and not class logits) serves /v1/embeddings; anything else generates.
  const bool encoder = s.encoder =
      !isClassifier(*g.plan) &&
      std::none_of(g.plan->entries.begin(), g.plan->entries.end(),
                   [](const sd::EntryDesc &e) { return e.name == "prefill" || e.name == "decode"; }) &&
      std::any_of(g.plan->entries.begin(), g.plan->entries.end(), [](const sd::EntryDesc &e) {
        return e.name == "infer" && !e.outputs.empty() && e.buffers[size_t(e.outputs[0].second)].dims.size() == 2;
      });
  std::vector<ServedModel> &models = s.models;
  models.resize(1);
  models[0].name = model;
  // Each model: a session on the one plan (its adapter), with a generator or an embedder.
  auto open = [&](ServedModel &m, const std::string &adapter) -> int {
    auto session = openSession(f, g.plan, adapter, so);
    if (!session.isOk()) return fail((m.name == model ? "" : "--lora-modules " + m.name + ": ") + session.status().message());
    m.session = std::move(session.value());
    if (encoder) {
      auto e = Embedder::create(*m.session);
      if (!e.isOk()) return fail(f.plan + ": " + e.status().message());
      m.embedder = std::move(e.value());
    } else {
      auto gen = sd::generate::Generator::create(*m.session, sampling);
      if (!gen.isOk()) return fail(f.plan + ": " + gen.status().message());
      m.generator = std::move(gen.value());
    }
    return 0;
  };
  if (encoder) {
    if (int rc = open(models[0], flagValue(f, "--adapter"))) return rc;
    std::string genConfig, genConfigName;
    auto tok = openTokenizer(f, *g.plan, genConfig, genConfigName);
    if (!tok.isOk()) return fail(tok.status().message());
    g.tokenizer = std::move(tok.value());
  } else { // the tokenizer, its stop ids and the text codec too
    if (int rc = openGeneration(f, so, sampling, true, g)) return rc;
    models[0].session = std::move(g.session);
    models[0].generator = std::move(g.gen);
  }
  // A plan of adapter slots: every --lora-modules adapter is read (and
  // checked) now, and goes into a slot of the first model's session when a
  // request for it takes a row.
  std::unique_ptr<sd::LoraSlots> &loraSlots = s.loraSlots;
  std::vector<sd::SlotAdapter> &slotAdapters = s.slotAdapters;
  slotAdapters.resize(1);
  if (!encoder && sd::loraSlotCount(*g.plan) > 0) {
    auto slots = sd::LoraSlots::create(*models[0].session);
    if (!slots.isOk()) return fail(f.plan + ": " + slots.status().message());
    loraSlots = std::move(slots.value());
  }
  if (hasFlag(f, "--lora-modules"))
    for (const std::string &spec : f.values.at("--lora-modules")) {
      const size_t eq = spec.find('=');
      ServedModel m;
      m.name = spec.substr(0, eq);
      if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
        return fail("--lora-modules '" + spec + "': expected NAME=ADAPTER_DIR");
      for (const ServedModel &o : models)
        if (o.name == m.name) return fail("--lora-modules: the model name '" + m.name + "' is taken twice");
      if (loraSlots) {
        auto adapter = loraSlots->read(spec.substr(eq + 1));
        if (!adapter.isOk()) return fail("--lora-modules " + m.name + ": " + adapter.status().message());
        m.adapter = slotAdapters.size();
        slotAdapters.push_back(std::move(adapter.value()));
      } else if (int rc = open(m, spec.substr(eq + 1))) {
        return rc;
      }
      models.push_back(std::move(m));
    }
  s.toolParser = flagValue(f, "--tool-call-parser");
  if (!s.toolParser.empty() && !openai::callParser(s.toolParser))
    return fail("--tool-call-parser '" + s.toolParser + "': the parsers are hermes (<tool_call> tags: Qwen2.5, Hermes), "
                "llama3_json (Llama 3.1's JSON calls), mistral ([TOOL_CALLS]), granite (<|tool_call|>) and "
                "pythonic (Llama 3.2/4's Python calls)");
  if (encoder && hasFlag(f, "--speculate")) return fail("--speculate: an encoder plan serves embeddings, not generation");
  if (!encoder && !speculateFlag(f, *models[0].generator, s.speculate, err)) return fail(err);
  if (encoder && hasFlag(f, "--draft")) return fail("--draft: an encoder plan serves embeddings, not generation");
  if (!encoder)
    if (int rc = openDraft(f, so, s.speculate, *models[0].generator, g)) return rc;
  return 0;
}

int serveCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args, {"--tokenizer", "--chat-template", "--host", "--port", "--served-model-name", "--lora-modules", "--api-key", "--seed",
                         "--request-timeout", "--keep-alive", "--tool-call-parser", "--speculate", "--draft",
                         "--adapter", "--adapter-rank", "--threads", "--device", "--cpu-ops"},
                  f, err, {"--no-cuda-graphs", "--no-cpu-fallback", "--speculate-always",
                           "--allow-runtime-lora-updating"})) {
    if (!f.help) return fail(err + " (see sdrun serve --help)");
  }
  if (f.help) return std::fputs(kServeUsage, stdout), 0;
  int64_t port, seed;
  ServerOptions o;
  sd::SessionOptions so;
  if (!intFlag(f, "--port", 8000, 0, 65535, port, err) || !intFlag(f, "--seed", 0, 0, INT64_MAX, seed, err) ||
      !numberFlag(f, "--request-timeout", 30, 0.1, 86400, o.requestTimeout, err) ||
      !numberFlag(f, "--keep-alive", 5, 0, 86400, o.keepAlive, err) || !sessionFlags(f, so, err))
    return fail(err);
  o.seed = uint64_t(seed);
  o.apiKey = flagValue(f, "--api-key");
  o.speculateAlways = hasFlag(f, "--speculate-always");
  ServedSetup s;
  if (int rc = openServed(f, so, s)) return rc;
  std::vector<ServedModel> &models = s.models;
  const bool encoder = s.encoder;
  const size_t speculate = s.speculate, adapters = s.slotAdapters.empty() ? 0 : s.slotAdapters.size() - 1;
  const std::string host = flagValue(f, "--host", "127.0.0.1");
  int fd = http::listenOn(host, int(port), err);
  if (fd < 0) return fail(err);
  Server server(s, o);
  if (hasFlag(f, "--allow-runtime-lora-updating")) {
    if (encoder || !models[0].generator->adapterSlots()) {
      ::close(fd);
      return fail("--allow-runtime-lora-updating loads adapters into a plan of adapter slots (sdc compile "
                  "--max-loras N); this plan has none");
    }
    server.allowLoraUpdating();
  }
  const std::string names = modelNames(models);
  const char *where = host.find(':') != std::string::npos ? "[%s]" : "%s";
  char address[300];
  std::snprintf(address, sizeof address, where, host.c_str());
  if (encoder) {
    std::fprintf(stderr, "sdrun: serving %s embeddings (%lld numbers, inputs up to %lld tokens) on http://%s:%d/v1; "
                         "Ctrl-C stops\n",
                 names.c_str(), (long long)models[0].embedder->dim(), (long long)models[0].embedder->maxTokens(),
                 address, http::boundPort(fd));
  } else {
    const sd::generate::Generator &gen = *models[0].generator;
    std::fprintf(stderr,
                 "sdrun: serving %s on http://%s:%d/v1 (%lld row%s at a time%s, context %lld tokens%s%s%s); "
                 "Ctrl-C stops\n",
                 names.c_str(), address, http::boundPort(fd), (long long)gen.batchSize(), gen.batchSize() == 1 ? "" : "s",
                 models.size() > 1 && !gen.adapterSlots() ? " each" : "", (long long)models[0].batcher->context(),
                 gen.cached() ? "" : ", a sliding window",
                 speculate ? (", up to " + std::to_string(speculate) + " guessed tokens a step").c_str() : "",
                 gen.adapterSlots() ? (", " + std::to_string(adapters) + " adapter" + (adapters == 1 ? "" : "s") +
                                       " in " + std::to_string(gen.adapterSlots()) + " slot" +
                                       (gen.adapterSlots() == 1 ? "" : "s") + ", any row any adapter")
                                          .c_str()
                                    : "");
  }
  int rc = server.run(fd);
  ::close(fd);
  return rc;
}

} // namespace sdrun
