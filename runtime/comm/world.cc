// Launch detection and the MPI plugin's loader.
#include "sd/comm/world.h"
#include <cstdlib>
#include <dlfcn.h>
#include <string>
#include <vector>

namespace sd {
namespace {

int envInt(const char *name, int fallback) {
  const char *v = std::getenv(name);
  if (!v || !*v) return fallback;
  char *end = nullptr;
  long x = std::strtol(v, &end, 10);
  return *end == '\0' && x >= 0 && x < (1 << 24) ? int(x) : fallback;
}

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Where the plugin may be: beside the binary or library that holds this code
// (sdrun, libsd.so, the Python module), in its ../lib, or where the build put it.
std::vector<std::string> pluginCandidates() {
  std::vector<std::string> out;
  if (const char *env = std::getenv("SD_COMM_MPI_PLUGIN"); env && *env) out.push_back(env);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(&detectLaunch), &info) && info.dli_fname) {
    std::string dir = directoryOf(info.dli_fname);
    out.push_back(dir + "/libsdcomm_mpi.so");
    out.push_back(dir + "/../lib/libsdcomm_mpi.so");
  }
#ifdef SD_COMM_MPI_PLUGIN_BUILD_PATH
  out.push_back(SD_COMM_MPI_PLUGIN_BUILD_PATH);
#endif
  return out;
}

using OpenFn = Communicator *(*)(char *, size_t);

StatusOr<std::shared_ptr<Communicator>> openMpi() {
  std::string tried;
  for (const std::string &path : pluginCandidates()) {
    // RTLD_GLOBAL: Open MPI's own components, which it dlopens, resolve
    // symbols of libmpi that the plugin brought in.
    void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      const char *why = dlerror();
      tried += "\n  " + path + ": " + (why ? why : "not loadable");
      continue;
    }
    auto open = reinterpret_cast<OpenFn>(dlsym(lib, "sd_comm_mpi_open"));
    if (!open) return sdError(path, " is not sdc's MPI plugin (no sd_comm_mpi_open)");
    char error[512] = "";
    Communicator *comm = open(error, sizeof error);
    if (!comm) return sdError("MPI: ", error);
    return std::shared_ptr<Communicator>(comm); // the plugin stays loaded: MPI cannot be re-initialized
  }
  return sdError("launched by mpirun, but sdc's MPI plugin could not be loaded (is Open MPI installed? Debian: ",
                 "openmpi-bin); tried:", tried);
}

} // namespace

LaunchInfo detectLaunch() {
  LaunchInfo l;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    l.launcher = "mpirun";
    l.rank = envInt("OMPI_COMM_WORLD_RANK", 0);
    l.size = envInt("OMPI_COMM_WORLD_SIZE", 1);
  } else if (std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK")) {
    l.launcher = "mpirun";
    l.rank = envInt("PMI_RANK", envInt("PMIX_RANK", 0));
    l.size = envInt("PMI_SIZE", 1);
  } else if (std::getenv("WORLD_SIZE") && std::getenv("RANK")) {
    l.launcher = "torchrun";
    l.rank = envInt("RANK", 0);
    l.size = envInt("WORLD_SIZE", 1);
  }
  return l;
}

StatusOr<std::shared_ptr<Communicator>> openWorld() {
  LaunchInfo l = detectLaunch();
  if (l.launcher.empty()) return std::shared_ptr<Communicator>();
  if (l.launcher == "torchrun") {
    if (l.size <= 1) return std::shared_ptr<Communicator>();
    return sdError("launched with RANK/WORLD_SIZE (torchrun style, world of ", l.size,
                   "): that launch needs the NCCL backend, which is not built yet; launch CPU ranks with mpirun -np ",
                   l.size);
  }
  return openMpi();
}

} // namespace sd
