// Shared helpers for pass implementations.
#pragma once
#include "SDDialect.h"
#include "sd/format/training_abi.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "llvm/Support/Regex.h"
#include <memory>
#include <optional>

namespace sd::ir {
class GradBuilder;
} // namespace sd::ir

namespace sd {
// Entry functions carry `sd.entry = "<name>"`.
inline bool isEntry(mlir::func::FuncOp f) { return f->hasAttr("sd.entry"); }
// The OpT ops of the module's inference entries (`sd.entry = "infer"`), in
// order: what the inference-only rewrites (conv epilogues, folded affines)
// may change, training entries keeping the ops their backward reads.
template <typename OpT> llvm::SmallVector<OpT> opsOfInferenceEntries(mlir::ModuleOp module) {
  llvm::SmallVector<OpT> ops;
  module.walk([&](mlir::func::FuncOp f) {
    auto entry = f->getAttrOfType<mlir::StringAttr>("sd.entry");
    if (entry && entry.getValue() == sd::abi::kInfer) f.walk([&](OpT op) { ops.push_back(op); });
  });
  return ops;
}
// The ONNX node name carried by a location, or "" when there is none.
std::string nodeNameOf(mlir::Location loc);
// The source-framework module an imported node belongs to, when the exporter
// recorded one in metadata (the importer's FusedLoc metadata), else "".
std::string moduleScopeOf(mlir::Location loc);
// "node 'x' (Op)" for diagnostics.
std::string describeNode(mlir::Operation *op);
// Kernels whose element i of the result reads only element i of each
// (broadcast) operand: sd-inplace-reuse may write over an operand of the same
// type, sd-bounded-extents passes a counted dim through.
bool isElementwiseContract(llvm::StringRef contract);

// --shapes/--dim values: "x=2x128,4x128" -> ("x", [[2,128],[4,128]]) ("scalar":
// []); dims "seq=128,256" -> ("seq", [[128],[256]]). Shared by sd-specialize
// and the driver, which hands the importer what it can use early.
mlir::LogicalResult parseBinding(llvm::StringRef text, bool isShape, std::string &name,
                                 std::vector<std::vector<int64_t>> &values, std::string &err);
// The global `name`, created after the module's last global (so state the
// passes add, such as all gradients, sits together in plan order) when missing.
sd::ir::GlobalOp getOrCreateGlobal(mlir::ModuleOp module, llvm::StringRef name, mlir::Type type,
                                   llvm::StringRef role, mlir::ElementsAttr init = {});
// Pattern helpers for the fusion passes. scalarValue: the value of a
// one-element float constant. isScalar: `v` is one within 1e-5 of `want`. otherOperand: for a binary op with operand
// `v`, the other one (null if `v` is not an operand). soleUser: the only user.
std::optional<double> scalarValue(mlir::Value v);
bool isScalar(mlir::Value v, double want);
// v = Mul(rest, c) or Mul(c, rest), read by nothing else, with c a nonzero
// scalar constant and rest of v's type: the Mul, with `rest` set and c
// multiplied into `scale`; else null (and nothing set).
sd::ir::MulOp scalarFactor(mlir::Value v, mlir::Value &rest, double &scale);
mlir::Value otherOperand(mlir::Operation *op, mlir::Value v);
mlir::Operation *soleUser(mlir::Value v);
// The only user of v, looking through casts to the same type (exporters
// leave them around softmax and normalizations); `out` is the value that
// user consumes.
mlir::Operation *soleUserThroughCasts(mlir::Value v, mlir::Value &out);
// The half value `v` widens (v = Cast to f32 of a bf16 or f16 value), else
// null: where autocast left a half value between casts (sd-half-elementwise,
// sd-norm-grad-sum read the half itself).
mlir::Value widenedHalf(mlir::Value v);
// A ReduceMean over the last axis only, keeping it (LayerNorm's and RMSNorm's statistics).
bool isLastAxisMean(sd::ir::ReduceMeanOp m);
// On an sd.global_load of a trainable global, or on any compute op: a value no
// gradient flows through (PyTorch's .detach(); DoRA's weight norm, KTO's KL
// estimate). sd-autodiff treats what it computes as constant.
constexpr const char *kDetachedAttr = "sd.detached";
// On a trainable global updated block by block (DyLoRA's A and B): a
// dictionary {axis, size, drawn, steps}: blocks of `size` along `axis`; block
// k takes an optimizer step only when the f32 flags global `drawn` has k set,
// with its own step count in the f32 global `steps` (sd-optimizer).
constexpr const char *kBlockUpdatesAttr = "sd.block_updates";
// On a DyLoRA block draw (an sd.seeded_random): its module's drawn-blocks
// global, which sd-dylora-draws fills in training entries.
constexpr const char *kDyloraDrawAttr = "sd.dylora_drawn";
// DyLoRA draws use random streams kDyloraStream + site (the adapted layer's
// index): apart from adapter dropout's (the site) and an exported model's
// (kExportedDropoutStream + k, 1 << 32). test/e2e/test_dylora.py reproduces them.
constexpr int64_t kDyloraStream = int64_t(1) << 33;
// On the last op of a weight's dequantization (sd-quantize-nf4), naming the
// weight: sd-rematerialize-dequant repeats the chain before each reader.
constexpr const char *kDequantizedAttr = "sd.dequantized";
// A regex that must match a whole name (Python's re.fullmatch, as PEFT uses),
// built on llvm::Regex (POSIX ERE) with the common Perl classes \d \w \s
// translated. Returns false with `error` set on a bad pattern.
bool fullMatchRegex(const std::string &pattern, std::unique_ptr<llvm::Regex> &out, std::string &error);
// The sd.linear layers PEFT's target_modules selects: a comma list matches a
// module named as an entry or ending with "." + entry; a pattern with regex
// characters must match the whole name; "all-linear" takes every linear
// layer but the output head (a layer whose result an entry returns), as PEFT
// does. `flag` names the option in errors ("--target-modules").
mlir::LogicalResult selectTargetLinears(mlir::ModuleOp module, const std::string &spec, llvm::StringRef flag,
                                        llvm::SmallVectorImpl<sd::ir::LinearOp> &out);
// Whether the source framework stores this layer's weight [in, out] (GPT-2's
// Conv1D; PEFT's fan_in_fan_out): an [in, out] weight under its own module
// name. An [in, out] initializer under another name (onnx::MatMul_N) is the
// exporter's folded transpose of an nn.Linear, which PyTorch stores [out, in].
bool storedInOut(sd::ir::LinearOp l);
// Prompt learning (sd-peft-prompt): an op that lengthens a value by the
// virtual tokens' positions carries this i64 attribute, the operand it stands
// for in entries that are fed the virtual ids as tokens (sd-kv-entries); and
// prefix tuning marks the embedding lookup whose indices' operand holds the
// ids (sd-prefix-attention reads them there).
constexpr const char *kVirtualPrefixAttr = "sd.virtual_prefix";
constexpr const char *kVirtualLookupAttr = "sd.virtual_lookup";
// Among integer token ids, the virtual ones first, first + 1, ...: where an
// id is one (i1, shaped like `ids`), and which one it is (id - first, 0 for
// the other ids), to gather its trained rows by.
struct VirtualIds {
  mlir::Value isVirtual, slot;
};
VirtualIds virtualIdsAmong(sd::ir::GradBuilder &g, mlir::Value ids, int64_t first);
// A layer's (in, out) features from its 2-D weight and layout ("oi": [out, in]; "io": [in, out]).
std::pair<int64_t, int64_t> linearInOut(sd::ir::LinearOp l);
// A PEFT pass's start (sd-peft-lora, -ia3, -loha, -vera, -osft): the layers
// --target-modules selects (selectTargetLinears), and the model's own
// weights frozen, so only what the pass adds trains.
mlir::LogicalResult adapterTargets(mlir::ModuleOp module, const std::string &targetModules,
                                   llvm::SmallVectorImpl<sd::ir::LinearOp> &out);
// The uses of `v` now, to redirect after new ops have read `v` too (an
// adapter's sum replaces the layer's result for its old readers only).
llvm::SmallVector<mlir::OpOperand *> usesOf(mlir::Value v);
// seeded_dropout(x) on an adapter's input (PEFT's lora_dropout, vera_dropout):
// random stream `stream` of the dropout_rng state, which sd-training-dropout
// keeps in training entries only.
mlir::Value adapterDropout(mlir::ModuleOp module, sd::ir::GradBuilder &g, mlir::Value x, double ratio, int64_t stream);
// A load of the dropout_rng state global ([seed, counter, row offset, rows];
// made when missing) that keys training-time randomness.
mlir::Value loadRandomState(mlir::ModuleOp module, mlir::OpBuilder &b, mlir::Location loc);
// Erases `v`'s defining op, and then its operands', while nothing reads them
// (side-effect-free ops and global loads).
void eraseIfUnread(mlir::Value v);
// The DyLoRA block a draw in [0, blocks) picks: its floor, at most blocks - 1.
mlir::Value dyloraBlock(sd::ir::GradBuilder &g, mlir::Value draw, int64_t blocks);
// A bias-free sd.linear of an adapter, named `module` (x Wᵀ for "oi", x W for "io").
mlir::Value adapterLinear(sd::ir::GradBuilder &g, mlir::Value x, mlir::Value w, llvm::StringRef layout,
                          llvm::StringRef module);
} // namespace sd
