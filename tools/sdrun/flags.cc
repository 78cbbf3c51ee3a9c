// Command-line flag parsing for sdrun.
#include <cstdio>
#include "flags.h"
#include "sd/runtime/session.h"
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace sdrun {

bool parseFlags(const std::vector<std::string> &args, const std::vector<std::string> &known, Flags &f, std::string &err,
                const std::vector<std::string> &switches) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    if (a == "-h" || a == "--help") {
      f.help = true;
      return true;
    }
    if (a.rfind("--", 0) == 0) {
      std::string name = a.substr(0, a.find('=')), value;
      if (std::find(switches.begin(), switches.end(), a) != switches.end()) {
        f.values[a].push_back("1");
        continue;
      }
      if (std::find(known.begin(), known.end(), name) == known.end()) return err = "unknown option '" + a + "'", false;
      if (a.find('=') != std::string::npos) value = a.substr(a.find('=') + 1);
      else if (i + 1 < args.size()) value = args[++i];
      else return err = name + " needs a value", false;
      f.values[name].push_back(value);
    } else if (f.plan.empty()) {
      f.plan = a;
    } else {
      return err = "unexpected argument '" + a + "'", false;
    }
  }
  if (f.plan.empty()) return err = "no plan given", false;
  return true;
}

static bool parseInt(const std::string &name, const std::string &s, int64_t lo, int64_t hi, int64_t &out,
                     std::string &err) {
  char *end = nullptr;
  errno = 0; // strtoll clamps out-of-range values to LLONG_MIN/MAX and says so only here
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || errno == ERANGE || v < lo || v > hi)
    return err = name + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'", false;
  return out = v, true;
}

bool intFlag(const Flags &f, const std::string &name, int64_t def, int64_t lo, int64_t hi, int64_t &out, std::string &err) {
  auto it = f.values.find(name);
  if (it == f.values.end()) return out = def, true;
  return parseInt(name, it->second.back(), lo, hi, out, err);
}

bool intFlags(const Flags &f, const std::string &name, int64_t lo, int64_t hi, std::vector<int64_t> &out, std::string &err) {
  auto it = f.values.find(name);
  if (it == f.values.end()) return true;
  for (const std::string &s : it->second) {
    int64_t v;
    if (!parseInt(name, s, lo, hi, v, err)) return false;
    out.push_back(v);
  }
  return true;
}

bool numberFlag(const Flags &f, const std::string &name, double def, double lo, double hi, double &out, std::string &err) {
  auto it = f.values.find(name);
  if (it == f.values.end()) return out = def, true;
  const std::string &s = it->second.back();
  char *end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || !std::isfinite(v) || v < lo || v > hi)
    return err = name + " must be a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'",
           false;
  return out = v, true;
}

bool sessionFlags(const Flags &f, sd::SessionOptions &out, std::string &err) {
  int64_t threads = 0;
  if (!intFlag(f, "--threads", 0, 0, 1024, threads, err)) return false;
  out.threads = int(threads);
  std::string name = flagValue(f, "--device", "cpu");
  auto device = sd::openDevice(name);
  if (!device.isOk()) {
    err = "--device: " + device.status().message();
    return false;
  }
  out.device = *device;
  out.graphs = !hasFlag(f, "--no-cuda-graphs");
  out.cpuFallback = !hasFlag(f, "--no-cpu-fallback");
  for (const std::string &list : f.values.count("--cpu-ops") ? f.values.at("--cpu-ops") : std::vector<std::string>{})
    for (size_t at = 0; at <= list.size();) {
      size_t comma = std::min(list.find(',', at), list.size());
      std::string op = list.substr(at, comma - at);
      at = comma + 1;
      if (op.empty()) continue;
      if (!sd::cpuKernels().find(op)) {
        err = "--cpu-ops: no CPU kernel computes '" + op + "' (names are ONNX or sd op names, e.g. NonMaxSuppression)";
        return false;
      }
      out.cpuOps.insert(op);
    }
  if (!out.cpuOps.empty() && !out.cpuFallback) {
    err = "--cpu-ops runs steps on the CPU, which --no-cpu-fallback forbids";
    return false;
  }
  if (name == "auto") std::fprintf(stderr, "sdrun: device auto: using %s\n", out.device->describe().c_str());
  return true;
}

} // namespace sdrun
