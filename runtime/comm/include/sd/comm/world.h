// The world a process runs in: alone, or as one rank of several launched by
// mpirun. openWorld() is called once, before any session is created; the
// communicator it returns goes into SessionOptions::comm.
#pragma once
#include "sd/ops/communicator.h"
#include <memory>
#include <string>

namespace sd {

// What the launcher told this process through its environment.
struct LaunchInfo {
  std::string launcher; // "mpirun", "torchrun"; empty when launched alone
  int rank = 0, size = 1;
};
LaunchInfo detectLaunch();

// Null when the process was launched alone. Under mpirun (Open MPI, or a PMI
// launcher such as srun) it is the MPI world, through the libsdcomm_mpi.so
// plugin, which is loaded only then. A torchrun-style launch (RANK,
// WORLD_SIZE) is refused with the reason: its NCCL bootstrap is not built yet.
StatusOr<std::shared_ptr<Communicator>> openWorld();

} // namespace sd
