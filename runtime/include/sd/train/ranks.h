// What the ranks of a data-parallel run agree on outside the plan: the state
// they start from (rank 0's, after it loads an adapter or a checkpoint), the
// host-side sums of losses and token counts, and, on request, a check that
// their parameters are still bitwise equal. All are no-ops without a
// communicator (a run alone).
#pragma once
#include "sd/ops/communicator.h"
#include "sd/runtime/session.h"
#include "sd/train/checkpoint.h"
#include <cstdint>
#include <string>

namespace sd::train {

// Every mutable global (parameters, optimizer state, gradients, counters)
// from rank 0 to the others. A global one rank holds alone (--shard
// optimizer) goes from rank 0 to that rank, when rank 0 has its value in
// `restored` (a checkpoint it read); otherwise its holder keeps its own.
Status broadcastState(Session &session, Communicator *comm, const GlobalValues &restored);
// The globals rank 0 does not hold, from their holders to rank 0 (for a
// checkpoint): every rank calls it; rank 0 gets them in `out`.
Status gatherToRankZero(const Session &session, Communicator *comm, GlobalValues &out);
// Bytes from `root` to the others (in pieces: MPI counts are ints).
Status broadcastBytes(Communicator *comm, void *data, size_t bytes, int root = 0);
// values[i] summed over the ranks, in place.
Status sumOverRanks(Communicator *comm, double *values, size_t n);
// Error naming the first rank whose trainable parameters differ from rank 0's
// (compared by CRC32C over their bytes).
Status checkReplicas(const Session &session, Communicator *comm, int64_t step);

} // namespace sd::train
