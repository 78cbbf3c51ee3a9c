// Body functions (BodyFunction.cpp): functions the importer outlines for a
// Loop or If step. Each becomes a plan entry marked `body`, run only by the
// step that names it.
#pragma once
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/ArrayRef.h"
#include <string>

namespace sd {

// "<prefix><k>" for the first k that no symbol of the module has.
std::string freshBodyName(mlir::ModuleOp module, llvm::StringRef prefix);

// The function holding the builder's insertion point.
mlir::func::FuncOp enclosingFunction(mlir::OpBuilder &b);

// An empty body function (one block with these arguments), placed right after
// `caller`, so a plan lists each body after what runs it.
mlir::func::FuncOp createBodyFunction(mlir::OpBuilder &b, mlir::func::FuncOp caller, llvm::StringRef name,
                                      mlir::TypeRange argTypes, mlir::Location loc);

// Makes every value `body` uses from another function its own: constants,
// absent operands and global loads are copied to the top of the body, other
// values become arguments appended after the existing ones. Returns those
// outer values, in argument order.
llvm::SmallVector<mlir::Value> captureOuterValues(mlir::func::FuncOp body);

// Gives the body its final type (its arguments, its return's operands) and
// the entry attributes: argument and output names, no buckets (its shapes are
// static from the start).
void finishBodyFunction(mlir::func::FuncOp body, llvm::ArrayRef<std::string> argNames,
                        llvm::ArrayRef<std::string> outputNames);

std::string typeText(mlir::Type t);

} // namespace sd
