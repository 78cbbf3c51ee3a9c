#include "sd/format/plugin_path.h"
#include <cstdlib>
#include <dlfcn.h>

namespace sd {
namespace {

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

} // namespace

std::vector<std::string> pluginCandidates(const char *file, const char *envOverride, const char *buildPath) {
  if (const char *env = std::getenv(envOverride); env && *env) return {env};
  std::vector<std::string> out;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(&pluginCandidates), &info) && info.dli_fname) {
    std::string dir = directoryOf(info.dli_fname);
    out.push_back(dir + "/" + file);
    out.push_back(dir + "/../lib/" + file);
  }
  if (buildPath && *buildPath) out.push_back(buildPath);
  return out;
}

} // namespace sd
