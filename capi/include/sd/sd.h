/* sdc's C API: load a compiled plan, create a session on a device, run its
 * entries, read and write its state, train, save adapters and generate.
 * No compiler inside (plans come from `sdc compile`).
 *
 * Conventions:
 *  - Handles are opaque; each has one *_free function (NULL is accepted).
 *  - Every fallible call returns sd_status*: NULL on success, otherwise an
 *    error object with a code and a one-line message, freed with
 *    sd_status_free. No call aborts the process or lets a C++ exception out.
 *  - Strings are NUL-terminated UTF-8; paths are file system paths.
 *  - A session must outlive the trainers and generators made from it; a plan
 *    is reference-counted by its sessions, so it may be freed first.
 *  - Handles are not thread-safe: one thread at a time per session.
 */
#ifndef SD_SD_H
#define SD_SD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SD_API __attribute__((visibility("default")))
#else
#define SD_API
#endif

/* 3: GRPO sampling its own groups (sd_trainer_create_sampling, sd_sampling_config, sd_trainer_last_reward).
 * 4: batch generation through the plan's rows and adapter slots (sd_generator_generate_batch,
 *    sd_generator_load_adapter), and a draft model's guesses (sd_generator_set_draft). */
#define SD_API_VERSION 4

typedef enum sd_status_code {
  SD_OK = 0,
  SD_INVALID_ARGUMENT = 1, /* a NULL handle, an unknown name, a wrong shape or dtype */
  SD_ERROR = 2,            /* the operation failed: a bad file, a non-finite loss, ... */
  SD_UNAVAILABLE = 3,      /* a device or feature this build or machine does not have */
  SD_OUT_OF_MEMORY = 4
} sd_status_code;

typedef struct sd_status sd_status;
SD_API sd_status_code sd_status_get_code(const sd_status *status); /* SD_OK for NULL */
SD_API const char *sd_status_message(const sd_status *status);     /* "" for NULL */
SD_API void sd_status_free(sd_status *status);

SD_API int sd_api_version(void);
SD_API const char *sd_version(void);

/* Element types, numbered as ONNX's TensorProto.DataType. */
typedef enum sd_dtype {
  SD_F32 = 1, SD_U8 = 2, SD_I8 = 3, SD_U16 = 4, SD_I16 = 5, SD_I32 = 6, SD_I64 = 7,
  SD_BOOL = 9, SD_F16 = 10, SD_F64 = 11, SD_U32 = 12, SD_U64 = 13, SD_BF16 = 16
} sd_dtype;
SD_API size_t sd_dtype_size(int32_t dtype); /* 0 for unknown types */

/* A tensor the caller owns: row-major, contiguous. */
typedef struct sd_tensor {
  const char *name;
  int32_t dtype; /* sd_dtype */
  int32_t rank;
  const int64_t *dims;
  const void *data;
  size_t bytes;
} sd_tensor;

/* ---- plans ---- */
typedef struct sd_plan sd_plan;
SD_API sd_status *sd_plan_load(const char *path, sd_plan **out);
SD_API void sd_plan_free(sd_plan *plan);
SD_API size_t sd_plan_entry_count(const sd_plan *plan);
/* Name of entry `index` (entries of one name differ by their shape bucket). */
SD_API const char *sd_plan_entry_name(const sd_plan *plan, size_t index);
SD_API size_t sd_plan_global_count(const sd_plan *plan);
/* Global `index`: name, dtype, rank, dims (valid while the plan lives) and role
 * ("frozen", "trainable", "optimizer_state", "scalar_state", "constant", "gradient"). */
SD_API sd_status *sd_plan_global_info(const sd_plan *plan, size_t index, sd_tensor *info, const char **role);
/* The JSON configuration sdc compile recorded (PEFT settings, token input). */
SD_API const char *sd_plan_config(const sd_plan *plan);

/* ---- ranks (docs/ranks.md) ---- */
/* Joins the world the launcher started this process in (mpirun: MPI), once
 * per process; later calls return the same place. rank and size (either may
 * be NULL) get this process's place: 0 of 1 when launched alone. A session
 * created with join_world = 1 then trains as one rank of it. */
SD_API sd_status *sd_world_join(int *rank, int *size);
/* Ends every rank's process with exit_code (MPI_Abort): for an error on one
 * rank, which the others would otherwise wait for in their next collective.
 * Alone, or before sd_world_join, it is exit(exit_code). Does not return. */
SD_API void sd_world_abort(int exit_code);

/* ---- sessions ---- */
typedef struct sd_session sd_session;
typedef struct sd_session_options {
  const char *device; /* "cpu", "cuda" or "auto" (NULL: "cpu"); no such device: SD_UNAVAILABLE */
  int threads;        /* 0: all hardware threads */
  int join_world;     /* 1: one rank of the world sd_world_join joined (data-parallel training); 0: alone */
} sd_session_options;
SD_API void sd_session_options_init(sd_session_options *options);
/* Binds every step of the plan to a kernel of the device; a plan needing a
 * kernel the device lacks fails here, naming the op and the device. */
SD_API sd_status *sd_session_create(const sd_plan *plan, const sd_session_options *options, sd_session **out);
SD_API void sd_session_free(sd_session *session);

/* Results of a run, owned by the list. */
typedef struct sd_tensor_list sd_tensor_list;
SD_API size_t sd_tensor_list_size(const sd_tensor_list *list);
/* Tensor `index`; pointers stay valid until the list is freed. */
SD_API sd_status *sd_tensor_list_get(const sd_tensor_list *list, size_t index, sd_tensor *out);
SD_API void sd_tensor_list_free(sd_tensor_list *list);

/* Runs entry `entry` (the bucket whose input shapes equal the inputs'),
 * inputs matched by name. */
SD_API sd_status *sd_session_run(sd_session *session, const char *entry, const sd_tensor *inputs, size_t n_inputs,
                                 sd_tensor_list **outputs);

/* Global state by name, copied: `bytes` must equal the global's size. Only
 * mutable globals (trainable, optimizer and scalar state, gradients) can be written. */
SD_API sd_status *sd_session_read_global(const sd_session *session, const char *name, void *dst, size_t bytes);
SD_API sd_status *sd_session_write_global(sd_session *session, const char *name, const void *src, size_t bytes);

/* LoRA adapters in Hugging Face PEFT's layout (plans compiled with --peft lora). */
SD_API sd_status *sd_session_load_adapter(sd_session *session, const char *dir);
SD_API sd_status *sd_session_save_adapter(const sd_session *session, const char *dir); /* in a world: rank 0 writes */
/* A DyLoRA plan (sdc compile --peft dylora): outside training, compute with the adapter's first
 * `ranks` ranks (a multiple of its block size, up to its r). SD_INVALID_ARGUMENT on other plans. */
SD_API sd_status *sd_session_set_adapter_rank(sd_session *session, int64_t ranks);

/* ---- training ---- */
typedef struct sd_train_config {
  const char *data_path;      /* JSON Lines (required) */
  const char *eval_path;      /* NULL: no evaluation */
  const char *checkpoint_dir; /* NULL: no checkpoints */
  const char *adapter_path;   /* start from this LoRA adapter; NULL: none */
  const char *lr_schedule;    /* "constant" or "cosine" */
  double lr, weight_decay, clip_norm;
  int64_t steps;  /* optimizer steps; 0: `epochs` passes over the data */
  int64_t epochs, batch, grad_accum, warmup_steps, eval_every, checkpoint_every;
  uint64_t seed;
  int shuffle, truncate, resume; /* booleans */
} sd_train_config;
/* sdrun train's defaults: lr 1e-4, constant schedule, 1 epoch, the plan's batch, shuffled. */
SD_API void sd_train_config_init(sd_train_config *config);

typedef struct sd_step_report {
  int64_t step, total, epoch;
  double loss, lr, grad_norm, tokens, seconds;
  int evaluated, checkpointed;
  double eval_loss;
  /* fp16 plans: skipped (an Inf/NaN gradient: no update, the scale halved)
     and the loss scale after the step; loss_scale 0: no loss scaling. */
  int skipped;
  double loss_scale;
} sd_step_report;

typedef struct sd_trainer sd_trainer;
SD_API sd_status *sd_trainer_create(sd_session *session, const sd_train_config *config, sd_trainer **out);

/* GRPO plans that sample their own groups (sdc compile --recipe grpo
 * --kv-cache; sdrun train --reward-cmd): config.data_path then holds prompts,
 * and each step's completions are sampled with the plan and scored. The
 * reward comes from `reward_command` (`sh -c`, one JSON line in, one number
 * out per completion) or, when that is NULL, from `reward_fn`: it gets
 * `count` requests, JSON objects {"prompt", "completion", "prompt_ids",
 * "completion_ids"}, writes a finite reward for each into `rewards` and
 * returns 0; nonzero is an error, whose message it may write into `error`
 * (NUL-terminated, at most `error_capacity` bytes). */
typedef int (*sd_reward_fn)(void *user, size_t count, const char *const *requests, double *rewards, char *error,
                            size_t error_capacity);
typedef struct sd_sampling_config {
  const char *reward_command;
  sd_reward_fn reward_fn;
  void *reward_user;        /* passed to reward_fn */
  double temperature, top_p; /* 1, 1: TRL's GRPOConfig defaults; temperature 0: greedy */
  int64_t top_k;            /* 0: the whole vocabulary */
  int64_t max_new_tokens;   /* 0: the rest of the plan's row */
  double reward_timeout_s;  /* reward_command: the longest wait for one reward (600) */
} sd_sampling_config;
SD_API void sd_sampling_config_init(sd_sampling_config *config);
SD_API sd_status *sd_trainer_create_sampling(sd_session *session, const sd_train_config *config,
                                             const sd_sampling_config *sampling, sd_trainer **out);
/* The mean reward of the last step's sampled completions (over all ranks); NaN when it sampled none. */
SD_API double sd_trainer_last_reward(const sd_trainer *trainer);
SD_API void sd_trainer_free(sd_trainer *trainer);
SD_API int64_t sd_trainer_step_count(const sd_trainer *trainer);  /* optimizer steps done */
SD_API int64_t sd_trainer_total_steps(const sd_trainer *trainer);
/* One optimizer step, then eval and checkpoint when due. */
SD_API sd_status *sd_trainer_step(sd_trainer *trainer, sd_step_report *report);
SD_API sd_status *sd_trainer_evaluate(sd_trainer *trainer, double *loss);
/* In a world of several ranks every rank calls these. A checkpoint: each
   rank writes the state it holds, rank 0 commits the set. Weights: the state
   ranks hold apart (weight rows) is gathered first, and rank 0 writes. */
SD_API sd_status *sd_trainer_save_checkpoint(sd_trainer *trainer);
SD_API sd_status *sd_trainer_save_weights(const sd_trainer *trainer, const char *path);

/* ---- generation ---- */
typedef struct sd_generator sd_generator;
/* temperature 0: greedy; top_k 0: the whole vocabulary. */
SD_API sd_status *sd_generator_create(sd_session *session, double temperature, int64_t top_k, uint64_t seed,
                                      sd_generator **out);
SD_API void sd_generator_free(sd_generator *generator);
SD_API int64_t sd_generator_vocab_size(const sd_generator *generator);
/* The token after tokens[0..n) (n >= 1). With a plan compiled with --kv-cache
 * the generator keeps row 0's cache: a call that extends the previous call's
 * tokens runs only the new ones (one decode step per added token). */
SD_API sd_status *sd_generator_next(sd_generator *generator, const int64_t *tokens, size_t n, int64_t *next);
/* Speculative decoding's most guessed tokens a step: the plan's verify entry
 * width less one (sdc compile --speculate K), 0 without one. */
SD_API int64_t sd_generator_speculation(const sd_generator *generator);
/* max_new tokens after tokens[0..n) into out (room for max_new), the same
 * tokens sd_generator_next gives one call at a time. speculate in
 * [0, sd_generator_speculation()]: each step guesses up to that many tokens
 * from the text so far (prompt lookup) and checks them in one call. */
SD_API sd_status *sd_generator_generate(sd_generator *generator, const int64_t *tokens, size_t n, size_t max_new,
                                        size_t speculate, int64_t *out);

/* Rows generated together: the plan's sdc compile --kv-batch (1 without a cache). */
SD_API int64_t sd_generator_batch_size(const sd_generator *generator);

/* Adapter slots (sdc compile --max-loras N): N, 0 for other plans. Slot 0 is
 * the plan's own adapter (sd_session_load_adapter's); slots 1..N hold what
 * sd_generator_load_adapter puts there. The single-text calls above go
 * through slot 0. */
SD_API int64_t sd_generator_adapter_slots(const sd_generator *generator);
/* Reads the PEFT LoRA adapter in dir (adapter_config.json and
 * adapter_model.safetensors: LoRA of rank up to the plan's, on modules the
 * plan adapts) into `slot` (0..N). Texts cached through the slot are dropped. */
SD_API sd_status *sd_generator_load_adapter(sd_generator *generator, int64_t slot, const char *dir);

/* Speculative decoding's guesses from a draft model: draft's greedy tokens
 * (a generator of a --kv-cache plan of the same vocabulary, with at least as
 * many rows and as long a context) instead of prompt lookup's, for the calls
 * with speculate > 0. The plan needs a verify entry (sdc compile --speculate).
 * The draft must outlive `generator` or be unset first (draft NULL). The
 * tokens are the same with any draft or none. */
SD_API sd_status *sd_generator_set_draft(sd_generator *generator, sd_generator *draft);

typedef struct sd_generate_options {
  size_t max_new;          /* tokens a text gets at most (default 64) */
  size_t speculate;        /* guessed tokens a step, at most sd_generator_speculation() (default 0) */
  const int64_t *slots;    /* text i's adapter slot (NULL: slot 0 for every text) */
  const int64_t *stop_ids; /* a drawn one ends its text and is not written (EOS ids); NULL when n_stop_ids is 0 */
  size_t n_stop_ids;
} sd_generate_options;
SD_API void sd_generate_options_init(sd_generate_options *options);
/* Continues n_texts texts through the plan's rows, sd_generator_batch_size()
 * at a time, in order. Text i is tokens[offsets[i]..offsets[i+1]) (offsets
 * has n_texts + 1 entries, offsets[0] = 0, at least one token a text). Its
 * tokens go to out[i * max_new ...] (room for n_texts * max_new), counts[i]
 * of them: max_new, fewer at a stop id or when the plan's cache is full.
 * Text i draws with its own RNG seeded with the generator's seed + i (afresh
 * each call), so its tokens do not depend on the texts beside it; greedy
 * texts equal sd_generator_generate's. */
SD_API sd_status *sd_generator_generate_batch(sd_generator *generator, const int64_t *tokens, const size_t *offsets,
                                              size_t n_texts, const sd_generate_options *options, int64_t *out,
                                              size_t *counts);

#ifdef __cplusplus
}
#endif
#endif /* SD_SD_H */
