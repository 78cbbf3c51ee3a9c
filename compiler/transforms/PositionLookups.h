// Rewrites that turn a specialized graph's implicit positions 0..seq-1 into
// an explicit int64 [batch, seq] position input, shared by sd-pack-sequences
// (positions restart per packed sequence) and sd-kv-cache (positions continue
// from the cache).
#pragma once
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace sd {
// indices is the constant 0, 1, ..., seq-1 (shape [seq] or [1, seq]).
bool isArange(mlir::Value indices, int64_t seq);
// Gather(table, arange(seq)) -> Gather(table, positions): the learned
// position embedding's [seq, C] lookup becomes [batch, seq, C]; its users must
// already produce that shape by adding it to the activations. `flag` names the
// option in errors. Counts the lookups rewritten in `found`.
mlir::LogicalResult replacePositionLookups(mlir::func::FuncOp f, mlir::Value positions, int64_t seq,
                                           llvm::StringRef flag, int &found);
// The value of `v` when it depends on nothing but constants and small (64
// KiB) frozen weights: foldFromFrozenWeights (GlobalData.h). (PyTorch's dynamo
// exporter keeps a rotary embedding's inv_freq buffer as an initializer, so
// its cos/sin never fold by themselves.) Null otherwise.
mlir::DenseElementsAttr foldPositionFree(mlir::Value v);
} // namespace sd
