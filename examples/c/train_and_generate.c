/* Trains a LoRA plan with sdc's C API, saves the adapter, and continues a
 * prompt with the trained model (a byte-level model: tokens are bytes).
 *
 *   train_and_generate PLAN.sdp DATA.jsonl STEPS ADAPTER_DIR [PROMPT]
 *
 * Prints one line per optimizer step ("step N loss X", the loss with all 17
 * digits so runs can be compared exactly), then the generated text. */
#include "sd/sd.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints the error and returns 1 when `s` is one; frees it either way. */
static int failed(sd_status *s, const char *what) {
  if (!s) return 0;
  fprintf(stderr, "train_and_generate: %s: %s\n", what, sd_status_message(s));
  sd_status_free(s);
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s PLAN.sdp DATA.jsonl STEPS ADAPTER_DIR [PROMPT]\n", argv[0]);
    return 2;
  }
  const char *prompt = argc > 5 ? argv[5] : "The ";
  int rc = 1;
  sd_plan *plan = NULL;
  sd_session *session = NULL;
  sd_trainer *trainer = NULL;
  sd_generator *gen = NULL;

  if (failed(sd_plan_load(argv[1], &plan), "loading the plan")) goto done;
  sd_session_options so;
  sd_session_options_init(&so);
  so.threads = 2;
  if (failed(sd_session_create(plan, &so, &session), "creating the session")) goto done;

  sd_train_config cfg;
  sd_train_config_init(&cfg);
  cfg.data_path = argv[2];
  cfg.steps = atoll(argv[3]);
  cfg.lr = 1e-3;
  cfg.seed = 1;
  if (failed(sd_trainer_create(session, &cfg, &trainer), "creating the trainer")) goto done;
  while (sd_trainer_step_count(trainer) < sd_trainer_total_steps(trainer)) {
    sd_step_report r;
    if (failed(sd_trainer_step(trainer, &r), "training")) goto done;
    printf("step %lld loss %.17g\n", (long long)r.step, r.loss);
  }
  if (failed(sd_session_save_adapter(session, argv[4]), "saving the adapter")) goto done;

  if (failed(sd_generator_create(session, 0.0, 0, 0, &gen), "creating the generator")) goto done;
  size_t n = strlen(prompt), cap = n + 32; /* 32 new tokens */
  int64_t *tokens = malloc(cap * sizeof *tokens);
  if (!tokens) goto done;
  for (size_t i = 0; i < n; ++i) tokens[i] = (unsigned char)prompt[i];
  for (; n < cap; ++n)
    if (failed(sd_generator_next(gen, tokens, n, &tokens[n]), "generating")) {
      free(tokens);
      goto done;
    }
  printf("generated: ");
  for (size_t i = 0; i < n; ++i) putchar((int)tokens[i]);
  putchar('\n');
  free(tokens);
  rc = 0;

done:
  sd_generator_free(gen);
  sd_trainer_free(trainer);
  sd_session_free(session);
  sd_plan_free(plan);
  return rc;
}
