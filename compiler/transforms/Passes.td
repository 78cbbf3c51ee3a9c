// Every sd pass, in pipeline order. Each pass lives in its own file and has a
// lit test named after it in test/lit.
#ifndef SD_PASSES_TD
#define SD_PASSES_TD

include "mlir/Pass/PassBase.td"

def FormLinear : Pass<"sd-form-linear", "mlir::ModuleOp"> {
  let summary = "Rewrite MatMul/Gemm with a weight global (+ bias) into sd.linear";
  let description = [{
    `MatMul(x, [Transpose] W) [+ Add b]` and `Gemm(x, W, b)` where W is a 2-D
    global become one `sd.linear` carrying the weight layout and a module name:
    the initializer's name without `.weight`, or, when the exporter renamed the
    weight (`onnx::MatMul_123`), the node scope (`/blocks.0/attn/qkv/MatMul`).
  }];
}

def FuseGelu : Pass<"sd-fuse-gelu", "mlir::ModuleOp"> {
  let summary = "Replace exported x*0.5*(1+erf(x/sqrt(2))) with one sd.gelu";
}

def Specialize : Pass<"sd-specialize", "mlir::ModuleOp"> {
  let summary = "Clone each entry per shape bucket with static input shapes";
  let options = [
    ListOption<"shapes", "shapes", "std::string",
               "INPUT=DxD[,DxD...] per input; several values make several buckets">,
    ListOption<"dims", "dims", "std::string",
               "NAME=N[,N...] binds an ONNX dim_param">,
  ];
}

def PropagateShapes : Pass<"sd-propagate-shapes", "mlir::ModuleOp"> {
  let summary = "Infer result types with the op library's shape rules and fold constants";
  let description = [{
    Walks each entry in order, refining result types by the shared shape rules
    and evaluating ops whose operands are all constant with the CPU kernels (so
    folding and execution agree). Shape/Size of static tensors fold too.
  }];
  let options = [
    Option<"maxFoldBytes", "max-fold-bytes", "int64_t", "1 << 20",
           "largest result a fold may materialize">,
  ];
}

def CheckStatic : Pass<"sd-check-static", "mlir::ModuleOp"> {
  let summary = "Fail, naming the node, if a dynamic dim or a shape op survives";
}

def Bufferize : Pass<"sd-bufferize", "mlir::ModuleOp"> {
  let summary = "Lower tensor entries to the buffer-level step IR";
  let description = [{
    Destination-passing: every compute op becomes an `sd.step` writing fresh
    `sd.buffer`s; reshape, squeeze, unsqueeze, flatten and identity become
    `sd.view` aliases; constants become constant-role globals.
  }];
}

def InPlaceReuse : Pass<"sd-inplace-reuse", "mlir::ModuleOp"> {
  let summary = "Let elementwise steps write into an input buffer that dies there";
}

def Liveness : Pass<"sd-liveness", "mlir::ModuleOp"> {
  let summary = "Annotate each arena buffer with its live step range";
}

def PackArena : Pass<"sd-pack-arena", "mlir::ModuleOp"> {
  let summary = "Assign arena offsets so buffers live at the same time never overlap";
  let description = [{
    Greedy best-fit by decreasing size over the live ranges from sd-liveness,
    64-byte aligned. Records `sd.arena_bytes` and `sd.tensor_bytes` (the sum of
    all buffer sizes) on each entry.
  }];
}

#endif // SD_PASSES_TD
