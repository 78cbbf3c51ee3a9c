// Cross-rank agreement for the trainer: start state, host-side sums, replica checks.
#include "sd/train/ranks.h"
#include "sd/format/crc32c.h"
#include <algorithm>
#include <vector>

namespace sd::train {

Status broadcastBytes(Communicator *comm, void *data, size_t bytes, int root) {
  if (!comm || comm->size() == 1) return Status::ok();
  for (size_t done = 0; done < bytes;) {
    size_t piece = std::min<size_t>(bytes - done, size_t(1) << 30);
    SD_RETURN_IF_ERROR(comm->broadcast(static_cast<uint8_t *>(data) + done, piece, DType::U8, root));
    done += piece;
  }
  return Status::ok();
}

Status broadcastState(Session &session, Communicator *comm) {
  if (!comm || comm->size() == 1) return Status::ok();
  const Plan &plan = session.plan();
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    if (!isTrainingStateRole(plan.globals[i].role) || session.rowSharded(i) || session.globalOwner(i) >= 0) continue;
    std::vector<uint8_t> bytes(plan.globals[i].bytes);
    if (comm->rank() == 0) SD_RETURN_IF_ERROR(session.readGlobal(i, bytes.data(), bytes.size()));
    SD_RETURN_IF_ERROR(broadcastBytes(comm, bytes.data(), bytes.size())
                           .withContext("broadcasting '" + plan.globals[i].name + "' from rank 0: "));
    if (comm->rank() != 0) SD_RETURN_IF_ERROR(session.writeGlobal(i, bytes.data(), bytes.size()));
  }
  return Status::ok();
}

Status broadcastString(Communicator *comm, std::string &s, int root) {
  if (!comm || comm->size() == 1) return Status::ok();
  int64_t size = int64_t(s.size());
  SD_RETURN_IF_ERROR(broadcastBytes(comm, &size, sizeof size, root));
  s.resize(size_t(size));
  return broadcastBytes(comm, s.data(), s.size(), root);
}

StatusOr<std::vector<std::string>> allGatherStrings(Communicator *comm, const std::string &mine) {
  if (!comm || comm->size() == 1) return std::vector<std::string>{mine};
  std::vector<int64_t> sizes(size_t(comm->size()));
  int64_t size = int64_t(mine.size());
  SD_RETURN_IF_ERROR(comm->allGather(&size, sizes.data(), 1, DType::I64));
  std::vector<size_t> counts(sizes.begin(), sizes.end());
  std::string all;
  for (size_t c : counts) all.resize(all.size() + c);
  SD_RETURN_IF_ERROR(comm->allGatherV(mine.data(), all.data(), counts, DType::U8));
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t c : counts) out.push_back(all.substr(at, c)), at += c;
  return out;
}

Status gatherToRankZero(const Session &session, Communicator *comm, GlobalValues &out) {
  out.clear();
  if (!comm || comm->size() == 1) return Status::ok();
  const Plan &plan = session.plan();
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    if (!isTrainingStateRole(plan.globals[i].role)) continue;
    if (session.rowSharded(i)) { // every rank's rows, rank by rank, into the whole value
      const GlobalDesc &g = plan.globals[i];
      std::vector<uint8_t> bytes(g.bytes), mine;
      SD_RETURN_IF_ERROR(session.readGlobalRows(i, mine));
      const uint64_t row = g.dims[0] ? g.bytes / uint64_t(g.dims[0]) : 0;
      for (int r = 0; r < comm->size(); ++r) {
        RowBlock b = rowBlock(g.dims[0], r, comm->size());
        uint8_t *at = bytes.data() + row * uint64_t(b.begin);
        if (r == comm->rank() && !mine.empty()) std::copy(mine.begin(), mine.end(), at);
        SD_RETURN_IF_ERROR(broadcastBytes(comm, at, row * uint64_t(b.count), r)
                               .withContext("gathering '" + g.name + "' rows from rank " + std::to_string(r) + ": "));
      }
      if (comm->rank() == 0) out[i] = std::move(bytes);
      continue;
    }
    int owner = session.globalOwner(i);
    if (owner <= 0) continue;
    std::vector<uint8_t> bytes(plan.globals[i].bytes);
    if (comm->rank() == owner) SD_RETURN_IF_ERROR(session.readGlobal(i, bytes.data(), bytes.size()));
    SD_RETURN_IF_ERROR(broadcastBytes(comm, bytes.data(), bytes.size(), owner)); // only rank 0 keeps it
    if (comm->rank() == 0) out[i] = std::move(bytes);
  }
  return Status::ok();
}

Status sumOverRanks(Communicator *comm, double *values, size_t n) {
  if (!comm || comm->size() == 1) return Status::ok();
  return comm->allReduce(values, values, n, DType::F64, ReduceOp::Sum);
}

Status checkReplicas(const Session &session, Communicator *comm, int64_t step) {
  if (!comm || comm->size() == 1) return Status::ok();
  const Plan &plan = session.plan();
  uint32_t crc = 0;
  for (size_t i = 0; i < plan.globals.size(); ++i) {
    if (plan.globals[i].role != GlobalRole::Trainable || session.rowSharded(i)) continue; // rows differ by design
    std::vector<uint8_t> bytes(plan.globals[i].bytes);
    SD_RETURN_IF_ERROR(session.readGlobal(i, bytes.data(), bytes.size()));
    crc = crc32c(bytes.data(), bytes.size(), crc);
  }
  std::vector<int64_t> all(size_t(comm->size()));
  int64_t mine = crc;
  SD_RETURN_IF_ERROR(comm->allGather(&mine, all.data(), 1, DType::I64));
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      return sdError("step ", step, ": the replicas diverged: rank ", r, "'s trainable parameters differ from rank 0's");
  return Status::ok();
}

} // namespace sd::train
