// sd-pack-arena: best-fit offsets over live ranges; buffers that are live at
// the same step never overlap.
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"

namespace sd {
#define GEN_PASS_DEF_PACKARENA
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;

namespace {

constexpr int64_t kAlign = 64;

int64_t byteSize(sd::ir::BufferOp b) { return sd::ir::storageBytes(cast<MemRefType>(b.getType())); }

struct Placed {
  int64_t offset, size, first, last;
};

struct PackArenaPass : sd::impl::PackArenaBase<PackArenaPass> {
  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (!sd::isEntry(f)) continue;
      SmallVector<sd::ir::BufferOp> bufs;
      bool missing = false;
      f.walk([&](sd::ir::BufferOp b) {
        bufs.push_back(b);
        if (!b.getLive()) missing = true;
      });
      if (missing) {
        f.emitError("sd-pack-arena needs live ranges: run sd-liveness first");
        return signalPassFailure();
      }
      // Largest first, ties by earlier start: the classic greedy-by-size order.
      llvm::stable_sort(bufs, [](sd::ir::BufferOp a, sd::ir::BufferOp b) {
        int64_t sa = byteSize(a), sb = byteSize(b);
        if (sa != sb) return sa > sb;
        return (*a.getLive())[0] < (*b.getLive())[0];
      });
      SmallVector<Placed> placed;
      int64_t arena = 0, total = 0;
      Builder builder(f.getContext());
      for (sd::ir::BufferOp b : bufs) {
        int64_t size = (byteSize(b) + kAlign - 1) / kAlign * kAlign, first = (*b.getLive())[0], last = (*b.getLive())[1];
        total += byteSize(b);
        SmallVector<std::pair<int64_t, int64_t>> busy;
        for (const Placed &p : placed)
          if (p.first <= last && first <= p.last) busy.push_back({p.offset, p.offset + p.size});
        llvm::sort(busy);
        // Best fit: the smallest gap that holds the buffer, else the end.
        int64_t best = -1, bestGap = INT64_MAX, cursor = 0;
        for (auto [s, e] : busy) {
          if (s - cursor >= size && s - cursor < bestGap) {
            best = cursor;
            bestGap = s - cursor;
          }
          cursor = std::max(cursor, e);
        }
        if (best < 0) best = cursor;
        placed.push_back({best, size, first, last});
        arena = std::max(arena, best + size);
        b.setOffsetAttr(builder.getI64IntegerAttr(best));
      }
      f->setAttr("sd.arena_bytes", builder.getI64IntegerAttr(arena));
      f->setAttr("sd.tensor_bytes", builder.getI64IntegerAttr(total));
    }
  }
};

} // namespace
