/* Every C API call given NULL handles or NULL out-pointers: an
 * SD_INVALID_ARGUMENT status with a one-line message naming what is NULL, or
 * the documented neutral value; never a crash. Plain C, as a C user compiles it. */
#include "sd/sd.h"
#include <stdio.h>
#include <string.h>

static int failures = 0;

static void expect_invalid(const char *call, sd_status *s) {
  const char *m = sd_status_message(s);
  if (!s || sd_status_get_code(s) != SD_INVALID_ARGUMENT || !strstr(m, "NULL") || strchr(m, '\n')) {
    fprintf(stderr, "FAIL %s: code %d, message '%s'\n", call, (int)sd_status_get_code(s), m);
    ++failures;
  }
  sd_status_free(s);
}

static void expect(const char *what, int ok) {
  if (!ok) {
    fprintf(stderr, "FAIL %s\n", what);
    ++failures;
  }
}

int main(void) {
  sd_plan *plan = NULL;
  sd_session *session = NULL;
  sd_trainer *trainer = NULL;
  sd_generator *gen = NULL;
  sd_tensor t;
  sd_tensor_list *list = NULL;
  sd_step_report report;
  sd_train_config config;
  double loss = 0;
  int64_t next = 0, token = 1;
  char buf[8];

  expect_invalid("sd_plan_load(NULL path)", sd_plan_load(NULL, &plan));
  expect_invalid("sd_plan_load(NULL out)", sd_plan_load("x.sdp", NULL));
  expect_invalid("sd_plan_global_info(NULL plan)", sd_plan_global_info(NULL, 0, &t, NULL));
  expect_invalid("sd_session_create(NULL plan)", sd_session_create(NULL, NULL, &session));
  expect_invalid("sd_session_run(NULL session)", sd_session_run(NULL, "infer", NULL, 0, &list));
  expect_invalid("sd_session_read_global(NULL session)", sd_session_read_global(NULL, "w", buf, sizeof buf));
  expect_invalid("sd_session_write_global(NULL session)", sd_session_write_global(NULL, "w", buf, sizeof buf));
  expect_invalid("sd_session_load_adapter(NULL session)", sd_session_load_adapter(NULL, "dir"));
  expect_invalid("sd_session_save_adapter(NULL session)", sd_session_save_adapter(NULL, "dir"));
  expect_invalid("sd_session_set_adapter_rank(NULL session)", sd_session_set_adapter_rank(NULL, 4));
  expect_invalid("sd_tensor_list_get(NULL list)", sd_tensor_list_get(NULL, 0, &t));
  sd_train_config_init(&config);
  expect_invalid("sd_trainer_create(NULL session)", sd_trainer_create(NULL, &config, &trainer));
  sd_sampling_config sampling;
  sd_sampling_config_init(&sampling);
  expect_invalid("sd_trainer_create_sampling(NULL session)",
                 sd_trainer_create_sampling(NULL, &config, &sampling, &trainer));
  expect_invalid("sd_trainer_create_sampling(NULL sampling)", sd_trainer_create_sampling(NULL, &config, NULL, &trainer));
  expect_invalid("sd_trainer_step(NULL trainer)", sd_trainer_step(NULL, &report));
  expect_invalid("sd_trainer_evaluate(NULL trainer)", sd_trainer_evaluate(NULL, &loss));
  expect_invalid("sd_trainer_save_checkpoint(NULL trainer)", sd_trainer_save_checkpoint(NULL));
  expect_invalid("sd_trainer_save_weights(NULL trainer)", sd_trainer_save_weights(NULL, "w.safetensors"));
  expect_invalid("sd_generator_create(NULL session)", sd_generator_create(NULL, 0, 0, 0, &gen));
  expect_invalid("sd_generator_next(NULL generator)", sd_generator_next(NULL, &token, 1, &next));
  expect_invalid("sd_generator_generate(NULL generator)", sd_generator_generate(NULL, &token, 1, 1, 0, &next));
  sd_generate_options options;
  sd_generate_options_init(&options);
  const size_t offsets[2] = {0, 1};
  size_t count = 0;
  expect_invalid("sd_generator_generate_batch(NULL generator)",
                 sd_generator_generate_batch(NULL, &token, offsets, 1, &options, &next, &count));
  expect_invalid("sd_generator_load_adapter(NULL generator)", sd_generator_load_adapter(NULL, 1, "adapter"));
  expect_invalid("sd_generator_set_draft(NULL generator)", sd_generator_set_draft(NULL, NULL));

  /* The documented neutral values. */
  expect("sd_status_get_code(NULL) is SD_OK", sd_status_get_code(NULL) == SD_OK);
  expect("sd_status_message(NULL) is \"\"", strcmp(sd_status_message(NULL), "") == 0);
  expect("sd_plan_entry_count(NULL) is 0", sd_plan_entry_count(NULL) == 0);
  expect("sd_plan_entry_name(NULL, 0) is NULL", sd_plan_entry_name(NULL, 0) == NULL);
  expect("sd_plan_global_count(NULL) is 0", sd_plan_global_count(NULL) == 0);
  expect("sd_tensor_list_size(NULL) is 0", sd_tensor_list_size(NULL) == 0);
  expect("sd_generator_speculation(NULL) is 0", sd_generator_speculation(NULL) == 0);
  expect("sd_generator_batch_size(NULL) is 0", sd_generator_batch_size(NULL) == 0);
  expect("sd_generator_adapter_slots(NULL) is 0", sd_generator_adapter_slots(NULL) == 0);
  expect("sd_generate_options_init's max_new is 64", options.max_new == 64 && options.slots == NULL);
  sd_generate_options_init(NULL);
  expect("sd_trainer_last_reward(NULL) is NaN", sd_trainer_last_reward(NULL) != sd_trainer_last_reward(NULL));
  sd_plan_free(NULL);
  sd_session_free(NULL);
  sd_tensor_list_free(NULL);
  sd_trainer_free(NULL);
  sd_generator_free(NULL);
  sd_status_free(NULL);
  if (failures) return 1;
  printf("capi_null_handles: every call refused NULL handles cleanly\n");
  return 0;
}
