// sd-kv-entries: --kv-cache makes the generation entries from the model's
// forward (the infer entry), before specialization:
//   prefill   tokens [batch, chunk]  -> logits [batch, chunk, vocab]
//   decode    tokens [batch, 1]      -> logits [batch, 1, vocab]
//   verify    tokens [batch, K + 1]  -> logits [batch, K + 1, vocab], with
//             --speculate K: speculative decoding checks K guessed tokens
//             after a row's last one in a single call
//   kv_probe  tokens [1, max_length] (read by sd-kv-cache for the position
//             tables of positions 0..max_length-1, then dropped)
// batch is --kv-batch, else the batch a fixed-shape export has, else 1; the
// model's sequence axis must be dynamic. Each is marked sd.kv_shape = [batch,
// seq] for sd-specialize, and keeps only
// the logits output. An attention_mask input becomes all ones: the cache's
// positions say which keys a token sees. A position_ids input stays the
// token positions. A with-past export's past_key_values inputs become empty
// (the plan's cache replaces them) and its present outputs are dropped; any
// other input is refused. Prompt tuning's virtual ids come as tokens (the
// lengthening Concats sd-peft-prompt marked are dropped). Without --shapes an inference
// plan is for generation only and drops the infer entry.
#include "sd/format/training_abi.h"
#include "EntryInputs.h"
#include "PassDetail.h"
#include "Passes.h"

namespace sd {
#define GEN_PASS_DEF_KVENTRIES
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

struct KvEntriesPass : sd::impl::KvEntriesBase<KvEntriesPass> {
  using KvEntriesBase::KvEntriesBase;

  void runOnOperation() override {
    if (maxLength <= 0) return;
    ModuleOp module = getOperation();
    func::FuncOp infer = sd::findEntry(module, sd::abi::kInfer);
    if (!infer) {
      module.emitError("--kv-cache needs the model's forward (an infer entry)");
      return signalPassFailure();
    }
    if (speculate < 0 || speculate >= maxLength) {
      module.emitError() << "--speculate " << int64_t(speculate) << ": the guessed tokens and the one before them must fit the cache (--kv-cache "
                         << int64_t(maxLength) << ")";
      return signalPassFailure();
    }
    if (batch < 0 || chunk <= 0 || chunk > maxLength) {
      // (The options are cl::opt objects: stream their int64 values, not them.)
      module.emitError() << "--kv-cache " << int64_t(maxLength) << ": --kv-batch must be > 0 (got " << int64_t(batch)
                         << ") and --prefill-chunk in [1, " << int64_t(maxLength) << "] (got " << int64_t(chunk) << ")";
      return signalPassFailure();
    }
    OpBuilder b(infer);
    auto forward = cast<func::FuncOp>(b.clone(*infer));
    forward->setAttr("sd.entry", b.getStringAttr("kv_forward"));
    int64_t rows = batch;
    if (failed(prepare(forward)) || failed(rowsFor(forward, rows))) {
      forward.erase();
      return signalPassFailure();
    }
    struct Made {
      const char *name;
      int64_t batch, seq;
    };
    SmallVector<Made> made = {Made{sd::abi::kPrefill, rows, chunk}, Made{sd::abi::kDecode, rows, 1},
                              Made{sd::abi::kKvProbe, rows, maxLength}};
    if (speculate > 0) made.push_back(Made{sd::abi::kVerify, rows, speculate + 1});
    for (Made m : made) {
      auto f = cast<func::FuncOp>(b.clone(*forward));
      f.setName(m.name);
      f->setAttr("sd.entry", b.getStringAttr(m.name));
      f->setAttr("sd.kv_shape", b.getDenseI64ArrayAttr({m.batch, m.seq}));
    }
    forward.erase();
    if (!keepInfer) infer.erase();
  }

  // The rows generated together: --kv-batch, else the batch an export with
  // fixed shapes has, else 1. The sequence axis must be free: the entries feed
  // 1, a chunk and (the probe) the maximum length of tokens per call.
  LogicalResult rowsFor(func::FuncOp f, int64_t &rows) {
    StringRef name = f->getAttrOfType<StringAttr>("sd.kv_token_input").getValue();
    unsigned token = 0;
    while (sd::argName(f, token) != name) ++token;
    ArrayRef<int64_t> dims = cast<RankedTensorType>(f.getArgument(token).getType()).getShape();
    if (!ShapedType::isDynamic(dims[1]))
      return f.emitError() << "--kv-cache: the model fixes input '" << name << "' at " << dims[1]
                           << " tokens per row, but cached generation feeds 1 to " << int64_t(maxLength)
                           << " per call; export it with a dynamic sequence axis (torch.onnx.export's dynamic_shapes "
                              "or dynamic_axes)";
    if (ShapedType::isDynamic(dims[0])) {
      if (rows == 0) rows = 1;
    } else if (rows == 0) {
      rows = dims[0];
    } else if (rows != dims[0]) {
      return f.emitError() << "--kv-cache: the model fixes input '" << name << "' at batch " << dims[0]
                           << "; compile with --kv-batch " << dims[0] << " or export it with a dynamic batch axis";
    }
    return success();
  }

  // Prompt learning (sd-peft-prompt) lengthened the token input and those
  // aligned with it by its virtual ids' positions (and prefix tuning cut
  // them from the logits): here the generator feeds those ids as tokens, so
  // each marked op stands for the operand it names. (What only fed it is
  // left to sd-propagate-shapes, which erases dead ops.)
  static void feedVirtualIdsAsTokens(func::FuncOp f) {
    SmallVector<Operation *> marked;
    f.walk([&](Operation *op) {
      if (op->hasAttr(sd::kVirtualPrefixAttr)) marked.push_back(op);
    });
    for (Operation *op : marked) {
      int64_t kept = op->getAttrOfType<IntegerAttr>(sd::kVirtualPrefixAttr).getInt();
      op->getResult(0).replaceAllUsesWith(op->getOperand(unsigned(kept)));
      op->erase();
    }
  }

  LogicalResult prepare(func::FuncOp f) {
    feedVirtualIdsAsTokens(f);
    FailureOr<unsigned> token = sd::findTokenInput(f, tokenInput, "--kv-cache");
    if (failed(token)) return failure();
    f->setAttr("sd.kv_token_input", StringAttr::get(f.getContext(), sd::argName(f, *token)));
    if (failed(sd::bindAuxiliaryInputs(f, *token, /*keepPositions=*/true, "--kv-cache"))) return failure();

    FailureOr<unsigned> logits = sd::findLogitsOutput(f, logitsOutput, "--kv-cache");
    if (failed(logits)) return failure();
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    std::string name = sd::outputName(f, *logits);
    sd::setEntryOutputs(f, {ret.getOperand(*logits)}, {name});
    return success();
  }
};

} // namespace
