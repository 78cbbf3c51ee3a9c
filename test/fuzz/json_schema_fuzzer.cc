// libFuzzer target: a JSON schema as a client sends it in response_format
// (or --json-schema FILE), then, after a NUL byte, text to match against it
// byte by byte. Refusals are fine; crashes, hangs and unbounded memory (a
// schema that refers to itself, deep nesting, huge unions) are not.
#include "sd/generate/json_grammar.h"
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *bytes = reinterpret_cast<const char *>(data);
  const char *nul = static_cast<const char *>(std::memchr(bytes, 0, size));
  const size_t schemaSize = nul ? size_t(nul - bytes) : size;
  auto grammar = sd::generate::JsonGrammar::fromSchema(std::string(bytes, schemaSize));
  if (!grammar.isOk()) return 0;
  sd::generate::JsonMatcher m(grammar.value());
  for (size_t i = schemaSize + 1; i < size; ++i) {
    const std::string c(1, bytes[i]);
    if (m.accepts(c) != m.feed(c)) __builtin_trap(); // accepts() must predict feed()
    (void)m.canEnd();
    (void)m.finished();
  }
  return 0;
}
