// The C API's handles and the helpers its source files share (not installed).
#pragma once
#include "sd/sd.h"
#include "sd/generate/draft_model.h"
#include "sd/generate/generator.h"
#include "sd/runtime/lora_slots.h"
#include "sd/runtime/session.h"
#include "sd/train/trainer.h"
#include <limits>
#include <memory>
#include <new>
#include <string>

struct sd_status {
  sd_status_code code;
  std::string message;
};
struct sd_plan {
  std::shared_ptr<const sd::Plan> plan;
};
struct sd_session {
  std::shared_ptr<const sd::Plan> plan;
  std::unique_ptr<sd::Session> session;
};
struct sd_tensor_list {
  std::vector<sd::HostTensor> tensors;
};
struct sd_trainer {
  std::unique_ptr<sd::train::Trainer> trainer;
  double lastReward = std::numeric_limits<double>::quiet_NaN();
};
struct sd_generator {
  std::unique_ptr<sd::generate::Generator> generator;
  sd::Session *session;                     // the generator's, for its adapter slots
  sd::generate::SamplingOptions sampling;   // as created: a batch's texts draw with these (seed + i)
  std::unique_ptr<sd::LoraSlots> slots;               // made by the first sd_generator_load_adapter
  std::unique_ptr<sd::generate::DraftModel> draft;    // sd_generator_set_draft
};

namespace sd::capi {

// When even the status cannot be allocated, this one is returned (and never freed).
extern sd_status kOutOfMemory;

inline sd_status *makeStatus(sd_status_code code, std::string message) {
  try {
    return new sd_status{code, std::move(message)};
  } catch (...) {
    return &kOutOfMemory;
  }
}
inline sd_status *fromStatus(const sd::Status &s, sd_status_code code = SD_ERROR) {
  return s.isOk() ? nullptr : makeStatus(code, s.message());
}
inline sd_status *invalid(const std::string &msg) { return makeStatus(SD_INVALID_ARGUMENT, msg); }

// Runs `body`, turning exceptions into statuses.
template <class F> sd_status *guard(F &&body) {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return makeStatus(SD_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    return makeStatus(SD_ERROR, std::string("internal error: ") + e.what());
  } catch (...) {
    return makeStatus(SD_ERROR, "internal error");
  }
}

#define SD_REQUIRE(ptr, what)                                                                                          \
  do {                                                                                                                 \
    if (!(ptr)) return invalid(std::string(what) + " is NULL");                                                        \
  } while (0)

} // namespace sd::capi
