// sd-pack-sequences: lets training entries take several sequences per row.
// Each specialized eval_step (accumulate and train_step are built from it
// later) gets an int64 [batch, seq] input `position_ids`: each token's
// position within its own sequence. It replaces the model's learned
// position-embedding lookup (a Gather of the constant arange(seq)), indexes
// the rotary embeddings' constant cos/sin tables, and goes to every fused
// attention as its `positions` operand, where it restricts each
// query to the keys of its own sequence. So a packed row computes exactly what
// its sequences would compute one by one, without a [seq, seq] mask tensor.
// A model that already takes `position_ids` keeps that input.
#include "sd/format/training_abi.h"
#include "PassDetail.h"
#include "PositionLookups.h"
#include "Passes.h"

namespace sd {
#define GEN_PASS_DEF_PACKSEQUENCES
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct PackSequencesPass : sd::impl::PackSequencesBase<PackSequencesPass> {
  void runOnOperation() override {
    for (auto f : getOperation().getOps<func::FuncOp>())
      if (sd::isEntry(f) && f->getAttrOfType<StringAttr>("sd.entry").getValue() == sd::abi::kEvalStep && failed(pack(f)))
        return signalPassFailure();
  }

  LogicalResult pack(func::FuncOp f) {
    int labelsArg = -1, positionsArg = -1;
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      auto name = f.getArgAttrOfType<StringAttr>(i, "sd.name");
      if (name && name.getValue() == sd::abi::kLabels) labelsArg = int(i);
      if (name && name.getValue() == sd::abi::kPositionIds) positionsArg = int(i);
    }
    if (labelsArg < 0) return f.emitError("--packing needs the sft recipe's [batch, seq] labels input");
    auto rowType = cast<RankedTensorType>(f.getArgument(unsigned(labelsArg)).getType());
    int64_t batch = rowType.getDimSize(0), seq = rowType.getDimSize(1);

    SmallVector<AttentionOp> attentions;
    f.walk([&](AttentionOp a) { attentions.push_back(a); });
    // A QkvAttention is a self-attention over [B, T, ...] by construction.
    SmallVector<QkvAttentionOp> fused;
    f.walk([&](QkvAttentionOp a) { fused.push_back(a); });
    if (attentions.empty() && fused.empty())
      return f.emitError("--packing: the model has no attention that sd-fuse-attention recognized, so packed "
                         "sequences could not be kept apart");
    for (AttentionOp a : attentions) {
      ArrayRef<int64_t> q = cast<RankedTensorType>(a.getQ().getType()).getShape();
      ArrayRef<int64_t> k = cast<RankedTensorType>(a.getKt().getType()).getShape();
      ArrayRef<int64_t> v = cast<RankedTensorType>(a.getV().getType()).getShape();
      const bool selfAttention =
          a.getLayout() == "bshd" // token-major [B, T, H, d], keys [B, S, Hkv, d]
              ? q.size() == 4 && k.size() == 4 && v.size() == 4 && q[0] == batch && q[1] == seq && k[0] == batch &&
                    k[1] == seq && v[0] == batch && v[1] == seq
              : q.size() >= 3 && q[0] == batch && q[q.size() - 2] == seq && k.back() == seq && k.size() == q.size() &&
                    v.size() == q.size() && k.drop_back(2) == q.drop_back(2) && v.drop_back(2) == q.drop_back(2);
      if (!selfAttention)
        return a.emitError() << "--packing: " << sd::describeNode(a)
                             << " is not a self-attention over [batch, ..., seq, d] with unbroadcast keys and values";
    }

    OpBuilder b(f.getContext());
    auto positionsType = RankedTensorType::get({batch, seq}, b.getI64Type());
    if (positionsArg < 0) {
      positionsArg = int(f.getNumArguments());
      NamedAttribute name(b.getStringAttr("sd.name"), b.getStringAttr(sd::abi::kPositionIds));
      f.insertArgument(unsigned(positionsArg), positionsType, b.getDictionaryAttr({name}), f.getLoc());
      Value positions = f.getArgument(unsigned(positionsArg));
      int found = 0;
      if (failed(sd::replacePositionLookups(f, positions, seq, "--packing", found)) || failed(indexRotaryTables(f, positions, seq, found)))
        return failure();
      if (!found)
        return f.emitError("--packing: cannot find the position-embedding lookup (a Gather of the constant "
                           "arange(seq)) or a rotary embedding that sd-fuse-rotary recognized; packing needs "
                           "learned absolute positions, rotary positions or a position_ids input");
    } else if (f.getArgument(unsigned(positionsArg)).getType() != positionsType) {
      return f.emitError() << "--packing: the model's position_ids input is "
                           << f.getArgument(unsigned(positionsArg)).getType() << ", not " << positionsType;
    }
    for (AttentionOp a : attentions) a->setOperand(4, f.getArgument(unsigned(positionsArg)));
    for (QkvAttentionOp a : fused) {
      ArrayRef<int64_t> qkv = cast<RankedTensorType>(a.getQkv().getType()).getShape();
      if (qkv[0] != batch || qkv[1] != seq)
        return a.emitError() << "--packing: " << sd::describeNode(a) << " is not a self-attention over [batch, seq]";
      a->setOperand(2, f.getArgument(unsigned(positionsArg)));
    }
    return success();
  }

  // A rotary embedding whose cos/sin are the constant angles of positions
  // 0..seq-1 ([1, seq, W], what the exporter folded from arange(seq)) reads
  // them as a table instead, row position_ids[b, t] for token t of row b.
  LogicalResult indexRotaryTables(func::FuncOp f, Value positions, int64_t seq, int &found) {
    SmallVector<RotaryOp> rotaries;
    f.walk([&](RotaryOp r) {
      if (isa<NoneType>(r.getPositions().getType())) rotaries.push_back(r);
    });
    for (RotaryOp r : rotaries) {
      SmallVector<Value, 2> tables;
      for (Value angles : {r.getCos(), r.getSin()}) {
        DenseElementsAttr dense = sd::foldPositionFree(angles);
        auto type = cast<RankedTensorType>(angles.getType());
        if (!dense || type.getDimSize(0) != 1 || type.getDimSize(1) != seq)
          return r.emitError() << "--packing: the rotary embedding " << sd::describeNode(r)
                               << " takes angles computed in the graph, not a constant table of positions "
                                  "0.."
                               << seq - 1 << "; export the model with a position_ids input";
        OpBuilder b(r);
        auto table = RankedTensorType::get({seq, type.getDimSize(2)}, type.getElementType());
        tables.push_back(b.create<ConstantOp>(r.getLoc(), table, dense.reshape(table)).getResult());
      }
      r->setOperand(1, tables[0]);
      r->setOperand(2, tables[1]);
      r->setOperand(3, positions);
      ++found;
    }
    return success();
  }
};

} // namespace
