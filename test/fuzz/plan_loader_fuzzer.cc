// libFuzzer target: arbitrary bytes as a plan. The CRC is skipped so mutations
// reach the structural checks; whatever loads is run on zero inputs, so ASan
// and UBSan watch the kernels too.
#include "sd/runtime/plan.h"
#include "sd/runtime/session.h"
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (bool crc : {true, false}) {
    sd::PlanLoadOptions opts;
    opts.verifyChecksum = crc;
    auto plan = sd::Plan::loadBytes(data, size, "fuzz.sdp", opts);
    if (!plan.isOk()) continue;
    std::shared_ptr<sd::Plan> p(std::move(plan.value()));
    // Keep the fuzzer fast: skip plans that ask for huge arenas, state or tensors.
    if (p->maxArenaSize() > (64u << 20)) return 0;
    uint64_t globalBytes = 0;
    for (const sd::GlobalDesc &g : p->globals) globalBytes += g.bytes;
    if (globalBytes > (64u << 20)) return 0;
    auto session = sd::Session::create(p, sd::SessionOptions{1});
    if (!session.isOk()) return 0;
    for (size_t e = 0; e < p->entries.size(); ++e) {
      std::vector<sd::HostTensor> in;
      bool small = true;
      for (auto &b : p->entries[e].inputs) {
        const sd::BufferDesc &bd = p->entries[e].buffers[size_t(b.second)];
        small = small && bd.bytes < (16u << 20);
        in.push_back(sd::HostTensor{b.first, bd.dtype, bd.dims, std::vector<uint8_t>(small ? bd.bytes : 0, 0)});
      }
      if (!small) continue;
      std::vector<const sd::HostTensor *> ptrs;
      for (auto &t : in) ptrs.push_back(&t);
      std::vector<sd::HostTensor> out;
      (void)session.value()->run(e, ptrs, out);
    }
    break;
  }
  return 0;
}
