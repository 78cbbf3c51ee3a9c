// The `sdc` Python module: classes over the C API (sd/sd.h). Errors from the
// C API become sdc.Error (a RuntimeError) carrying its message; tensors go in
// and out as NumPy arrays (inputs are read in place when C-contiguous,
// outputs wrap the C API's result memory without a copy).
#include "sd/sd.h"
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

struct SdError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(sd_status *s) {
  if (!s) return;
  std::string msg = sd_status_message(s);
  sd_status_free(s);
  throw SdError(msg);
}

py::dtype numpyDtype(int32_t t) {
  switch (t) {
  case SD_F32: return py::dtype("float32");
  case SD_F64: return py::dtype("float64");
  case SD_F16: return py::dtype("float16");
  case SD_BF16: return py::dtype("uint16"); // NumPy has no bfloat16: the raw bits
  case SD_I8: return py::dtype("int8");
  case SD_U8: return py::dtype("uint8");
  case SD_I16: return py::dtype("int16");
  case SD_U16: return py::dtype("uint16");
  case SD_I32: return py::dtype("int32");
  case SD_U32: return py::dtype("uint32");
  case SD_I64: return py::dtype("int64");
  case SD_U64: return py::dtype("uint64");
  case SD_BOOL: return py::dtype("bool");
  }
  throw SdError("tensor dtype " + std::to_string(t) + " has no NumPy equivalent");
}

int32_t sdDtype(const py::dtype &d) {
  static const std::pair<const char *, int32_t> kTypes[] = {
      {"float32", SD_F32}, {"float64", SD_F64}, {"float16", SD_F16}, {"int8", SD_I8},     {"uint8", SD_U8},
      {"int16", SD_I16},   {"uint16", SD_U16},  {"int32", SD_I32},   {"uint32", SD_U32}, {"int64", SD_I64},
      {"uint64", SD_U64},  {"bool", SD_BOOL}};
  for (auto &[name, t] : kTypes)
    if (d.is(py::dtype(name))) return t;
  throw py::type_error("arrays of dtype " + py::repr(d).cast<std::string>() + " cannot be passed to a plan");
}

struct Plan {
  sd_plan *plan = nullptr;
  std::map<std::string, size_t> globals;
  explicit Plan(const std::string &path) {
    check(sd_plan_load(path.c_str(), &plan));
    for (size_t i = 0; i < sd_plan_global_count(plan); ++i) {
      sd_tensor info;
      check(sd_plan_global_info(plan, i, &info, nullptr));
      globals[info.name] = i;
    }
  }
  ~Plan() { sd_plan_free(plan); }
  sd_tensor info(const std::string &name, const char **role = nullptr) const {
    auto it = globals.find(name);
    if (it == globals.end()) throw py::key_error("the plan has no global '" + name + "'");
    sd_tensor t;
    check(sd_plan_global_info(plan, it->second, &t, role));
    return t;
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < sd_plan_entry_count(plan); ++i) out.push_back(sd_plan_entry_name(plan, i));
    return out;
  }
  py::list globalList() const {
    py::list out;
    for (size_t i = 0; i < sd_plan_global_count(plan); ++i) {
      sd_tensor t;
      const char *role;
      check(sd_plan_global_info(plan, i, &t, &role));
      out.append(py::make_tuple(t.name, numpyDtype(t.dtype), std::vector<int64_t>(t.dims, t.dims + t.rank), role));
    }
    return out;
  }
};

struct Session {
  std::shared_ptr<Plan> plan;
  sd_session *session = nullptr;
  Session(std::shared_ptr<Plan> p, const std::string &device, int threads, bool joinWorld) : plan(std::move(p)) {
    sd_session_options o;
    sd_session_options_init(&o);
    o.device = device.c_str();
    o.threads = threads;
    o.join_world = joinWorld;
    check(sd_session_create(plan->plan, &o, &session));
  }
  ~Session() { sd_session_free(session); }

  py::dict run(const std::string &entry, const py::dict &inputs) {
    std::vector<py::array> keep;
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> dims;
    for (auto item : inputs) {
      names.push_back(py::str(item.first));
      keep.push_back(py::array::ensure(item.second, py::array::c_style));
      if (!keep.back()) throw py::type_error("input '" + names.back() + "' is not an array");
      dims.emplace_back(keep.back().shape(), keep.back().shape() + keep.back().ndim());
    }
    std::vector<sd_tensor> ts;
    for (size_t i = 0; i < keep.size(); ++i)
      ts.push_back(sd_tensor{names[i].c_str(), sdDtype(keep[i].dtype()), int32_t(dims[i].size()), dims[i].data(),
                             keep[i].data(), size_t(keep[i].nbytes())});
    sd_tensor_list *list = nullptr;
    {
      py::gil_scoped_release release;
      check(sd_session_run(session, entry.c_str(), ts.data(), ts.size(), &list));
    }
    // The arrays share the list's memory; the capsule frees it with the last one.
    py::capsule owner(list, [](void *p) { sd_tensor_list_free(static_cast<sd_tensor_list *>(p)); });
    py::dict out;
    for (size_t i = 0; i < sd_tensor_list_size(list); ++i) {
      sd_tensor t;
      check(sd_tensor_list_get(list, i, &t));
      std::vector<py::ssize_t> shape(t.dims, t.dims + t.rank);
      out[py::str(t.name)] = py::array(numpyDtype(t.dtype), shape, t.data, owner);
    }
    return out;
  }

  py::array readGlobal(const std::string &name) const {
    sd_tensor t = plan->info(name);
    py::array a(numpyDtype(t.dtype), std::vector<py::ssize_t>(t.dims, t.dims + t.rank));
    check(sd_session_read_global(session, name.c_str(), a.mutable_data(), size_t(a.nbytes())));
    return a;
  }

  void writeGlobal(const std::string &name, const py::array &value) {
    sd_tensor t = plan->info(name);
    py::array a = py::array::ensure(value, py::array::c_style);
    if (!a) throw py::type_error("the value of '" + name + "' is not an array");
    if (sdDtype(a.dtype()) != t.dtype)
      throw py::type_error("global '" + name + "' is " + py::repr(numpyDtype(t.dtype)).cast<std::string>() + ", the array " +
                           py::repr(a.dtype()).cast<std::string>());
    std::vector<int64_t> want(t.dims, t.dims + t.rank), got(a.shape(), a.shape() + a.ndim());
    if (want != got) throw py::value_error("global '" + name + "' has another shape than the array");
    check(sd_session_write_global(session, name.c_str(), a.data(), size_t(a.nbytes())));
  }
};

struct StepReport {
  sd_step_report r;
  double reward = std::numeric_limits<double>::quiet_NaN(); // sampled GRPO groups: the step's mean reward
};

struct Trainer {
  std::shared_ptr<Session> session;
  sd_trainer *trainer = nullptr;
  py::object reward; // a Python reward function, kept alive while the trainer may call it
  ~Trainer() { sd_trainer_free(trainer); }
};

// sd_reward_fn over a Python callable: it takes a list of dicts
// ({"prompt", "completion", "prompt_ids", "completion_ids"}) and returns a
// reward for each. Called from a step, which runs without the GIL.
int callPythonReward(void *user, size_t count, const char *const *requests, double *rewards, char *error,
                     size_t capacity) {
  py::gil_scoped_acquire gil;
  try {
    py::object loads = py::module_::import("json").attr("loads");
    py::list batch;
    for (size_t i = 0; i < count; ++i) batch.append(loads(requests[i]));
    py::sequence got = static_cast<py::handle>(*static_cast<py::object *>(user))(batch);
    if (size_t(py::len(got)) != count)
      throw py::value_error("returned " + std::to_string(py::len(got)) + " rewards for " + std::to_string(count) +
                            " completions");
    for (size_t i = 0; i < count; ++i) rewards[i] = got[i].cast<double>();
    return 0;
  } catch (const std::exception &e) {
    std::snprintf(error, capacity, "%s", e.what());
    return 1;
  }
}

struct Generator {
  std::shared_ptr<Session> session;
  std::shared_ptr<Generator> draft; // kept alive while it guesses for this one
  sd_generator *gen = nullptr;
  ~Generator() {
    if (draft) sd_status_free(sd_generator_set_draft(gen, nullptr));
    sd_generator_free(gen);
  }
  int64_t next(const std::vector<int64_t> &tokens) {
    int64_t t;
    py::gil_scoped_release release;
    check(sd_generator_next(gen, tokens.data(), tokens.size(), &t));
    return t;
  }
  int64_t speculateOrDefault(std::optional<int64_t> speculate) const {
    const int64_t guesses = speculate ? *speculate : sd_generator_speculation(gen);
    if (guesses < 0) throw py::value_error("speculate must be >= 0");
    return guesses;
  }
  // Many texts through the plan's rows (sd_generator_generate_batch).
  std::vector<std::vector<int64_t>> generateBatch(const std::vector<std::vector<int64_t>> &texts, int64_t maxNew,
                                                  std::optional<std::vector<int64_t>> adapters,
                                                  std::optional<int64_t> speculate,
                                                  const std::vector<int64_t> &stopTokens) {
    if (maxNew < 0) throw py::value_error("max_new_tokens must be >= 0");
    if (adapters && adapters->size() != texts.size())
      throw py::value_error("adapters has " + std::to_string(adapters->size()) + " slots for " +
                            std::to_string(texts.size()) + " texts");
    std::vector<int64_t> tokens;
    std::vector<size_t> offsets{0};
    for (const auto &t : texts) {
      tokens.insert(tokens.end(), t.begin(), t.end());
      offsets.push_back(tokens.size());
    }
    sd_generate_options o;
    sd_generate_options_init(&o);
    o.max_new = size_t(maxNew);
    o.speculate = size_t(speculateOrDefault(speculate));
    o.slots = adapters ? adapters->data() : nullptr;
    o.stop_ids = stopTokens.data();
    o.n_stop_ids = stopTokens.size();
    std::vector<int64_t> out(texts.size() * size_t(maxNew));
    std::vector<size_t> counts(texts.size());
    {
      py::gil_scoped_release release;
      check(sd_generator_generate_batch(gen, tokens.data(), offsets.data(), texts.size(), &o, out.data(),
                                        counts.data()));
    }
    std::vector<std::vector<int64_t>> result(texts.size());
    for (size_t i = 0; i < texts.size(); ++i)
      result[i].assign(out.begin() + long(i * size_t(maxNew)), out.begin() + long(i * size_t(maxNew) + counts[i]));
    return result;
  }
};

std::shared_ptr<Trainer> makeTrainer(std::shared_ptr<Session> session, const std::string &data, int64_t steps,
                                     int64_t epochs, int64_t batch, int64_t gradAccum, double lr,
                                     const std::string &lrSchedule, int64_t warmupSteps, double weightDecay,
                                     double clipNorm, uint64_t seed, bool shuffle, bool truncate,
                                     std::optional<std::string> evalData, int64_t evalEvery,
                                     std::optional<std::string> checkpointDir, int64_t checkpointEvery, bool resume,
                                     std::optional<std::string> adapter, py::object reward, double temperature,
                                     int64_t topK, double topP, int64_t maxNewTokens) {
  auto t = std::make_shared<Trainer>();
  t->session = session;
  sd_train_config c;
  sd_train_config_init(&c);
  c.data_path = data.c_str();
  c.eval_path = evalData ? evalData->c_str() : nullptr;
  c.checkpoint_dir = checkpointDir ? checkpointDir->c_str() : nullptr;
  c.adapter_path = adapter ? adapter->c_str() : nullptr;
  c.lr_schedule = lrSchedule.c_str();
  c.lr = lr;
  c.weight_decay = weightDecay;
  c.clip_norm = clipNorm;
  c.steps = steps;
  c.epochs = epochs;
  c.batch = batch;
  c.grad_accum = gradAccum;
  c.warmup_steps = warmupSteps;
  c.eval_every = evalEvery;
  c.checkpoint_every = checkpointEvery;
  c.seed = seed;
  c.shuffle = shuffle;
  c.truncate = truncate;
  c.resume = resume;
  if (reward.is_none()) {
    check(sd_trainer_create(session->session, &c, &t->trainer));
    return t;
  }
  // GRPO sampling its own groups: `reward` a shell command (str) or a Python function.
  sd_sampling_config sc;
  sd_sampling_config_init(&sc);
  sc.temperature = temperature;
  sc.top_k = topK;
  sc.top_p = topP;
  sc.max_new_tokens = maxNewTokens;
  std::string command;
  if (py::isinstance<py::str>(reward)) {
    command = reward.cast<std::string>();
    sc.reward_command = command.c_str();
  } else if (PyCallable_Check(reward.ptr())) {
    t->reward = reward;
    sc.reward_fn = callPythonReward;
    sc.reward_user = &t->reward;
  } else {
    throw py::type_error("reward must be a shell command (str) or a function of a list of completions");
  }
  check(sd_trainer_create_sampling(session->session, &c, &sc, &t->trainer));
  return t;
}

StepReport trainerStep(Trainer &t) {
  StepReport r;
  {
    py::gil_scoped_release release;
    check(sd_trainer_step(t.trainer, &r.r));
  }
  r.reward = sd_trainer_last_reward(t.trainer);
  return r;
}

} // namespace

PYBIND11_MODULE(sdc, m) {
  m.doc() = "sdc: run, train and sample compiled plans (.sdp) from Python, over the sd C API";
  m.attr("__version__") = sd_version();
  py::register_exception<SdError>(m, "Error", PyExc_RuntimeError);

  m.def(
      "join_world",
      []() {
        int rank = 0, size = 1;
        check(sd_world_join(&rank, &size));
        // As `python -m mpi4py` does: an uncaught exception on one rank ends
        // the whole job instead of leaving the others waiting in a collective.
        if (size > 1) {
          py::module_ sys = py::module_::import("sys");
          py::object previous = sys.attr("excepthook");
          sys.attr("excepthook") = py::cpp_function([previous](py::object type, py::object value, py::object tb) {
            previous(type, value, tb);
            sd_world_abort(1);
          });
        }
        return py::make_tuple(rank, size);
      },
      "Joins the world mpirun started this process in (once); returns (rank, size), (0, 1) when alone. "
      "Sessions made with join_world=True then train data-parallel; an uncaught exception aborts every rank.");
  m.def("abort_world", [](int code) { sd_world_abort(code); }, py::arg("exit_code") = 1,
        "Ends every rank's process (after an error on this one).");

  py::class_<Plan, std::shared_ptr<Plan>>(m, "Plan", "A compiled plan, loaded and verified.")
      .def(py::init<const std::string &>(), py::arg("path"))
      .def_property_readonly("entries", &Plan::entries, "entry names (one per shape bucket)")
      .def_property_readonly("globals", &Plan::globalList, "(name, dtype, shape, role) of every global")
      .def_property_readonly("config", [](const Plan &p) { return std::string(sd_plan_config(p.plan)); });

  py::class_<Session, std::shared_ptr<Session>>(m, "Session", "A plan bound to a device, with its own state.")
      .def(py::init<std::shared_ptr<Plan>, const std::string &, int, bool>(), py::arg("plan"), py::arg("device") = "cpu",
           py::arg("threads") = 0, py::arg("join_world") = false,
           "join_world=True: train as one rank of the world sdc.join_world() joined (under mpirun).")
      .def_property_readonly("plan", [](const Session &s) { return s.plan; })
      .def("run", &Session::run, py::arg("entry"), py::arg("inputs"),
           "Runs an entry on a dict of NumPy arrays (the bucket is chosen by their shapes); returns a dict.")
      .def("read_global", &Session::readGlobal, py::arg("name"), "A copy of a global's value.")
      .def("write_global", &Session::writeGlobal, py::arg("name"), py::arg("value"),
           "Sets a mutable global (parameters, optimizer state).")
      .def("load_adapter", [](Session &s, const std::string &dir) { check(sd_session_load_adapter(s.session, dir.c_str())); },
           py::arg("dir"), "Loads an adapter (PEFT layout) of the plan's method into its session.")
      .def("set_adapter_rank", [](Session &s, int64_t ranks) { check(sd_session_set_adapter_rank(s.session, ranks)); },
           py::arg("ranks"), "A DyLoRA plan: compute with the adapter's first `ranks` ranks outside training.")
      .def("save_adapter", [](Session &s, const std::string &dir) { check(sd_session_save_adapter(s.session, dir.c_str())); },
           py::arg("dir"), "Writes the session's adapter (LoRA, DoRA, IA3, LoHa, LoKr, DyLoRA, VeRA, OSF or prompt tuning) in PEFT's layout; bottleneck adapters in AdapterHub's.");

  py::class_<StepReport>(m, "StepReport", "What one optimizer step did.")
      .def_property_readonly("step", [](const StepReport &s) { return s.r.step; })
      .def_property_readonly("total", [](const StepReport &s) { return s.r.total; })
      .def_property_readonly("epoch", [](const StepReport &s) { return s.r.epoch; })
      .def_property_readonly("loss", [](const StepReport &s) { return s.r.loss; })
      .def_property_readonly("lr", [](const StepReport &s) { return s.r.lr; })
      .def_property_readonly("grad_norm", [](const StepReport &s) { return s.r.grad_norm; })
      .def_property_readonly("tokens", [](const StepReport &s) { return s.r.tokens; })
      .def_property_readonly("seconds", [](const StepReport &s) { return s.r.seconds; })
      .def_property_readonly("eval_loss", [](const StepReport &s) -> std::optional<double> {
        return s.r.evaluated ? std::optional<double>(s.r.eval_loss) : std::nullopt;
      })
      .def_property_readonly("checkpointed", [](const StepReport &s) { return bool(s.r.checkpointed); })
      .def_property_readonly("reward", [](const StepReport &s) -> std::optional<double> {
        return std::isfinite(s.reward) ? std::optional<double>(s.reward) : std::nullopt;
      }, "GRPO plans sampling their groups: the step's mean reward over all ranks; None otherwise")
      .def_property_readonly("skipped", [](const StepReport &s) { return bool(s.r.skipped); },
                             "fp16 plans: the gradient held an Inf or NaN, so the update was not taken")
      .def_property_readonly("loss_scale", [](const StepReport &s) -> std::optional<double> {
        return s.r.loss_scale > 0 ? std::optional<double>(s.r.loss_scale) : std::nullopt;
      }, "fp16 plans: the dynamic loss scale after this step; None without loss scaling")
      .def("__repr__", [](const StepReport &s) {
        return "StepReport(step=" + std::to_string(s.r.step) + ", loss=" + std::to_string(s.r.loss) + ")";
      });

  py::class_<Trainer, std::shared_ptr<Trainer>>(m, "Trainer",
                                                "sdrun train's loop on a session: iterate it for one report per step.")
      .def(py::init(&makeTrainer), py::arg("session"), py::arg("data"), py::arg("steps") = 0, py::arg("epochs") = 1,
           py::arg("batch") = 0, py::arg("grad_accum") = 1, py::arg("lr") = 1e-4, py::arg("lr_schedule") = "constant",
           py::arg("warmup_steps") = 0, py::arg("weight_decay") = 0.0, py::arg("clip_norm") = 0.0, py::arg("seed") = 0,
           py::arg("shuffle") = true, py::arg("truncate") = false, py::arg("eval_data") = std::nullopt,
           py::arg("eval_every") = 0, py::arg("checkpoint_dir") = std::nullopt, py::arg("checkpoint_every") = 0,
           py::arg("resume") = false, py::arg("adapter") = std::nullopt, py::arg("reward") = py::none(),
           py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("max_new_tokens") = 0,
           "GRPO plans compiled with --kv-cache sample their own groups when given `reward`: a shell command "
           "(sdrun train --reward-cmd's protocol) or a function taking a list of dicts {prompt, completion, "
           "prompt_ids, completion_ids} and returning one reward each; `data` then holds prompt lines.")
      .def_property_readonly("step_count", [](const Trainer &t) { return sd_trainer_step_count(t.trainer); })
      .def_property_readonly("total_steps", [](const Trainer &t) { return sd_trainer_total_steps(t.trainer); })
      .def("step", &trainerStep, "One optimizer step (eval and checkpoint when due).")
      .def("__iter__", [](std::shared_ptr<Trainer> t) { return t; })
      .def("__next__", [](Trainer &t) {
        if (sd_trainer_step_count(t.trainer) >= sd_trainer_total_steps(t.trainer)) throw py::stop_iteration();
        return trainerStep(t);
      })
      .def("evaluate", [](Trainer &t) {
        double loss;
        py::gil_scoped_release release;
        check(sd_trainer_evaluate(t.trainer, &loss));
        return loss;
      })
      .def("save_checkpoint", [](Trainer &t) { check(sd_trainer_save_checkpoint(t.trainer)); })
      .def("save_weights", [](Trainer &t, const std::string &path) { check(sd_trainer_save_weights(t.trainer, path.c_str())); },
           py::arg("path"));

  py::class_<Generator, std::shared_ptr<Generator>>(m, "Generator", "Sampling from a plan: through its key/value cache (--kv-cache plans) or its batch-1 infer window.")
      .def(py::init([](std::shared_ptr<Session> s, double temperature, int64_t topK, uint64_t seed) {
             auto g = std::make_shared<Generator>();
             g->session = s;
             check(sd_generator_create(s->session, temperature, topK, seed, &g->gen));
             return g;
           }),
           py::arg("session"), py::arg("temperature") = 0.8, py::arg("top_k") = 40, py::arg("seed") = 0)
      .def_property_readonly("vocab_size", [](const Generator &g) { return sd_generator_vocab_size(g.gen); })
      .def("next", &Generator::next, py::arg("tokens"), "The token after `tokens`.")
      .def_property_readonly("speculation", [](const Generator &g) { return sd_generator_speculation(g.gen); },
                             "The most tokens a step guesses: sdc compile --speculate K's K, 0 without it.")
      .def("generate", [](Generator &g, const std::vector<int64_t> &tokens, int64_t maxNew,
                          std::optional<int64_t> speculate) {
        if (maxNew < 0) throw py::value_error("max_new_tokens must be >= 0");
        const int64_t guesses = g.speculateOrDefault(speculate);
        std::vector<int64_t> out(static_cast<size_t>(maxNew));
        py::gil_scoped_release release;
        check(sd_generator_generate(g.gen, tokens.data(), tokens.size(), size_t(maxNew), size_t(guesses), out.data()));
        return out;
      }, py::arg("tokens"), py::arg("max_new_tokens"), py::arg("speculate") = py::none(),
      "`max_new_tokens` tokens after `tokens`. A plan compiled with --speculate K guesses up to `speculate` "
      "(default K) tokens a step from the text so far and checks them in one call: the same tokens as "
      "`next` one at a time, in fewer steps when the text repeats itself.")
      .def_property_readonly("batch_size", [](const Generator &g) { return sd_generator_batch_size(g.gen); },
                             "Rows generated together: sdc compile --kv-batch (1 without a cache).")
      .def_property_readonly("adapter_slots", [](const Generator &g) { return sd_generator_adapter_slots(g.gen); },
                             "Adapter slots besides slot 0: sdc compile --max-loras N's N, 0 for other plans.")
      .def("load_adapter", [](Generator &g, int64_t slot, const std::string &dir) {
        py::gil_scoped_release release;
        check(sd_generator_load_adapter(g.gen, slot, dir.c_str()));
      }, py::arg("slot"), py::arg("dir"),
      "Reads a PEFT LoRA adapter folder into an adapter slot (1..adapter_slots; 0 is the plan's own).")
      .def_property("draft", [](const Generator &g) { return g.draft; },
                    [](Generator &g, std::shared_ptr<Generator> d) {
                      check(sd_generator_set_draft(g.gen, d ? d->gen : nullptr));
                      g.draft = d;
                    },
                    "A draft model's Generator whose greedy tokens are the guesses (None: prompt lookup's).")
      .def("generate_batch", &Generator::generateBatch, py::arg("texts"), py::arg("max_new_tokens"),
           py::arg("adapters") = py::none(), py::arg("speculate") = py::none(),
           py::arg("stop_tokens") = std::vector<int64_t>{},
           "Up to `max_new_tokens` tokens after each of `texts` (lists of token ids), generated batch_size at a "
           "time; text i draws with seed + i and goes through adapter slot adapters[i] (default 0). A text ends "
           "early at any of `stop_tokens` (not returned) or when the plan's cache is full.");
}
