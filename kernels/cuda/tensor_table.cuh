// Launches over several tensors at once (GroupedAdamW, GroupedCast,
// GradScale's sums of squares): each tensor has a slot naming the first
// block of the launch that works on it, and the slots sit in a table on the
// device, written once when the session is prepared (a session's tensors
// never move), so a captured step replays with no copy.
#pragma once
#include <cstdint>
#include "cuda_util.cuh"
#include <cuda_runtime.h>
#include <memory>
#include <vector>

namespace sd::cuda {

// This block's slot: the last one whose firstBlock is at most blockIdx.x (a
// tensor of no elements has no block).
template <typename Slot> __device__ int blockSlot(const Slot *slots, int count) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (slots[mid].firstBlock <= int64_t(blockIdx.x)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The slots on the host and, once uploaded, on the device.
template <typename Slot> struct TensorTable {
  std::vector<Slot> slots;
  Slot *device = nullptr;
  int64_t blocks = 0; // of the launch
  TensorTable() = default;
  TensorTable(const TensorTable &) = delete;
  TensorTable &operator=(const TensorTable &) = delete;
  ~TensorTable() { cudaFree(device); }
  // Before any capture (synchronous copy); false, the error cleared, when it fails.
  bool upload() {
    const size_t bytes = (slots.empty() ? 1 : slots.size()) * sizeof(Slot);
    if (cudaMalloc(&device, bytes) != cudaSuccess ||
        (!slots.empty() && cudaMemcpy(device, slots.data(), slots.size() * sizeof(Slot), cudaMemcpyHostToDevice) !=
                               cudaSuccess)) {
      cudaGetLastError();
      return false;
    }
    return true;
  }
  // True while the table still describes a step whose slots are now `now`
  // (Slot::sameTensors compares two slots' addresses and sizes).
  bool describes(const std::vector<Slot> &now) const {
    if (now.size() != slots.size()) return false;
    for (size_t i = 0; i < now.size(); ++i)
      if (!now[i].sameTensors(slots[i])) return false;
    return true;
  }
};

// A grouped step's prepare function: its table from `slotsOf(step, blocks)`
// (the slots of the step's tensors, empty when they do not fit the op),
// uploaded; null when there is none or it could not be allocated.
template <typename Slot, typename SlotsOf> std::shared_ptr<const void> prepareTable(const PrepareContext &p, SlotsOf slotsOf) {
  auto t = std::make_shared<TensorTable<Slot>>();
  t->slots = slotsOf(p.kernel, t->blocks);
  if (t->slots.empty() || !t->upload()) return nullptr;
  return t;
}

// The table prepared for step `c`, checked against its tensors now: a
// kernel writing through a table of moved tensors would corrupt memory.
template <typename Slot, typename SlotsOf>
StatusOr<const TensorTable<Slot> *> preparedTable(const KernelContext &c, SlotsOf slotsOf, const char *op,
                                                  const char *whyNone) {
  auto *table = static_cast<const TensorTable<Slot> *>(c.prepared);
  if (!table) return sdError(op, ": ", whyNone, ", or the device table could not be allocated");
  int64_t blocks = 0;
  if (!table->describes(slotsOf(c, blocks)))
    return sdError(op, ": its tensors are not where they were when the session was prepared");
  return table;
}

} // namespace sd::cuda
