// The sd dialect: definition, base classes and the compute-op interface.
#ifndef SD_BASE_TD
#define SD_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/BuiltinTypeInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def SD_Dialect : Dialect {
  let name = "sd";
  let cppNamespace = "::sd::ir";
  let summary = "ONNX-level tensor ops, module state and the buffer-level step IR";
  let description = [{
    Tensor ops mirror ONNX semantics at their latest opset (axes, pads and the
    like are operands); the importer upgrades older opsets. Every compute op maps
    1:1 to a backend-neutral kernel contract named after the ONNX op.
  }];
  let usePropertiesForAttributes = 0;
  let hasConstantMaterializer = 1;
  let useDefaultTypePrinterParser = 1;
}

// Element types ONNX has and MLIR 19's builtins lack: storage only, one byte
// per element in memory (sd/format/dtype.h), converted by Cast and the
// quantization ops.
class SD_StorageType<string name, string typeMnemonic, string what>
    : TypeDef<SD_Dialect, name, [MemRefElementTypeInterface]> {
  let mnemonic = typeMnemonic;
  let summary = what;
}
def SD_Float4E2M1Type : SD_StorageType<"Float4E2M1", "f4e2m1", "ONNX FLOAT4E2M1 (sign, 2 exponent, 1 mantissa bit)">;
def SD_Float8E8M0Type : SD_StorageType<"Float8E8M0", "f8e8m0", "ONNX FLOAT8E8M0 (a power-of-two scale)">;

// Compute ops: the op library (kernels/) defines their shape rule and
// kernels; the interface connects an op to its contract and verifies result
// types against the shape rule.
def SD_ComputeOpInterface : OpInterface<"ComputeOpInterface"> {
  let cppNamespace = "::sd::ir";
  let description = "An op executed by a kernel contract of the same name.";
  let methods = [
    InterfaceMethod<"Kernel contract (ONNX op name) of this op.",
      "::llvm::StringRef", "getContractName", (ins), [{}],
      [{ return ConcreteOp::getContract(); }]>,
  ];
  let verify = [{ return ::sd::ir::verifyAgainstShapeRule($_op); }];
}

// Reverse-mode rule of a differentiable op (sd-autodiff). Given the
// gradients of the op's results (a null Value where a result has none) and
// which operands need one, builds ops that compute the operand gradients at
// the builder's insertion point, one entry per operand (null where none is
// needed or the operand is not differentiable). Rules may read forward
// results (Softmax's output) and must reduce broadcast gradients to the
// operand's shape. Rules are attached per op family in dialects/sd/vjp/.
def SD_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::sd::ir";
  let methods = [
    InterfaceMethod<"Builds the operand gradients from the result gradients.",
      "::mlir::LogicalResult", "buildVJP",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::ArrayRef<bool>":$needed, "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

def SD_OptTensor : AnyTypeOf<[AnyTensor, NoneType]>;

class SD_Op<string mnemonic, list<Trait> traits = []>
    : Op<SD_Dialect, mnemonic, traits>;

// A compute op named after its ONNX contract.
class SD_ComputeOp<string mnemonic, string contract, list<Trait> traits = []>
    : SD_Op<mnemonic, !listconcat(traits, [Pure, SD_ComputeOpInterface])> {
  let summary = "ONNX " # contract;
  let extraClassDeclaration = [{
    static ::llvm::StringRef getContract() { return "}] # contract # [{"; }
  }];
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

class SD_Unary<string mnemonic, string contract, dag attrs = (ins)>
    : SD_ComputeOp<mnemonic, contract> {
  let arguments = !con((ins AnyTensor:$input), attrs);
  let results = (outs AnyTensor:$output);
}

class SD_Binary<string mnemonic, string contract, dag attrs = (ins)>
    : SD_ComputeOp<mnemonic, contract> {
  let arguments = !con((ins AnyTensor:$lhs, AnyTensor:$rhs), attrs);
  let results = (outs AnyTensor:$output);
}

class SD_Nary<string mnemonic, string contract, dag operands, dag attrs = (ins),
              dag res = (outs AnyTensor:$output)>
    : SD_ComputeOp<mnemonic, contract> {
  let arguments = !con(operands, attrs);
  let results = res;
}

#endif // SD_BASE_TD
