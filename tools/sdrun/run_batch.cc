// sdrun run-batch: a file of OpenAI batch requests answered offline, as
// vLLM's `run-batch` and OpenAI's Batch API take them. Each request goes to
// the same Server as sdrun serve's (server.h), without sockets: the same
// routes, fields, errors and replies, and the requests share the plan's rows
// as concurrent clients would.
#include "commands.h"
#include "server.h"
#include "sd/format/file_io.h"
#include "sd/format/json.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

namespace sdrun {
namespace {

const char *kRunBatchUsage =
    "usage: sdrun run-batch PLAN.sdp -i INPUT.jsonl -o OUTPUT.jsonl [--tokenizer DIR] [--chat-template FILE]\n"
    "                      [--served-model-name NAME] [--lora-modules NAME=ADAPTER_DIR]... [--tool-call-parser NAME]\n"
    "                      [--seed S] [--speculate N [--speculate-always] [--draft PLAN]] [--adapter DIR]\n"
    "                      [--adapter-rank K] [--max-in-flight N] [--threads N]\n"
    "                      [--device cpu|cuda|auto] [--no-cuda-graphs] [--no-cpu-fallback] [--cpu-ops OP,...]\n"
    "\n"
    "Answers a file of requests in the OpenAI Batch API's format, as vLLM's run-batch\n"
    "does: each line of INPUT is\n"
    "  {\"custom_id\": \"...\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {...}}\n"
    "with url /v1/chat/completions, /v1/completions or /v1/embeddings and the body\n"
    "sdrun serve takes on that route (see sdrun serve --help). Each line of OUTPUT,\n"
    "in the input's order, is\n"
    "  {\"id\": \"batch_req_N\", \"custom_id\": \"...\", \"response\": {\"status_code\": 200,\n"
    "   \"request_id\": \"req_N\", \"body\": {...}}, \"error\": null}\n"
    "where the body is the reply sdrun serve gives (an error reply, status 400 or\n"
    "404, for a request it refuses). Requests share the plan's rows as concurrent\n"
    "clients would; --max-in-flight N requests (4 x the rows by default) are taken at\n"
    "a time. A malformed line (not JSON, a missing or repeated custom_id, another\n"
    "method or url, a body that is not an object) is an error naming the line before\n"
    "anything runs, and OUTPUT is written whole at the end or not at all. The model\n"
    "flags are sdrun serve's.\n"
    "  -i, --input-file FILE     the requests (JSON Lines)\n"
    "  -o, --output-file FILE    the responses (JSON Lines)\n";

// One line of the input file.
struct BatchLine {
  size_t line = 0; // 1-based, for messages
  std::string customId, url, body;
  bool stream = false;
};

// Reads and checks every line; an error names the file and line.
sd::StatusOr<std::vector<BatchLine>> readBatch(const std::string &path) {
  auto text = sd::readWholeFile(path);
  if (!text.isOk()) return text.status();
  std::vector<BatchLine> lines;
  std::set<std::string> ids;
  size_t at = 0, number = 0;
  const std::string &t = text.value();
  while (at < t.size()) {
    size_t end = t.find('\n', at);
    if (end == std::string::npos) end = t.size();
    std::string raw = t.substr(at, end - at);
    at = end + 1;
    ++number;
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    if (raw.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    auto doc = sd::parseJson(raw, where);
    if (!doc.isOk()) return doc.status();
    if (doc.value().type != sd::Json::Type::Object) return sd::sdError(where, ": a request line must be a JSON object");
    BatchLine b;
    b.line = number;
    for (const auto &[key, value] : doc.value().obj) {
      if (key == "custom_id" || key == "method" || key == "url") {
        if (value.type != sd::Json::Type::String) return sd::sdError(where, ": ", key, " must be a string");
        if (key == "method" && value.str != "POST")
          return sd::sdError(where, ": method must be \"POST\", not \"", value.str.substr(0, 40), "\"");
        if (key != "method") (key == "url" ? b.url : b.customId) = value.str;
      } else if (key == "body") {
        if (value.type != sd::Json::Type::Object) return sd::sdError(where, ": body must be a JSON object");
        b.body = sd::jsonCompact(value);
        const sd::Json *stream = value.get("stream");
        b.stream = stream && stream->type == sd::Json::Type::Bool && stream->b;
      } else {
        return sd::sdError(where, ": '", key.substr(0, 60), "' is not a field of a batch request (custom_id, method, "
                           "url, body)");
      }
    }
    if (b.customId.empty()) return sd::sdError(where, ": custom_id is missing (each request needs a unique one)");
    if (!doc.value().get("method")) return sd::sdError(where, ": method is missing (\"POST\")");
    if (b.url != "/v1/chat/completions" && b.url != "/v1/completions" && b.url != "/v1/embeddings")
      return sd::sdError(where, ": url must be /v1/chat/completions, /v1/completions or /v1/embeddings",
                         b.url.empty() ? " (it is missing)" : ", not " + b.url.substr(0, 60));
    if (b.body.empty()) return sd::sdError(where, ": body is missing");
    if (!ids.insert(b.customId).second)
      return sd::sdError(where, ": custom_id '", b.customId.substr(0, 60), "' is used twice");
    lines.push_back(std::move(b));
  }
  if (lines.empty()) return sd::sdError(path, ": no requests");
  return lines;
}

std::string outputLine(const BatchLine &b, size_t index, int status, const std::string &body) {
  const bool json = !body.empty() && body[0] == '{';
  return "{\"id\":\"batch_req_" + std::to_string(index + 1) + "\",\"custom_id\":" + sd::jsonQuote(b.customId) +
         ",\"response\":{\"status_code\":" + std::to_string(status) + ",\"request_id\":\"req_" +
         std::to_string(index + 1) + "\",\"body\":" + (json ? body : sd::jsonQuote(body)) + "},\"error\":null}\n";
}

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace

int runBatchCommand(const std::vector<std::string> &given) {
  std::vector<std::string> args = given;
  for (std::string &a : args) // vLLM's short forms
    if (a == "-i") a = "--input-file";
    else if (a == "-o") a = "--output-file";
  Flags f;
  std::string err;
  if (!parseFlags(args, {"--input-file", "--output-file", "--tokenizer", "--chat-template", "--served-model-name",
                         "--lora-modules", "--seed", "--tool-call-parser", "--speculate", "--draft", "--adapter",
                         "--adapter-rank", "--max-in-flight", "--threads", "--device", "--cpu-ops"},
                  f, err, {"--no-cuda-graphs", "--no-cpu-fallback", "--speculate-always"})) {
    if (!f.help) return fail(err + " (see sdrun run-batch --help)");
  }
  if (f.help) return std::fputs(kRunBatchUsage, stdout), 0;
  const std::string input = flagValue(f, "--input-file"), output = flagValue(f, "--output-file");
  if (input.empty() || output.empty())
    return fail(std::string(input.empty() ? "-i INPUT.jsonl" : "-o OUTPUT.jsonl") +
                " is required (see sdrun run-batch --help)");
  int64_t seed, inFlight;
  ServerOptions o;
  sd::SessionOptions so;
  if (!intFlag(f, "--seed", 0, 0, INT64_MAX, seed, err) || !intFlag(f, "--max-in-flight", 0, 1, 1 << 20, inFlight, err) ||
      !sessionFlags(f, so, err))
    return fail(err);
  o.seed = uint64_t(seed);
  o.speculateAlways = hasFlag(f, "--speculate-always");
  if (sd::Status s = sd::checkOutputFile(output, "-o"); !s.isOk()) return fail(s.message());
  auto lines = readBatch(input);
  if (!lines.isOk()) return fail(lines.status().message());
  ServedSetup setup;
  if (int rc = openServed(f, so, setup)) return rc;
  const int64_t rows = setup.encoder ? 1 : setup.models[0].generator->batchSize();
  if (!inFlight) inFlight = 4 * rows;
  Server server(setup, o);
  server.logRequests(false);

  const std::vector<BatchLine> &batch = lines.value();
  std::vector<std::string> out(batch.size());
  std::vector<int> ids(batch.size(), -1);
  std::map<int, uint64_t> statuses;
  size_t next = 0, answered = 0, first = 0; // first: the oldest line not yet answered
  const double started = seconds();
  double shown = started;
  while (answered < batch.size()) {
    for (; next < batch.size() && int64_t(next - answered) < inFlight; ++next) {
      const BatchLine &b = batch[next];
      if (b.stream) { // a stream has no place in a file of responses
        const std::string e = "{\"error\":{\"message\":\"stream is not available in a batch (its response is written "
                              "whole)\",\"type\":\"invalid_request_error\",\"param\":\"stream\",\"code\":null}}";
        out[next] = outputLine(b, next, 400, e);
        ++statuses[400];
        ++answered;
        continue;
      }
      http::Request req;
      req.method = "POST";
      req.path = b.url;
      req.body = b.body;
      ids[next] = server.submit(input + ":" + std::to_string(b.line), req);
    }
    for (size_t i = first; i < next; ++i) {
      int status = 0;
      std::string body;
      if (ids[i] < 0 || !server.takeAnswer(ids[i], status, body)) continue;
      out[i] = outputLine(batch[i], i, status, body);
      ids[i] = -1;
      ++statuses[status];
      ++answered;
    }
    while (first < next && !out[first].empty()) ++first;
    if (answered == batch.size()) break;
    if (server.busy()) server.step();
    else if (next == batch.size() || int64_t(next - answered) >= inFlight)
      return fail(input + ":" + std::to_string(batch[first].line) + ": the request got no response (internal error)");
    if (seconds() - shown >= 5) {
      shown = seconds();
      std::fprintf(stderr, "sdrun: run-batch: %zu of %zu requests answered (%.0f s)\n", answered, batch.size(),
                   shown - started);
    }
  }
  std::string all;
  for (const std::string &l : out) all += l;
  if (sd::Status s = sd::writeFileAtomic(output, all); !s.isOk()) return fail(s.message());
  std::string counts;
  for (const auto &[status, count] : statuses)
    counts += (counts.empty() ? "" : ", ") + std::to_string(count) + " x " + std::to_string(status);
  std::fprintf(stderr, "sdrun: run-batch: %zu requests answered (%s) in %.1f s, %llu prompt + %llu generated "
                       "tokens; wrote %s\n",
               batch.size(), counts.c_str(), seconds() - started, (unsigned long long)server.promptTokens(),
               (unsigned long long)server.generatedTokens(), output.c_str());
  return 0;
}

} // namespace sdrun
