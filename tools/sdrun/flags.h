// Command-line flags shared by the sdrun commands.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sd {
struct SessionOptions;
}

namespace sdrun {

struct Flags {
  std::string plan;
  std::map<std::string, std::vector<std::string>> values;
  bool help = false;
};

// Parses `--flag value` / `--flag=value` and the plan path; `known` lists flags
// that take a value, `switches` flags that take none. -h/--help sets f.help.
bool parseFlags(const std::vector<std::string> &args, const std::vector<std::string> &known, Flags &f, std::string &err,
                const std::vector<std::string> &switches = {});
// Integer flag in [lo, hi], `def` when absent.
bool intFlag(const Flags &f, const std::string &name, int64_t def, int64_t lo, int64_t hi, int64_t &out, std::string &err);
// Every value of a repeatable integer flag, each in [lo, hi], appended to `out`.
bool intFlags(const Flags &f, const std::string &name, int64_t lo, int64_t hi, std::vector<int64_t> &out, std::string &err);
// Finite number flag in [lo, hi], `def` when absent.
bool numberFlag(const Flags &f, const std::string &name, double def, double lo, double hi, double &out, std::string &err);
// --threads N, --device cpu|cuda|auto, --no-cuda-graphs, --no-cpu-fallback and --cpu-ops
// into session options.
bool sessionFlags(const Flags &f, sd::SessionOptions &out, std::string &err);
inline bool hasFlag(const Flags &f, const std::string &name) { return f.values.count(name) > 0; }
inline std::string flagValue(const Flags &f, const std::string &name, const std::string &def = "") {
  auto it = f.values.find(name);
  return it == f.values.end() ? def : it->second.back();
}

} // namespace sdrun
