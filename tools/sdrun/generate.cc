// sdrun generate: sampling from a byte-level model's infer entry (batch 1).
#include "commands.h"
#include "flags.h"
#include "sd/runtime/session.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

namespace sdrun {
namespace {

const char *kGenerateUsage =
    "usage: sdrun generate PLAN.sdp --prompt TEXT [--max-new-tokens N] [--temperature T]\n"
    "                     [--top-k K] [--seed S] [--adapter DIR] [--threads N]\n"
    "\n"
    "Continues TEXT with a byte-level (256-token) model, using the plan's infer\n"
    "entry with batch 1 (training plans get such a bucket by default). Greedy when\n"
    "--temperature is 0 (the default is 0.8 with --top-k 40). There is no KV cache\n"
    "yet: every new token re-runs the whole window (the last `seq` tokens), so the\n"
    "cost per token grows with the bucket length.\n";

struct Bucket {
  size_t entry;
  int64_t seq;
};

} // namespace

int generateCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args, {"--prompt", "--max-new-tokens", "--temperature", "--top-k", "--seed", "--adapter", "--threads"}, f,
                  err)) {
    if (!f.help) return fail(err + " (see sdrun generate --help)");
  }
  if (f.help) return std::fputs(kGenerateUsage, stdout), 0;
  int64_t maxNew, topK, seed, threads;
  double temperature;
  if (!intFlag(f, "--max-new-tokens", 64, 1, 1 << 20, maxNew, err) || !intFlag(f, "--top-k", 40, 0, 1 << 20, topK, err) ||
      !intFlag(f, "--seed", 0, 0, INT64_MAX, seed, err) || !intFlag(f, "--threads", 0, 0, 1024, threads, err) ||
      !numberFlag(f, "--temperature", 0.8, 0, 100, temperature, err))
    return fail(err);
  if (!hasFlag(f, "--prompt")) return fail("--prompt TEXT is required (see sdrun generate --help)");
  std::string prompt = flagValue(f, "--prompt");
  auto loaded = sd::Plan::loadFile(f.plan);
  if (!loaded.isOk()) return fail(loaded.status().message());
  std::shared_ptr<const sd::Plan> plan(std::move(loaded.value()));
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < plan->entries.size(); ++i) {
    const sd::EntryDesc &e = plan->entries[i];
    if (e.name != "infer" || e.inputs.size() != 1 || e.outputs.empty()) continue;
    const sd::BufferDesc &in = e.buffers[size_t(e.inputs[0].second)];
    const sd::BufferDesc &out = e.buffers[size_t(e.outputs[0].second)];
    if (in.dtype != sd::DType::I64 || in.dims.size() != 2 || in.dims[0] != 1 || in.dims[1] < 1) continue;
    if (out.dims.size() != 3 || out.dims.back() != 256 || out.dtype != sd::DType::F32)
      return fail(f.plan + ": generate supports byte-level models (256 logits per position) for now");
    buckets.push_back({i, in.dims[1]});
  }
  if (buckets.empty())
    return fail(f.plan + ": the plan has no batch-1 infer bucket with a [1, seq] token input (seq > 0); compile "
                         "with --shapes TOKENS=1xSEQ (training plans: --infer-shapes TOKENS=1xSEQ)");
  std::sort(buckets.begin(), buckets.end(), [](const Bucket &a, const Bucket &b) { return a.seq < b.seq; });
  sd::SessionOptions so;
  so.threads = int(threads);
  auto session = sd::Session::create(plan, so);
  if (!session.isOk()) return fail(session.status().message());
  sd::Session &s = *session.value();
  if (hasFlag(f, "--adapter"))
    if (auto st = loadAdapterFlag(f.plan, flagValue(f, "--adapter"), s); !st.isOk()) return fail(st.message());
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  for (int64_t &t : tokens) t = int64_t(uint8_t(t));
  if (tokens.empty()) tokens.push_back('\n');
  std::mt19937_64 rng{static_cast<uint64_t>(seed)};
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::vector<sd::HostTensor> outs;
  for (int64_t step = 0; step < maxNew; ++step) {
    size_t want = tokens.size();
    const Bucket *b = &buckets.back();
    for (const Bucket &c : buckets)
      if (c.seq >= int64_t(want)) {
        b = &c;
        break;
      }
    size_t window = std::min(want, size_t(b->seq)), start = tokens.size() - window;
    sd::HostTensor ids{"input_ids", sd::DType::I64, {1, b->seq}, std::vector<uint8_t>(size_t(b->seq) * 8, 0)};
    std::memcpy(ids.data.data(), tokens.data() + start, window * 8);
    if (auto st = s.run(b->entry, {&ids}, outs); !st.isOk()) return fail(st.message());
    const float *logits = reinterpret_cast<const float *>(outs[0].data.data()) + (window - 1) * 256;
    int next;
    if (temperature == 0) {
      next = int(std::max_element(logits, logits + 256) - logits);
    } else {
      std::vector<int> idx(256);
      std::iota(idx.begin(), idx.end(), 0);
      size_t keep = topK > 0 ? size_t(std::min<int64_t>(topK, 256)) : 256;
      std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), [&](int a, int c) { return logits[a] > logits[c]; });
      std::vector<double> p(keep);
      for (size_t k = 0; k < keep; ++k) p[k] = std::exp((double(logits[idx[k]]) - double(logits[idx[0]])) / temperature);
      std::discrete_distribution<size_t> d(p.begin(), p.end());
      next = idx[d(rng)];
    }
    tokens.push_back(next);
    std::fputc(next, stdout);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
  return 0;
}

} // namespace sdrun
