// What the ranks of a data-parallel run agree on outside the plan: the state
// they start from (rank 0's, after it loads an adapter), the
// host-side sums of losses and token counts, and, on request, a check that
// their parameters are still bitwise equal. All are no-ops without a
// communicator (a run alone).
#pragma once
#include "sd/ops/communicator.h"
#include "sd/runtime/session.h"
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sd::train {

// Values of globals split over the ranks (sdc compile --shard), by global
// index, gathered whole on rank 0 to save weights or an adapter.
using GlobalValues = std::map<size_t, std::vector<uint8_t>>;

// Every mutable global that every rank holds whole (parameters, optimizer
// state, gradients, counters) from rank 0 to the others, for a run that
// starts fresh; globals split over the ranks keep the plan's values, or each
// rank's own rows of an adapter it read.
Status broadcastState(Session &session, Communicator *comm);
// The globals rank 0 does not hold whole, from their holders to rank 0 (for
// saved weights and adapters): every rank calls it; rank 0 gets them in `out`.
Status gatherToRankZero(const Session &session, Communicator *comm, GlobalValues &out);
// Bytes from `root` to the others (in pieces: MPI counts are ints).
Status broadcastBytes(Communicator *comm, void *data, size_t bytes, int root = 0);
// A string from `root` to the others.
Status broadcastString(Communicator *comm, std::string &s, int root = 0);
// Every rank's `mine`, in rank order, on every rank.
StatusOr<std::vector<std::string>> allGatherStrings(Communicator *comm, const std::string &mine);
// values[i] summed over the ranks, in place.
Status sumOverRanks(Communicator *comm, double *values, size_t n);
// Error naming the first rank whose trainable parameters differ from rank 0's
// (compared by CRC32C over their bytes).
Status checkReplicas(const Session &session, Communicator *comm, int64_t step);

} // namespace sd::train
