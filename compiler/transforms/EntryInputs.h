// Naming and finding an entry function's inputs and outputs, shared by the
// passes that build entries from the model's forward (sd-recipe-sft,
// sd-kv-entries).
#pragma once
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include <string>

namespace sd {
// The entry function whose sd.entry is `entry` (the first), or null.
mlir::func::FuncOp findEntry(mlir::ModuleOp module, llvm::StringRef entry);
// The input's sd.name, else "inputN"; the output's sd.output_names entry, else "outputN".
std::string argName(mlir::func::FuncOp f, unsigned i);
std::string outputName(mlir::func::FuncOp f, unsigned i);
// " (the model's outputs: 'a', 'b')", for errors about an output the user named
// (TorchScript exports name them after node numbers unless told otherwise).
std::string outputNamesNote(mlir::func::FuncOp f);
// Makes `values` f's outputs, named `names` (sd.output_names), in place of its own.
void setEntryOutputs(mlir::func::FuncOp f, mlir::ValueRange values, llvm::ArrayRef<llvm::StringRef> names);
// The Gather whose indices are `v`, directly or through a cast or reshape
// (nanoGPT-style and Hugging Face exports both do this): the embedding lookup
// a token input feeds. Null when there is none.
mlir::Operation *embeddingLookupOf(mlir::Value v, int depth = 0);
// An int64 [batch, seq] value.
bool isTokenShaped(mlir::Value v);
// The token input: `named` when given, else the only int64 [batch, seq]
// input, else the only one that indexes an embedding (Hugging Face's
// attention_mask, position_ids and token_type_ids never count). `who` starts errors
// ("--recipe sft").
mlir::FailureOr<unsigned> findTokenInput(mlir::func::FuncOp f, llvm::StringRef named, llvm::StringRef who);
// The logits output: `named` when given, else the only float [batch, seq,
// vocab] output. `who` starts errors ("--kv-cache").
mlir::FailureOr<unsigned> findLogitsOutput(mlir::func::FuncOp f, llvm::StringRef named, llvm::StringRef who);
// Binds the inputs Hugging Face exports carry besides the tokens to what a
// step without them means: attention_mask all ones (no padding: packing and
// the KV cache's positions say which keys a token sees), a with-past
// export's past_key_values.N.key/value empty (the step computes its keys and
// values alone), and position_ids 0..seq-1 ([1, seq], transformers' default) unless `keepPositions` (then it
// stays an input), token_type_ids zeros (one segment). attention_mask stays
// an input when `keepMask` (rows padded to a bucket's length). Any other input is an error naming `flag` when
// `refuseOthers`, else left alone. The bound inputs are erased from `f`.
mlir::LogicalResult bindAuxiliaryInputs(mlir::func::FuncOp f, unsigned tokenArg, bool keepPositions,
                                        llvm::StringRef flag, bool refuseOthers = true, bool keepMask = false);
} // namespace sd
