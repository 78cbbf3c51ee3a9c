// The OpenAI API server (server.h): routes, responses and streams, and the
// event loop of sdrun serve. One thread accepts connections, reads requests
// as their bytes come, and between reads generates one token for every
// running choice at once.
#include "server.h"
#include "commands.h"
#include "tool_calls.h"
#include "sd/generate/regex_constraint.h"
#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace sdrun {
namespace {

volatile std::sig_atomic_t gStop = 0;
void onStopSignal(int) { gStop = 1; }

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr size_t kMaxConnections = 256;
// Bytes kept from a client beyond its request (a pipelined next one).
const size_t kMaxBuffered = http::Limits().maxHeader + http::Limits().maxBody + 4;
constexpr size_t kMaxPendingOutput = 64u << 20; // a client this far behind its stream is dropped
constexpr double kWriteStall = 60;              // seconds without a byte accepted: dropped

} // namespace

std::string modelNames(const std::vector<ServedModel> &models) {
  std::string names;
  for (const ServedModel &m : models)
    if (!m.name.empty()) names += (names.empty() ? "'" : ", '") + m.name + "'";
  return names;
}

Server::Server(ServedSetup &s, const ServerOptions &o)
    : g_(s.g), models_(s.models), apiKey_(o.apiKey), seeds_(o.seed), requestTimeout_(o.requestTimeout),
      keepAlive_(o.keepAlive), created_(int64_t(std::time(nullptr))), toolParser_(s.toolParser) {
  Batcher::Events events;
  events.text = [this](Job &job, size_t i, const std::string &text, const std::string &finish) {
    emit(job, i, text, finish);
  };
  events.done = [this](Job &job) { finishJob(job); };
  events.failed = [this](Job &job, const std::string &message) { failJob(job, message); };
  for (ServedModel &m : models_)
    if (m.generator)
      m.batcher = std::make_shared<Batcher>(*m.generator, g_.codec, events, s.speculate, o.speculateAlways,
                                            g_.draft.get());
    else if (m.adapter) m.batcher = models_[0].batcher;
  if (s.loraSlots) models_[0].batcher->serveAdapters(std::move(s.loraSlots), std::move(s.slotAdapters));
}

void Server::log(const std::string &peer, const std::string &what) {
  if (logRequests_) std::fprintf(stderr, "sdrun: serve: %s %s\n", peer.c_str(), what.c_str());
}

void Server::reply(Connection &c, int status, const std::string &body, const std::string &extraHeaders,
                   const char *contentType) {
  if (c.fd < 0) c.status = status, c.body = body; // a request without a socket
  else c.out += http::response(status, contentType, body, extraHeaders, c.keepAlive);
  c.complete = true;
  ++responses_[status];
}

// The end of a stream: its last chunk (chunked), or the connection's close.
void Server::endStream(Connection &c) {
  if (c.chunked) c.out += http::lastChunk();
  c.complete = true;
}

// Prometheus's text format, as vLLM's /metrics serves its counters.
std::string Server::metrics() const {
  std::string s = "# HELP sdrun_responses_total Responses sent, by HTTP status (a stream counts when it ends).\n"
                  "# TYPE sdrun_responses_total counter\n";
  for (const auto &[status, count] : responses_)
    s += "sdrun_responses_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(count) + "\n";
  auto counter = [&](const char *name, const char *help, uint64_t value) {
    s += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " +
         std::to_string(value) + "\n";
  };
  counter("sdrun_prompt_tokens_total", "Prompt tokens of finished requests.", promptTokens_);
  counter("sdrun_generation_tokens_total", "Tokens generated for finished requests.", generatedTokens_);
  counter("sdrun_embedding_inputs_total", "Inputs embedded.", embeddedInputs_);
  counter("sdrun_connections_total", "Connections accepted (a client keeping one open sends many requests on it).",
          connections_);
  uint64_t guessed = 0, confirmed = 0, adapterLoads = 0;
  for (Batcher *b : batchers()) guessed += b->guessed(), confirmed += b->confirmed(), adapterLoads += b->adapterLoads();
  counter("sdrun_spec_decode_draft_tokens_total", "Tokens guessed by prompt lookup (--speculate).", guessed);
  counter("sdrun_spec_decode_accepted_tokens_total", "Guessed tokens the model drew too (each a decode step saved).",
          confirmed);
  counter("sdrun_lora_slot_loads_total", "Adapters written into a slot of the plan (sdc compile --max-loras).",
          adapterLoads);
  for (const char *kind : {"running", "waiting"}) {
    s += std::string("# HELP sdrun_choices_") + kind + " Choices " +
         (kind[0] == 'r' ? "generating in a row" : "waiting for a row") + ", by model.\n# TYPE sdrun_choices_" + kind +
         " gauge\n";
    for (size_t i = 0; i < models_.size(); ++i)
      if (const ServedModel &m = models_[i]; m.batcher && !m.name.empty())
        s += std::string("sdrun_choices_") + kind + "{model=\"" + m.name + "\"} " +
             std::to_string(kind[0] == 'r' ? m.batcher->running(i) : m.batcher->waiting(i)) + "\n";
  }
  return s;
}

void Server::replyError(Connection &c, const openai::Error &e, const std::string &what) {
  reply(c, e.status, openai::errorJson(e));
  log(c.peer, what + " " + std::to_string(e.status) + ": " + e.message);
}

void Server::acceptAll(int listenFd) {
  while (conns_.size() < kMaxConnections) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    int fd = ::accept4(listenFd, reinterpret_cast<sockaddr *>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; // EAGAIN: none left; anything else: try on the next poll
    Connection c;
    c.fd = fd;
    char host[64] = "?";
    if (addr.ss_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in *>(&addr)->sin_addr, host, sizeof host);
    else if (addr.ss_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6 *>(&addr)->sin6_addr, host, sizeof host);
    c.peer = host;
    c.since = c.lastWrite = now();
    conns_.emplace(nextConn_++, std::move(c));
    ++connections_;
  }
}

void Server::drop(int id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (const auto &job = it->second.job; job && job->finished < job->choices.size()) {
    log(it->second.peer, "POST " + job->path + ": the client closed the connection; request cancelled");
    models_[job->model].batcher->cancel(*job);
  }
  ::close(it->second.fd);
  conns_.erase(it);
}

void Server::readFrom(int id, Connection &c) {
  char buf[16384];
  while (c.in.size() < kMaxBuffered) { // a pipelined request waits in `in` for the one before it
    ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, kMaxBuffered - c.in.size()), 0);
    if (n > 0) {
      c.in.append(buf, size_t(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      drop(id); // the client closed (or broke) the connection
      return;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
  }
  if (!c.job && !c.complete) parseInput(id, c);
}

// The request at the start of c.in, when it is all there.
void Server::parseInput(int id, Connection &c) {
  http::Request req;
  int status = 0;
  std::string error;
  switch (http::parseRequest(c.in, http::Limits(), req, status, error)) {
  case http::Parse::NeedMore: return;
  case http::Parse::HeadersDone:
    if (req.expectContinue && !c.continued) {
      c.out += "HTTP/1.1 100 Continue\r\n\r\n";
      c.continued = true;
    }
    return;
  case http::Parse::Bad: { // where the next request would start is unknown: the connection closes after
    openai::Error e;
    e.status = status;
    e.message = error;
    c.keepAlive = false;
    replyError(c, e, "(malformed request)");
    return;
  }
  case http::Parse::Complete:
    c.in.erase(0, req.length);
    c.keepAlive = keepAlive_ > 0 && req.keepAlive;
    c.chunked = c.keepAlive; // else a stream ends when the connection closes (HTTP/1.0 knows no chunks)
    handle(id, c, req);
    return;
  }
}

void Server::writeTo(int id, Connection &c) {
  while (!c.out.empty()) {
    ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(0, size_t(n));
      c.lastWrite = now();
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    drop(id); // EPIPE, ECONNRESET: the client is gone
    return;
  }
  if (!c.complete || (c.job && c.job->finished < c.job->choices.size())) return;
  if (!c.keepAlive) {
    ::shutdown(c.fd, SHUT_WR);
    drop(id);
    return;
  }
  c.job.reset(); // the response is sent: the connection waits for the next request
  c.complete = c.continued = false;
  c.since = now();
  ++c.served;
  if (!c.in.empty()) parseInput(id, c);
}

void Server::handle(int id, Connection &c, const http::Request &req) {
  const std::string what = req.method + " " + req.path;
  openai::Error err;
  const bool completions = req.path == "/v1/completions", chat = req.path == "/v1/chat/completions";
  const bool embeddings = req.path == "/v1/embeddings";
  const bool models = req.path == "/v1/models", health = req.path == "/health", metricsPath = req.path == "/metrics";
  const bool model = req.path.rfind("/v1/models/", 0) == 0;
  const bool load = req.path == "/v1/load_lora_adapter", unload = req.path == "/v1/unload_lora_adapter";
  if ((load || unload) && !loraUpdating_) {
    err.status = 404;
    err.message = req.path + ": adapters are loaded and unloaded at run time only with sdrun serve "
                  "--allow-runtime-lora-updating (on a plan of adapter slots, sdc compile --max-loras)";
    err.type = "not_found_error";
    return replyError(c, err, what);
  }
  if (!completions && !chat && !embeddings && !models && !health && !model && !metricsPath && !load && !unload) {
    err.status = 404;
    err.message = "no route " + req.path.substr(0, 200) +
                  " (POST /v1/completions, /v1/chat/completions, /v1/embeddings; GET /v1/models, /health, /metrics)";
    err.type = "not_found_error";
    return replyError(c, err, what);
  }
  if (!apiKey_.empty() && !health && !metricsPath) {
    const std::string *auth = req.header("authorization");
    if (!auth || *auth != "Bearer " + apiKey_) {
      err.status = 401;
      err.message = auth ? "the API key is wrong" : "an API key is needed (Authorization: Bearer KEY)";
      err.type = "authentication_error";
      err.code = "invalid_api_key";
      return replyError(c, err, what);
    }
  }
  const std::string allowed = completions || chat || embeddings || load || unload ? "POST" : "GET";
  if (req.method != allowed) {
    err.status = 405;
    err.message = req.path + " takes " + allowed + ", not " + req.method.substr(0, 20);
    reply(c, 405, openai::errorJson(err), "Allow: " + allowed + "\r\n");
    log(c.peer, what + " 405");
    return;
  }
  if (health) return reply(c, 200, "{\"status\":\"ok\"}");
  if (metricsPath) {
    return reply(c, 200, metrics(), "", "text/plain; version=0.0.4");
  }
  if (embeddings) return embed(c, req.body, what);
  if (load || unload) return updateAdapters(c, load, req.body, what);
  if (models) return reply(c, 200, "{\"object\":\"list\",\"data\":[" + modelsJson() + "]}");
  if (model) { // GET /v1/models/NAME: one the server has, named
    const std::string name = req.path.substr(11);
    const size_t served = name.empty() ? SIZE_MAX : findModel(name, err);
    if (served != SIZE_MAX) return reply(c, 200, openai::modelJson(models_[served].name, created_));
    if (name.empty()) modelNotFound(name, err);
    return replyError(c, err, what);
  }
  openai::Defaults defaults;
  defaults.sampling.temperature = 1.0; // OpenAI's defaults: the model's own distribution
  defaults.sampling.topK = 0;
  openai::GenerationRequest gr;
  if (!openai::parseRequest(req.body, chat, defaults, gr, err) || !startJob(id, c, gr, req.path, err))
    return replyError(c, err, what);
}

// The model a request names (none: the first), or SIZE_MAX with a 404 in `err`.
size_t Server::findModel(const std::string &name, openai::Error &err) const {
  for (size_t i = 0; i < models_.size(); ++i)
    if ((name.empty() && i == 0) || (!name.empty() && models_[i].name == name)) return i;
  modelNotFound(name, err);
  return SIZE_MAX;
}

void Server::modelNotFound(const std::string &name, openai::Error &err) const {
  err.status = 404;
  err.type = "not_found_error";
  err.code = "model_not_found";
  err.param = "model";
  err.message = "the model '" + name.substr(0, 200) + "' does not exist; this server has " + modelNames(models_);
}

// vLLM's runtime adapter API: {"lora_name", "lora_path"} adds a model served
// through the slots (its adapter read and checked now, between steps);
// {"lora_name"} removes one no request is using. The reply is plain text, as vLLM's.
void Server::updateAdapters(Connection &c, bool load, const std::string &body, const std::string &what) {
  openai::Error err;
  err.status = 400;
  auto fail = [&](const std::string &message, const std::string &param = "") {
    err.message = message;
    err.param = param;
    replyError(c, err, what);
  };
  Batcher *rows = models_[0].batcher.get();
  if (!rows || !rows->generator().adapterSlots())
    return fail("adapters are loaded at run time into a plan of adapter slots (sdc compile --max-loras); this "
                "plan has none");
  auto doc = sd::parseJson(body, "the request body");
  if (!doc.isOk() || doc.value().type != sd::Json::Type::Object)
    return fail(doc.isOk() ? "the request body must be a JSON object" : doc.status().message());
  for (const auto &[key, value] : doc.value().obj)
    if (key != "lora_name" && key != "lora_int_id" && (!load || key != "lora_path"))
      return fail("'" + key.substr(0, 100) + "' is not a field of " + (load ? "load" : "unload") +
                      "_lora_adapter (lora_name" + (load ? ", lora_path" : "") + ")",
                  key.substr(0, 100));
  const sd::Json *name = doc.value().get("lora_name"), *path = doc.value().get("lora_path");
  if (!name || name->type != sd::Json::Type::String || name->str.empty())
    return fail("lora_name must be a non-empty string", "lora_name");
  if (load && (!path || path->type != sd::Json::Type::String || path->str.empty()))
    return fail("lora_path must be a non-empty string (the adapter's folder on the server)", "lora_path");
  size_t at = SIZE_MAX;
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].name == name->str) at = i;
  if (load) {
    if (at != SIZE_MAX) return fail("the model '" + name->str + "' is already served", "lora_name");
    auto adapter = rows->addAdapter(path->str);
    if (!adapter.isOk()) return fail(adapter.status().message(), "lora_path");
    ServedModel m;
    m.name = name->str;
    m.batcher = models_[0].batcher;
    m.adapter = adapter.value();
    models_.push_back(std::move(m));
    reply(c, 200, "Success: LoRA adapter '" + name->str + "' added successfully.", "", "text/plain");
  } else {
    if (at == SIZE_MAX || !models_[at].adapter)
      return fail(at == SIZE_MAX ? "the model '" + name->str + "' does not exist; this server has " + modelNames(models_)
                                 : "'" + name->str + "' is the plan's own model, not an adapter loaded beside it",
                  "lora_name");
    if (size_t busy = rows->running(at) + rows->waiting(at))
      return fail("the model '" + name->str + "' has " + std::to_string(busy) + " choice" + (busy == 1 ? "" : "s") +
                      " generating or waiting; unload it once they end",
                  "lora_name");
    rows->dropAdapter(models_[at].adapter);
    models_[at].name.clear(); // its index stays taken: jobs name models by index
    models_[at].batcher.reset();
    reply(c, 200, "Success: LoRA adapter '" + name->str + "' removed successfully.", "", "text/plain");
  }
  log(c.peer, what + " 200: " + name->str);
}

// Embeddings are computed at once, between generation steps: an encoder runs
// each input once, with no rows to share.
void Server::embed(Connection &c, const std::string &body, const std::string &what) {
  openai::EmbeddingRequest req;
  openai::Error err;
  if (!openai::parseEmbeddingRequest(body, req, err)) return replyError(c, err, what);
  const size_t served = findModel(req.model, err);
  if (served == SIZE_MAX) return replyError(c, err, what);
  const ServedModel &m = models_[served];
  auto bad = [&](const std::string &msg, const std::string &param) {
    err.status = 400;
    err.message = msg;
    err.param = param;
    replyError(c, err, what);
  };
  if (!m.embedder) return bad("the model '" + m.name + "' generates text; it makes no embeddings", "model");
  if (req.dimensions >= 0 && req.dimensions != m.embedder->dim())
    return bad("this model's embeddings have " + std::to_string(m.embedder->dim()) + " numbers, not " +
                   std::to_string(req.dimensions),
               "dimensions");
  std::vector<std::vector<int64_t>> rows;
  int64_t tokens = 0;
  for (size_t i = 0; i < req.inputs.size(); ++i) {
    std::vector<int64_t> ids = req.inputs[i].ids;
    if (!req.inputs[i].isIds) {
      if (!g_.tokenizer) return bad("text input needs a tokenizer: start the server with --tokenizer DIR", "input");
      for (int32_t id : g_.tokenizer->encode(req.inputs[i].text)) ids.push_back(id);
    }
    if (ids.empty()) return bad("input " + std::to_string(i) + " gives no tokens", "input");
    tokens += int64_t(ids.size());
    rows.push_back(std::move(ids));
  }
  auto vectors = m.embedder->embed(rows);
  if (!vectors.isOk()) return bad(vectors.status().message(), "input");
  reply(c, 200, openai::embeddingsJson(m.name, vectors.value(), req.base64, tokens));
  embeddedInputs_ += rows.size();
  promptTokens_ += uint64_t(tokens);
  char done[96];
  std::snprintf(done, sizeof done, " 200 (%zu input%s, %lld tokens)", rows.size(), rows.size() == 1 ? "" : "s",
                (long long)tokens);
  log(c.peer, what + done);
}

// Tokenizes the request's prompts and queues one choice per prompt and n.
bool Server::startJob(int id, Connection &c, const openai::GenerationRequest &req, const std::string &path,
                      openai::Error &err) {
  auto bad = [&](int status, const std::string &msg, const std::string &param = "") {
    err.status = status;
    err.message = msg;
    err.param = param;
    return false;
  };
  const size_t served = findModel(req.model, err);
  if (served == SIZE_MAX) return false;
  if (!models_[served].batcher)
    return bad(400, "the model '" + models_[served].name + "' makes embeddings (POST /v1/embeddings), not text",
               "model");
  Batcher &batcher = *models_[served].batcher;
  sd::generate::Generator &gen = batcher.generator();
  std::vector<openai::Prompt> prompts = req.prompts;
  if (req.chat) {
    if (!g_.tokenizer)
      return bad(400, "this server has no tokenizer, so no chat template: start it with --tokenizer DIR", "messages");
    const bool tools = req.tools.type == sd::Json::Type::Array && !req.tools.arr.empty();
    auto rendered = g_.tokenizer->renderChat(req.messages, true, tools ? &req.tools : nullptr);
    if (!rendered.isOk()) return bad(400, rendered.status().message(), "messages");
    prompts = {{rendered.value(), {}, false}};
  }
  if (req.toolChoice == openai::ToolChoice::Auto && toolParser_.empty())
    return bad(400, "tool_choice \"auto\" (the default with tools) needs the server started with --tool-call-parser "
                    "(hermes, llama3_json, mistral, granite, pythonic); or send tool_choice \"none\", \"required\" or a named function",
               "tool_choice");
  if (req.toolChoice != openai::ToolChoice::None && req.logprobs >= 0)
    return bad(400, "logprobs beside tool calls are not supported", "logprobs");
  std::shared_ptr<const sd::generate::JsonGrammar> grammar = req.grammar;
  if (req.toolChoice == openai::ToolChoice::Named || req.toolChoice == openai::ToolChoice::Required) {
    auto calls = openai::toolGrammar(req); // the reply is the call, written under its schema
    if (!calls.isOk()) return bad(400, calls.status().message(), "tools");
    grammar = calls.value();
  }
  auto job = std::make_shared<Job>();
  job->conn = id;
  job->model = served;
  job->path = path;
  job->stream = req.stream;
  job->includeUsage = req.includeUsage;
  job->echo = req.echo;
  job->logprobs = req.logprobs;
  job->stop = req.stop;
  job->toolChoice = req.toolChoice;
  job->toolName = req.toolName;
  job->started = now();
  job->head = {(req.chat ? "chatcmpl-" : "cmpl-") + std::to_string(nextId_++), models_[served].name,
               int64_t(std::time(nullptr)),
               req.chat};
  for (const auto &[t, bias] : req.sampling.logitBias)
    if (t >= gen.vocabSize())
      return bad(400, "logit_bias names token " + std::to_string(t) + ", outside the model's vocabulary of " +
                          std::to_string(gen.vocabSize()),
                 "logit_bias");
  const int64_t context = batcher.context();
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<int64_t> ids = prompts[p].ids;
    if (!prompts[p].isIds) {
      auto enc = encodePrompt(g_.tokenizer.get(), gen.vocabSize(), prompts[p].text, req.chat);
      if (!enc.isOk()) return bad(400, enc.status().message(), req.chat ? "messages" : "prompt");
      ids = enc.value();
    }
    if (ids.empty()) return bad(400, "the prompt gives no tokens", req.chat ? "messages" : "prompt");
    for (int64_t t : ids)
      if (t >= gen.vocabSize())
        return bad(400, "token " + std::to_string(t) + " is outside the model's vocabulary of " +
                            std::to_string(gen.vocabSize()),
                   "prompt");
    // New tokens that fit: the cache's room after the prompt; a window slides
    // on, but holds the prompt only that long (a chat's default).
    if (int64_t(ids.size()) >= context)
      return bad(400, "the prompt is " + std::to_string(ids.size()) + " tokens; this model's context is " +
                          std::to_string(context) + " tokens",
                 req.chat ? "messages" : "prompt");
    const int64_t room = context - int64_t(ids.size());
    int64_t maxNew = req.maxTokens;
    if (maxNew < 0) maxNew = req.chat ? room : gen.cached() ? std::min<int64_t>(16, room) : 16;
    if (gen.cached() && maxNew > room)
      return bad(400, "this model's context is " + std::to_string(context) + " tokens; the prompt is " +
                          std::to_string(ids.size()) + ", so at most " + std::to_string(room) +
                          " new tokens fit, not max_tokens " + std::to_string(maxNew),
                 req.chat ? "max_completion_tokens" : "max_tokens");
    job->promptTokens += int64_t(ids.size()) * req.n;
    for (int64_t k = 0; k < req.n; ++k) {
      Choice ch;
      ch.row.tokens = ids;
      // A completion continues its prompt's text: a few tokens before the new
      // ones set the first one's spacing. A chat reply is decoded alone, as
      // transformers users decode the new tokens (and sdrun generate --chat).
      startRow(ch.row, g_.codec, req.chat ? 0 : 6);
      ch.maxNew = maxNew;
      sd::generate::SamplingOptions s = req.sampling;
      s.penaltyFrom = ids.size(); // presence and frequency count the generated tokens
      s.seed = req.seedGiven ? req.sampling.seed + uint64_t(p * size_t(req.n) + size_t(k)) : seeds_();
      ch.sampler = sd::generate::RowSampler(s);
      ch.sampler.topLogprobs = req.logprobs;
      ch.sampler.scorePrompt = req.echo && req.logprobs >= 0;
      if ((grammar || req.regex) && !tokens_) // every served model has the plan's vocabulary
        tokens_ = sd::generate::JsonVocabulary::make(tokenTable(g_, gen.vocabSize()));
      if (req.regex) ch.sampler.constraint = std::make_shared<sd::generate::RegexConstraint>(req.regex, tokens_);
      else if (grammar) ch.sampler.constraint = std::make_shared<sd::generate::JsonConstraint>(grammar, tokens_);
      if (req.toolChoice != openai::ToolChoice::None) ch.callId = newCallId();
      ch.adapter = models_[served].adapter;
      if (req.echo) ch.text = prompts[p].isIds ? g_.codec.decode(ids) : prompts[p].text;
      job->choices.push_back(std::move(ch));
    }
  }
  if (job->stream) { // a chat's role first; an echo goes with the first tokens (and the prompt's logprobs)
    c.out += http::eventStreamHead(c.chunked);
    for (size_t i = 0; req.chat && i < job->choices.size(); ++i) {
      c.out += http::event(openai::chunkJson(job->head, i, "", "", true), c.chunked);
      if (job->toolChoice == openai::ToolChoice::Named) // the call's id and name; its arguments stream after
        c.out += http::event(openai::toolCallChunkJson(job->head, i,
                                                       openai::toolCallsJson({{job->choices[i].callId, job->toolName, ""}}, true),
                                                       ""),
                             c.chunked);
    }
  }
  batcher.add(job);
  c.job = job;
  return true;
}

bool Server::busy() const {
  return std::any_of(models_.begin(), models_.end(),
                     [](const ServedModel &m) { return m.batcher && m.batcher->busy(); });
}

std::string Server::modelsJson() const {
  std::string s;
  for (const ServedModel &m : models_)
    if (!m.name.empty()) s += (s.empty() ? "" : ",") + openai::modelJson(m.name, created_);
  return s;
}

std::string Server::newCallId() {
  static const char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int k = 0; k < 24; ++k) id += kAlnum[seeds_() % 62];
  return id;
}

// A finished choice as the response gives it: its tool calls read from its
// text by the tool choice (a named call's arguments, "required"'s list, the
// --tool-call-parser's format), the text besides them as its content.
openai::ChoiceResult Server::result(const Job &job, const Choice &ch) {
  openai::ChoiceResult r{ch.text, ch.finish,
                         job.logprobs >= 0 ? openai::logprobsJson(job.head.chat, ch.logprobs, 0) : "null", {}};
  std::vector<openai::ToolCall> calls;
  std::string content;
  bool whole = true; // false: calls cut short (max_tokens), returned as far as they came, as a stream sends them
  switch (job.toolChoice) {
  case openai::ToolChoice::None: return r;
  case openai::ToolChoice::Named:
    r.toolCalls = {{ch.callId, job.toolName, ch.text}};
    r.text.clear();
    return r;
  case openai::ToolChoice::Required: {
    openai::RequiredCallReader reader;
    reader.feed(ch.text);
    if (reader.calls().empty()) return r; // cut before its first call's name: the text as it is
    calls = reader.calls();
    whole = reader.whole();
    break;
  }
  case openai::ToolChoice::Auto:
    if (!openai::callParser(toolParser_)(ch.text, calls, content)) return r;
    break;
  }
  for (size_t k = 0; k < calls.size(); ++k) calls[k].id = k ? newCallId() : ch.callId;
  r.toolCalls = std::move(calls);
  r.text = content;
  if (whole) r.finishReason = "tool_calls";
  return r;
}

void Server::emit(Job &job, size_t index, const std::string &text, const std::string &finish) {
  Choice &ch = job.choices[index];
  auto it = conns_.find(job.conn);
  if (job.stream && job.toolChoice == openai::ToolChoice::Named) { // the arguments as they come
    if (it == conns_.end()) return;
    if (!text.empty())
      it->second.out += http::event(
          openai::toolCallChunkJson(job.head, index, openai::toolCallsJson({{"", "", text}}, true, true), ""),
          it->second.chunked);
    if (!finish.empty()) it->second.out += http::event(openai::chunkJson(job.head, index, "", finish, false), it->second.chunked);
    return;
  }
  if (job.stream && job.toolChoice == openai::ToolChoice::Required) { // each call's name, then its arguments
    ch.text += text;
    for (const openai::RequiredCallReader::Piece &piece : ch.calls.feed(text)) {
      openai::ToolCall call{"", "", piece.text};
      if (piece.name) {
        ch.callIds.push_back(piece.call ? newCallId() : ch.callId);
        call = {ch.callIds.back(), piece.text, ""};
      }
      if (it != conns_.end())
        it->second.out += http::event(
            openai::toolCallChunkJson(job.head, index, openai::toolCallsJson({call}, true, !piece.name, piece.call), ""),
            it->second.chunked);
    }
    if (!finish.empty() && it != conns_.end())
      it->second.out += http::event(
          openai::chunkJson(job.head, index, "", ch.calls.whole() ? "tool_calls" : finish, false), it->second.chunked);
    return;
  }
  if (!job.stream || job.toolChoice != openai::ToolChoice::None) {
    // Kept whole: a response's text, or a stream whose calls are known at
    // its end (under auto, the text before where a call may begin streams
    // as content meanwhile).
    ch.text += text;
    if (!job.stream || it == conns_.end()) return;
    auto content = [&](size_t upTo) {
      if (upTo <= ch.sent) return;
      it->second.out += http::event(openai::chunkJson(job.head, index, ch.text.substr(ch.sent, upTo - ch.sent), "", false),
                                    it->second.chunked);
      ch.sent = upTo;
    };
    if (job.toolChoice == openai::ToolChoice::Auto) content(openai::callTextStart(toolParser_, ch.text));
    if (finish.empty()) return;
    const openai::ChoiceResult r = result(job, ch);
    if (r.toolCalls.empty()) content(ch.text.size());
    else if (r.text.size() > ch.sent && r.text.compare(0, ch.sent, ch.text, 0, ch.sent) == 0) content(r.text.size());
    if (!r.toolCalls.empty())
      it->second.out += http::event(openai::toolCallChunkJson(job.head, index, openai::toolCallsJson(r.toolCalls, true), ""),
                                    it->second.chunked);
    it->second.out += http::event(openai::chunkJson(job.head, index, "", r.finishReason, false), it->second.chunked);
    return;
  }
  if (text.empty() && ch.text.empty() && finish.empty()) return; // its tokens' logprobs wait for their text
  std::string logprobs = "null";
  if (job.logprobs >= 0) {
    logprobs = openai::logprobsJson(job.head.chat, ch.logprobs, ch.offset);
    for (const openai::LogprobEntry &e : ch.logprobs) ch.offset += e.token.size();
    ch.logprobs.clear();
  }
  if (it != conns_.end())
    it->second.out +=
        http::event(openai::chunkJson(job.head, index, ch.text + text, finish, false, logprobs), it->second.chunked);
  ch.text.clear();
}

void Server::finishJob(Job &job) {
  auto it = conns_.find(job.conn);
  if (it == conns_.end()) return;
  Connection &c = it->second;
  openai::Usage usage{job.promptTokens, 0};
  for (const Choice &ch : job.choices) usage.completion += ch.generated;
  promptTokens_ += uint64_t(usage.prompt);
  generatedTokens_ += uint64_t(usage.completion);
  if (job.stream) {
    if (job.includeUsage) c.out += http::event(openai::usageChunkJson(job.head, usage), c.chunked);
    c.out += http::event("[DONE]", c.chunked);
    endStream(c);
    ++responses_[200];
  } else {
    std::vector<openai::ChoiceResult> results;
    for (const Choice &ch : job.choices) results.push_back(result(job, ch));
    reply(c, 200, openai::responseJson(job.head, results, usage));
  }
  char took[160];
  std::snprintf(took, sizeof took, " 200 (%zu choice%s, %lld prompt + %lld completion tokens, %.3f s)",
                job.choices.size(), job.choices.size() == 1 ? "" : "s", (long long)usage.prompt,
                (long long)usage.completion, now() - job.started);
  log(c.peer, "POST " + job.path + took);
}

// A generation error (NaN logits, a device failure) ends a running request
// with a 500, or an error event where its stream has begun.
void Server::failJob(Job &job, const std::string &message) {
  openai::Error e;
  e.status = 500;
  e.type = "server_error";
  e.message = message;
  auto it = conns_.find(job.conn);
  if (it == conns_.end()) return;
  if (job.stream) {
    it->second.out += http::event(openai::errorJson(e), it->second.chunked);
    endStream(it->second);
    log(it->second.peer, "POST " + job.path + " 500: " + message);
  } else {
    replyError(it->second, e, "POST " + job.path);
  }
}

int Server::run(int listenFd) {
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = onStopSignal; // no SA_RESTART: poll returns at once
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  while (!gStop) {
    std::vector<pollfd> fds;
    std::vector<int> ids;
    fds.push_back({listenFd, short(conns_.size() < kMaxConnections ? POLLIN : 0), 0});
    for (auto &[id, c] : conns_) {
      short ev = c.in.size() < kMaxBuffered ? POLLIN : 0; // a full buffer waits for its request's turn
      if (!c.out.empty() || c.complete) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      ids.push_back(id);
    }
    int ready = ::poll(fds.data(), fds.size(), busy() ? 0 : 250);
    if (ready < 0 && errno != EINTR) return fail(std::string("serve: poll: ") + std::strerror(errno));
    if (ready > 0) {
      if (fds[0].revents & POLLIN) acceptAll(listenFd);
      for (size_t k = 0; k < ids.size(); ++k) {
        const short rev = fds[k + 1].revents;
        if (!rev) continue;
        auto it = conns_.find(ids[k]);
        if (it != conns_.end() && (rev & (POLLHUP | POLLERR)) && it->second.in.size() >= kMaxBuffered) {
          drop(ids[k]); // gone, with its buffer full (nothing more would be read to see it)
          continue;
        }
        if (it != conns_.end() && (rev & (POLLIN | POLLHUP | POLLERR))) readFrom(ids[k], it->second);
        it = conns_.find(ids[k]);
        if (it != conns_.end() && (rev & POLLOUT)) writeTo(ids[k], it->second);
      }
    }
    const double t = now();
    std::vector<int> stale;
    for (auto &[id, c] : conns_) {
      const bool idle = !c.job && !c.complete && c.in.empty() && c.served > 0; // kept, awaiting a request
      if (idle && t - c.since > keepAlive_) {
        stale.push_back(id); // closed without a word, as servers do
        continue;
      }
      if (!idle && !c.job && !c.complete && t - c.since > requestTimeout_) {
        c.keepAlive = false;
        openai::Error e;
        e.status = 408;
        char within[64];
        std::snprintf(within, sizeof within, "no whole request within %g s", requestTimeout_);
        e.message = within;
        replyError(c, e, "(request)");
      }
      if ((!c.out.empty() && t - c.lastWrite > kWriteStall) || c.out.size() > kMaxPendingOutput) stale.push_back(id);
    }
    for (int id : stale) drop(id);
    step();
  }
  std::fprintf(stderr, "sdrun: serve: stopped\n");
  for (auto &[id, c] : conns_) ::close(c.fd);
  conns_.clear();
  return 0;
}

void Server::step() {
  for (Batcher *b : batchers()) // a step for each model's rows with work, in turn
    if (b->busy()) b->step();
}

int Server::submit(const std::string &label, const http::Request &req) {
  const int id = nextConn_++;
  Connection &c = conns_[id];
  c.peer = label;
  c.since = c.lastWrite = now();
  handle(id, c, req);
  return id;
}

bool Server::takeAnswer(int id, int &status, std::string &body) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return false;
  Connection &c = it->second;
  if (!c.complete || (c.job && c.job->finished < c.job->choices.size())) return false;
  status = c.status;
  body = std::move(c.body);
  conns_.erase(it);
  return true;
}


} // namespace sdrun
