// The MPI backend of sd::Communicator, built as a plugin (libsdcomm_mpi.so)
// that runtime/comm loads only when the process was launched by mpirun: sdrun,
// the C API and the Python module then neither need MPI installed nor pay for
// loading it when they run alone.
#include "sd/ops/communicator.h"
#include <mpi.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace sd {
namespace {

Status mpiError(const char *what, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "MPI error %d", code);
  return sdError(what, ": ", std::string(text, size_t(len)));
}

StatusOr<MPI_Datatype> mpiType(DType t) {
  switch (t) {
  case DType::F32: return MPI_FLOAT;
  case DType::F64: return MPI_DOUBLE;
  case DType::I32: return MPI_INT32_T;
  case DType::I64: return MPI_INT64_T;
  case DType::U8: return MPI_UINT8_T;
  default: return sdError("MPI collectives take f32, f64, i32, i64 or u8 data, not ", dtypeName(t));
  }
}

class MpiRequest final : public CommRequest {
public:
  MpiRequest(MPI_Request r, const char *what) : request_(r), what_(what) {}
  ~MpiRequest() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  Status wait() override {
    int rc = MPI_Wait(&request_, MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? Status::ok() : mpiError(what_, rc);
  }
  // A completed request becomes MPI_REQUEST_NULL; its error, if any, is wait()'s to report.
  void test() override {
    int done = 0;
    if (request_ != MPI_REQUEST_NULL) MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
  }

private:
  MPI_Request request_;
  const char *what_;
};

class MpiCommunicator final : public Communicator {
public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, size_t(len));
    v = v.substr(0, v.find_first_of(",\n")); // "Open MPI v4.1.4"
    describe_ = "MPI (" + v + ")";
  }
  ~MpiCommunicator() override {
    (void)waitDeferred(); // requests left by a failed entry: MPI must still be up to complete them
    MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return describe_; }

  StatusOr<std::unique_ptr<CommRequest>> startAllReduce(const void *send, void *recv, size_t count, DType type,
                                                        ReduceOp op) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    MPI_Request r;
    int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, int(count), *t, mpiOp(op), MPI_COMM_WORLD, &r);
    return started(rc, r, "MPI_Iallreduce");
  }
  StatusOr<std::unique_ptr<CommRequest>> startReduceScatter(const void *send, void *recv, size_t recvCount, DType type,
                                                            ReduceOp op) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    MPI_Request r;
    int rc = MPI_Ireduce_scatter_block(send, recv, int(recvCount), *t, mpiOp(op), MPI_COMM_WORLD, &r);
    return started(rc, r, "MPI_Ireduce_scatter_block");
  }
  StatusOr<std::unique_ptr<CommRequest>> startAllGather(const void *send, void *recv, size_t sendCount,
                                                        DType type) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    MPI_Request r;
    int rc = MPI_Iallgather(send, int(sendCount), *t, recv, int(sendCount), *t, MPI_COMM_WORLD, &r);
    return started(rc, r, "MPI_Iallgather");
  }
  StatusOr<std::unique_ptr<CommRequest>> startBroadcast(void *data, size_t count, DType type, int root) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    MPI_Request r;
    int rc = MPI_Ibcast(data, int(count), *t, root, MPI_COMM_WORLD, &r);
    return started(rc, r, "MPI_Ibcast");
  }
  Status allReduce(const void *send, void *recv, size_t count, DType type, ReduceOp op) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    return checked(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, int(count), *t, mpiOp(op), MPI_COMM_WORLD),
                   "MPI_Allreduce");
  }
  Status reduceScatter(const void *send, void *recv, size_t recvCount, DType type, ReduceOp op) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    return checked(MPI_Reduce_scatter_block(send, recv, int(recvCount), *t, mpiOp(op), MPI_COMM_WORLD),
                   "MPI_Reduce_scatter_block");
  }
  Status allGatherV(const void *send, void *recv, const std::vector<size_t> &counts, DType type) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    auto layout = blocks(counts);
    if (!layout.isOk()) return layout.status();
    auto &[n, at] = layout.value();
    return checked(MPI_Allgatherv(send, n[size_t(rank_)], *t, recv, n.data(), at.data(), *t, MPI_COMM_WORLD),
                   "MPI_Allgatherv");
  }
  Status reduceScatterV(const void *send, void *recv, const std::vector<size_t> &counts, DType type,
                        ReduceOp op) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    auto layout = blocks(counts);
    if (!layout.isOk()) return layout.status();
    return checked(MPI_Reduce_scatter(send, recv, layout.value().first.data(), *t, mpiOp(op), MPI_COMM_WORLD),
                   "MPI_Reduce_scatter");
  }
  Status allGather(const void *send, void *recv, size_t sendCount, DType type) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    return checked(MPI_Allgather(send, int(sendCount), *t, recv, int(sendCount), *t, MPI_COMM_WORLD), "MPI_Allgather");
  }
  Status broadcast(void *data, size_t count, DType type, int root) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    return checked(MPI_Bcast(data, int(count), *t, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  [[noreturn]] void abort(int exitCode) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exitCode);
    std::_Exit(exitCode); // MPI_Abort does not return; if it did, still end this rank
  }
  StatusOr<std::unique_ptr<CommRequest>> startReduce(const void *send, void *recv, size_t count, DType type, ReduceOp op,
                                                     int root) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    MPI_Request r;
    int rc = MPI_Ireduce(inPlace(send, recv, root), recv, int(count), *t, mpiOp(op), root, MPI_COMM_WORLD, &r);
    return started(rc, r, "MPI_Ireduce");
  }
  Status reduce(const void *send, void *recv, size_t count, DType type, ReduceOp op, int root) override {
    auto t = mpiType(type);
    if (!t.isOk()) return t.status();
    return checked(MPI_Reduce(inPlace(send, recv, root), recv, int(count), *t, mpiOp(op), root, MPI_COMM_WORLD),
                   "MPI_Reduce");
  }
  Status barrier() override { return checked(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

private:
  // Per-rank counts and displacements as MPI's ints (one per rank, under 2^31 in all).
  StatusOr<std::pair<std::vector<int>, std::vector<int>>> blocks(const std::vector<size_t> &counts) const {
    if (counts.size() != size_t(size_)) return sdError("uneven collective: ", counts.size(), " counts for ", size_, " ranks");
    std::vector<int> n, at;
    size_t total = 0;
    for (size_t c : counts) {
      if (total + c > size_t(INT32_MAX)) return sdError("uneven collective over 2^31 elements is not supported by MPI counts");
      n.push_back(int(c)), at.push_back(int(total)), total += c;
    }
    return std::pair{n, at};
  }
  // MPI_IN_PLACE is only for the root of a reduction; elsewhere send is read.
  const void *inPlace(const void *send, void *recv, int root) const {
    return send == recv && rank_ == root ? MPI_IN_PLACE : send;
  }
  static Status checked(int rc, const char *what) { return rc == MPI_SUCCESS ? Status::ok() : mpiError(what, rc); }
  static MPI_Op mpiOp(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }
  static StatusOr<std::unique_ptr<CommRequest>> started(int rc, MPI_Request r, const char *what) {
    if (rc != MPI_SUCCESS) return mpiError(what, rc);
    return std::unique_ptr<CommRequest>(new MpiRequest(r, what));
  }
  int rank_ = 0, size_ = 1;
  std::string describe_;
};

} // namespace
} // namespace sd

// The plugin's one entry point: initializes MPI (once per process) and returns
// the world's communicator, or null with the reason in `error`.
extern "C" __attribute__((visibility("default"))) sd::Communicator *sd_comm_mpi_open(char *error, size_t errorSize) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    std::snprintf(error, errorSize, "MPI is already initialized in this process");
    return nullptr;
  }
  int provided = 0;
  // Only the thread that runs the session's steps calls MPI.
  if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS) {
    std::snprintf(error, errorSize, "MPI_Init_thread failed (MPI error %d)", rc);
    return nullptr;
  }
  // Errors come back as codes (and become Status), not an abort inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return new sd::MpiCommunicator();
}
