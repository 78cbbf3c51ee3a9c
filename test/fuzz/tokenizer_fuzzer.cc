// libFuzzer target: bytes as text for a GPT-2-style byte-level BPE and a
// Llama-3-style one (written to a temp folder at start-up). Checks what must
// hold for any input: ids inside the vocabulary, and for the byte-level
// tokenizer without a prefix space, decode(encode(x)) == x with invalid
// UTF-8 replaced as Python's errors="replace" does.
#include "sd/tokenize/tokenizer.h"
#include "unicode.h"
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

namespace {

std::unique_ptr<sd::Tokenizer> gpt2, llama3;

// The 256 byte-level characters, two merges, and the given pre-tokenizer.
std::string tokenizerJson(const std::string &preTokenizer) {
  std::string vocab;
  int id = 0;
  auto add = [&](const std::string &escaped) { vocab += (id ? "," : "") + std::string("\"") + escaped + "\":" + std::to_string(id++); };
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = printable ? b : next++;
    char buf[16];
    if (cp == '"' || cp == '\\') std::snprintf(buf, sizeof buf, "\\%c", cp);
    else if (cp < 0x80) std::snprintf(buf, sizeof buf, "%c", cp);
    else std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    add(buf);
  }
  add("th");
  add("\\u0120th");
  return "{\"added_tokens\":[{\"id\":" + std::to_string(id) + ",\"content\":\"<|end|>\",\"special\":true}],"
         "\"normalizer\":null,\"pre_tokenizer\":" + preTokenizer + ",\"post_processor\":null,"
         "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{" + vocab +
         "},\"merges\":[\"t h\",\"\\u0120 th\"]}}";
}

std::unique_ptr<sd::Tokenizer> load(const std::string &json) {
  char dir[] = "/tmp/sd_tokenizer_fuzzXXXXXX";
  if (!mkdtemp(dir)) std::abort();
  std::string path = std::string(dir) + "/tokenizer.json";
  std::ofstream(path) << json;
  auto tok = sd::Tokenizer::load(path);
  unlink(path.c_str());
  rmdir(dir);
  if (!tok.isOk()) {
    std::fprintf(stderr, "%s\n", tok.status().message().c_str());
    std::abort();
  }
  return std::move(tok.value());
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  gpt2 = load(tokenizerJson("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"));
  llama3 = load(tokenizerJson(
      "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
      "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|"
      "\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
      "\"add_prefix_space\":false,\"use_regex\":false}]}"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  for (sd::Tokenizer *tok : {gpt2.get(), llama3.get()}) {
    for (bool special : {false, true}) {
      sd::EncodeOptions o;
      o.parseSpecial = special;
      std::vector<int32_t> ids = tok->encode(text, o);
      for (int32_t id : ids)
        if (id < 0 || id >= tok->vocabSize()) std::abort();
      auto back = tok->decode(ids);
      // Byte-level BPE keeps every byte: the round trip is the text, cleaned.
      if (!back.isOk() || back.value() != sd::tok::toValidUtf8(text)) std::abort();
    }
  }
  return 0;
}
