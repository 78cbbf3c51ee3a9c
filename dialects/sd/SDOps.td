// sd tensor ops (ONNX semantics), module state ops and step-IR ops.
#ifndef SD_OPS_TD
#define SD_OPS_TD

include "SDBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"

defvar OptI64 = OptionalAttr<I64Attr>;
defvar OptF32 = OptionalAttr<F32Attr>;
defvar OptF64 = OptionalAttr<F64Attr>;
defvar OptStr = OptionalAttr<StrAttr>;
defvar OptI64s = OptionalAttr<DenseI64ArrayAttr>;
defvar I64ArrayAttrKernel = DenseI64ArrayAttr;

//===----------------------------------------------------------------------===//
// Module state, constants and absent operands
//===----------------------------------------------------------------------===//

def SD_GlobalOp : SD_Op<"global", [Symbol]> {
  let summary = "module-level state tensor (weight, optimizer moment, counter)";
  let description = [{
    Every entry and shape bucket shares one set of globals. `role` is one of
    the plan's global roles (sd/format/plan_format.h): frozen, trainable,
    optimizer_state, scalar_state, constant, gradient, kv_cache, statistics. Weight data is
    held as an MLIR resource (dense_resource), not in attribute storage.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttr:$type, StrAttr:$role,
                       OptionalAttr<ElementsAttr>:$initial_value);
  let assemblyFormat = "$sym_name $role attr-dict `:` $type (`=` $initial_value^)?";
  let hasVerifier = 1;
}

def SD_GlobalLoadOp : SD_Op<"global_load", [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "reads a global";
  let arguments = (ins FlatSymbolRefAttr:$global);
  let results = (outs AnyTensor:$result);
  let assemblyFormat = "$global attr-dict `:` type($result)";
}

def SD_GlobalStoreOp : SD_Op<"global_store", [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "writes a global (in-place state update)";
  let arguments = (ins FlatSymbolRefAttr:$global, AnyTensor:$value);
  let assemblyFormat = "$value `,` $global attr-dict `:` type($value)";
}

def SD_ConstantOp : SD_Op<"constant", [ConstantLike, Pure]> {
  let summary = "small constant tensor (shape arithmetic, scalars)";
  let arguments = (ins ElementsAttr:$value);
  let results = (outs AnyTensor:$output);
  // Printed like arith.constant: `sd.constant dense<[1, 2]> : tensor<2xi64>`.
  let hasCustomAssemblyFormat = 1;
  let hasFolder = 1;
}

def SD_NoneOp : SD_Op<"none", [Pure]> {
  let summary = "placeholder for an absent optional operand";
  let results = (outs NoneType:$result);
  let assemblyFormat = "attr-dict";
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

foreach op = [["exp", "Exp"], ["log", "Log"], ["sqrt", "Sqrt"],
              ["reciprocal", "Reciprocal"], ["sin", "Sin"], ["cos", "Cos"],
              ["tan", "Tan"], ["asin", "Asin"], ["acos", "Acos"],
              ["atan", "Atan"], ["sinh", "Sinh"], ["cosh", "Cosh"],
              ["asinh", "Asinh"], ["acosh", "Acosh"], ["atanh", "Atanh"],
              ["tanh", "Tanh"], ["erf", "Erf"], ["sigmoid", "Sigmoid"],
              ["softsign", "Softsign"], ["softplus", "Softplus"],
              ["mish", "Mish"], ["hard_swish", "HardSwish"], ["neg", "Neg"],
              ["abs", "Abs"], ["sign", "Sign"], ["relu", "Relu"],
              ["floor", "Floor"], ["ceil", "Ceil"], ["round", "Round"],
              ["identity", "Identity"], ["not", "Not"], ["is_nan", "IsNaN"],
              ["bitwise_not", "BitwiseNot"]] in
  def SD_ # op[1] # Op : SD_Unary<op[0], op[1]>;

def SD_HardSigmoidOp : SD_Unary<"hard_sigmoid", "HardSigmoid", (ins OptF32:$alpha, OptF32:$beta)>;
def SD_LeakyReluOp : SD_Unary<"leaky_relu", "LeakyRelu", (ins OptF32:$alpha)>;
def SD_SwishOp : SD_Unary<"swish", "Swish", (ins OptF32:$alpha)>;
def SD_SwiGLUOp : SD_Nary<"swiglu", "SwiGLU", (ins AnyTensor:$gate, AnyTensor:$up)> {
  let description = [{
    y = silu(gate) * up = gate * sigmoid(gate) * up, gate and up of one shape:
    the gated MLP of Llama-class models, as sd-fuse-swiglu recognizes it.
  }];
}
def SD_SwiGLUPackedOp : SD_Nary<"swiglu_packed", "SwiGLUPacked", (ins AnyTensor:$x)> {
  let description = [{
    SwiGLU of x = [gate | up] along its last axis (2F wide): y [..., F] =
    silu(gate) * up. What sd-pack-swiglu makes of a SwiGLU on the two halves
    of one projection (gate and up fused by sd-fuse-projections), so no Split
    copies them apart (nor a Concat joins their gradients).
  }];
}
def SD_ShrinkOp : SD_Unary<"shrink", "Shrink", (ins OptF32:$bias, OptF32:$lambd)>;
def SD_EluOp : SD_Unary<"elu", "Elu", (ins OptF32:$alpha)>;
def SD_SeluOp : SD_Unary<"selu", "Selu", (ins OptF32:$alpha, OptF32:$gamma)>;
def SD_CeluOp : SD_Unary<"celu", "Celu", (ins OptF32:$alpha)>;
def SD_ThresholdedReluOp : SD_Unary<"thresholded_relu", "ThresholdedRelu", (ins OptF32:$alpha)>;
def SD_GeluOp : SD_Unary<"gelu", "Gelu", (ins OptStr:$approximate)>;
def SD_IsInfOp : SD_Unary<"is_inf", "IsInf", (ins OptI64:$detect_negative, OptI64:$detect_positive)>;
def SD_CastOp : SD_Unary<"cast", "Cast", (ins I64Attr:$to, OptI64:$saturate, OptStr:$round_mode)>;
def SD_BitCastOp : SD_Unary<"bit_cast", "BitCast", (ins I64Attr:$to)>;
def SD_CastLikeOp : SD_Binary<"cast_like", "CastLike", (ins OptStr:$round_mode, OptI64:$saturate)>;

foreach op = [["add", "Add"], ["sub", "Sub"], ["mul", "Mul"], ["div", "Div"],
              ["pow", "Pow"], ["and", "And"], ["or", "Or"], ["xor", "Xor"],
              ["equal", "Equal"], ["less", "Less"],
              ["less_or_equal", "LessOrEqual"], ["greater", "Greater"],
              ["greater_or_equal", "GreaterOrEqual"], ["prelu", "PRelu"],
              ["bitwise_and", "BitwiseAnd"], ["bitwise_or", "BitwiseOr"], ["bitwise_xor", "BitwiseXor"]] in
  def SD_ # op[1] # Op : SD_Binary<op[0], op[1]>;

def SD_ModOp : SD_Binary<"mod", "Mod", (ins OptI64:$fmod)>;
def SD_BitShiftOp : SD_Binary<"bit_shift", "BitShift", (ins StrAttr:$direction)>;

foreach op = [["min", "Min"], ["max", "Max"], ["mean", "Mean"], ["sum", "Sum"]] in
  def SD_ # op[1] # Op : SD_Nary<op[0], op[1], (ins Variadic<AnyTensor>:$inputs)>;

def SD_WhereOp : SD_Nary<"where", "Where",
    (ins AnyTensor:$condition, AnyTensor:$x, AnyTensor:$y)>;
// Sampling X at normalized grid positions (spatial transformers, optical flow).
def SD_GridSampleOp : SD_Binary<"grid_sample", "GridSample",
    (ins OptI64:$align_corners, OptStr:$mode, OptStr:$padding_mode)>;
def SD_AffineGridOp : SD_Binary<"affine_grid", "AffineGrid", (ins OptI64:$align_corners)>;
// GridSample's gradient: dy back to X (dx, the taps' adjoint) and to the grid
// (dgrid, the interpolation's slope), with GridSample's attributes.
def SD_GridSampleGradOp : SD_Nary<"grid_sample_grad", "GridSampleGrad",
    (ins AnyTensor:$grad, AnyTensor:$x, AnyTensor:$grid),
    (ins OptI64:$align_corners, OptStr:$mode, OptStr:$padding_mode), (outs AnyTensor:$dx, AnyTensor:$dgrid)>;
// Ops of recent opsets and vision models (kernels/cpu: linear_attention.cc,
// roi_align.cc, deform_conv.cc, col2im.cc, tfidf.cc and the family files).
def SD_LinearAttentionOp : SD_Nary<"linear_attention", "LinearAttention",
    (ins AnyTensor:$query, AnyTensor:$key, AnyTensor:$value, SD_OptTensor:$past_state, SD_OptTensor:$decay,
         SD_OptTensor:$beta),
    (ins OptI64:$chunk_size, OptI64:$kv_num_heads, OptI64:$q_num_heads, OptF32:$scale, OptStr:$update_rule),
    (outs AnyTensor:$output, AnyTensor:$present_state)>;
def SD_TensorScatterOp : SD_Nary<"tensor_scatter", "TensorScatter",
    (ins AnyTensor:$past_cache, AnyTensor:$update, SD_OptTensor:$write_indices), (ins OptI64:$axis, OptStr:$mode)>;
def SD_DetOp : SD_Unary<"det", "Det">;
def SD_LRNOp : SD_Unary<"lrn", "LRN", (ins OptF32:$alpha, OptF32:$beta, OptF32:$bias, I64Attr:$size)>;
def SD_MaxUnpoolOp : SD_Nary<"max_unpool", "MaxUnpool",
    (ins AnyTensor:$x, AnyTensor:$indices, SD_OptTensor:$output_shape),
    (ins I64ArrayAttrKernel:$kernel_shape, OptI64s:$pads, OptI64s:$strides)>;
def SD_Col2ImOp : SD_Nary<"col2im", "Col2Im", (ins AnyTensor:$input, AnyTensor:$image_shape, AnyTensor:$block_shape),
    (ins OptI64s:$dilations, OptI64s:$pads, OptI64s:$strides)>;
def SD_DeformConvOp : SD_Nary<"deform_conv", "DeformConv",
    (ins AnyTensor:$x, AnyTensor:$w, AnyTensor:$offset, SD_OptTensor:$b, SD_OptTensor:$mask),
    (ins OptI64s:$dilations, OptI64:$group, OptI64s:$kernel_shape, OptI64:$offset_group, OptI64s:$pads,
         OptI64s:$strides)>;
def SD_RoiAlignOp : SD_Nary<"roi_align", "RoiAlign", (ins AnyTensor:$x, AnyTensor:$rois, AnyTensor:$batch_indices),
    (ins OptStr:$coordinate_transformation_mode, OptStr:$mode, OptI64:$output_height, OptI64:$output_width,
         OptI64:$sampling_ratio, OptF32:$spatial_scale)>;
def SD_ReverseSequenceOp : SD_Binary<"reverse_sequence", "ReverseSequence",
    (ins OptI64:$batch_axis, OptI64:$time_axis)>;
def SD_CenterCropPadOp : SD_Binary<"center_crop_pad", "CenterCropPad", (ins OptI64s:$axes)>;
def SD_TfIdfVectorizerOp : SD_Unary<"tfidf_vectorizer", "TfIdfVectorizer",
    (ins I64Attr:$max_gram_length, OptI64:$max_skip_count, I64Attr:$min_gram_length, StrAttr:$mode,
         OptI64s:$ngram_counts, OptI64s:$ngram_indexes, OptI64s:$pool_int64s, OptionalAttr<DenseF32ArrayAttr>:$weights)>;
// Spectral ops (speech front ends): DFT (axis resolved by the importer), STFT,
// the window generators and the mel filter bank.
def SD_DFTOp : SD_Nary<"dft", "DFT", (ins AnyTensor:$input, SD_OptTensor:$dft_length, SD_OptTensor:$axis_value),
    (ins OptI64:$axis, OptI64:$inverse, OptI64:$onesided)>;
def SD_STFTOp : SD_Nary<"stft", "STFT",
    (ins AnyTensor:$signal, AnyTensor:$frame_step, SD_OptTensor:$window, SD_OptTensor:$frame_length),
    (ins OptI64:$onesided)>;
class SD_WindowOp<string mnemonic, string contract>
    : SD_Nary<mnemonic, contract, (ins AnyTensor:$size), (ins OptI64:$periodic, OptI64:$output_datatype)>;
def SD_HannWindowOp : SD_WindowOp<"hann_window", "HannWindow">;
def SD_HammingWindowOp : SD_WindowOp<"hamming_window", "HammingWindow">;
def SD_BlackmanWindowOp : SD_WindowOp<"blackman_window", "BlackmanWindow">;
def SD_MelWeightMatrixOp : SD_Nary<"mel_weight_matrix", "MelWeightMatrix",
    (ins AnyTensor:$num_mel_bins, AnyTensor:$dft_length, AnyTensor:$sample_rate, AnyTensor:$lower_edge_hertz,
         AnyTensor:$upper_edge_hertz), (ins OptI64:$output_datatype)>;
// Selections whose result size depends on operand values (shapes/selection.h):
// exact where those values are known (constants, --bind), else sized for the
// most they can select; `count` says how many slices are real
// (CountedExtents.h, sd-bounded-extents).
def SD_NonZeroOp : SD_Nary<"non_zero", "NonZero", (ins AnyTensor:$input), (ins),
    (outs AnyTensor:$output, AnyTensor:$count)>;
def SD_CompressOp : SD_Nary<"compress", "Compress", (ins AnyTensor:$input, AnyTensor:$condition), (ins OptI64:$axis),
    (outs AnyTensor:$output, AnyTensor:$count)>;
def SD_UniqueOp : SD_Nary<"unique", "Unique", (ins AnyTensor:$input), (ins OptI64:$axis, OptI64:$sorted),
    (outs AnyTensor:$y, AnyTensor:$indices, AnyTensor:$inverse_indices, AnyTensor:$counts, AnyTensor:$count)>;
// A selection sized for the most it can keep, with a scalar count of the rows
// it filled (kernels/shapes/nms_shapes.cc); sd-bounded-extents follows the
// count to the entry's outputs.
def SD_NonMaxSuppressionOp : SD_Nary<"non_max_suppression", "NonMaxSuppression",
    (ins AnyTensor:$boxes, AnyTensor:$scores, SD_OptTensor:$max_output_boxes_per_class,
         SD_OptTensor:$iou_threshold, SD_OptTensor:$score_threshold),
    (ins OptI64:$center_point_box), (outs AnyTensor:$selected_indices, AnyTensor:$count)>;
// ONNX If whose condition is run-time data: both branches were computed, this
// picks one (folded away once the condition is a constant).
def SD_IfSelectOp : SD_Nary<"if_select", "IfSelect",
    (ins AnyTensor:$condition, AnyTensor:$then_value, AnyTensor:$else_value)>;
// An unrolled ONNX Loop bounded by --max-trip: passes `value` through, and
// fails the run when `overflow` is true (the loop wanted more iterations).
def SD_LoopGuardOp : SD_Nary<"loop_guard", "LoopGuard",
    (ins AnyTensor:$value, AnyTensor:$overflow), (ins StrAttr:$message)>;
// An ONNX Loop too long to unroll: the loop-body function `body` (its own
// plan entry) runs once per iteration, at most max_trips times, while the
// iteration number is below M and the condition holds. Operands: M, cond,
// the first `carried` loop-carried values, then the outer-scope values the
// body reads. Results: the final carried values, then the scan outputs
// (max_trips slices stacked). `message` is the error when the loop still
// wants to go on after max_trips iterations.
def SD_LoopOp : SD_Nary<"loop", "Loop", (ins Variadic<AnyTensor>:$loop_inputs),
    (ins StrAttr:$body, I64Attr:$max_trips, I64Attr:$carried, StrAttr:$message),
    (outs Variadic<AnyTensor>:$loop_results)>;
// An ONNX If on run-time data whose branches cost more than computing both
// is worth (sdc --max-select): only the taken branch's body function (each
// its own plan entry) runs. Operands: the condition, the `then_inputs`
// outer-scope values then_body reads, then those else_body reads.
def SD_IfOp : SD_Nary<"if", "If", (ins Variadic<AnyTensor>:$if_inputs),
    (ins StrAttr:$then_body, StrAttr:$else_body, I64Attr:$then_inputs),
    (outs Variadic<AnyTensor>:$if_results)>;
def SD_ClipOp : SD_Nary<"clip", "Clip",
    (ins AnyTensor:$input, SD_OptTensor:$min, SD_OptTensor:$max)>;
def SD_DropoutOp : SD_Nary<"dropout", "Dropout",
    (ins AnyTensor:$data, SD_OptTensor:$ratio, SD_OptTensor:$training_mode),
    (ins OptI64:$seed), (outs AnyTensor:$output, Optional<AnyTensor>:$mask)>;

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

def SD_MatMulOp : SD_Binary<"matmul", "MatMul">;
def SD_GemmOp : SD_Nary<"gemm", "Gemm", (ins AnyTensor:$a, AnyTensor:$b, SD_OptTensor:$c),
    (ins OptF32:$alpha, OptF32:$beta, OptI64:$transA, OptI64:$transB)>;

def SD_LinearOp : SD_Nary<"linear", "Linear",
    (ins AnyTensor:$input, AnyTensor:$weight, SD_OptTensor:$bias),
    (ins StrAttr:$layout, StrAttr:$module)> {
  let description = [{
    The canonical linear layer: `input[..., K] x weight + bias`. `layout` is
    "oi" when weight is [out, in] (PyTorch, Gemm transB) and "io" when it is
    [in, out] (MatMul). `module` names the layer as PEFT's target_modules do.
  }];
}

// sd-accumulate-into-gemm: a Linear whose product an Add sums with another
// value of its shape (LoRA's base + scale * up, a residual).
def SD_LinearAddOp : SD_Nary<"linear_add", "LinearAdd",
    (ins AnyTensor:$input, AnyTensor:$weight, SD_OptTensor:$bias, AnyTensor:$addend),
    (ins StrAttr:$layout, StrAttr:$module)> {
  let description = [{
    output = input x weight + bias + addend, as Linear; `addend` has the
    output's shape and type. The GEMM accumulates onto it (cuBLASLt's C)
    where Linear then Add would write the product and read it back.
  }];
}

// GEMM epilogues (sd-fuse-gemm-epilogues): a GELU after a Linear, and the
// GELU gradient (with its bias gradient) after the GEMM that produces the
// gradient it scales, computed as one step (cuBLASLt applies them while the
// product's tiles are in registers). Each may also accumulate onto a value
// of the product's shape (cuBLASLt's C, beta 1), as sd-accumulate-into-gemm
// makes LinearAdd and Gemm do.
def SD_LinearGeluOp : SD_Nary<"linear_gelu", "LinearGelu",
    (ins AnyTensor:$input, AnyTensor:$weight, SD_OptTensor:$bias, SD_OptTensor:$addend),
    (ins StrAttr:$layout, StrAttr:$module, OptStr:$approximate),
    (outs AnyTensor:$output, Optional<AnyTensor>:$pre)> {
  let description = [{
    output = gelu(input x weight + bias + addend) as Linear (LinearAdd with an
    addend) and Gelu compute them; `pre` (training: GeluGrad reads it) is the
    GELU's input. Both come from one f32 intermediate, rounded once to each
    result's type: in a half plan the GELU reads the unrounded product.
  }];
}
def SD_GemmDGeluOp : SD_Nary<"gemm_dgelu", "GemmDGelu",
    (ins AnyTensor:$a, AnyTensor:$b, AnyTensor:$pre, SD_OptTensor:$c),
    (ins OptI64:$transA, OptI64:$transB, OptStr:$approximate),
    (outs AnyTensor:$grad, Optional<AnyTensor>:$bias_grad)> {
  let description = [{
    grad = GeluGrad(op(a) x op(b) + c, pre) over 2-D operands (pre and c
    [m, n]), and bias_grad = grad summed over its rows (ReduceSum over axis
    0): the backward of Linear + GELU, fused into the GEMM of the next
    layer's input gradient. In a half plan the GELU's gradient reads the
    unrounded f32 product.
  }];
}

// sd-fuse-elementwise: a chain of exact f32 arithmetic in one pass, with
// the half Casts around it.
def SD_FusedElementwiseOp : SD_Nary<"fused_elementwise", "FusedElementwise",
    (ins Variadic<AnyTensor>:$inputs), (ins DenseI64ArrayAttr:$program, OptI64:$to)> {
  let description = [{
    `program` is (opcode, lhs, rhs) triples over the operands and the results
    before it (sd/ops/fused_elementwise.h: 0 Add, 1 Sub, 2 Mul, 3 Div, 4 Neg);
    the last result is the output. Every operand has the output's shape or
    one element; operands are f32, bf16 or f16 (widened exactly), the output
    f32 or the type `to` names (an ONNX type code: 16 bf16, 10 f16).
  }];
}

// Orthogonal subspace fine-tuning (sd-peft-osft): W = U_high diag(S_high) V_high
// + U_low diag(S_low) V_low, U [out, k], S [k], V [k, in]; the high part frozen.
def SD_OsftLinearOp : SD_Nary<"osft_linear", "OsftLinear",
    (ins AnyTensor:$input, AnyTensor:$u_high, AnyTensor:$s_high, AnyTensor:$v_high, AnyTensor:$u_low,
         AnyTensor:$s_low, AnyTensor:$v_low, SD_OptTensor:$bias),
    (ins StrAttr:$module)> {
  let description = [{
    y = ((x V_high^T) diag(S_high)) U_high^T + ((x V_low^T) diag(S_low)) U_low^T + bias
    over the flattened rows of x, the low path accumulated into the same
    output; W itself is never formed.
  }];
}
def SD_OsftLinearGradOp : SD_Nary<"osft_linear_grad", "OsftLinearGrad",
    (ins AnyTensor:$grad, AnyTensor:$input, AnyTensor:$u_high, AnyTensor:$s_high, AnyTensor:$v_high,
         AnyTensor:$u_low, AnyTensor:$s_low, AnyTensor:$v_low),
    (ins OptI64:$input_grad),
    (outs AnyTensor:$x_grad, AnyTensor:$u_low_grad, AnyTensor:$s_low_grad, AnyTensor:$v_low_grad)> {
  let description = "OsftLinear's gradients in factored form; x_grad is left unwritten when input_grad is 0.";
}
def SD_OsftComposeOp : SD_Nary<"osft_compose", "OsftCompose",
    (ins AnyTensor:$u_high, AnyTensor:$s_high, AnyTensor:$v_high, AnyTensor:$u_low, AnyTensor:$s_low,
         AnyTensor:$v_low), (ins)> {
  let description = "W [out, in] rebuilt from its factors (the dense strategy: one GEMM per step on W).";
}
def SD_OsftComposeGradOp : SD_Nary<"osft_compose_grad", "OsftComposeGrad",
    (ins AnyTensor:$grad, AnyTensor:$u_low, AnyTensor:$s_low, AnyTensor:$v_low), (ins),
    (outs AnyTensor:$u_low_grad, AnyTensor:$s_low_grad, AnyTensor:$v_low_grad)>;
def SD_OsftCoefficientsOp : SD_Nary<"osft_coefficients", "OsftCoefficients",
    (ins Variadic<AnyTensor>:$operands), (ins DenseI64ArrayAttr:$sides)> {
  let description = [{
    The projection coefficients of every pair (x, high) in one flat buffer,
    pair i at the sum of the earlier pairs' sizes: side 0 (U) high^T x
    [k, r]; side 1 (V) x high^T [r, k]. One buffer, so that ranks holding
    shards complete them with one collective.
  }];
}
def SD_OsftDeflateOp : SD_Nary<"osft_deflate", "OsftDeflate",
    (ins Variadic<AnyTensor>:$operands), (ins DenseI64ArrayAttr:$sides), (outs Variadic<AnyTensor>:$deflated)> {
  let description = [{
    Operands: the coefficients of sd.osft_coefficients, then the same (x,
    high) pairs. Each x with its component in the high subspace removed:
    side 0: x - high C; side 1: x - C high. In place once bufferized.
  }];
}

//===----------------------------------------------------------------------===//
// Softmax, reductions, normalization
//===----------------------------------------------------------------------===//

foreach op = [["softmax", "Softmax"], ["log_softmax", "LogSoftmax"], ["hardmax", "Hardmax"]] in
  def SD_ # op[1] # Op : SD_Unary<op[0], op[1], (ins OptI64:$axis, OptI64:$coerce2d)>;

foreach op = [["reduce_sum", "ReduceSum"], ["reduce_mean", "ReduceMean"],
              ["reduce_max", "ReduceMax"], ["reduce_min", "ReduceMin"],
              ["reduce_prod", "ReduceProd"], ["reduce_l1", "ReduceL1"],
              ["reduce_l2", "ReduceL2"], ["reduce_log_sum", "ReduceLogSum"],
              ["reduce_log_sum_exp", "ReduceLogSumExp"],
              ["reduce_sum_square", "ReduceSumSquare"]] in
  def SD_ # op[1] # Op : SD_Nary<op[0], op[1], (ins AnyTensor:$data, SD_OptTensor:$axes),
                                 (ins OptI64:$keepdims, OptI64:$noop_with_empty_axes)>;

foreach op = [["arg_max", "ArgMax"], ["arg_min", "ArgMin"]] in
  def SD_ # op[1] # Op : SD_Unary<op[0], op[1], (ins OptI64:$axis, OptI64:$keepdims, OptI64:$select_last_index)>;

def SD_LayerNormalizationOp : SD_Nary<"layer_normalization", "LayerNormalization",
    (ins AnyTensor:$x, AnyTensor:$scale, SD_OptTensor:$bias),
    (ins OptI64:$axis, OptF32:$epsilon, OptI64:$stash_type, OptI64:$out_type),
    (outs AnyTensor:$y, Variadic<AnyTensor>:$stats)> {
  let description = [{
    `stats` holds the optional Mean and InvStdDev outputs (0, 1 or 2).
    `out_type` (16 bf16, 10 f16; sd-half-elementwise) rounds y of an f32 x to
    that half type, as a Cast after it would.
  }];
}
def SD_RMSNormalizationOp : SD_Nary<"rms_normalization", "RMSNormalization",
    (ins AnyTensor:$x, AnyTensor:$scale), (ins OptI64:$axis, OptF32:$epsilon, OptI64:$stash_type, OptI64:$out_type)> {
  let description = [{
    ONNX's RMSNormalization (opset 23): y = x / sqrt(mean(x^2 over axis..end) + epsilon) * scale,
    statistics in f32 or wider. Also what sd-fuse-rmsnorm makes of the decomposed forms exporters write.
    `out_type` as LayerNormalization's.
  }];
}
def SD_BatchNormalizationOp : SD_Nary<"batch_normalization", "BatchNormalization",
    (ins AnyTensor:$x, AnyTensor:$scale, AnyTensor:$bias, AnyTensor:$input_mean,
         AnyTensor:$input_var),
    (ins OptF32:$epsilon, OptF32:$momentum, OptI64:$training_mode)>;
def SD_InstanceNormalizationOp : SD_Nary<"instance_normalization", "InstanceNormalization",
    (ins AnyTensor:$input, AnyTensor:$scale, AnyTensor:$bias), (ins OptF32:$epsilon)>;
def SD_LpNormalizationOp : SD_Unary<"lp_normalization", "LpNormalization", (ins OptI64:$axis, OptI64:$p)>;
def SD_MeanVarianceNormalizationOp : SD_Unary<"mean_variance_normalization",
    "MeanVarianceNormalization", (ins OptI64s:$axes)>;

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

def SD_ConvOp : SD_Nary<"conv", "Conv", (ins AnyTensor:$x, AnyTensor:$w, SD_OptTensor:$b),
    (ins OptStr:$auto_pad, OptI64s:$dilations, OptI64:$group, OptI64s:$kernel_shape, OptI64s:$pads,
         OptI64s:$strides)>;
def SD_FusedConvOp : SD_Nary<"fused_conv", "FusedConv",
    (ins AnyTensor:$x, AnyTensor:$w, SD_OptTensor:$b, SD_OptTensor:$residual),
    (ins OptStr:$auto_pad, OptI64s:$dilations, OptI64:$group, OptI64s:$kernel_shape, OptI64s:$pads,
         OptI64s:$strides, StrAttr:$activation, OptF32:$activation_alpha, OptF32:$activation_beta)> {
  let description = [{
    `activation(conv(x, w) + b + residual)`, formed by sd-fuse-conv-epilogue
    in inference entries so the sum and the activation happen while the
    convolution's output is still in cache. `activation` is "" (none),
    "Relu", "Clip" (alpha = min, beta = max), "HardSwish", "HardSigmoid"
    (alpha, beta) or "LeakyRelu" (alpha). No gradient: training entries keep
    the separate ops.
  }];
}
def SD_ConvTransposeOp : SD_Nary<"conv_transpose", "ConvTranspose", (ins AnyTensor:$x, AnyTensor:$w, SD_OptTensor:$b),
    (ins OptStr:$auto_pad, OptI64s:$dilations, OptI64:$group, OptI64s:$kernel_shape, OptI64s:$output_padding,
         OptI64s:$output_shape, OptI64s:$pads, OptI64s:$strides)>;
def SD_MaxPoolOp : SD_Nary<"max_pool", "MaxPool", (ins AnyTensor:$x),
    (ins OptStr:$auto_pad, OptI64:$ceil_mode, OptI64s:$dilations, I64ArrayAttrKernel:$kernel_shape, OptI64s:$pads,
         OptI64:$storage_order, OptI64s:$strides), (outs AnyTensor:$y, Optional<AnyTensor>:$indices)>;
def SD_AveragePoolOp : SD_Nary<"average_pool", "AveragePool", (ins AnyTensor:$x),
    (ins OptStr:$auto_pad, OptI64:$ceil_mode, OptI64:$count_include_pad, OptI64s:$dilations,
         I64ArrayAttrKernel:$kernel_shape, OptI64s:$pads, OptI64s:$strides)>;
def SD_LpPoolOp : SD_Nary<"lp_pool", "LpPool", (ins AnyTensor:$x),
    (ins OptStr:$auto_pad, OptI64:$ceil_mode, OptI64s:$dilations, I64ArrayAttrKernel:$kernel_shape, OptI64:$p,
         OptI64s:$pads, OptI64s:$strides)>;
def SD_GlobalAveragePoolOp : SD_Unary<"global_average_pool", "GlobalAveragePool">;
def SD_GlobalMaxPoolOp : SD_Unary<"global_max_pool", "GlobalMaxPool">;
def SD_GlobalLpPoolOp : SD_Unary<"global_lp_pool", "GlobalLpPool", (ins OptI64:$p)>;

def SD_AttentionOp : SD_Nary<"attention", "Attention",
    (ins AnyTensor:$q, AnyTensor:$kt, AnyTensor:$v, SD_OptTensor:$mask, SD_OptTensor:$positions),
    (ins OptF32:$scale, OptF32:$mask_value, OptI64:$zero_masked_rows, OptStr:$layout),
    (outs AnyTensor:$y, Variadic<AnyTensor>:$lse)> {
  let description = [{
    Fused scaled-dot-product attention, recognized by sd-fuse-attention:
    y = softmax(where(mask, mask_value, q @ kt * scale)) @ v with q [..., T, d],
    kt (keys already transposed) [..., d, S], v [..., S, dv], mask bool.
    `positions` (i64 [B, T], from sd-pack-sequences; q is [B, ..., T, d]) is
    each query's position in its packed sequence: query t sees only keys
    s >= t - positions[b, t], so sequences packed into one row never attend
    to each other (a block-diagonal mask that is never materialized).
    `zero_masked_rows` = 1: a query whose keys are all masked (at -inf) gets
    zero probabilities, and so a zero output and zero gradients, where the
    softmax alone would give NaN (the Where(IsNaN(p), 0, p) guard SDPA exports
    put after it, fused).
    `layout` = "bshd" (set by sd-attention-layout): the operands as the
    projections store them, token-major, rank 4: q [B, T, H, d], keys as rows
    (not transposed) [B, S, Hkv, d], v [B, S, Hkv, dv], y [B, T, H, dv]; H a
    multiple of Hkv, query head h reading key/value head h / (H / Hkv)
    (grouped-query attention without repeated keys). The mask broadcasts to
    the scores [B, H, T, S] as in the default layout.
    `lse` (optional, set by sd-attention-stats in training entries): f32, one
    per query row ([..., T], or [B, H, T] in layout bshd), the natural-log
    log-sum-exp of that row's scaled, masked scores (-inf for a row that sees
    no key), which AttentionGrad takes so a fused backward need not run the
    forward again.
  }];
}
def SD_QkvAttentionOp : SD_Nary<"qkv_attention", "QkvAttention",
    (ins AnyTensor:$qkv, SD_OptTensor:$mask, SD_OptTensor:$positions),
    (ins OptF32:$scale, OptF32:$mask_value, OptI64:$zero_masked_rows, OptI64:$kv_heads),
    (outs AnyTensor:$y, Variadic<AnyTensor>:$lse)> {
  let description = [{
    Self-attention in layout "bshd" on one fused projection's output as it is
    (sd-qkv-attention): qkv [B, T, H + 2 Hkv, d] holds each token's H query
    heads, then its Hkv key heads, then its Hkv value heads (`kv_heads` =
    Hkv), so no Split copies them apart. Otherwise Attention's semantics:
    y [B, T, H, d], the mask broadcast to [B, H, T, T], `positions`, `lse`
    [B, H, T] and `zero_masked_rows` as there.
  }];
}
def SD_CachedAttentionOp : SD_Nary<"cached_attention", "CachedAttention",
    (ins AnyTensor:$q, AnyTensor:$k, AnyTensor:$v, AnyTensor:$k_cache, AnyTensor:$v_cache, AnyTensor:$positions),
    (ins OptF32:$scale), (outs AnyTensor:$output, AnyTensor:$k_cache_out, AnyTensor:$v_cache_out)> {
  let description = [{
    Causal self-attention through a key/value cache, made by sd-kv-cache for
    the prefill and decode entries: q [B, H, T, d], this step's keys k and
    values v [B, Hkv, T, d|dv] (H a multiple of Hkv: grouped-query heads share
    a cache head), caches [B, Hkv, L, d|dv] (L the plan's maximum length) and
    positions i64 [B, T] in [0, L). Token t of row b is first written to cache
    slot positions[b, t]; then its query attends to slots 0..positions[b, t]
    of its row. The cache outputs are the updated caches (stored in place into
    the plan's kv_cache globals, so a decode step keeps stable addresses).
  }];
}
def SD_RotaryOp : SD_Nary<"rotary", "Rotary",
    (ins AnyTensor:$x, AnyTensor:$cos, AnyTensor:$sin, SD_OptTensor:$positions),
    (ins OptI64:$interleaved, OptI64:$transposed, OptI64:$seq_axis, OptI64:$out_type, OptI64:$rotated_heads)> {
  let description = [{
    Rotary position embedding over the last axis of x [B, ..., S, D], as
    sd-fuse-rotary recognizes it: y = x * cos + rot(x) * sin, where rot(x) is
    [-x2, x1] on the halves (rotate-half) or (-x[2i+1], x[2i]) on pairs
    (interleaved = 1). cos and sin are [Bc, S, W] (Bc 1 or B) or, with
    positions (i64 [B, S]), tables [P, W] whose rows the positions pick. W is
    D (a value per feature) or D/2 (one per rotated pair). transposed = 1
    applies the transpose, y = x * cos + rot^T(x * sin): the gradient.
    seq_axis (default rank - 2) is the axis of x that indexes the positions:
    1 for token-major x [B, S, H, D] (sd-attention-layout). `out_type`
    (sd-half-elementwise) is y's type where it is not x's: 16 (bf16) or 10
    (f16) rounds the result of an f32 x, 1 (f32) keeps that of a half x.
    `rotated_heads` = R (token-major x [B, S, P, D], seq_axis 1; set by
    sd-qkv-attention on a fused q|k|v projection's heads): heads 0..R-1 are
    rotated, the others (the values) pass through as they are.
  }];
}
def SD_ResizeOp : SD_Nary<"resize", "Resize",
    (ins AnyTensor:$x, SD_OptTensor:$roi, SD_OptTensor:$scales, SD_OptTensor:$sizes),
    (ins OptI64:$antialias, OptI64s:$axes, OptStr:$coordinate_transformation_mode, OptF32:$cubic_coeff_a,
         OptI64:$exclude_outside, OptF32:$extrapolation_value, OptStr:$keep_aspect_ratio_policy, OptStr:$mode,
         OptStr:$nearest_mode)>;
// Resize's gradient: the adjoint of its interpolation, from dy (the resized
// shape) to `input_shape`, with Resize's attributes and roi/scales.
def SD_ResizeGradOp : SD_Nary<"resize_grad", "ResizeGrad",
    (ins AnyTensor:$grad, SD_OptTensor:$roi, SD_OptTensor:$scales),
    (ins DenseI64ArrayAttr:$input_shape, OptI64:$antialias, OptI64s:$axes, OptStr:$coordinate_transformation_mode,
         OptF32:$cubic_coeff_a, OptI64:$exclude_outside, OptStr:$keep_aspect_ratio_policy, OptStr:$mode,
         OptStr:$nearest_mode)>;
def SD_EinsumOp : SD_Nary<"einsum", "Einsum", (ins Variadic<AnyTensor>:$inputs), (ins StrAttr:$equation)>;

//===----------------------------------------------------------------------===//
// Backward contracts (emitted by sd-autodiff) and optimizer updates
//===----------------------------------------------------------------------===//

def SD_SoftmaxGradOp : SD_Nary<"softmax_grad", "SoftmaxGrad", (ins AnyTensor:$grad, AnyTensor:$forward_output),
    (ins OptI64:$axis)> {
  let description = "dx = y * (dy - sum(dy * y, axis)), from Softmax's output y.";
}
def SD_LogSoftmaxGradOp : SD_Nary<"log_softmax_grad", "LogSoftmaxGrad", (ins AnyTensor:$grad, AnyTensor:$forward_output),
    (ins OptI64:$axis)> {
  let description = "dx = dy - exp(y) * sum(dy, axis), from LogSoftmax's output y.";
}
def SD_GeluGradOp : SD_Nary<"gelu_grad", "GeluGrad", (ins AnyTensor:$grad, AnyTensor:$input),
    (ins OptStr:$approximate)>;
def SD_SwiGLUPackedGradOp : SD_Nary<"swiglu_packed_grad", "SwiGLUPackedGrad", (ins AnyTensor:$grad, AnyTensor:$x)> {
  let description = "SwiGLUPacked's gradient: dx = [d gate | d up], one tensor shaped like x.";
}
def SD_SwiGLUGradOp : SD_Nary<"swiglu_grad", "SwiGLUGrad", (ins AnyTensor:$grad, AnyTensor:$gate, AnyTensor:$up),
    (ins), (outs AnyTensor:$gate_grad, AnyTensor:$up_grad)> {
  let description = "SwiGLU's gradient: d up = dy * silu(gate), d gate = dy * up * silu'(gate).";
}
// One direction of an ONNX RNN/GRU/LSTM over the whole sequence, after the
// input projection (xw = X·Wᵀ + biases, a MatMul in the graph). `saved` keeps
// what the backward needs per step (gate inputs, previous states).
// activations: comma list, one per function of the cell, with one resolved
// alpha and beta each.
defvar SD_RecurrenceAttrs = (ins StrAttr:$cell, OptI64:$reverse, OptF32:$clip, OptI64:$input_forget,
    OptI64:$linear_before_reset, StrAttr:$activations, DenseF32ArrayAttr:$activation_alpha,
    DenseF32ArrayAttr:$activation_beta);
def SD_RecurrenceOp : SD_Nary<"recurrence", "Recurrence",
    (ins AnyTensor:$xw, AnyTensor:$r, SD_OptTensor:$initial_h, SD_OptTensor:$initial_c,
         SD_OptTensor:$peepholes, SD_OptTensor:$reset_bias, SD_OptTensor:$sequence_lens),
    SD_RecurrenceAttrs, (outs AnyTensor:$y, AnyTensor:$y_h, AnyTensor:$y_c, AnyTensor:$saved)>;
def SD_RecurrenceGradOp : SD_Nary<"recurrence_grad", "RecurrenceGrad",
    (ins AnyTensor:$grad, AnyTensor:$saved, AnyTensor:$r, SD_OptTensor:$grad_h, SD_OptTensor:$grad_c,
         SD_OptTensor:$peepholes, SD_OptTensor:$sequence_lens),
    SD_RecurrenceAttrs,
    (outs AnyTensor:$xw_grad, AnyTensor:$r_grad, AnyTensor:$initial_h_grad, AnyTensor:$initial_c_grad,
          AnyTensor:$peepholes_grad, AnyTensor:$reset_bias_grad)>;
// What a norm gradient computes besides dx, and how it reads dy.
def SD_NormGradSums {
  string description = [{
    `sums` (optional): first `accumulate` (f32 or f64 of x's type, x's shape,
    or none): x_grad is accumulate + the input gradient, that gradient
    rounded to x's type first; then up to three more summands of dy (grad's
    shape and type): dy = ((grad + sums[1]) + sums[2]) + sums[3], each
    addition one rounded f32 addition of the widened values (f64 for f64),
    as the Adds it replaces computed it.
    `narrow_type` (16 bf16, 10 f16; f32 x only): one more result, x_grad
    (after the accumulate) rounded to that type, as the Cast it replaces
    rounds it: the residual stream's gradient for the next products, which
    read it in half, while the next norm gradient reads it in f32.
    `param_grads` = 0 (sd-autodiff, where nothing needs them: the norm's
    parameters are frozen, as under LoRA): scale_grad and bias_grad are left
    unwritten, which spares the kernels a second pass over dy and x.
  }];
}
def SD_LayerNormalizationGradOp : SD_Nary<"layer_normalization_grad", "LayerNormalizationGrad",
    (ins AnyTensor:$grad, AnyTensor:$x, AnyTensor:$scale, Variadic<SD_OptTensor>:$sums),
    (ins OptI64:$axis, OptF32:$epsilon, OptI64:$narrow_type, OptI64:$param_grads),
    (outs AnyTensor:$x_grad, AnyTensor:$scale_grad, AnyTensor:$bias_grad, Variadic<AnyTensor>:$x_grad_narrow)> {
  let description = SD_NormGradSums.description;
}
def SD_RMSNormalizationGradOp : SD_Nary<"rms_normalization_grad", "RMSNormalizationGrad",
    (ins AnyTensor:$grad, AnyTensor:$x, AnyTensor:$scale, Variadic<SD_OptTensor>:$sums),
    (ins OptI64:$axis, OptF32:$epsilon, OptI64:$narrow_type, OptI64:$param_grads),
    (outs AnyTensor:$x_grad, AnyTensor:$scale_grad, Variadic<AnyTensor>:$x_grad_narrow)> {
  let description = SD_NormGradSums.description;
}
def SD_GatherGradOp : SD_Nary<"gather_grad", "GatherGrad", (ins AnyTensor:$grad, AnyTensor:$indices),
    (ins OptI64:$axis, DenseI64ArrayAttr:$data_shape)> {
  let description = "Scatter-add of Gather's output gradient into zeros of `data_shape` (deterministic).";
}
def SD_ConvGradWeightOp : SD_Nary<"conv_grad_weight", "ConvGradWeight", (ins AnyTensor:$grad, AnyTensor:$x),
    (ins OptStr:$auto_pad, OptI64s:$dilations, OptI64:$group, I64ArrayAttrKernel:$kernel_shape, OptI64s:$pads,
         OptI64s:$strides)> {
  let description = "Conv's weight gradient, summed over the batch; Conv's input gradient is a ConvTranspose.";
}
def SD_MaxPoolGradOp : SD_Nary<"max_pool_grad", "MaxPoolGrad", (ins AnyTensor:$grad, AnyTensor:$x),
    (ins OptStr:$auto_pad, OptI64:$ceil_mode, OptI64s:$dilations, OptI64s:$kernel_shape, OptI64s:$pads,
         OptI64s:$strides)> {
  let description = "Routes each output's gradient to the first maximum of its window; no kernel_shape = global.";
}
def SD_AveragePoolGradOp : SD_Nary<"average_pool_grad", "AveragePoolGrad", (ins AnyTensor:$grad, AnyTensor:$x),
    (ins OptStr:$auto_pad, OptI64:$ceil_mode, OptI64:$count_include_pad, OptI64s:$dilations, OptI64s:$kernel_shape,
         OptI64s:$pads, OptI64s:$strides)>;
def SD_SoftmaxCrossEntropyLossGradOp : SD_Nary<"softmax_cross_entropy_loss_grad", "SoftmaxCrossEntropyLossGrad",
    (ins AnyTensor:$grad, AnyTensor:$scores, AnyTensor:$labels), (ins OptI64:$ignore_index, OptStr:$reduction)>;

def SD_AttentionGradOp : SD_Nary<"attention_grad", "AttentionGrad",
    (ins AnyTensor:$grad, AnyTensor:$q, AnyTensor:$kt, AnyTensor:$v, SD_OptTensor:$mask,
         SD_OptTensor:$positions, SD_OptTensor:$y, SD_OptTensor:$lse),
    (ins OptF32:$scale, OptF32:$mask_value, OptI64:$zero_masked_rows, OptStr:$layout),
    (outs AnyTensor:$q_grad, AnyTensor:$kt_grad, AnyTensor:$v_grad)> {
  let description = [{
    Attention's gradient; recomputes the probabilities from q and kt. Under
    layout "bshd" the gradients have their operands' layout, and a key/value
    head's gradients sum over the query heads that share it. `y` and `lse`
    (or none) are the forward's output and row statistics (sd-attention-stats).
  }];
}
def SD_QkvAttentionGradOp : SD_Nary<"qkv_attention_grad", "QkvAttentionGrad",
    (ins AnyTensor:$grad, AnyTensor:$qkv, SD_OptTensor:$mask, SD_OptTensor:$positions, SD_OptTensor:$y,
         SD_OptTensor:$lse),
    (ins OptF32:$scale, OptF32:$mask_value, OptI64:$zero_masked_rows, OptI64:$kv_heads),
    (outs AnyTensor:$qkv_grad)> {
  let description = [{
    QkvAttention's gradient: [dq | dk | dv] per token, one tensor shaped
    like qkv, as the fused projection's backward reads it (no Concat).
  }];
}
def SD_SeededRandomOp : SD_Nary<"seeded_random", "SeededRandom", (ins AnyTensor:$like, AnyTensor:$rng),
    (ins OptI64:$normal, OptF32:$a, OptF32:$b, OptI64:$stream)> {
  let description = [{
    Training-time random numbers shaped like `like` (its values unread):
    uniform in [a, b), or with `normal` = 1 normal of mean a and scale b,
    element i a pure function of rng = [seed, counter, ...], `stream` and i,
    as SeededDropout's mask (sd/ops/counter_rng.h). A train-mode export's
    RandomUniformLike and RandomNormalLike (Dropout2d's and drop path's
    Bernoulli masks, a VAE's noise). Nothing flows back through it.
  }];
}
def SD_SeededDropoutOp : SD_Nary<"seeded_dropout", "SeededDropout", (ins AnyTensor:$x, AnyTensor:$rng),
    (ins OptF32:$ratio, OptI64:$stream)> {
  let description = [{
    Training-time dropout: y = x * mask / (1 - ratio), the mask a pure function
    of rng = [seed, counter], `stream` (the op site) and the element index
    (sd/ops/counter_rng.h). Linear in x: its gradient is the same op on dy.
  }];
}
def SD_AdamWOp : SD_Nary<"adamw", "AdamW",
    (ins AnyTensor:$param, AnyTensor:$grad, AnyTensor:$exp_avg, AnyTensor:$exp_avg_sq, AnyTensor:$step,
         AnyTensor:$lr, AnyTensor:$weight_decay, AnyTensor:$grad_scale, SD_OptTensor:$skip),
    (ins OptF64:$beta1, OptF64:$beta2, OptF64:$epsilon, OptI64:$decay),
    (outs AnyTensor:$new_param, AnyTensor:$new_exp_avg, AnyTensor:$new_exp_avg_sq, AnyTensor:$zeroed_grad)> {
  let description = [{
    torch.optim.AdamW on grad * grad_scale: decoupled weight decay (when
    `decay` is 1), bias correction from `step` (the optimizer step, from 1).
    Returns the updated parameter and moments and a zeroed gradient, all
    written in place once bufferized. When `skip` (fp16's found-Inf flag, a
    scalar) is nonzero, parameter and moments are returned unchanged, bit for
    bit, and only the gradient is zeroed: no whole-tensor select, and a
    row-sharded parameter (--shard params) skips on its own rows.
  }];
}
// sd-group-updates: the AdamW updates of one optimizer step that share
// their scalars, as one step (one launch on a GPU instead of one per tensor).
def SD_GroupedAdamWOp : SD_Nary<"grouped_adamw", "GroupedAdamW",
    (ins AnyTensor:$step, AnyTensor:$lr, AnyTensor:$weight_decay, AnyTensor:$grad_scale, SD_OptTensor:$skip,
         Variadic<AnyTensor>:$tensors),
    (ins OptF64:$beta1, OptF64:$beta2, OptF64:$epsilon, DenseI64ArrayAttr:$decay),
    (outs Variadic<AnyTensor>:$updated)> {
  let description = [{
    AdamW on N tensors at once: `tensors` is params, grads, exp_avgs and
    exp_avg_sqs (N each, in that order; tensor i's four have one shape), and
    `decay` holds N flags (AdamW's `decay` per tensor). Results: the updated
    params, exp_avgs and exp_avg_sqs and the zeroed grads (N each), element
    for element what N AdamW steps give, `skip` included.
  }];
}
// sd-group-weight-casts: the half copies of an entry's small trainable
// weights, made at its start in one step (one launch, not one per weight).
def SD_GroupedCastOp : SD_Nary<"grouped_cast", "GroupedCast", (ins Variadic<AnyTensor>:$inputs), (ins I64Attr:$to),
    (outs Variadic<AnyTensor>:$outputs)> {
  let description = [{
    Each f32 input rounded to `to` (an ONNX type code: 16 bf16, 10 f16), one
    result each, as Cast rounds it.
  }];
}
def SD_SGDOp : SD_Nary<"sgd", "SGD",
    (ins AnyTensor:$param, AnyTensor:$grad, AnyTensor:$momentum_buffer, AnyTensor:$step, AnyTensor:$lr,
         AnyTensor:$weight_decay, AnyTensor:$grad_scale, SD_OptTensor:$skip),
    (ins OptF64:$momentum, OptF64:$dampening, OptI64:$nesterov, OptI64:$decay),
    (outs AnyTensor:$new_param, AnyTensor:$new_momentum_buffer, AnyTensor:$zeroed_grad)> {
  let description = "torch.optim.SGD on grad * grad_scale; `skip` as AdamW's.";
}
def SD_GradScaleOp : SD_Nary<"grad_scale", "GradScale",
    (ins AnyTensor:$tokens, AnyTensor:$max_norm, Variadic<AnyTensor>:$grads), (ins),
    (outs AnyTensor:$scale, AnyTensor:$norm)> {
  let description = [{
    scale = 1/tokens * min(1, max_norm / (norm + 1e-6)) with norm the global
    L2 norm of grads/tokens (no clipping when max_norm <= 0).
  }];
}

def SD_AllReduceOp : SD_Nary<"all_reduce", "AllReduce", (ins Variadic<AnyTensor>:$tensors), (ins),
    (outs Variadic<AnyTensor>:$reduced)> {
  let description = [{
    Each tensor summed over every rank of a data-parallel run (sd-data-parallel
    inserts one per gradient bucket); the identity when the plan runs alone.
    Once bufferized the results are the operands' memory, reduced in place.
    With `async` = 1 the step only starts the reduction; a later
    WaitCollectives step completes it.
  }];
}

def SD_WaitCollectivesOp : SD_Nary<"wait_collectives", "WaitCollectives", (ins Variadic<AnyTensor>:$tensors), (ins),
    (outs Variadic<AnyTensor>:$done)> {
  let description = [{
    Completes every collective an earlier step started and left running (an
    AllReduce marked `async`: sd-data-parallel's overlap of a bucket's
    reduction with the rest of the backward). The operands are the tensors
    those reductions write, returned as they are once complete, in place once
    bufferized: everything that reads them comes after this step.
  }];
}

def SD_BroadcastOp : SD_Nary<"broadcast", "Broadcast", (ins Variadic<AnyTensor>:$tensors), (ins OptI64:$root),
    (outs Variadic<AnyTensor>:$received)> {
  let description = [{
    Each tensor as the root rank holds it, on every rank: after a sharded
    optimizer step (sdc compile --shard optimizer) the rank that updated a
    parameter sends it to the others. The root is the step's shard owner
    (the session decides it from the plan's parameters and the world size),
    else `root`. The identity when the plan runs alone; in place once bufferized.
  }];
}

def SD_ReduceToOwnerOp : SD_Nary<"reduce_to_owner", "ReduceToOwner", (ins Variadic<AnyTensor>:$tensors), (ins),
    (outs Variadic<AnyTensor>:$reduced)> {
  let description = [{
    Each tensor summed over the ranks into the step's shard owner (sdc compile
    --shard grads: a micro-batch's gradient goes to the rank that accumulates
    and updates that parameter); on other ranks the result is unspecified.
    The identity when the plan runs alone; in place once bufferized.
  }];
}

def SD_AllGatherRowsOp : SD_Nary<"all_gather_rows", "AllGatherRows", (ins AnyTensor:$shard), (ins),
    (outs AnyTensor:$full)> {
  let description = [{
    The whole of a row-sharded global (sdc compile --shard params): each rank
    holds the rows sd::rowBlock gives it, and every rank gets all of them,
    just before a step reads the tensor (the arena frees it after). The
    operand's type is the whole tensor's; at run time it holds this rank's
    rows only. A copy when the plan runs alone.
  }];
}

def SD_ReduceScatterRowsOp : SD_Nary<"reduce_scatter_rows", "ReduceScatterRows",
    (ins AnyTensor:$acc, AnyTensor:$delta), (ins), (outs AnyTensor:$sum)> {
  let description = [{
    acc + this rank's rows of delta summed over the ranks (sdc compile
    --shard params: a micro-batch's gradient accumulated into the rows of
    grad/<p> this rank keeps). acc and the result hold this rank's rows, delta
    the whole tensor; in place once bufferized. acc + delta when alone.
  }];
}

//===----------------------------------------------------------------------===//
// Quantization
//===----------------------------------------------------------------------===//

def SD_QuantizeLinearOp : SD_Nary<"quantize_linear", "QuantizeLinear",
    (ins AnyTensor:$x, AnyTensor:$y_scale, SD_OptTensor:$y_zero_point),
    (ins OptI64:$axis, OptI64:$block_size, OptI64:$output_dtype, OptI64:$saturate)>;
def SD_DequantizeLinearOp : SD_Nary<"dequantize_linear", "DequantizeLinear",
    (ins AnyTensor:$x, AnyTensor:$x_scale, SD_OptTensor:$x_zero_point),
    (ins OptI64:$axis, OptI64:$block_size, OptI64:$output_dtype)>;
def SD_DynamicQuantizeLinearOp : SD_Nary<"dynamic_quantize_linear", "DynamicQuantizeLinear", (ins AnyTensor:$x),
    (ins), (outs AnyTensor:$y, AnyTensor:$y_scale, AnyTensor:$y_zero_point)>;
def SD_MatMulIntegerOp : SD_Nary<"matmul_integer", "MatMulInteger",
    (ins AnyTensor:$a, AnyTensor:$b, SD_OptTensor:$a_zero_point, SD_OptTensor:$b_zero_point)>;
def SD_QLinearMatMulOp : SD_Nary<"qlinear_matmul", "QLinearMatMul",
    (ins AnyTensor:$a, AnyTensor:$a_scale, AnyTensor:$a_zero_point, AnyTensor:$b, AnyTensor:$b_scale,
         AnyTensor:$b_zero_point, AnyTensor:$y_scale, AnyTensor:$y_zero_point)>;
def SD_MatMulNBitsOp : SD_Nary<"matmul_nbits", "MatMulNBits",
    (ins AnyTensor:$a, AnyTensor:$b, AnyTensor:$scales, SD_OptTensor:$zero_points, SD_OptTensor:$bias),
    (ins I64Attr:$K, I64Attr:$N, I64Attr:$bits, I64Attr:$block_size, OptI64:$accuracy_level)> {
  let description = [{
    onnxruntime's MatMulNBits (com.microsoft; the int4 models of
    onnxruntime-genai's model builder): y [..., N] = a [..., K] W^T + bias,
    where W [N, K] is stored block-wise along K in `bits` (2, 4 or 8) bits:
    b u8 [N, ceil(K / block_size), block_size * bits / 8], element k of a
    block at bit (k * bits) of its blob, low bits first; scales [N, blocks]
    (a's type); zero_points either packed u8 [N, ceil(blocks * bits / 8)] in
    the same bit order or a's type [N, blocks], 2^(bits-1) when absent.
    W[n, k] = (q[n, k] - zero_point[n, k / block_size]) * scale[n, k / block_size].
    `accuracy_level` 4 lets a be quantized to int8 per block (onnxruntime's
    meaning); the others compute in f32.
  }];
}
def SD_ConvIntegerOp : SD_Nary<"conv_integer", "ConvInteger",
    (ins AnyTensor:$x, AnyTensor:$w, SD_OptTensor:$x_zero_point, SD_OptTensor:$w_zero_point),
    (ins OptStr:$auto_pad, OptI64s:$dilations, OptI64:$group, OptI64s:$kernel_shape, OptI64s:$pads,
         OptI64s:$strides)>;
def SD_QLinearConvOp : SD_Nary<"qlinear_conv", "QLinearConv",
    (ins AnyTensor:$x, AnyTensor:$x_scale, AnyTensor:$x_zero_point, AnyTensor:$w, AnyTensor:$w_scale,
         AnyTensor:$w_zero_point, AnyTensor:$y_scale, AnyTensor:$y_zero_point, SD_OptTensor:$b),
    (ins OptStr:$auto_pad, OptI64s:$dilations, OptI64:$group, OptI64s:$kernel_shape, OptI64s:$pads,
         OptI64s:$strides)>;

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

def SD_SoftmaxCrossEntropyLossOp : SD_Nary<"softmax_cross_entropy_loss", "SoftmaxCrossEntropyLoss",
    (ins AnyTensor:$scores, AnyTensor:$labels, SD_OptTensor:$weights),
    (ins OptI64:$ignore_index, OptStr:$reduction, OptI64:$f32_loss),
    (outs AnyTensor:$output, Optional<AnyTensor>:$log_prob)> {
  let description = [{
    ONNX SoftmaxCrossEntropyLoss. `f32_loss` = 1 (set by sd-half-elementwise
    on bf16/f16 scores that autocast only widened for it): the loss and
    log_prob are f32, computed on the exactly widened scores as for f32
    scores, so the [N, C] scores never exist in f32.
  }];
}
def SD_NegativeLogLikelihoodLossOp : SD_Nary<"negative_log_likelihood_loss", "NegativeLogLikelihoodLoss",
    (ins AnyTensor:$input, AnyTensor:$target, SD_OptTensor:$weight),
    (ins OptI64:$ignore_index, OptStr:$reduction)>;

//===----------------------------------------------------------------------===//
// Shape and data movement
//===----------------------------------------------------------------------===//

def SD_ReshapeOp : SD_Binary<"reshape", "Reshape", (ins OptI64:$allowzero)>;
def SD_TransposeOp : SD_Unary<"transpose", "Transpose", (ins OptI64s:$perm)>;
def SD_ConcatOp : SD_Nary<"concat", "Concat", (ins Variadic<AnyTensor>:$inputs), (ins I64Attr:$axis)>;
def SD_SplitOp : SD_Nary<"split", "Split", (ins AnyTensor:$input, SD_OptTensor:$split),
    (ins OptI64:$axis, OptI64:$num_outputs), (outs Variadic<AnyTensor>:$outputs)>;
def SD_SliceOp : SD_Nary<"slice", "Slice",
    (ins AnyTensor:$data, AnyTensor:$starts, AnyTensor:$ends, SD_OptTensor:$axes,
         SD_OptTensor:$steps)>;
def SD_GatherOp : SD_Binary<"gather", "Gather", (ins OptI64:$axis)>;
def SD_GatherElementsOp : SD_Binary<"gather_elements", "GatherElements", (ins OptI64:$axis)>;
def SD_GatherNDOp : SD_Binary<"gather_nd", "GatherND", (ins OptI64:$batch_dims)>;
def SD_ScatterElementsOp : SD_Nary<"scatter_elements", "ScatterElements",
    (ins AnyTensor:$data, AnyTensor:$indices, AnyTensor:$updates), (ins OptI64:$axis, OptStr:$reduction)>;
def SD_ScatterNDOp : SD_Nary<"scatter_nd", "ScatterND",
    (ins AnyTensor:$data, AnyTensor:$indices, AnyTensor:$updates), (ins OptStr:$reduction)>;
def SD_ExpandOp : SD_Binary<"expand", "Expand">;
def SD_SqueezeOp : SD_Nary<"squeeze", "Squeeze", (ins AnyTensor:$data, SD_OptTensor:$axes)>;
def SD_UnsqueezeOp : SD_Binary<"unsqueeze", "Unsqueeze">;
def SD_FlattenOp : SD_Unary<"flatten", "Flatten", (ins OptI64:$axis)>;
def SD_ShapeOp : SD_Unary<"shape", "Shape", (ins OptI64:$start, OptI64:$end)>;
def SD_SizeOp : SD_Unary<"size", "Size">;
def SD_ConstantOfShapeOp : SD_Unary<"constant_of_shape", "ConstantOfShape",
    (ins OptF64:$value, OptI64:$dtype)>;
def SD_EyeLikeOp : SD_Unary<"eye_like", "EyeLike", (ins OptI64:$dtype, OptI64:$k)>;
def SD_OneHotOp : SD_Nary<"one_hot", "OneHot",
    (ins AnyTensor:$indices, AnyTensor:$depth, AnyTensor:$values), (ins OptI64:$axis)>;
def SD_RangeOp : SD_Nary<"range", "Range",
    (ins AnyTensor:$start, AnyTensor:$limit, AnyTensor:$delta)>;
def SD_TileOp : SD_Binary<"tile", "Tile">;
def SD_PadOp : SD_Nary<"pad", "Pad",
    (ins AnyTensor:$data, AnyTensor:$pads, SD_OptTensor:$constant_value, SD_OptTensor:$axes),
    (ins OptStr:$mode)>;
def SD_DepthToSpaceOp : SD_Unary<"depth_to_space", "DepthToSpace", (ins I64Attr:$blocksize, OptStr:$mode)>;
def SD_SpaceToDepthOp : SD_Unary<"space_to_depth", "SpaceToDepth", (ins I64Attr:$blocksize, OptStr:$mode)>;
def SD_TopKOp : SD_Nary<"top_k", "TopK", (ins AnyTensor:$x, AnyTensor:$k),
    (ins OptI64:$axis, OptI64:$largest, OptI64:$sorted), (outs AnyTensor:$values, Optional<AnyTensor>:$indices)>;
// TopK whose k is only known at run time: values and indices sized for the
// whole axis, filled up to k (zeros after), and k itself as the count
// (CountedExtents.h). sd-propagate-shapes makes it a TopK once k is known.
def SD_TopKBoundedOp : SD_Nary<"top_k_bounded", "TopKBounded", (ins AnyTensor:$x, AnyTensor:$k),
    (ins OptI64:$axis, OptI64:$largest, OptI64:$sorted),
    (outs AnyTensor:$values, AnyTensor:$indices, AnyTensor:$count)>;
def SD_TriluOp : SD_Nary<"trilu", "Trilu", (ins AnyTensor:$input, SD_OptTensor:$k), (ins OptI64:$upper)>;
def SD_CumSumOp : SD_Binary<"cum_sum", "CumSum", (ins OptI64:$exclusive, OptI64:$reverse)>;
def SD_CumProdOp : SD_Binary<"cum_prod", "CumProd", (ins OptI64:$exclusive, OptI64:$reverse)>;

//===----------------------------------------------------------------------===//
// Step IR: buffers and kernel invocations after bufferization
//===----------------------------------------------------------------------===//

def SD_BufferOp : SD_Op<"buffer"> {
  let summary = "an arena buffer (offset assigned by sd-pack-arena)";
  let arguments = (ins OptStr:$input, OptI64:$offset, OptionalAttr<DenseI64ArrayAttr>:$live);
  let results = (outs AnyStaticShapeMemRef:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
}

def SD_GlobalBufferOp : SD_Op<"global_buffer", [Pure]> {
  let summary = "the storage of a global";
  let arguments = (ins FlatSymbolRefAttr:$global);
  let results = (outs AnyStaticShapeMemRef:$result);
  let assemblyFormat = "$global attr-dict `:` type($result)";
}

def SD_ViewOp : SD_Op<"view", [Pure]> {
  let summary = "reinterprets a buffer with another shape (reshape, squeeze, flatten)";
  let arguments = (ins AnyStaticShapeMemRef:$source);
  let results = (outs AnyStaticShapeMemRef:$result);
  let assemblyFormat = "$source attr-dict `:` type($source) `to` type($result)";
  let hasVerifier = 1;
}

def SD_StepOp : SD_Op<"step", [AttrSizedOperandSegments]> {
  let summary = "one kernel invocation: a backend-neutral contract with buffer operands";
  let arguments = (ins StrAttr:$contract, DictionaryAttr:$params,
                       Variadic<AnyTypeOf<[AnyStaticShapeMemRef, NoneType]>>:$inputs,
                       Variadic<AnyStaticShapeMemRef>:$outputs);
  let assemblyFormat = [{
    $contract $params (`ins` `(` $inputs^ `:` type($inputs) `)`)?
    `outs` `(` $outputs `:` type($outputs) `)` attr-dict
  }];
}

def SD_OutputOp : SD_Op<"output"> {
  let summary = "binds an entry output name to a buffer";
  let description = [{
    With `extent`, the buffer is sized for the most its producer can select
    and the one-element int64 `extent` counts the real slices along
    `extent_axis` (sd-bounded-extents); the runtime returns only those.
  }];
  let arguments = (ins StrAttr:$name, AnyStaticShapeMemRef:$buffer, Optional<AnyStaticShapeMemRef>:$extent,
                       OptI64:$extent_axis);
  let assemblyFormat = "$name `,` $buffer (`counted` `by` $extent^ `:` type($extent))? attr-dict `:` type($buffer)";
}

#endif // SD_OPS_TD
