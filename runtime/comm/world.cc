// Launch detection and the MPI plugin's loader.
#include "sd/comm/world.h"
#include "sd/comm/rendezvous.h"
#include "sd/format/plugin_path.h"
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

#ifdef SD_COMM_MPI_PLUGIN_BUILD_PATH
constexpr const char *kMpiBuildPath = SD_COMM_MPI_PLUGIN_BUILD_PATH;
#else
constexpr const char *kMpiBuildPath = nullptr;
#endif
#ifdef SD_COMM_NCCL_PLUGIN_BUILD_PATH
constexpr const char *kNcclBuildPath = SD_COMM_NCCL_PLUGIN_BUILD_PATH;
#else
constexpr const char *kNcclBuildPath = nullptr;
#endif

using OpenFn = Communicator *(*)(char *, size_t);

StatusOr<std::shared_ptr<Communicator>> openMpi() {
  std::string tried;
  for (const std::string &path : pluginCandidates("libsdcomm_mpi.so", "SD_COMM_MPI_PLUGIN", kMpiBuildPath)) {
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

using NcclIdFn = int (*)(char *, size_t, char *, size_t);
using NcclOpenFn = Communicator *(*)(const char *, size_t, int, int, int, double, char *, size_t);

// The NCCL world: rank 0's unique id to every rank (over MPI under mpirun,
// else over the TCP rendezvous), then one communicator per process.
StatusOr<std::shared_ptr<Communicator>> openNccl(const LaunchInfo &l, const WorldOptions &o) {
  void *lib = nullptr;
  std::string tried;
  for (const std::string &path : pluginCandidates("libsdcomm_nccl.so", "SD_COMM_NCCL_PLUGIN", kNcclBuildPath)) {
    if ((lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    const char *why = dlerror();
    tried += "\n  " + path + ": " + (why ? why : "not loadable");
  }
  if (!lib) return sdError("ranks on CUDA devices need sdc's NCCL plugin, which could not be loaded; tried:", tried);
  auto uniqueId = reinterpret_cast<NcclIdFn>(dlsym(lib, "sd_comm_nccl_unique_id"));
  auto open = reinterpret_cast<NcclOpenFn>(dlsym(lib, "sd_comm_nccl_open"));
  if (!uniqueId || !open) return sdError("libsdcomm_nccl.so is not sdc's NCCL plugin");
  char error[512] = "";
  std::string id(129, '\0'); // the id, then one byte: rank 0 got it
  if (l.rank == 0) {
    int n = uniqueId(id.data(), 128, error, sizeof error);
    id[128] = n == 128;
  }
  if (l.launcher == "mpirun") {
    auto mpi = openMpi();
    if (!mpi.isOk()) return mpi.status();
    static std::shared_ptr<Communicator> bootstrap; // MPI cannot be re-initialized: it stays up
    bootstrap = mpi.value();
    SD_RETURN_IF_ERROR(bootstrap->broadcast(id.data(), id.size(), DType::U8, 0).withContext("NCCL bootstrap over MPI: "));
  } else {
    Rendezvous r;
    const char *host = std::getenv("MASTER_ADDR");
    r.host = host && *host ? host : "127.0.0.1";
    r.port = envInt("MASTER_PORT", 29500);
    r.rank = l.rank;
    r.size = l.size;
    r.timeoutSeconds = o.commTimeoutSeconds;
    auto shared = shareFromRankZero(r, id);
    if (!shared.isOk()) return shared.status();
    id = shared.value();
  }
  if (id.size() != 129 || !id[128])
    return sdError("NCCL bootstrap: rank 0 could not make an NCCL id", l.rank == 0 ? std::string(" (") + error + ")" : "");
  Communicator *comm = open(id.data(), 128, l.rank, l.size, l.localRank, o.commTimeoutSeconds, error, sizeof error);
  if (!comm) return sdError("NCCL: ", error);
  return std::shared_ptr<Communicator>(comm);
}

} // namespace

LaunchInfo detectLaunch() {
  LaunchInfo l;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    l.launcher = "mpirun";
    l.rank = envInt("OMPI_COMM_WORLD_RANK", 0);
    l.size = envInt("OMPI_COMM_WORLD_SIZE", 1);
    l.localRank = envInt("OMPI_COMM_WORLD_LOCAL_RANK", l.rank);
  } else if (std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK")) {
    l.launcher = "mpirun";
    l.rank = envInt("PMI_RANK", envInt("PMIX_RANK", 0));
    l.size = envInt("PMI_SIZE", 1);
    l.localRank = envInt("MPI_LOCALRANKID", envInt("SLURM_LOCALID", l.rank));
  } else if (std::getenv("WORLD_SIZE") && std::getenv("RANK")) {
    l.launcher = "torchrun";
    l.rank = envInt("RANK", 0);
    l.size = envInt("WORLD_SIZE", 1);
    l.localRank = envInt("LOCAL_RANK", l.rank);
  }
  return l;
}

StatusOr<std::shared_ptr<Communicator>> openWorld(const WorldOptions &o) {
  LaunchInfo l = detectLaunch();
  if (l.launcher.empty()) return std::shared_ptr<Communicator>();
  if (o.cudaDevices) return openNccl(l, o);
  if (l.launcher == "torchrun") {
    if (l.size <= 1) return std::shared_ptr<Communicator>();
    return sdError("launched with RANK/WORLD_SIZE (torchrun style, world of ", l.size,
                   "): that launch is for ranks on GPUs (--device cuda, over NCCL); launch CPU ranks with mpirun -np ",
                   l.size);
  }
  return openMpi();
}

} // namespace sd
