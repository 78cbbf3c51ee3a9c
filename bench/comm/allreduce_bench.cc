// All-reduce bandwidth of sdc's communicator (sd::openWorld: the MPI plugin;
// its blocking allReduce, which the AllReduce kernel calls, and its
// nonblocking start + wait) against a raw MPI_Allreduce loop on the same
// buffers, sizes 4 KiB to 64 MiB of f32, in place. Run under mpirun:
//   mpirun -np 2 build/bench/sd_allreduce_bench
// Prints one tab-separated line per size from rank 0: bytes, then time (us),
// algbw and busbw (GB/s; nccl-tests' formulas: algbw = bytes / time, busbw =
// algbw * 2 (n - 1) / n) for sdc and for raw MPI, then sdc's nonblocking time.
#include "sd/comm/world.h"
#include <mpi.h>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

template <class F> double secondsPerCall(F &&call, int iters) {
  call(); // warm-up
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  MPI_Barrier(MPI_COMM_WORLD);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

} // namespace

int main() {
  auto world = sd::openWorld();
  if (!world.isOk() || !world.value()) {
    std::fprintf(stderr, "sd_allreduce_bench: run it under mpirun (%s)\n",
                 world.isOk() ? "not launched by mpirun" : world.status().message().c_str());
    return 1;
  }
  sd::Communicator &comm = *world.value();
  const int n = comm.size();
  if (comm.rank() == 0)
    std::printf("# %d ranks, %s\n# bytes\tsdc_us\tsdc_algbw\tsdc_busbw\tmpi_us\tmpi_algbw\tmpi_busbw\tsdc_nonblocking_us\n", n,
                comm.describe().c_str());
  for (size_t bytes = 4096; bytes <= (size_t(64) << 20); bytes *= 4) {
    std::vector<float> buf(bytes / 4, 1.0f);
    int iters = bytes <= (1 << 20) ? 200 : 20;
    double ours = secondsPerCall([&] { (void)comm.allReduce(buf.data(), buf.data(), buf.size(), sd::DType::F32, sd::ReduceOp::Sum); }, iters);
    double raw = secondsPerCall(
        [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(buf.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }, iters);
    double started = secondsPerCall(
        [&] {
          auto r = comm.startAllReduce(buf.data(), buf.data(), buf.size(), sd::DType::F32, sd::ReduceOp::Sum);
          if (r.isOk()) (void)r.value()->wait();
        },
        iters);
    double busFactor = 2.0 * (n - 1) / n;
    if (comm.rank() == 0)
      std::printf("%zu\t%.1f\t%.3f\t%.3f\t%.1f\t%.3f\t%.3f\t%.1f\n", bytes, ours * 1e6, bytes / ours / 1e9,
                  bytes / ours / 1e9 * busFactor, raw * 1e6, bytes / raw / 1e9, bytes / raw / 1e9 * busFactor,
                  started * 1e6);
  }
  return 0;
}
