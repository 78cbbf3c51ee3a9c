// sdrun generate: byte-level text in and out around the runtime's generator
// (sd/generate/generator.h).
#include "commands.h"
#include "flags.h"
#include "sd/generate/generator.h"
#include <cstdio>

namespace sdrun {
namespace {

const char *kGenerateUsage =
    "usage: sdrun generate PLAN.sdp --prompt TEXT [--max-new-tokens N] [--temperature T]\n"
    "                     [--top-k K] [--seed S] [--adapter DIR] [--threads N] [--device cpu|cuda|auto]\n"
    "\n"
    "Continues TEXT with a byte-level (256-token) model, using the plan's infer\n"
    "entry with batch 1 (training plans get such a bucket by default). Greedy when\n"
    "--temperature is 0 (the default is 0.8 with --top-k 40). There is no KV cache\n"
    "yet: every new token re-runs the whole window (the last `seq` tokens), so the\n"
    "cost per token grows with the bucket length.\n";

} // namespace

int generateCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args, {"--prompt", "--max-new-tokens", "--temperature", "--top-k", "--seed", "--adapter", "--threads", "--device"}, f,
                  err, {"--no-cuda-graphs"})) {
    if (!f.help) return fail(err + " (see sdrun generate --help)");
  }
  if (f.help) return std::fputs(kGenerateUsage, stdout), 0;
  int64_t maxNew, topK, seed;
  sd::SessionOptions so;
  double temperature;
  if (!intFlag(f, "--max-new-tokens", 64, 1, 1 << 20, maxNew, err) || !intFlag(f, "--top-k", 40, 0, 1 << 20, topK, err) ||
      !intFlag(f, "--seed", 0, 0, INT64_MAX, seed, err) || !sessionFlags(f, so, err) ||
      !numberFlag(f, "--temperature", 0.8, 0, 100, temperature, err))
    return fail(err);
  if (!hasFlag(f, "--prompt")) return fail("--prompt TEXT is required (see sdrun generate --help)");
  std::string prompt = flagValue(f, "--prompt");
  auto loaded = sd::Plan::loadFile(f.plan);
  if (!loaded.isOk()) return fail(loaded.status().message());
  std::shared_ptr<const sd::Plan> plan(std::move(loaded.value()));
  auto session = sd::Session::create(plan, so);
  if (!session.isOk()) return fail(session.status().message());
  sd::Session &s = *session.value();
  if (hasFlag(f, "--adapter"))
    if (auto st = loadAdapterFlag(f.plan, flagValue(f, "--adapter"), s); !st.isOk()) return fail(st.message());
  sd::generate::SamplingOptions sampling;
  sampling.temperature = temperature;
  sampling.topK = topK;
  sampling.seed = uint64_t(seed);
  auto gen = sd::generate::Generator::create(s, sampling);
  if (!gen.isOk()) return fail(f.plan + ": " + gen.status().message());
  if (gen.value()->vocabSize() != 256)
    return fail(f.plan + ": generate supports byte-level models (256 logits per position) for now");
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  for (int64_t &t : tokens) t = int64_t(uint8_t(t));
  if (tokens.empty()) tokens.push_back('\n');
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  sd::Status st = gen.value()->generate(tokens, maxNew, [](int64_t t) {
    std::fputc(int(t), stdout);
    std::fflush(stdout);
  });
  if (!st.isOk()) return fail(st.message());
  std::fputc('\n', stdout);
  return 0;
}

} // namespace sdrun
