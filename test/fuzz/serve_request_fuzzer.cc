// libFuzzer target: bytes as what a client sends `sdrun serve`: parsed as an
// HTTP request and, when one is complete, its body read as a completion, a
// chat completion and an embeddings request (errors are fine; crashes, hangs and
// unbounded memory are not). The bytes are also a model's reply read by every
// --tool-call-parser and by tool_choice "required"'s reader.
#include "http.h"
#include "openai_api.h"
#include "tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string in(reinterpret_cast<const char *>(data), size);
  for (const char *parser : {"hermes", "llama3_json", "mistral", "granite", "pythonic"}) {
    std::vector<sdrun::openai::ToolCall> calls;
    std::string content;
    (void)sdrun::openai::callParser(parser)(in, calls, content);
    (void)sdrun::openai::callTextStart(parser, in);
  }
  sdrun::openai::RequiredCallReader reader;
  (void)reader.feed(in);
  sdrun::http::Limits limits;
  limits.maxHeader = 4096;
  limits.maxBody = 32768;
  sdrun::http::Request req;
  int status = 0;
  std::string error;
  if (sdrun::http::parseRequest(in, limits, req, status, error) != sdrun::http::Parse::Complete) return 0;
  sdrun::openai::Defaults defaults;
  for (bool chat : {false, true}) {
    sdrun::openai::GenerationRequest gr;
    sdrun::openai::Error err;
    if (sdrun::openai::parseRequest(req.body, chat, defaults, gr, err)) {
      sdrun::openai::Head head{"id", "m", 0, chat};
      (void)sdrun::openai::responseJson(head, {{"text", "stop"}}, {1, 1});
    } else {
      (void)sdrun::openai::errorJson(err);
    }
  }
  sdrun::openai::EmbeddingRequest er;
  sdrun::openai::Error eerr;
  if (sdrun::openai::parseEmbeddingRequest(req.body, er, eerr))
    (void)sdrun::openai::embeddingsJson("m", {{1.0f, -2.5f}}, er.base64, 3);
  return 0;
}
