// The C API over the runtime library: handles wrap the C++ objects, every
// call converts Status (and any exception, bad_alloc included) into an
// sd_status, so nothing C++ crosses the boundary.
#include "handles.h"
#include "sd/comm/world.h"
#include "sd/runtime/adapter.h"
#include "sd/runtime/session.h"
#include "sd/train/trainer.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>

namespace {

using namespace sd::capi;

sd::StatusOr<size_t> findGlobal(const sd::Session &s, const char *name) {
  int64_t g = s.findGlobal(name);
  if (g < 0) return sd::sdError("the plan has no global '", name, "'");
  return size_t(g);
}

std::string str(const char *s) { return s ? s : ""; }

} // namespace

namespace sd::capi {
sd_status kOutOfMemory{SD_OUT_OF_MEMORY, "out of memory"};
}

extern "C" {

sd_status_code sd_status_get_code(const sd_status *status) { return status ? status->code : SD_OK; }
const char *sd_status_message(const sd_status *status) { return status ? status->message.c_str() : ""; }
void sd_status_free(sd_status *status) {
  if (status != &kOutOfMemory) delete status;
}
int sd_api_version(void) { return SD_API_VERSION; }
const char *sd_version(void) { return SD_VERSION; }
size_t sd_dtype_size(int32_t dtype) { return sd::dtypeIsKnown(dtype) ? sd::dtypeSize(sd::DType(dtype)) : 0; }

// ---- plans ----

sd_status *sd_plan_load(const char *path, sd_plan **out) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(path, "path");
    SD_REQUIRE(out, "out");
    *out = nullptr;
    auto p = sd::Plan::loadFile(path);
    if (!p.isOk()) return fromStatus(p.status());
    *out = new sd_plan{std::shared_ptr<const sd::Plan>(std::move(p.value()))};
    return nullptr;
  });
}
void sd_plan_free(sd_plan *plan) { delete plan; }
size_t sd_plan_entry_count(const sd_plan *plan) { return plan ? plan->plan->entries.size() : 0; }
const char *sd_plan_entry_name(const sd_plan *plan, size_t index) {
  return plan && index < plan->plan->entries.size() ? plan->plan->entries[index].name.c_str() : nullptr;
}
size_t sd_plan_global_count(const sd_plan *plan) { return plan ? plan->plan->globals.size() : 0; }
sd_status *sd_plan_global_info(const sd_plan *plan, size_t index, sd_tensor *info, const char **role) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(plan, "plan");
    SD_REQUIRE(info, "info");
    if (index >= plan->plan->globals.size())
      return invalid("global index " + std::to_string(index) + " out of range (the plan has " +
                     std::to_string(plan->plan->globals.size()) + ")");
    const sd::GlobalDesc &g = plan->plan->globals[index];
    *info = sd_tensor{g.name.c_str(), int32_t(g.dtype), int32_t(g.dims.size()), g.dims.data(), g.data, g.bytes};
    if (role) *role = sd::globalRoleName(g.role);
    return nullptr;
  });
}
const char *sd_plan_config(const sd_plan *plan) { return plan ? plan->plan->config.c_str() : ""; }

// ---- sessions ----

// The process's world (null: alone), joined once; it lives until exit, when
// MPI is finalized (every rank reaches exit; a failing rank calls sd_world_abort).
static std::mutex worldMutex;
static std::shared_ptr<sd::Communicator> world;
static bool worldJoined = false;

sd_status *sd_world_join(int *rank, int *size) {
  return guard([&]() -> sd_status * {
    std::lock_guard<std::mutex> lock(worldMutex);
    if (!worldJoined) {
      auto w = sd::openWorld();
      if (!w.isOk()) return makeStatus(SD_UNAVAILABLE, w.status().message());
      world = w.value();
      worldJoined = true;
    }
    if (rank) *rank = world ? world->rank() : 0;
    if (size) *size = world ? world->size() : 1;
    return nullptr;
  });
}

void sd_world_abort(int exit_code) {
  std::shared_ptr<sd::Communicator> w;
  {
    std::lock_guard<std::mutex> lock(worldMutex);
    w = world;
  }
  std::fflush(nullptr);
  if (w && w->size() > 1) w->abort(exit_code);
  std::_Exit(exit_code);
}

void sd_session_options_init(sd_session_options *options) {
  if (options) *options = sd_session_options{"cpu", 0, 0};
}

sd_status *sd_session_create(const sd_plan *plan, const sd_session_options *options, sd_session **out) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(plan, "plan");
    SD_REQUIRE(out, "out");
    *out = nullptr;
    sd_session_options o;
    sd_session_options_init(&o);
    if (options) o = *options;
    if (o.threads < 0) return invalid("threads must be >= 0, got " + std::to_string(o.threads));
    auto device = sd::openDevice(o.device ? o.device : "cpu");
    if (!device.isOk()) return makeStatus(SD_UNAVAILABLE, device.status().message());
    sd::SessionOptions so;
    so.threads = o.threads;
    so.device = *device;
    if (o.join_world) {
      std::lock_guard<std::mutex> lock(worldMutex);
      if (!worldJoined) return makeStatus(SD_INVALID_ARGUMENT, "join_world: join the world first (sd_world_join; Python: sdc.join_world())");
      so.comm = world;
    }
    auto s = sd::Session::create(plan->plan, so);
    if (!s.isOk()) return fromStatus(s.status());
    *out = new sd_session{plan->plan, std::move(s.value())};
    return nullptr;
  });
}
void sd_session_free(sd_session *session) { delete session; }

size_t sd_tensor_list_size(const sd_tensor_list *list) { return list ? list->tensors.size() : 0; }
sd_status *sd_tensor_list_get(const sd_tensor_list *list, size_t index, sd_tensor *out) {
  SD_REQUIRE(list, "list");
  SD_REQUIRE(out, "out");
  if (index >= list->tensors.size()) return invalid("output index " + std::to_string(index) + " out of range");
  const sd::HostTensor &t = list->tensors[index];
  *out = sd_tensor{t.name.c_str(), int32_t(t.dtype), int32_t(t.dims.size()), t.dims.data(), t.data.data(), t.data.size()};
  return nullptr;
}
void sd_tensor_list_free(sd_tensor_list *list) { delete list; }

sd_status *sd_session_run(sd_session *session, const char *entry, const sd_tensor *inputs, size_t n_inputs,
                          sd_tensor_list **outputs) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(session, "session");
    SD_REQUIRE(entry, "entry");
    SD_REQUIRE(outputs, "outputs");
    if (n_inputs) SD_REQUIRE(inputs, "inputs");
    *outputs = nullptr;
    // Inputs by name, checked before they are copied.
    std::vector<sd::HostTensor> given(n_inputs);
    for (size_t i = 0; i < n_inputs; ++i) {
      const sd_tensor &t = inputs[i];
      if (!t.name) return invalid("input " + std::to_string(i) + " has no name");
      if (!sd::dtypeIsKnown(t.dtype)) return invalid("input '" + str(t.name) + "' has unknown dtype " + std::to_string(t.dtype));
      if (t.rank < 0 || (t.rank && !t.dims)) return invalid("input '" + str(t.name) + "' has no dims");
      sd::HostTensor &h = given[i];
      h.name = t.name;
      h.dtype = sd::DType(t.dtype);
      h.dims.assign(t.dims, t.dims + t.rank);
      for (int64_t d : h.dims)
        if (d < 0) return invalid("input '" + h.name + "' has a negative dim");
      size_t want = size_t(sd::product(h.dims)) * sd::dtypeSize(h.dtype);
      if (t.bytes != want)
        return invalid("input '" + h.name + "' has " + std::to_string(t.bytes) + " bytes, its shape " +
                       sd::formatDims(h.dims) + " needs " + std::to_string(want));
      if (want && !t.data) return invalid("input '" + h.name + "' has no data");
    }
    // Inputs in the entry's order (its buckets share the names), then the
    // bucket by their shapes: Plan::selectEntry, whose error lists the buckets.
    int64_t first = session->session->findEntry(entry);
    if (first < 0) return invalid("plan has no entry '" + str(entry) + "'");
    std::vector<const sd::HostTensor *> ordered;
    std::vector<sd::Dims> dims;
    for (auto &[name, b] : session->plan->entries[size_t(first)].inputs) {
      size_t i = 0;
      while (i < n_inputs && given[i].name != name) ++i;
      if (i == n_inputs) return invalid("entry '" + str(entry) + "' needs input '" + name + "'");
      given[i].data.assign(static_cast<const uint8_t *>(inputs[i].data),
                           static_cast<const uint8_t *>(inputs[i].data) + inputs[i].bytes);
      ordered.push_back(&given[i]);
      dims.push_back(given[i].dims);
    }
    if (ordered.size() != n_inputs)
      return invalid("entry '" + str(entry) + "' takes " + std::to_string(ordered.size()) + " inputs, got " +
                     std::to_string(n_inputs));
    auto chosen = session->plan->selectEntry(entry, dims);
    if (!chosen.isOk()) return fromStatus(chosen.status(), SD_INVALID_ARGUMENT);
    auto list = std::make_unique<sd_tensor_list>();
    if (sd::Status s = session->session->run(chosen.value(), ordered, list->tensors); !s.isOk()) return fromStatus(s);
    *outputs = list.release();
    return nullptr;
  });
}

sd_status *sd_session_read_global(const sd_session *session, const char *name, void *dst, size_t bytes) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(session, "session");
    SD_REQUIRE(name, "name");
    if (bytes) SD_REQUIRE(dst, "dst");
    auto g = findGlobal(*session->session, name);
    if (!g.isOk()) return fromStatus(g.status(), SD_INVALID_ARGUMENT);
    return fromStatus(session->session->readGlobal(g.value(), dst, bytes), SD_INVALID_ARGUMENT);
  });
}

sd_status *sd_session_write_global(sd_session *session, const char *name, const void *src, size_t bytes) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(session, "session");
    SD_REQUIRE(name, "name");
    if (bytes) SD_REQUIRE(src, "src");
    auto g = findGlobal(*session->session, name);
    if (!g.isOk()) return fromStatus(g.status(), SD_INVALID_ARGUMENT);
    return fromStatus(session->session->writeGlobal(g.value(), src, bytes), SD_INVALID_ARGUMENT);
  });
}

sd_status *sd_session_load_adapter(sd_session *session, const char *dir) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(session, "session");
    SD_REQUIRE(dir, "dir");
    auto cfg = sd::loraConfigOf(*session->plan);
    if (!cfg.isOk()) return fromStatus(cfg.status(), SD_INVALID_ARGUMENT);
    return fromStatus(sd::loadAdapter(dir, *session->session, cfg.value()));
  });
}

sd_status *sd_session_set_adapter_rank(sd_session *session, int64_t ranks) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(session, "session");
    auto cfg = sd::loraConfigOf(*session->plan);
    if (!cfg.isOk()) return fromStatus(cfg.status(), SD_INVALID_ARGUMENT);
    return fromStatus(sd::setAdapterRank(*session->session, cfg.value(), ranks), SD_INVALID_ARGUMENT);
  });
}

sd_status *sd_session_save_adapter(const sd_session *session, const char *dir) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(session, "session");
    SD_REQUIRE(dir, "dir");
    auto cfg = sd::loraConfigOf(*session->plan);
    if (!cfg.isOk()) return fromStatus(cfg.status(), SD_INVALID_ARGUMENT);
    // One writer per world: the replicas hold the same adapter.
    if (sd::Communicator *c = session->session->communicator(); c && c->rank() != 0) return nullptr;
    return fromStatus(sd::saveAdapter(dir, *session->session, cfg.value()));
  });
}

// ---- training ----

void sd_train_config_init(sd_train_config *c) {
  if (!c) return;
  sd::train::TrainConfig d;
  *c = sd_train_config{};
  c->lr_schedule = "constant";
  c->lr = d.schedule.peak;
  c->weight_decay = d.weightDecay;
  c->clip_norm = d.clipNorm;
  c->steps = d.steps;
  c->epochs = d.epochs;
  c->batch = d.batch;
  c->grad_accum = d.gradAccum;
  c->warmup_steps = d.schedule.warmupSteps;
  c->eval_every = d.evalEvery;
  c->checkpoint_every = d.checkpointEvery;
  c->seed = d.seed;
  c->shuffle = d.shuffle;
  c->truncate = d.truncate;
  c->resume = d.resume;
}

namespace {

// What a C sampling configuration asks the trainer for.
sd_status *rolloutOf(const sd_sampling_config *c, sd::train::RolloutOptions &r) {
  if (!c) return nullptr;
  if (!c->reward_command && !c->reward_fn) return invalid("sampling.reward_command or sampling.reward_fn is required");
  if (c->reward_command && !*c->reward_command) return invalid("sampling.reward_command is empty");
  if (!(c->temperature >= 0 && c->temperature <= 100)) return invalid("sampling.temperature must be in [0, 100]");
  if (!(c->top_p > 0 && c->top_p <= 1)) return invalid("sampling.top_p must be in (0, 1]");
  if (c->top_k < 0 || c->max_new_tokens < 0) return invalid("sampling.top_k and max_new_tokens must be >= 0");
  if (!(c->reward_timeout_s > 0)) return invalid("sampling.reward_timeout_s must be positive");
  r.temperature = c->temperature;
  r.topP = c->top_p;
  r.topK = c->top_k;
  r.maxNewTokens = c->max_new_tokens;
  r.rewardTimeoutSeconds = c->reward_timeout_s;
  if (c->reward_command) {
    r.rewardCommand = c->reward_command;
    return nullptr;
  }
  r.rewardFunction = [fn = c->reward_fn, user = c->reward_user](const std::vector<std::string> &requests)
      -> sd::StatusOr<std::vector<float>> {
    std::vector<const char *> texts;
    for (const std::string &q : requests) texts.push_back(q.c_str());
    std::vector<double> rewards(requests.size(), std::numeric_limits<double>::quiet_NaN());
    char error[512] = "";
    if (fn(user, requests.size(), texts.data(), rewards.data(), error, sizeof error) != 0)
      return sd::sdError("the reward function failed", error[0] ? ": " : "", std::string(error, strnlen(error, sizeof error)));
    return std::vector<float>(rewards.begin(), rewards.end());
  };
  return nullptr;
}

sd_status *createTrainer(sd_session *session, const sd_train_config *c, const sd_sampling_config *sampling,
                         sd_trainer **out) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(session, "session");
    SD_REQUIRE(c, "config");
    SD_REQUIRE(out, "out");
    *out = nullptr;
    if (!c->data_path) return invalid("config.data_path is required");
    auto kind = sd::train::parseScheduleKind(str(c->lr_schedule ? c->lr_schedule : "constant"));
    if (!kind.isOk()) return fromStatus(kind.status(), SD_INVALID_ARGUMENT);
    struct { const char *name; int64_t value, min; } ints[] = {
        {"steps", c->steps, 0}, {"epochs", c->epochs, 1}, {"batch", c->batch, 0}, {"grad_accum", c->grad_accum, 1},
        {"warmup_steps", c->warmup_steps, 0}, {"eval_every", c->eval_every, 0}, {"checkpoint_every", c->checkpoint_every, 0}};
    for (auto &i : ints)
      if (i.value < i.min)
        return invalid(std::string("config.") + i.name + " must be >= " + std::to_string(i.min) + ", got " +
                       std::to_string(i.value));
    for (auto [name, v] : {std::pair{"lr", c->lr}, {"weight_decay", c->weight_decay}, {"clip_norm", c->clip_norm}})
      if (!(v >= 0) || v > 1e12) return invalid(std::string("config.") + name + " must be a number >= 0");
    sd::train::TrainConfig t;
    t.dataPath = c->data_path;
    t.evalPath = str(c->eval_path);
    t.checkpointDir = str(c->checkpoint_dir);
    t.adapterIn = str(c->adapter_path);
    t.schedule = sd::train::LrSchedule{kind.value(), c->lr, c->warmup_steps};
    t.weightDecay = c->weight_decay;
    t.clipNorm = c->clip_norm;
    t.steps = c->steps;
    t.epochs = c->epochs;
    t.batch = c->batch;
    t.gradAccum = c->grad_accum;
    t.evalEvery = c->eval_every;
    t.checkpointEvery = c->checkpoint_every;
    t.seed = c->seed;
    t.shuffle = c->shuffle != 0;
    t.truncate = c->truncate != 0;
    t.resume = c->resume != 0;
    if (sd_status *bad = rolloutOf(sampling, t.rollout)) return bad;
    auto tr = sd::train::Trainer::create(*session->session, t);
    if (!tr.isOk()) return fromStatus(tr.status());
    *out = new sd_trainer{std::move(tr.value())};
    return nullptr;
  });
}

} // namespace

void sd_trainer_free(sd_trainer *trainer) { delete trainer; }
int64_t sd_trainer_step_count(const sd_trainer *trainer) { return trainer ? trainer->trainer->step() : 0; }
int64_t sd_trainer_total_steps(const sd_trainer *trainer) { return trainer ? trainer->trainer->totalSteps() : 0; }

sd_status *sd_trainer_create(sd_session *session, const sd_train_config *c, sd_trainer **out) {
  return createTrainer(session, c, nullptr, out);
}

void sd_sampling_config_init(sd_sampling_config *c) {
  if (!c) return;
  *c = sd_sampling_config{nullptr, nullptr, nullptr, 1.0, 1.0, 0, 0, 600.0};
}

sd_status *sd_trainer_create_sampling(sd_session *session, const sd_train_config *c, const sd_sampling_config *sampling,
                                      sd_trainer **out) {
  if (!sampling) return invalid("sampling is NULL");
  return createTrainer(session, c, sampling, out);
}

double sd_trainer_last_reward(const sd_trainer *trainer) {
  return trainer ? trainer->lastReward : std::numeric_limits<double>::quiet_NaN();
}

sd_status *sd_trainer_step(sd_trainer *trainer, sd_step_report *report) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(trainer, "trainer");
    auto r = trainer->trainer->runStep();
    if (!r.isOk()) return fromStatus(r.status());
    const sd::train::StepReport &s = r.value();
    trainer->lastReward = s.meanReward;
    if (report)
      *report = sd_step_report{s.step, s.total, s.epoch, s.loss, s.lr, s.gradNorm, s.tokens, s.seconds,
                               s.evaluated, s.checkpointed, s.evalLoss, s.skipped, s.lossScale};
    return nullptr;
  });
}

sd_status *sd_trainer_evaluate(sd_trainer *trainer, double *loss) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(trainer, "trainer");
    SD_REQUIRE(loss, "loss");
    auto l = trainer->trainer->evaluate();
    if (!l.isOk()) return fromStatus(l.status());
    *loss = l.value();
    return nullptr;
  });
}

sd_status *sd_trainer_save_checkpoint(sd_trainer *trainer) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(trainer, "trainer");
    return fromStatus(trainer->trainer->saveCheckpoint());
  });
}

sd_status *sd_trainer_save_weights(const sd_trainer *trainer, const char *path) {
  return guard([&]() -> sd_status * {
    SD_REQUIRE(trainer, "trainer");
    SD_REQUIRE(path, "path");
    return fromStatus(trainer->trainer->saveWeights(path));
  });
}

} // extern "C"
