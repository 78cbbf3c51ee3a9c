// libFuzzer target: bytes as a checkpoint manifest, as given and re-signed
// (the bytes as the body, its checksum appended), so that mutations get past
// the checksum to the field checks. One that verifies has a position a resume
// can use: no negative step, epoch or position, and no step past the total.
#include "sd/format/crc32c.h"
#include "sd/train/checkpoint.h"
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string body(reinterpret_cast<const char *>(data), size);
  std::string signed_ = body + ",\"manifest_crc32c\":" + std::to_string(sd::crc32c(body.data(), body.size())) + "}\n";
  for (const std::string &text : {body, signed_}) {
    auto m = sd::parseCheckpointManifest(text, "fuzz");
    if (!m.isOk()) continue;
    const sd::CheckpointMeta &meta = m.value();
    if (meta.step < 0 || meta.epoch < 0 || meta.position < 0 || meta.step > meta.totalSteps) std::abort();
  }
  return 0;
}
