// The bootstrap of a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT): rank 0 listens on MASTER_ADDR:MASTER_PORT and hands every
// other rank the bytes it was given (NCCL's unique id). The NCCL backend's
// communicators are built from those bytes; nothing else goes over this socket.
#pragma once
#include "sd/format/status.h"
#include <string>

namespace sd {

struct Rendezvous {
  std::string host; // MASTER_ADDR: a name or an IPv4/IPv6 address rank 0 can bind
  int port = 0;     // MASTER_PORT
  int rank = 0, size = 1;
  double timeoutSeconds = 300; // for every rank to arrive (and for rank 0 to be listening)
};

// Rank 0 passes `payload` and gets it back once every rank has it; the
// others get rank 0's payload. An error names the address, the ranks still
// missing or the rank that sent something else, and never waits past the timeout.
StatusOr<std::string> shareFromRankZero(const Rendezvous &r, const std::string &payload);

} // namespace sd
