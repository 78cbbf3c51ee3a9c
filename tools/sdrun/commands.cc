// sdrun infer / bench / inspect.
#include "sd/ops/kernel.h"
#include "commands.h"
#include "sd/comm/world.h"
#include "flags.h"
#include "trace.h"
#include "sd/train/trainer.h"
#include "sd/ops/cpu_info.h"
#include "sd/runtime/cuda_backend.h"
#include "sd/runtime/adapter.h"
#include "sd/runtime/lora_slots.h"
#include "sd/runtime/plan.h"
#include "sd/runtime/session.h"
#include "sd/format/tensor_io.h"
#include "sd/format/training_abi.h"
#include <algorithm>
#include <optional>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <sys/stat.h>

namespace sdrun {

// Training state (mutable globals) per rank of a data-parallel run: all of
// it on every rank, except what --shard splits (optimizer state, and with
// grads the gradients, by parameter; with params every weight, gradient and
// moment by rows); the busiest rank's share for a few world sizes.
void printStatePerRank(const sd::Plan &p) {
  if (const int64_t slots = sd::loraSlotCount(p)) { // a serving plan: its only mutable state is the adapters
    uint64_t bytes = 0;
    for (const sd::GlobalDesc &g : p.globals)
      if (g.role == sd::GlobalRole::Trainable) bytes += g.bytes;
    std::printf("adapter slots: %lld besides the plan's own (sdc compile --max-loras), %llu bytes\n", (long long)slots,
                (unsigned long long)bytes);
    return;
  }
  auto rows = sd::rowShardedGlobals(p);
  std::vector<bool> rowSharded = rows.isOk() ? rows.value() : std::vector<bool>(p.globals.size(), false);
  auto busiest = [&](int ranks, bool state) {
    std::vector<int> holder = sd::globalHolders(p, ranks);
    uint64_t most = 0;
    for (int r = 0; r < ranks; ++r) {
      uint64_t bytes = 0;
      for (size_t i = 0; i < p.globals.size(); ++i)
        if (state ? sd::isTrainingStateRole(p.globals[i].role) : p.globals[i].role == sd::GlobalRole::Frozen)
          bytes += sd::globalBytesOnRank(p, i, r, ranks, holder, rowSharded);
      most = std::max(most, bytes);
    }
    return most;
  };
  const uint64_t state = busiest(1, true);
  if (!state) return;
  std::printf("training state: %llu bytes", (unsigned long long)state);
  if (sd::shardMode(p) == "none") {
    std::printf(" on every rank (sdc compile --shard none)\n");
    return;
  }
  std::printf("; per rank with --shard %s (the busiest rank):", sd::shardMode(p).c_str());
  for (int ranks : {2, 4, 8}) std::printf(" %d ranks %llu", ranks, (unsigned long long)busiest(ranks, true));
  std::printf("\n");
  if (std::find(rowSharded.begin(), rowSharded.end(), true) == rowSharded.end()) return;
  std::printf("frozen weights: %llu bytes; per rank with --shard params (the busiest rank):",
              (unsigned long long)busiest(1, false));
  for (int ranks : {2, 4, 8}) std::printf(" %d ranks %llu", ranks, (unsigned long long)busiest(ranks, false));
  std::printf("\n");
}

// How the first train_step reduces its gradients across ranks: the number
// of AllReduce steps over gradients, and how many of them start while the
// backward still runs (async; sdc compile --bucket-mb,
// --no-overlap-reduction). Nothing for plans without a reduction.
void printGradientReduction(const sd::Plan &p) {
  for (const sd::EntryDesc &e : p.entries) {
    if (e.name != sd::abi::kTrainStep) continue;
    size_t buckets = 0, during = 0;
    for (const sd::StepDesc &s : e.steps) {
      // Gradient buckets, not the token count's own reduction (one number).
      bool tensors = std::any_of(s.inputs.begin(), s.inputs.end(), [&](int32_t i) {
        return i >= 0 && sd::product(e.buffers[size_t(i)].dims) > 1;
      });
      if (s.op == "AllReduce" && tensors) ++buckets, during += s.attrs.getInt("async", 0) != 0;
    }
    if (!buckets) return;
    std::printf("gradient reduction (train_step): %zu bucket%s, %zu started during the backward\n", buckets,
                buckets == 1 ? "" : "s", during);
    return;
  }
}

int fail(const std::string &msg) {
  // Under mpirun every rank's stderr lands in one stream: say whose error it is.
  sd::LaunchInfo launch = sd::detectLaunch();
  if (launch.size > 1) std::fprintf(stderr, "sdrun: error: rank %d: %s\n", launch.rank, msg.c_str());
  else std::fprintf(stderr, "sdrun: error: %s\n", msg.c_str());
  return 1;
}

sd::Status loadAdapterFlag(const std::string &planPath, const std::string &dir, sd::Session &session) {
  auto cfg = sd::loraConfigOf(session.plan());
  if (!cfg.isOk()) return sd::sdError(planPath, ": ", cfg.status().message());
  return sd::loadAdapter(dir, session, cfg.value());
}

sd::Status adapterRankFlag(const Flags &f, sd::Session &session) {
  if (!hasFlag(f, "--adapter-rank")) return sd::Status::ok();
  std::string v = flagValue(f, "--adapter-rank");
  char *end = nullptr;
  long long ranks = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end) return sd::sdError("--adapter-rank needs a whole number of ranks, got '", v, "'");
  auto cfg = sd::loraConfigOf(session.plan());
  if (!cfg.isOk()) return sd::sdError("--adapter-rank needs a DyLoRA plan (sdc compile --peft dylora): ", cfg.status().message());
  return sd::setAdapterRank(session, cfg.value(), ranks);
}

namespace {

const char *kInferUsage =
    "usage: sdrun infer PLAN.sdp [--input NAME=FILE]... [--input-dir DIR] [--output-dir DIR]\n"
    "                  [--output-format pb|npy] [--threads N] [--device cpu|cuda|auto] [--adapter DIR]\n"
    "                  [--adapter-rank K] [--no-cuda-graphs] [--no-cpu-fallback] [--cpu-ops OP,...] [--profile TRACE.json]\n"
    "\n"
    "Runs the plan's `infer` entry. FILE is an ONNX TensorProto (.pb) or NumPy .npy.\n"
    "--adapter loads an adapter (HF PEFT layout: LoRA, DoRA, DyLoRA, IA3, LoHa, LoKr, VeRA, OSF or prompt\n"
    "tuning; AdapterHub's for bottleneck adapters) of the plan's method first. A prompt tuning plan's logits cover its virtual tokens\n"
    "first, as PEFT's do. --adapter-rank K runs a DyLoRA plan's adapter (sdc compile --peft\n"
    "dylora) at its first K ranks (a multiple of its block size), as a LoRA cut to rank K.\n"
    "--input-dir reads input_0.pb, input_1.pb, ... (or .npy) in graph-input order.\n"
    "On a GPU a step with no CUDA kernel runs the CPU's (with copies each way);\n"
    "--no-cpu-fallback refuses such a plan instead, naming the step; --cpu-ops runs\n"
    "the named ops' steps that way too (to check a GPU kernel against the CPU's).\n"
    "Outputs go to DIR/output_0.pb, ... in graph-output order; without --output-dir\n"
    "a summary is printed.\n";

const char *kBenchUsage =
    "usage: sdrun bench PLAN.sdp [--input-dir DIR] [--iterations N] [--warmup N] [--threads N] [--device cpu|cuda|auto]\n"
    "                  [--entry NAME] [--data FILE.jsonl [--batch B]] [--profile[=TRACE.json]]\n"
    "                  [--no-cuda-graphs] [--no-cpu-fallback] [--cpu-ops OP,...] [--gemms [--tune FILE]]\n"
    "\n"
    "Times an entry in-process (default: infer, first bucket, random inputs unless\n"
    "--input-dir is given). For training entries (--entry train_step), --data takes\n"
    "the batch from JSON Lines data as sdrun train would (B rows, padded to the\n"
    "bucket). --profile prints time per op before the summary, with the rate its bytes\n"
    "move at (runs are then eager, and each GPU kernel is waited for);\n"
    "--profile=TRACE.json also writes a Chrome trace.\n"
    "--gemms (CUDA builds, on a GPU) times each distinct GEMM of the entry instead:\n"
    "our cuBLASLt plan against every algorithm cuBLASLt's heuristic offers for it;\n"
    "--tune FILE appends each shape's fastest algorithm to a GEMM tuning file, which\n"
    "sessions on this GPU model then use (SD_GEMM_TUNING=FILE; runs stay bit for bit\n"
    "the same with one file).\n"
    "On a GPU it also times the runs pipelined (each launched before the one ahead\n"
    "is waited for, as sdrun train runs steps) and prints how much of the time the\n"
    "GPU waited for the host, both ways (from CUDA events around each run).\n"
    "The last line is JSON with median_ms (and pipelined_ms, device_idle_pct).\n";

const char *kInspectUsage = "usage: sdrun inspect PLAN.sdp [--kernels cpu|cuda] [--traffic ENTRY]\n       sdrun inspect --cpu [PLAN.sdp]\n\n"
                            "Shows entries, buckets, globals, arena size and weights, and the bytes each\n"
                            "entry's steps read and write (operands once, results once: a count, not a time).\n"
                            "--kernels B lists the plan's ops and whether backend B has a kernel for each\n"
                            "(no GPU needed); it exits 1 when some step has none.\n"
                            "--traffic ENTRY lists that entry's ops by the bytes their steps read and write,\n"
                            "largest first: where a memory-bound step's time is likely to go; then how\n"
                            "many steps move under 1 MB each, by op (on a GPU, launch-bound ones).\n"
                            "--cpu shows the CPU's model and vector features and the GEMM kernels\n"
                            "chosen for it (SD_CPU_ISA=avx2|generic caps the f32 choice).\n";

void printCpuReport() {
  sd::CpuInfo c = sd::cpuInfo();
  std::printf("cpu: %s\n", c.model.empty() ? "(no brand string)" : c.model.c_str());
  std::printf("features:%s%s%s%s%s\n", c.avx2 ? " avx2" : "", c.fma ? " fma" : "", c.avx512f ? " avx512f" : "",
              c.avx512bf16 ? " avx512_bf16" : "", c.amxTile ? " amx_tile" : "");
  std::printf("f32 gemm: %s\n", sd::f32GemmKernel());
  std::printf("f64 gemm: system BLAS (%s)\n", sd::f64GemmKernel());
}

bool fileExists(const std::string &p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string describe(const sd::HostTensor &t) {
  return std::string(sd::dtypeName(t.dtype)) + "[" + sd::formatDims(t.dims) + "]";
}

// Loads inputs in the entry's input order from --input / --input-dir.
sd::Status loadInputs(const Flags &f, const sd::EntryDesc &proto, std::vector<sd::HostTensor> &inputs) {
  std::map<std::string, std::string> byName;
  if (auto it = f.values.find("--input"); it != f.values.end())
    for (const std::string &kv : it->second) {
      size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) return sd::sdError("--input expects NAME=FILE, got '", kv, "'");
      std::string name = kv.substr(0, eq);
      bool known = false;
      std::string listed;
      for (auto &in : proto.inputs) {
        known |= in.first == name;
        listed += (listed.empty() ? "" : ", ") + in.first;
      }
      if (!known)
        return sd::sdError("--input names '", name, "', which is not an input of the plan (its inputs: ",
                           listed.empty() ? "none" : listed, ")");
      byName[name] = kv.substr(eq + 1);
    }
  std::string dir;
  if (auto it = f.values.find("--input-dir"); it != f.values.end()) dir = it->second.back();
  inputs.clear();
  for (size_t i = 0; i < proto.inputs.size(); ++i) {
    const std::string &name = proto.inputs[i].first;
    std::string path;
    if (byName.count(name)) path = byName[name];
    else if (!dir.empty()) {
      path = dir + "/input_" + std::to_string(i) + ".pb";
      if (!fileExists(path) && fileExists(dir + "/input_" + std::to_string(i) + ".npy"))
        path = dir + "/input_" + std::to_string(i) + ".npy";
    } else {
      return sd::sdError("no value for input '", name, "' (use --input ", name, "=FILE or --input-dir)");
    }
    auto t = sd::readTensorFile(path);
    if (!t.isOk()) return t.status();
    t.value().name = name;
    inputs.push_back(std::move(t.value()));
  }
  return sd::Status::ok();
}

sd::StatusOr<std::shared_ptr<sd::Plan>> loadPlan(const std::string &path) {
  auto p = sd::Plan::loadFile(path);
  if (!p.isOk()) return p.status();
  return std::shared_ptr<sd::Plan>(std::move(p.value()));
}

const sd::EntryDesc *firstEntry(const sd::Plan &plan, const std::string &name) {
  for (auto &e : plan.entries)
    if (e.name == name) return &e;
  return nullptr;
}

// Picks the bucket matching the inputs, creates a session and runs it once.
struct Prepared {
  std::unique_ptr<sd::Session> session;
  size_t entry = 0;
  std::vector<const sd::HostTensor *> ptrs;
};

sd::Status prepare(const std::shared_ptr<sd::Plan> &plan, const std::string &planPath, const std::string &entryName,
                   const std::vector<sd::HostTensor> &inputs, const sd::SessionOptions &opts, Prepared &out) {
  std::vector<sd::Dims> dims;
  for (auto &t : inputs) dims.push_back(t.dims);
  auto entry = plan->selectEntry(entryName, dims);
  if (!entry.isOk()) return entry.status().withContext(planPath + ": ");
  auto session = sd::Session::create(plan, opts);
  if (!session.isOk()) return session.status();
  out.session = std::move(session.value());
  out.entry = entry.value();
  for (auto &t : inputs) out.ptrs.push_back(&t);
  return sd::Status::ok();
}

} // namespace

int inferCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  if (!parseFlags(args, {"--input", "--input-dir", "--output-dir", "--output-format", "--threads", "--device", "--adapter",
                         "--adapter-rank", "--profile", "--cpu-ops"},
                  f, err, {"--no-cuda-graphs", "--no-cpu-fallback"})) {
    if (!f.help) return fail(err + " (see sdrun infer --help)");
  }
  if (f.help) return std::fputs(kInferUsage, stdout), 0;
  sd::SessionOptions sessionOpts;
  if (!sessionFlags(f, sessionOpts, err)) return fail(err);
  std::string format = f.values.count("--output-format") ? f.values["--output-format"].back() : "pb";
  if (format != "pb" && format != "npy") return fail("--output-format takes 'pb' or 'npy', got '" + format + "'");
  std::string tracePath = flagValue(f, "--profile");
  if (sd::Status s = sd::checkOutputFile(tracePath, "--profile"); !s.isOk()) return fail(s.message());
  auto plan = loadPlan(f.plan);
  if (!plan.isOk()) return fail(plan.status().message());
  const sd::EntryDesc *proto = firstEntry(*plan.value(), "infer");
  if (!proto) return fail(f.plan + ": plan has no 'infer' entry");
  std::vector<sd::HostTensor> inputs;
  if (auto s = loadInputs(f, *proto, inputs); !s.isOk()) return fail(s.message());
  Prepared run;
  if (auto s = prepare(plan.value(), f.plan, "infer", inputs, sessionOpts, run); !s.isOk()) return fail(s.message());
  if (auto a = f.values.find("--adapter"); a != f.values.end())
    if (auto s = loadAdapterFlag(f.plan, a->second.back(), *run.session); !s.isOk()) return fail(s.message());
  if (auto s = adapterRankFlag(f, *run.session); !s.isOk()) return fail(s.message());
  std::vector<sd::HostTensor> outputs;
  startTrace(*run.session, tracePath);
  if (auto s = run.session->run(run.entry, run.ptrs, outputs); !s.isOk()) return fail(s.message());
  if (auto s = writeTrace(*run.session, tracePath); !s.isOk()) return fail(s.message());
  auto outDir = f.values.find("--output-dir");
  if (outDir == f.values.end()) {
    for (auto &o : outputs) {
      std::printf("%s: %s", o.name.c_str(), describe(o).c_str());
      std::vector<double> vals;
      if (sd::readDoubles(o.view(), vals)) {
        std::printf(" =");
        for (size_t i = 0; i < std::min<size_t>(vals.size(), 8); ++i) std::printf(" %g", vals[i]);
        if (vals.size() > 8) std::printf(" ...");
      }
      std::printf("\n");
    }
    return 0;
  }
  std::string dir = outDir->second.back();
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    if (mkdir(dir.c_str(), 0755) != 0) return fail(dir + ": cannot create output directory");
  } else if (!S_ISDIR(st.st_mode)) {
    return fail(dir + ": not a directory");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string path = dir + "/output_" + std::to_string(i) + "." + format;
    std::string bytes = format == "pb" ? sd::encodeTensorProto(outputs[i]) : sd::encodeNpy(outputs[i]);
    if (auto s = sd::writeFileAtomic(path, bytes); !s.isOk()) return fail(s.message());
  }
  return 0;
}

// sdrun bench --gemms: the entry's GEMMs against raw cuBLASLt's best
// algorithm on the same shapes (sd/ops/cuda_gemm_compare.h).
int benchGemms(Flags &f) {
  std::string err;
  int64_t iters;
  if (!intFlag(f, "--iterations", 20, 1, 100000, iters, err)) return fail(err);
  std::string entryName = f.values.count("--entry") ? f.values["--entry"].back() : "infer";
  auto plan = loadPlan(f.plan);
  if (!plan.isOk()) return fail(plan.status().message());
  const sd::EntryDesc *entry = firstEntry(*plan.value(), entryName);
  if (!entry) return fail(f.plan + ": plan has no '" + entryName + "' entry");
  auto cuda = sd::cudaBackend();
  if (!cuda.isOk()) return fail("--gemms compares GEMMs on a GPU: " + cuda.status().message());
  std::vector<sd::cuda::GemmStep> steps;
  for (const sd::StepDesc &step : entry->steps) {
    sd::cuda::GemmStep g{step.op, &step.attrs, {}, {}};
    for (int32_t b : step.inputs)
      g.inputs.push_back(b < 0 ? sd::TensorView{} : sd::TensorView{nullptr, entry->buffers[size_t(b)].dtype,
                                                                   entry->buffers[size_t(b)].dims});
    for (int32_t b : step.outputs)
      g.outputs.push_back(sd::TensorView{nullptr, entry->buffers[size_t(b)].dtype, entry->buffers[size_t(b)].dims});
    steps.push_back(std::move(g));
  }
  std::string device;
  auto timed = cuda.value()->compareGemms(steps, int(iters), 16, device);
  if (!timed.isOk()) return fail("--gemms: " + timed.status().message());
  if (timed.value().empty()) return fail(f.plan + ": entry '" + entryName + "' runs no GEMM step");
  std::printf("device: %s; entry %s; median of %lld runs per algorithm (CUDA events)\n", device.c_str(),
              entryName.c_str(), (long long)iters);
  // Rates of ours, so a shape far from both the GPU's FLOP and bandwidth
  // peaks stands out (LoRA's rank-r products move bytes, not FLOPs).
  std::printf("%-10s %7s %7s %7s %5s %5s %5s %10s %10s %6s %5s %8s %8s\n", "op", "m", "n", "k", "trans", "type", "steps",
              "ours ms", "best ms", "ratio", "algos", "TFLOP/s", "GB/s");
  double ours = 0, best = 0;
  std::string rows;
  for (const sd::cuda::GemmTiming &t : timed.value()) {
    const double flops = 2.0 * double(t.m) * double(t.n) * double(t.k);
    const double bytes = double(t.m * t.k + t.k * t.n + t.m * t.n) * double(sd::dtypeSize(t.dtype));
    const double seconds = t.oursMs > 0 ? t.oursMs * 1e-3 : 0;
    std::printf("%-10s %7lld %7lld %7lld %2s%-3s %5s %5d %10.4f %10.4f %6.3f %5d %8.1f %8.0f\n", t.op.c_str(),
                (long long)t.m, (long long)t.n, (long long)t.k, t.transA ? "T" : "N", t.transB ? "T" : "N",
                sd::dtypeName(t.dtype), t.steps, t.oursMs, t.bestMs, t.bestMs > 0 ? t.oursMs / t.bestMs : -1.0,
                t.algorithms, seconds > 0 ? flops / seconds * 1e-12 : 0.0, seconds > 0 ? bytes / seconds * 1e-9 : 0.0);
    if (t.oursMs > 0 && t.bestMs > 0) ours += t.oursMs * t.steps, best += t.bestMs * t.steps;
    char row[200];
    std::snprintf(row, sizeof row, "%s{\"m\":%lld,\"n\":%lld,\"k\":%lld,\"steps\":%d,\"ours_ms\":%.5f,\"best_ms\":%.5f}",
                  rows.empty() ? "" : ",", (long long)t.m, (long long)t.n, (long long)t.k, t.steps, t.oursMs, t.bestMs);
    rows += row;
  }
  std::printf("per run of %s: our GEMMs %.3f ms, raw cuBLASLt's best %.3f ms (%+.1f%%)\n", entryName.c_str(), ours, best,
              best > 0 ? 100.0 * (ours / best - 1) : 0.0);
  if (f.values.count("--tune")) {
    // GPU <TAB> shape <TAB> index, appended (one file can hold several plans and GPUs).
    const std::string &path = f.values["--tune"].back();
    std::FILE *out = std::fopen(path.c_str(), "a");
    if (!out) return fail("--tune: cannot open " + path + " for appending");
    int lines = 0;
    for (const sd::cuda::GemmTiming &t : timed.value())
      if (t.bestIndex >= 0 && !t.tuningKey.empty())
        lines += std::fprintf(out, "%s\t%s\t%d\n", device.c_str(), t.tuningKey.c_str(), t.bestIndex) > 0;
    if (std::fclose(out) != 0) return fail("--tune: cannot write " + path);
    std::printf("tuning: %d shapes appended to %s (use with SD_GEMM_TUNING=%s)\n", lines, path.c_str(), path.c_str());
  }
  std::printf("{\"device\":\"%s\",\"entry\":\"%s\",\"gemm_ours_ms\":%.4f,\"gemm_best_ms\":%.4f,\"shapes\":[%s]}\n",
              device.c_str(), entryName.c_str(), ours, best, rows.c_str());
  return 0;
}

// The bytes a step reads (each operand once) and writes (each result once).
std::pair<uint64_t, uint64_t> stepTraffic(const sd::EntryDesc &e, const sd::StepDesc &s) {
  uint64_t read = 0, written = 0;
  for (int32_t b : s.inputs) read += b >= 0 ? e.buffers[size_t(b)].bytes : 0;
  for (int32_t b : s.outputs) written += b >= 0 ? e.buffers[size_t(b)].bytes : 0;
  return {read, written};
}

int benchCommand(const std::vector<std::string> &args) {
  Flags f;
  std::string err;
  std::vector<std::string> rest;
  bool profile = false;
  std::string tracePath; // --profile=FILE.json: the table and a Chrome trace
  for (auto &a : args) {
    if (a == "--profile" || a.rfind("--profile=", 0) == 0) {
      profile = true;
      if (a.size() > 10) tracePath = a.substr(10);
    } else {
      rest.push_back(a);
    }
  }
  if (sd::Status s = sd::checkOutputFile(tracePath, "--profile"); !s.isOk()) return fail(s.message());
  if (!parseFlags(rest, {"--input-dir", "--iterations", "--warmup", "--threads", "--device", "--entry", "--data", "--batch",
                         "--tune", "--cpu-ops"}, f, err,
                  {"--no-cuda-graphs", "--no-cpu-fallback", "--gemms"})) {
    if (!f.help) return fail(err + " (see sdrun bench --help)");
  }
  if (f.help) return std::fputs(kBenchUsage, stdout), 0;
  if (hasFlag(f, "--gemms")) return benchGemms(f);
  if (f.values.count("--tune")) return fail("--tune goes with --gemms (see sdrun bench --help)");
  int64_t iters, warmup;
  sd::SessionOptions sessionOpts;
  if (!sessionFlags(f, sessionOpts, err) || !intFlag(f, "--iterations", 20, 1, 1000000, iters, err) ||
      !intFlag(f, "--warmup", 3, 0, 1000000, warmup, err))
    return fail(err);
  std::string entryName = f.values.count("--entry") ? f.values["--entry"].back() : "infer";
  auto plan = loadPlan(f.plan);
  if (!plan.isOk()) return fail(plan.status().message());
  const sd::EntryDesc *proto = firstEntry(*plan.value(), entryName);
  if (!proto) return fail(f.plan + ": plan has no '" + entryName + "' entry");
  std::vector<sd::HostTensor> inputs;
  if (f.values.count("--data")) {
    int64_t batch;
    if (!intFlag(f, "--batch", 0, 0, 1 << 20, batch, err)) return fail(err);
    size_t index = size_t(proto - plan.value()->entries.data());
    if (auto s = sd::train::trainInputsFromData(*plan.value(), index, f.values["--data"].back(), batch, inputs); !s.isOk())
      return fail(s.message());
  } else if (f.values.count("--input-dir")) {
    if (auto s = loadInputs(f, *proto, inputs); !s.isOk()) return fail(s.message());
  } else {
    // Random floats; zeros for integers so index inputs stay in range.
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    for (auto &in : proto->inputs) {
      const sd::BufferDesc &b = proto->buffers[size_t(in.second)];
      sd::HostTensor t;
      t.name = in.first;
      t.dtype = b.dtype;
      t.dims = b.dims;
      t.data.assign(b.bytes, 0);
      if (b.dtype == sd::DType::F32)
        for (size_t i = 0; i < b.bytes / 4; ++i) reinterpret_cast<float *>(t.data.data())[i] = uni(rng);
      inputs.push_back(std::move(t));
    }
  }
  Prepared run;
  if (auto s = prepare(plan.value(), f.plan, entryName, inputs, sessionOpts, run); !s.isOk()) return fail(s.message());
  std::vector<sd::HostTensor> outputs;
  std::vector<double> times;
  for (int64_t i = 0; i < warmup + iters; ++i) {
    if (profile && i == warmup) run.session->setProfiling(true);
    if (i == warmup) run.session->resetDeviceTime();
    auto t0 = std::chrono::steady_clock::now();
    if (auto s = run.session->run(run.entry, run.ptrs, outputs); !s.isOk()) return fail(s.message());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  const std::optional<sd::Session::DeviceTime> waited = run.session->deviceTime();
  // On a GPU, also as sdrun train runs steps: each run launched before the
  // one ahead of it is waited for, so the device always has the next queued.
  double pipelinedMs = -1;
  std::optional<sd::Session::DeviceTime> queued;
  if (!run.session->device().hostAddressable() && !profile) {
    run.session->resetDeviceTime();
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) {
      if (auto s = run.session->launch(run.entry, run.ptrs); !s.isOk()) return fail(s.message());
      if (i > 0)
        if (auto s = run.session->collect(outputs); !s.isOk()) return fail(s.message());
    }
    if (auto s = run.session->collect(outputs); !s.isOk()) return fail(s.message());
    pipelinedMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / double(iters);
    queued = run.session->deviceTime();
  }
  if (auto s = writeTrace(*run.session, tracePath); !s.isOk()) return fail(s.message());
  if (profile) {
    double total = 0;
    for (auto &p : run.session->profile()) total += p.ms;
    // Each op's bytes per run (as `sdrun inspect --traffic` counts them): a
    // rate far under the memory's bandwidth marks a kernel to look at.
    std::map<std::string, uint64_t> bytes;
    const sd::EntryDesc &entry = plan.value()->entries[run.entry];
    for (const sd::StepDesc &step : entry.steps) {
      auto [read, written] = stepTraffic(entry, step);
      bytes[step.op] += read + written;
    }
    std::printf("%-28s %10s %8s %7s %8s\n", "op", "ms/iter", "calls", "share", "GB/s");
    for (auto &p : run.session->profile()) {
      const double ms = p.ms / double(iters);
      auto it = bytes.find(p.op); // none: the op runs only inside a loop's or branch's body
      char rate[32] = "-";
      if (it != bytes.end() && ms > 0) std::snprintf(rate, sizeof rate, "%.1f", double(it->second) / (ms * 1e-3) * 1e-9);
      std::printf("%-28s %10.3f %8lld %6.1f%% %8s\n", p.op.c_str(), ms, (long long)(p.calls / iters),
                  100.0 * p.ms / std::max(total, 1e-9), rate);
    }
  }
  double median = times[times.size() / 2], mean = 0;
  for (double t : times) mean += t / double(times.size());
  std::printf("cpu: %s; f32 gemm: %s\n", sd::cpuInfo().model.c_str(), sd::f32GemmKernel());
  std::printf("entry %s: %lld iterations, median %.3f ms, mean %.3f ms, min %.3f ms\n", entryName.c_str(),
              (long long)iters, median, mean, times.front());
  const sd::Device &dev = run.session->device();
  if (!dev.hostAddressable()) std::printf("device: %s\n", dev.describe().c_str());
  // The device's idle share: the time it waited for the host between runs.
  auto idlePct = [](const std::optional<sd::Session::DeviceTime> &t) {
    return t && t->spanMs > 0 ? 100.0 * (t->spanMs - t->busyMs) / t->spanMs : -1.0;
  };
  auto printIdle = [&](const char *how, const std::optional<sd::Session::DeviceTime> &t) {
    if (t) std::printf("device idle, %s: %.1f%% of the span (%.3f ms per run)\n", how, idlePct(t), t->idleMsPerRun());
  };
  printIdle("each run waited for", waited);
  if (pipelinedMs >= 0) std::printf("pipelined (the next run queued before waiting): %.3f ms per iteration\n", pipelinedMs);
  printIdle("pipelined", queued);
  std::printf("{\"entry\":\"%s\",\"iterations\":%lld,\"threads\":%lld,\"median_ms\":%.4f,\"mean_ms\":%.4f,\"min_ms\":%.4f,"
              "\"f32_gemm\":\"%s\",\"device\":\"%s\",\"device_mib\":%.1f,\"pipelined_ms\":%.4f,"
              "\"device_idle_pct\":%.2f,\"pipelined_device_idle_pct\":%.2f}\n",
              entryName.c_str(), (long long)iters, (long long)sessionOpts.threads, median, mean, times.front(),
              sd::f32GemmKernel(), dev.name().c_str(), double(run.session->deviceBytes()) / double(1 << 20), pipelinedMs,
              idlePct(waited), idlePct(queued));
  return 0;
}

// Each op of the plan with its step count and whether `kernels` runs it (on
// another backend than the CPU, a step it has no kernel for runs the CPU's
// kernel on host copies: Session's cpuFallback); 1 when some step runs
// nowhere (the first such step is named).
int printKernelCoverage(const sd::Plan &p, const sd::KernelRegistry &kernels) {
  struct OpCoverage {
    size_t steps = 0, onCpu = 0;
    std::string refusal; // the first step no backend runs
  };
  std::map<std::string, OpCoverage> ops;
  const bool canFallBack = kernels.backend() != "cpu";
  size_t missing = 0, onCpu = 0;
  for (const sd::EntryDesc &e : p.entries)
    for (size_t i = 0; i < e.steps.size(); ++i) {
      OpCoverage &op = ops[e.steps[i].op];
      ++op.steps;
      bool fallback = false;
      sd::StatusOr<const sd::KernelDef *> k = sd::bindStepOrCpu(e, i, kernels, canFallBack, fallback);
      if (k.isOk()) {
        if (fallback) ++op.onCpu, ++onCpu;
        continue;
      }
      ++missing;
      if (op.refusal.empty()) op.refusal = k.status().message();
    }
  std::printf("kernels on '%s':\n", kernels.backend().c_str());
  for (auto &[name, op] : ops) {
    std::string how = !op.refusal.empty() ? op.refusal
                      : op.onCpu ? (op.onCpu == op.steps ? "" : std::to_string(op.onCpu) + " ") + "on the CPU (no '" +
                                       kernels.backend() + "' kernel)"
                                          : "ok";
    std::printf("  %-28s %4zu steps  %s\n", name.c_str(), op.steps, how.c_str());
  }
  if (onCpu)
    std::printf("%zu steps run on the CPU, with copies each way (CUDA graphs capture the steps between them)\n", onCpu);
  if (missing) std::printf("%zu steps cannot run on '%s'\n", missing, kernels.backend().c_str());
  else if (!onCpu) std::printf("every step runs on '%s'\n", kernels.backend().c_str());
  return missing ? 1 : 0;
}

// One entry's ops ordered by the bytes their steps read and write.
void printTrafficByOp(const sd::EntryDesc &e) {
  struct OpTraffic {
    size_t steps = 0, small = 0;
    uint64_t read = 0, written = 0;
  };
  // A step moving less than this costs its launch on a GPU more than its bytes.
  constexpr uint64_t kSmallStepBytes = 1000000;
  std::map<std::string, OpTraffic> ops;
  uint64_t total = 0;
  size_t small = 0;
  for (const sd::StepDesc &s : e.steps) {
    auto [read, written] = stepTraffic(e, s);
    OpTraffic &op = ops[s.op];
    ++op.steps, op.read += read, op.written += written, total += read + written;
    if (read + written < kSmallStepBytes) ++op.small, ++small;
  }
  std::vector<std::pair<std::string, OpTraffic>> rows(ops.begin(), ops.end());
  std::stable_sort(rows.begin(), rows.end(), [](auto &a, auto &b) {
    return a.second.read + a.second.written > b.second.read + b.second.written;
  });
  std::printf("traffic of %s by op (MB read + written, share of %.3f MB):\n", e.name.c_str(), double(total) / 1e6);
  for (auto &[name, op] : rows)
    std::printf("  %-28s %4zu steps  %12.3f + %12.3f  %5.1f%%\n", name.c_str(), op.steps, double(op.read) / 1e6,
                double(op.written) / 1e6, total ? 100.0 * double(op.read + op.written) / double(total) : 0.0);
  std::printf("steps moving under 1 MB each (on a GPU their launches cost more than their bytes): %zu", small);
  std::stable_sort(rows.begin(), rows.end(), [](auto &a, auto &b) { return a.second.small > b.second.small; });
  for (size_t i = 0; i < rows.size() && rows[i].second.small > 0; ++i)
    std::printf("%s %s %zu", i ? "," : ":", rows[i].first.c_str(), rows[i].second.small);
  std::printf("\n");
}

int inspectCommand(const std::vector<std::string> &all) {
  Flags f;
  std::string err;
  std::vector<std::string> args;
  bool cpu = false;
  for (auto &a : all) (a == "--cpu" ? cpu = true : (args.push_back(a), false));
  if (cpu && args.empty()) return printCpuReport(), 0;
  if (!parseFlags(args, {"--kernels", "--traffic"}, f, err)) {
    if (!f.help) return fail(err + " (see sdrun inspect --help)");
  }
  if (f.help) return std::fputs(kInspectUsage, stdout), 0;
  std::string backend = flagValue(f, "--kernels");
  const sd::KernelRegistry *registry = nullptr;
  if (f.values.count("--kernels") && !(registry = sd::kernelRegistry(backend))) {
    if (backend == "cuda") return fail("--kernels cuda: " + sd::cudaBackend().status().message());
    return fail("--kernels: no backend '" + backend + "' (backends: cpu, cuda)");
  }
  auto plan = loadPlan(f.plan);
  if (!plan.isOk()) return fail(plan.status().message());
  if (cpu) printCpuReport(); // only once the arguments are known good: no output before an error
  const sd::Plan &p = *plan.value();
  const sd::EntryDesc *trafficEntry = nullptr;
  if (f.values.count("--traffic")) {
    std::string name = flagValue(f, "--traffic"), names;
    for (const sd::EntryDesc &e : p.entries) {
      if (e.name == name) trafficEntry = &e;
      names += (names.empty() ? "" : ", ") + e.name;
    }
    if (!trafficEntry) return fail("--traffic: the plan has no entry '" + name + "' (entries: " + names + ")");
  }
  std::string sha;
  for (uint8_t b : p.sourceSha256) {
    char h[3];
    std::snprintf(h, sizeof h, "%02x", b);
    sha += h;
  }
  std::printf("plan: %s (%llu bytes)\n", f.plan.c_str(), (unsigned long long)p.fileBytes);
  std::printf("schema: %u.%u  producer: %s\n", p.schemaMajor, p.schemaMinor, p.producer.c_str());
  std::printf("source sha256: %s\n", sha.c_str());
  std::printf("config: %s\n", p.config.c_str());
  uint64_t wbytes = 0;
  for (auto &g : p.globals) wbytes += g.bytes;
  std::printf("weights: %llu bytes in %zu globals%s\n", (unsigned long long)wbytes, p.globals.size(),
              p.externalWeights.empty() ? " (in the plan)" : (" (external: " + p.externalWeights + ")").c_str());
  for (const auto &[name, bytes] : p.files) std::printf("carries: %s (%zu bytes)\n", name.c_str(), bytes.size());
  const bool bodies = std::any_of(p.entries.begin(), p.entries.end(), [](const sd::EntryDesc &e) { return e.isBody; });
  std::printf("arena: %llu bytes (largest entry%s)\n", (unsigned long long)p.maxArenaSize(),
              bodies ? ", plus each Loop or If body's own" : "");
  printStatePerRank(p);
  printGradientReduction(p);
  std::printf("entries:\n");
  for (auto &e : p.entries) {
    std::printf("  %s", e.name.c_str());
    if (!e.bucket.empty()) {
      std::printf(" [");
      for (size_t i = 0; i < e.bucket.size(); ++i)
        std::printf("%s%s=%lld", i ? ", " : "", e.bucket[i].first.c_str(), (long long)e.bucket[i].second);
      std::printf("]");
    }
    if (e.isBody) std::printf(" (body of a Loop or If step)");
    std::printf(": %zu steps, arena %llu bytes", e.steps.size(), (unsigned long long)e.arenaSize);
    if (e.tensorBytes)
      std::printf(" for %llu bytes of tensors (%.0f%% shared)", (unsigned long long)e.tensorBytes,
                  // Tiny entries can need more than their tensors (64-byte alignment).
                  std::max(0.0, 100.0 * (1.0 - double(e.arenaSize) / double(e.tensorBytes))));
    // The memory traffic the plan asks for (each step's operands read once
    // and results written once): what fusions save, a count, not a time.
    uint64_t read = 0, written = 0;
    for (const sd::StepDesc &s : e.steps) {
      auto [r, w] = stepTraffic(e, s);
      read += r, written += w;
    }
    if (!e.steps.empty())
      std::printf("; steps read %llu and write %llu bytes", (unsigned long long)read, (unsigned long long)written);
    std::printf("\n");
    for (auto &in : e.inputs) {
      auto &b = e.buffers[size_t(in.second)];
      std::printf("    input  %s: %s[%s]\n", in.first.c_str(), sd::dtypeName(b.dtype), sd::formatDims(b.dims).c_str());
    }
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      auto &b = e.buffers[size_t(e.outputs[i].second)];
      std::printf("    output %s: %s[%s]", e.outputs[i].first.c_str(), sd::dtypeName(b.dtype), sd::formatDims(b.dims).c_str());
      if (e.outputExtents[i].buffer >= 0)
        std::printf(" (at most; dim %d holds the run-time count of what was selected)", e.outputExtents[i].axis);
      std::printf("\n");
    }
  }
  std::printf("globals:\n");
  size_t shown = 0;
  for (auto &g : p.globals) {
    if (shown++ == 50) {
      std::printf("  ... %zu more\n", p.globals.size() - 50);
      break;
    }
    std::printf("  %s: %s[%s] %s\n", g.name.c_str(), sd::dtypeName(g.dtype), sd::formatDims(g.dims).c_str(),
                sd::globalRoleName(g.role));
  }
  if (trafficEntry) printTrafficByOp(*trafficEntry);
  return registry ? printKernelCoverage(p, *registry) : 0;
}

} // namespace sdrun
