// The summed cross-entropy and the two-output loss entry both training
// recipes build (sd-recipe-sft over token positions, sd-recipe-classify over
// rows): eval_step returns loss_sum and the count of labels it covered, so
// gradient accumulation normalizes over a whole window.
#pragma once
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace sd::ir {
class GradBuilder;
}

namespace sd {

// Labels that are not counted (PyTorch's ignore_index).
constexpr int64_t kIgnoreIndex = -100;

struct SummedLoss {
  mlir::Value loss;  // f32 scalar: the sum over counted labels
  mlir::Value count; // f32 scalar: how many labels were not kIgnoreIndex
};
// Prompt tuning's virtual tokens before every row's logits (sd-peft-prompt), else 0.
int64_t promptVirtualTokens(mlir::ModuleOp module);
// 1.0 where a label counts (is not kIgnoreIndex), else 0.0: f32, shaped like `labels`.
mlir::Value countedLabels(sd::ir::GradBuilder &g, mlir::Value labels);
// Cross-entropy of scores [n, classes] against int64 labels [n], summed
// over the labels that are not kIgnoreIndex. Null values when g failed.
SummedLoss summedCrossEntropy(sd::ir::GradBuilder &g, mlir::Value scores, mlir::Value labels);

// The causal-LM pieces the token recipes (sd-recipe-sft, sd-recipe-preference) share:
// the model's [batch, seq, vocab] logits, and the labels input they are scored
// against, shifted left by one so position t's scores meet token t+1 (the last
// position gets kIgnoreIndex), flattened to [batch * seq].
struct TokenScores {
  mlir::Value logits;     // [batch, seq, vocab], vocab static
  mlir::Value tokens;     // the token input
  mlir::Value labels;     // the new int64 [batch, seq] labels input
  mlir::Value nextLabels; // int64 [batch * seq]
};
// `labels` [batch, seq] shifted left by one, the last position kIgnoreIndex,
// flattened to [batch * seq]: what each position's scores are scored against.
mlir::Value nextTokenLabels(sd::ir::GradBuilder &g, mlir::Value labels);
// Adds the labels input to `f` (a clone of infer, ending in its outputs) and
// records the token input as the module's sd.token_input. `who` starts errors.
mlir::FailureOr<TokenScores> tokenScores(mlir::func::FuncOp f, llvm::StringRef logitsOutput, llvm::StringRef tokenInput,
                                         llvm::StringRef who);
// Clones `infer` into a new eval_step entry, first binding the inputs a
// Hugging Face export carries besides the tokens when `bindInputs` (data that
// gives tokens only). Null on error (reported).
mlir::func::FuncOp cloneInferAsEvalStep(mlir::ModuleOp module, llvm::StringRef tokenInput, llvm::StringRef who,
                                        bool bindInputs);

// Replaces f's outputs with (loss_sum, tokens).
mlir::LogicalResult finishLossEntry(mlir::func::FuncOp f, mlir::Value loss, mlir::Value count);

// A new input of `f` named `name`, shaped [dims of `like` up to `rank`],
// with `like`'s dimension names for those axes (so --shapes specializes it
// with the input it follows); int64 unless `element` says otherwise.
mlir::Value addLabelsInput(mlir::func::FuncOp f, unsigned like, int64_t rank, llvm::StringRef name,
                           mlir::Type element = {});

// Per position: the log-probability `logits` [batch, seq, vocab] give the
// label each position is scored against (`next`, flattened [batch * seq]),
// 0 where that label is not counted; shaped like `rowsLike` [batch, seq].
mlir::Value tokenLogProbs(sd::ir::GradBuilder &g, mlir::Value logits, mlir::Value next, mlir::Value rowsLike);

// The recipes' reference model (DPO, KTO, GRPO's KL term): `f`'s forward
// once more, each trainable parameter read from a `reference/<name>` copy
// (scalar state, never optimized); only ops that depend on a trainable
// parameter are cloned. Returns what `v` is in that copy. `who` starts errors.
mlir::FailureOr<mlir::Value> referenceForward(mlir::func::FuncOp f, mlir::Value v, llvm::StringRef who);

} // namespace sd
