// libFuzzer target: bytes as a chat template, parsed and, when it parses,
// rendered on a fixed conversation (errors are fine; crashes, hangs and
// unbounded recursion are not).
#include "sd/tokenize/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string source(reinterpret_cast<const char *>(data), size);
  auto parsed = sd::ChatTemplate::parse(source);
  if (!parsed.isOk()) return 0;
  std::vector<sd::ChatMessage> chat = {{"system", "Be brief."}, {"user", "hi {{ x }}"}, {"assistant", "hello"}};
  for (bool generation : {false, true})
    (void)parsed.value()->render(chat, generation, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  return 0;
}
