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
  int localRank = 0; // among the ranks on this machine: picks its GPU
};
LaunchInfo detectLaunch();

struct WorldOptions {
  // The ranks run on CUDA devices (one GPU per process): their collectives
  // go through NCCL. Otherwise they are CPU ranks over MPI.
  bool cudaDevices = false;
  // NCCL: how long the bootstrap waits for every rank, and how long one
  // training step may run before the watchdog aborts it (--comm-timeout).
  double commTimeoutSeconds = 300;
};

// Null when the process was launched alone. CPU ranks under mpirun (Open
// MPI, or a PMI launcher such as srun) get the MPI world, through the
// libsdcomm_mpi.so plugin, loaded only then. CUDA ranks get an NCCL
// communicator (libsdcomm_nccl.so), bootstrapped over MPI under mpirun or
// over a TCP rendezvous on MASTER_ADDR:MASTER_PORT for a torchrun-style
// launch (RANK, WORLD_SIZE, LOCAL_RANK); that launch is refused for CPU ranks.
StatusOr<std::shared_ptr<Communicator>> openWorld(const WorldOptions &options = {});

} // namespace sd
