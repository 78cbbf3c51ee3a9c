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

def FoldConvAffine : Pass<"sd-fold-conv-affine", "mlir::ModuleOp"> {
  let summary = "In inference entries, fold a per-channel constant multiply and add after a Conv into its weights";
}

def FuseHardSwish : Pass<"sd-fuse-hardswish", "mlir::ModuleOp"> {
  let summary = "In inference entries, replace x * Clip(x + 3, 0, 6) / 6 with one HardSwish";
}

def FuseConvEpilogue : Pass<"sd-fuse-conv-epilogue", "mlir::ModuleOp"> {
  let summary = "In inference entries, fold a residual Add and an activation into the Conv before them";
}

def FuseGemmEpilogues : Pass<"sd-fuse-gemm-epilogues", "mlir::ModuleOp"> {
  let summary = "Fold a GELU into the Linear before it, and GeluGrad with its bias gradient into the Gemm before it";
  let options = [
    Option<"halfEpilogues", "half", "bool", "true",
           "also in half plans, where the GELU then reads the unrounded f32 product (other bits than the unfused plan)">,
  ];
}

def AccumulateIntoGemm : Pass<"sd-accumulate-into-gemm", "mlir::ModuleOp"> {
  let summary = "A sum of matrix products (LoRA's base and adapter, a residual) is accumulated by the GEMMs onto their C instead of written and added";
}

def FoldCastRoundTrips : Pass<"sd-fold-cast-round-trips", "mlir::ModuleOp"> {
  let summary = "A half value widened exactly and narrowed back is the half value itself; repeated casts of one value become one";
}

def FoldFrozenMasks : Pass<"sd-fold-frozen-masks", "mlir::ModuleOp"> {
  let summary = "A bool tensor computed only from constants and frozen weights (a causal mask registered as a buffer) becomes a constant";
}

def MoveCasts : Pass<"sd-move-casts", "mlir::ModuleOp"> {
  let summary = "Half casts moved across data-moving ops (Transpose, Reshape, Split, Concat, ...), so those move half elements";
}

def AttentionLayout : Pass<"sd-attention-layout", "mlir::ModuleOp"> {
  let summary = "Attention reads q, k, v token-major where the projections wrote them (layout bshd): no transposes or repeated key/value heads around it";
}

def ScaleIntoGemm : Pass<"sd-scale-into-gemm", "mlir::ModuleOp"> {
  let summary = "A matrix product takes a constant power-of-two scale of its operand (LoRA's backward) as its alpha instead of reading a scaled copy";
}

def NormGradSum : Pass<"sd-norm-grad-sum", "mlir::ModuleOp"> {
  let summary = "A LayerNorm/RMSNorm gradient added to the residual stream's gradient writes the sum itself (its accumulate operand): no Add step";
}

def GroupUpdates : Pass<"sd-group-updates", "mlir::ModuleOp"> {
  let summary = "The AdamW updates of an optimizer step that share their scalars become GroupedAdamW steps (one launch for many tensors, the same bits)";
}

def GroupWeightCasts : Pass<"sd-group-weight-casts", "mlir::ModuleOp"> {
  let summary = "The half casts an entry makes of its small weights become one GroupedCast at the entry's start (one launch, the same bits)";
}

def LoraSlots : Pass<"sd-lora-slots", "mlir::ModuleOp"> {
  let summary = "--max-loras: each LoRA factor a stack of adapter slots, and each entry's adapter products read each row's slot (a lora_ids input)";
  let options = [
    Option<"maxLoras", "max-loras", "int64_t", "0", "adapters served in one batch beside the plan's own (0: off)">,
  ];
}

def JoinLora : Pass<"sd-join-lora", "mlir::ModuleOp"> {
  let summary = "LoRA adapters on the parts of one fused projection become one adapter on the whole (the A's stacked, the B's block-diagonal), added before its Split";
}

def QkvAttention : Pass<"sd-qkv-attention", "mlir::ModuleOp"> {
  let summary = "A self-attention on the three parts of one fused q|k|v projection reads it as it is (QkvAttention): no Split forward, no Concat backward";
}

def PackSwiglu : Pass<"sd-pack-swiglu", "mlir::ModuleOp"> {
  let summary = "A SwiGLU on the two halves of one fused gate/up projection reads it as it is (SwiGLUPacked): no Split forward, no Concat backward";
}

def AttentionStats : Pass<"sd-attention-stats", "mlir::ModuleOp"> {
  let summary = "Each AttentionGrad takes its forward Attention's output and row log-sum-exp (a second result), so a fused backward need not recompute the forward";
}

def HalfElementwise : Pass<"sd-half-elementwise", "mlir::ModuleOp"> {
  let summary = "SwiGLU, rotary, cross-entropy, norms and their gradients between widening and narrowing half casts run on the half values (the same bits, no casts)";
}

def FuseElementwise : Pass<"sd-fuse-elementwise", "mlir::ModuleOp"> {
  let summary = "Fuse chains of f32 elementwise steps (arithmetic, activations, GeluGrad) and the half casts around them into one sd.fused_elementwise step";
}

def Autocast : Pass<"sd-autocast", "mlir::ModuleOp"> {
  let summary = "Mixed precision: matrix products and attention in bf16, everything else and all state in f32";
  let description = [{
    PyTorch's autocast as a rewrite, before autodiff: every f32 float operand
    of sd.linear, sd.matmul, sd.gemm and sd.attention is cast to bf16, the op
    computes in bf16 (with f32 accumulation in the kernels), and its results
    are cast back to f32 for the ops after it. Weights stay f32 globals (the
    master copies the optimizer updates); norms, softmax outside attention,
    losses and reductions stay f32. Autodiff then differentiates through the
    casts, so weight gradients are computed in bf16 and accumulated in f32,
    as under torch.autocast.
  }];
  let options = [
    Option<"precision", "precision", "std::string", "\"bf16\"", "the compute type of the cast ops: bf16 | fp16">,
    Option<"lossScaleInit", "loss-scale-init", "double", "65536.0",
           "fp16: the dynamic loss scale's first value (sd.loss_scale_init for sd-autodiff and sd-optimizer)">,
    Option<"lossScaleWindow", "loss-scale-window", "int64_t", "2000",
           "fp16: clean optimizer steps after which the loss scale doubles (sd.loss_scale_window)">,
  ];
}

def MarkTrainable : Pass<"sd-mark-trainable", "mlir::ModuleOp"> {
  let summary = "Full fine-tuning: make float weight globals trainable";
  let description = [{
    Every frozen floating-point global whose name fully matches `pattern`
    becomes trainable, unless its values only ever become bools (a causal
    mask registered as a buffer), so no gradient can reach it. Globals the
    loss does not depend on are made frozen again by sd-autodiff (an unused
    embedding, rotary tables). Globals whose full name matches `freeze` stay
    frozen (sdc --freeze: Marian's and Whisper's sinusoidal positions, which
    PyTorch keeps with requires_grad=False).
  }];
  let options = [
    Option<"pattern", "pattern", "std::string", "\".*\"", "regex a global's full name must match">,
    Option<"freeze", "freeze", "std::string", "\"\"",
           "regex of globals kept frozen (PyTorch's requires_grad=False, which exports do not record)">,
  ];
}

def PeftBitfit : Pass<"sd-peft-bitfit", "mlir::ModuleOp"> {
  let summary = "BitFit: only the model's bias terms train";
  let description = [{
    Marks trainable every stored 1-D float weight that an op reads as its
    bias: `sd.linear`'s bias, `sd.gemm`'s C, a convolution's B and the shift
    of LayerNorm, InstanceNorm and BatchNorm. Every other weight is frozen.
    Found by operand, not by name, so exporters that rename initializers
    change nothing.
  }];
}

def PeftBottleneck : Pass<"sd-peft-bottleneck", "mlir::ModuleOp"> {
  let summary = "bottleneck adapters (AdapterHub's seq_bn, double_seq_bn, par_bn) on a transformer's blocks";
  let description = [{
    Finds each sublayer's end: a `sd.linear` whose result (through reshapes)
    an `sd.add` sums with the residual stream r, z = h + r. The layer is an
    attention block's output projection when its input comes from an
    attention; a feed-forward block's otherwise. seq_bn (Pfeiffer) adapts the
    feed-forward ends, double_seq_bn (Houlsby) both kinds, par_bn (parallel)
    the feed-forward ends, each as AdapterHub's adapters library computes it:
    z' = z + s up(act(down(u))) with u = z, h or r. In a post-LN block (r a
    norm's output, z read by the block's LayerNorm alone, BERT) the
    LayerNorm reads z', and seq_bn's u is LayerNorm(z). down
    is [hidden / reduction_factor, hidden] and up [hidden, that], each with a
    bias, named as AdapterHub's parameters with the adapter name
    "bottleneck" (`model.layers.0.output_adapters.adapters.bottleneck.
    adapter_down.0.weight`; the layer is the module name up to its last
    number; in the BERT family the block's `...output` module). Layers in
    leave-out get none. With scaling-kind learned or channel the output's
    factor is a trained `.scaling` ([1] or [hidden], ones at first); with
    use-gating it is also multiplied by AdapterHub's gate, the mean over
    the sequence of sigmoid(u Wᵀ + b) (`.gate.weight` [1, hidden], `.bias`).
    Every other weight is frozen.
    Records the configuration in `sd.peft`.
  }];
  let options = [
    Option<"config", "config", "std::string", "\"seq_bn\"", "seq_bn | double_seq_bn | par_bn">,
    Option<"reductionFactor", "reduction-factor", "double", "-1.0",
           "hidden size / bottleneck size (negative: the config's, 16 or par_bn's 2)">,
    Option<"nonLinearity", "non-linearity", "std::string", "\"\"", "the bottleneck's activation (empty: the config's)">,
    Option<"scaling", "scaling", "double", "-1.0", "the adapter output's factor (negative: the config's)">,
    Option<"scalingKind", "scaling-kind", "std::string", "\"\"",
           "learned (a trained factor) or channel (one per output), AdapterHub's; empty: the fixed factor">,
    Option<"useGating", "use-gating", "bool", "false",
           "AdapterHub's use_gating: the output times the sequence mean of sigmoid(gate(u))">,
    Option<"init", "init", "std::string", "\"\"", "bert | mam_adapter | houlsby (empty: the config's)">,
    Option<"leaveOut", "leave-out", "std::string", "\"\"",
           "comma list of layer numbers left without adapters (AdapterHub's leave_out)">,
    Option<"seed", "seed", "int64_t", "0", "seed of the adapters' start">,
  ];
}

def PeftIa3 : Pass<"sd-peft-ia3", "mlir::ModuleOp"> {
  let summary = "(IA)³: trained vectors that scale the matched sd.linear modules' outputs or inputs";
  let description = [{
    Matches `sd.linear` modules as sd-peft-lora does. Each matched layer gets
    `<module>.ia3_l`, ones, trainable, and computes y = linear(x, W, b) * l
    with l [out, 1] (bias included, as PEFT's IA3 scales the layer's
    result), or, for the feedforward modules, y = linear(x * l, W, b) with
    l [1, in]. A module is a feedforward one as PEFT decides it: a comma list
    entry it ends with, or a regex it matches whole. Every other weight is
    frozen. Records the configuration in `sd.peft` on the module.
  }];
  let options = [
    Option<"targetModules", "target-modules", "std::string", "\"\"", "comma list of module names, or a regex">,
    Option<"feedforwardModules", "feedforward-modules", "std::string", "\"\"",
           "the target modules whose input (not output) is scaled: comma list of name endings, or a regex">,
  ];
}

def PeftAdalora : Pass<"sd-peft-adalora", "mlir::ModuleOp"> {
  let summary = "AdaLoRA: SVD-form adapters whose triplets a budget schedule prunes during training";
  let description = [{
    Matches `sd.linear` modules as sd-peft-lora does. Each gets trainable
    `<module>.lora_A` [r, in], `.lora_E` [r, 1] and `.lora_B` [out, r]
    (PEFT's AdaLoRA names and start: A and B ~ N(0, 0.02), E zeros) and
    y = linear(x, W, b) + (x (A * E)ᵀ Bᵀ) alpha / (r + 1e-5). The recipes add
    PEFT's orthogonality penalty to the loss and sd-optimizer the rank
    allocation after each step (AdaloraAllocation.h). Records the
    configuration (tinit, tfinal, deltaT, total_step, target_r, ...) in `sd.peft`.
  }];
  let options = [
    Option<"targetModules", "target-modules", "std::string", "\"\"", "comma list of module names, or a regex">,
    Option<"rank", "r", "int64_t", "12", "PEFT's init_r: the triplets each module starts with">,
    Option<"targetRank", "target-r", "int64_t", "8", "PEFT's target_r: the average triplets each module ends with">,
    Option<"alpha", "alpha", "double", "8.0", "PEFT's lora_alpha (the update is scaled by alpha / r)">,
    Option<"seed", "seed", "int64_t", "0", "seed of the adapter initialization">,
    Option<"tinit", "tinit", "int64_t", "0", "steps before the budget starts to shrink">,
    Option<"tfinal", "tfinal", "int64_t", "0", "steps at the end that keep the final pattern">,
    Option<"deltaT", "delta-t", "int64_t", "1", "steps between two allocations">,
    Option<"beta1", "beta1", "double", "0.85", "EMA factor of the sensitivity">,
    Option<"beta2", "beta2", "double", "0.85", "EMA factor of the uncertainty">,
    Option<"orthRegWeight", "orth-reg-weight", "double", "0.5", "weight of the orthogonality penalty">,
    Option<"totalStep", "total-step", "int64_t", "0", "PEFT's total_step: the optimizer steps the schedule spans">,
  ];
}

def PeftLoha : Pass<"sd-peft-loha", "mlir::ModuleOp"> {
  let summary = "LoHa: Hadamard products of two low-rank pairs added to the matched sd.linear modules";
  let description = [{
    Matches `sd.linear` modules as sd-peft-lora does. Each matched layer gets
    `<module>.hada_w1_a` and `.hada_w2_a` [out, r], `.hada_w1_b` and
    `.hada_w2_b` [r, in] (PEFT's LoHa names and init: Kaiming-uniform with
    a = sqrt(5), w2_b zeros), all trainable, and computes
    y = linear(x, W, b) + x ΔWᵀ with ΔW = (w1_a w1_b) ⊙ (w2_a w2_b) · alpha / r,
    rebuilt each step. Every other weight is frozen. Records the
    configuration in `sd.peft` on the module.
  }];
  let options = [
    Option<"targetModules", "target-modules", "std::string", "\"\"", "comma list of module names, or a regex">,
    Option<"rank", "r", "int64_t", "8", "rank of each factor pair">,
    Option<"alpha", "alpha", "double", "8.0", "scaling numerator">,
    Option<"seed", "seed", "int64_t", "0", "seed of the adapter initialization">,
  ];
}

def PeftDylora : Pass<"sd-peft-dylora", "mlir::ModuleOp"> {
  let summary = "DyLoRA: LoRA adapters trained at a rank drawn each step, so every rank prefix works";
  let description = [{
    Matches `sd.linear` modules as sd-peft-lora does and adds PEFT's LoRA
    tensors `<module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r],
    cut into r / block-size blocks of ranks. Each training forward draws a
    block b per module (uniform, from the seeded counter RNG): blocks below b
    compute but are detached, block b trains, blocks above it are out, and
    the scale is alpha / (b + 1), as LyCORIS's DyLoraModule. Outside training
    the blocks in play are the `dylora.eval_blocks` global's (all of them at
    first). A and B carry `sd.block_updates`, so sd-optimizer updates a block
    only in steps that drew it (PyTorch's rule for a parameter without a
    gradient). sd-dylora-draws finishes the draws per entry.
  }];
  let options = [
    Option<"targetModules", "target-modules", "std::string", "\"\"", "comma list of module names, or a regex">,
    Option<"rank", "r", "int64_t", "8", "the largest rank (every block in play)">,
    Option<"alpha", "alpha", "double", "8.0", "scaling numerator: alpha / blocks in play">,
    Option<"blockSize", "block-size", "int64_t", "1", "ranks per block (LyCORIS's block_size)">,
    Option<"seed", "seed", "int64_t", "0", "seed of the adapter initialization">,
  ];
}

def DyloraDraws : Pass<"sd-dylora-draws", "mlir::ModuleOp"> {
  let summary = "DyLoRA's rank draws: recorded in training entries, the chosen rank elsewhere";
  let description = [{
    In accumulate entries each DyLoRA draw (a seeded_random tagged
    `sd.dylora_touched`) marks its block in that global, which sd-optimizer
    reads and clears. In every other entry the draw becomes
    `dylora.eval_blocks` - 1: the blocks in play outside training. Runs after
    sd-autodiff and before sd-training-dropout.
  }];
}

def PeftLokr : Pass<"sd-peft-lokr", "mlir::ModuleOp"> {
  let summary = "LoKr: a Kronecker product of two factors added to the matched sd.linear modules";
  let description = [{
    Matches `sd.linear` modules as sd-peft-lora does. Each matched layer of
    out = a·b outputs and in = c·d inputs (PEFT's factorization of each,
    near the square root or by decompose-factor) gets PEFT's LoKr factors:
    `<module>.lokr_w1` [a, c] (zeros), or with decompose-both and r < max(a, c)/2
    `.lokr_w1_a` [a, r] (zeros) and `.lokr_w1_b` [r, c]; `.lokr_w2` [b, d], or
    with r < max(b, d)/2 `.lokr_w2_a` [b, r] and `.lokr_w2_b` [r, d]
    (Kaiming-uniform with a = sqrt(5)), all trainable. The layer computes
    y = linear(x, W, b) + x ΔWᵀ with ΔW = (W1 ⊗ W2) · alpha / r rebuilt each
    step, so it starts as it was. Every other weight is frozen. Records the
    configuration, each module's factor names included, in `sd.peft`.
  }];
  let options = [
    Option<"targetModules", "target-modules", "std::string", "\"\"", "comma list of module names, or a regex">,
    Option<"rank", "r", "int64_t", "8", "rank of a decomposed factor, and the r of alpha / r">,
    Option<"alpha", "alpha", "double", "8.0", "scaling numerator">,
    Option<"decomposeBoth", "decompose-both", "bool", "false", "also decompose the left factor W1 (PEFT's decompose_both)">,
    Option<"decomposeFactor", "decompose-factor", "int64_t", "-1",
           "split each dimension as factor x dim/factor when it divides (PEFT's decompose_factor; -1: near the square root)">,
    Option<"seed", "seed", "int64_t", "0", "seed of the adapter initialization">,
  ];
}

def QuantizeInt4 : Pass<"sd-quantize-int4", "mlir::ModuleOp"> {
  let summary = "Store the frozen weights of the linear layers as 4-bit codes read by MatMulNBits (inference plans)";
  let description = [{
    Every linear layer whose weight is a frozen f32 matrix that only linear
    layers read becomes onnxruntime's MatMulNBits: 4 bits, blocks of 32,
    symmetric (each block's largest-magnitude value over -8 its scale),
    accuracy_level 4, as onnxruntime-genai's builder writes int4 models for
    CPUs. The weight becomes `<w>.int4` (u8 [out, blocks, 16]) and
    `<w>.int4_scales` (f32 [out, blocks]). Records the count in
    `sd.quantized_int4`.
  }];
}

def QuantizeNf4 : Pass<"sd-quantize-nf4", "mlir::ModuleOp"> {
  let summary = "Store the frozen weights of the linear layers (not the head) as bitsandbytes' NF4 codes, dequantized where read";
  let description = [{
    Every linear layer but the output head whose weight is a frozen f32
    global of a multiple of 64 values: the weight becomes `<w>.nf4` (u8, two
    4-bit codes a byte) and `<w>.nf4_absmax` (f32, one per block of 64), as
    bitsandbytes' quantize_4bit (nf4) makes them bit for bit, and each load
    of it a dequantization (BitShift, BitwiseAnd, Gather from the NF4 table,
    Mul by the block's absmax) marked `sd.dequantized`. Records the count in
    `sd.quantized_nf4`.
  }];
}

def RematerializeDequant : Pass<"sd-rematerialize-dequant", "mlir::ModuleOp"> {
  let summary = "Repeat each weight's dequantization just before each op that reads it";
  let description = [{
    For every chain sd-quantize-nf4 built (its last op `sd.dequantized`),
    each reader gets its own copy of the chain placed just before it, so no
    dequantized weight stays alive between ops (the backward dequantizes
    again instead of keeping the forward's copy).
  }];
}

def PeftPrompt : Pass<"sd-peft-prompt", "mlir::ModuleOp"> {
  let summary = "Prompt tuning: trained embeddings of virtual tokens put before every row's tokens";
  let description = [{
    PEFT's prompt tuning. Adds the trainable `prompt_embeddings`
    [virtual-tokens, hidden] and freezes every other weight. The infer
    entry's token input gets virtual-tokens placeholder ids in front, so all
    the model derives from it (positions, masks, shapes) covers N + S
    positions; attention_mask is extended by ones and token_type_ids by
    zeros, and position_ids is bound to 0..N+S-1 (PEFT ignores given ones).
    The embedding lookup's first N rows are then replaced by the prompt, for
    every row: the model runs on concat(prompt, embeddings) as PEFT's does on
    inputs_embeds, and its logits cover all N + S positions. Initialized as
    PEFT's RANDOM (N(0, 1)), SAMPLE_VOCAB (the table's rows of random token
    ids, from `seed`) or TEXT (the rows of init-ids, repeated to fill).
    Records the configuration in `sd.peft`. With `prefix`: no prompt here; the lookup takes table rows for the virtual
    ids (and is marked), the infer logits drop the virtual positions, and
    sd-prefix-attention adds the trained keys and values.
  }];
  let options = [
    Option<"virtualTokens", "virtual-tokens", "int64_t", "20", "PEFT's num_virtual_tokens">,
    Option<"init", "init", "std::string", "\"random\"",
           "random (N(0, 1)), vocab (rows of the embedding table) or text (the rows of init-ids)">,
    ListOption<"initIds", "init-ids", "int64_t", "text: the start text's token ids, repeated or cut to the virtual tokens">,
    Option<"initText", "init-text", "std::string", "\"\"", "text: the start text (recorded, as PEFT's prompt_tuning_init_text)">,
    Option<"tokenizerPath", "tokenizer", "std::string", "\"\"", "text: the tokenizer (recorded, as PEFT's tokenizer_name_or_path)">,
    Option<"seed", "seed", "int64_t", "0", "seed of the initialization">,
    Option<"tokenInput", "token-input", "std::string", "\"\"", "the token input (default: found as the recipes do)">,
    Option<"prefix", "prefix", "bool", "false",
           "prefix tuning: the virtual tokens' keys and values train (sd-prefix-attention), the logits are the tokens' own">,
  ];
}

def PrefixAttention : Pass<"sd-prefix-attention", "mlir::ModuleOp"> {
  let summary = "Prefix tuning: trained keys and values of the virtual tokens in every attention layer";
  let description = [{
    After sd-peft-prompt with prefix (the entries' virtual ids, vocab + i,
    read at the marked embedding lookup) and specialization, before
    sd-kv-cache. Adds the trainable `prompt_embeddings` [N, 2 L Hkv d] in
    PEFT's PrefixEncoder layout (per virtual token: each layer's key heads,
    then its value heads), N(0, 1) from `seed`. In each entry, attention op
    i (in order) takes, at the keys of virtual ids, rows 2i (keys) and 2i+1
    (values) of the virtual token's embedding instead of what the layer
    computed there, each key/value head repeated over its query heads:
    keys not rotated, as PEFT's past_key_values. Hkv is read from the
    projection the keys come from (a k_proj of Hkv d outputs, or a fused
    q/k/v of (H + 2 Hkv) d). Records token_dim, num_layers and
    num_attention_heads (Hkv) in `sd.peft`. With `projection` (PEFT's
    prefix_projection) those values are an MLP's output, computed in each
    entry: the trainable `prompt_encoder.embedding.weight` [N, Hkv d]
    through `prompt_encoder.transform.0` (to encoder-hidden-size, Tanh) and
    `prompt_encoder.transform.2` (to 2 L Hkv d), PEFT's PrefixEncoder.
  }];
  let options = [
    Option<"seed", "seed", "int64_t", "0", "seed of the initialization">,
    Option<"projection", "projection", "bool", "false", "the prefix through PEFT's two-layer MLP">,
    Option<"encoderHiddenSize", "encoder-hidden-size", "int64_t", "0", "the MLP's width (0: token_dim, PEFT's)">,
  ];
}

def PeftVera : Pass<"sd-peft-vera", "mlir::ModuleOp"> {
  let summary = "VeRA: one shared frozen random pair of projections, trained scaling vectors per sd.linear";
  let description = [{
    Matches `sd.linear` modules as sd-peft-lora does. Adds the frozen
    `vera_A` [r, max in] and `vera_B` [max out, r], drawn as PEFT draws them
    (torch.Generator seeded with projection-key, Kaiming-uniform with gain
    sqrt(2): PyTorch's mt19937 and float uniform reproduced, so the values
    are PEFT's bit for bit), and per layer the trainable
    `<module>.vera_lambda_d` [r] (d-initial) and `.vera_lambda_b` [out]
    (zeros): y = linear(x, W, b) + λ_b ⊙ ((λ_d ⊙ (x A[:, :in]ᵀ)) B[:out]ᵀ),
    x read through seeded_dropout with dropout > 0 (one stream per layer).
    Every other weight is frozen. Records the configuration in `sd.peft`.
  }];
  let options = [
    Option<"targetModules", "target-modules", "std::string", "\"\"", "comma list of module names, or a regex">,
    Option<"rank", "r", "int64_t", "256", "rank of the shared projections">,
    Option<"projectionKey", "projection-key", "int64_t", "0", "PEFT's projection_prng_key">,
    Option<"dInitial", "d-initial", "double", "0.1", "initial value of every lambda_d">,
    Option<"dropout", "dropout", "double", "0.0", "dropout probability on the adapter input (PEFT's vera_dropout; training only)">,
  ];
}

def PeftOsft : Pass<"sd-peft-osft", "mlir::ModuleOp"> {
  let summary = "OSFT: split the matched sd.linear weights by SVD into frozen high and trainable low factors";
  let description = [{
    Matches modules as sd-peft-lora does (plus "all-linear"). Each weight W
    [out, in] is split at compile time, W = U diag(S) V by LAPACK in f64:
    the top k triplets (k = floor(ratio * min(out, in)), or a rank-pattern
    override) become frozen globals `<module>.osf_{U,S,V}_high`, the rest
    trainable `<module>.osf_svd_params.{U,S,V}_low` (PEFT's OSF names), and
    the layer becomes sd.osft_linear. Every other weight is frozen. Records
    the configuration and a CRC32C of the split base weights in `sd.peft`.
  }];
  let options = [
    Option<"targetModules", "target-modules", "std::string", "\"\"", "comma list of module names, a regex, or all-linear">,
    Option<"ratio", "preserved-ratio", "double", "0.5", "preserved (frozen) fraction of min(out, in)">,
    Option<"rankPattern", "rank-pattern", "std::string", "\"\"", "NAME=K|R,...: per-module preserved rank or ratio">,
  ];
}

def OsftStrategy : Pass<"sd-osft-strategy", "mlir::ModuleOp"> {
  let summary = "OSFT: factored layer or W rebuilt once per step, whichever costs fewer multiply-adds";
  let options = [
    Option<"strategy", "strategy", "std::string", "\"auto\"", "auto | factored | dense">,
  ];
}

def OsftProject : Pass<"sd-osft-project", "mlir::ModuleOp"> {
  let summary = "OSFT: project low-factor gradients and updated factors out of the frozen high subspaces";
  let options = [
    Option<"vRule", "v-rule", "std::string", "\"gather\"",
           "under --shard params: gather V_high for the V-side coefficients (right), or allreduce per-rank products of its local rows (known wrong; tests only)">,
  ];
}

def PeftLora : Pass<"sd-peft-lora", "mlir::ModuleOp"> {
  let summary = "LoRA: add trainable low-rank adapters to the matched sd.linear modules";
  let description = [{
    Matches `sd.linear` modules as PEFT's target_modules does: a comma list
    matches a module whose name equals an entry or ends with "." + entry; a
    pattern with regex characters must match the whole name. Each matched
    layer gets `<module>.lora_A.weight` [r, in] (Kaiming-uniform with a = sqrt(5),
    as PEFT, or N(0, 1/r) with init=gaussian) and `<module>.lora_B.weight`
    [out, r] (zeros), both trainable, and computes
    y = linear(x, W, b) + scale * linear(linear(x, A), B) with
    scale = alpha / r (alpha / sqrt(r) with rslora). With dropout > 0 the
    adapter branch reads seeded_dropout(x) (PEFT's lora_dropout), one random
    stream per adapted layer, keyed by the `dropout_rng` state [seed, counter]
    (sd-training-dropout keeps it in training entries only). Every other
    weight is frozen. Records the configuration in `sd.peft` on the module.

    With dora (PEFT's use_dora, weight-decomposed LoRA) each layer also gets
    `<module>.lora_magnitude_vector` [out] (trainable, initialized to W's row
    norms) and computes y = m / |W + scale B A|_row * (x Wᵀ + scale x Aᵀ Bᵀ)
    + b, the norm read through detached loads of A and B (sd.detached: no
    gradient flows through it, as in DoRA's paper and PEFT). With dropout the
    magnitude's correction reads the dropped input as PEFT's does:
    y = linear(x, W, b) + (m / n - 1) x_d Wᵀ + m / n * scale x_d Aᵀ Bᵀ.

    With init = pissa, olora or loftq (PEFT's init_lora_weights) the
    adapters start from the frozen weight W ([out, in] as nn.Linear holds it)
    and W itself is rewritten so the layer starts as it was: PiSSA takes A, B
    from W's top r singular triplets (each sqrt(S / scale)) and leaves
    W - scale B A; OLoRA takes A = R[:r], B = Q[:, :r] of W = Q R and leaves
    W - scale B A; LoftQ alternates NF4 quantization of the residual and a
    rank-r SVD of W minus the dequantized weight (loftq-iter rounds), leaving
    the dequantized weight and A, B of the last SVD (unscaled, as PEFT).

    With bias = all (PEFT's bias="all") every frozen float weight whose name
    contains "bias" trains beside the adapters, as PEFT marks every
    parameter so named; with lora_only the adapted layers' own biases do.
    `sd.peft` then lists them (trained_biases).
  }];
  let options = [
    Option<"targetModules", "target-modules", "std::string", "\"\"", "comma list of module names, or a regex">,
    Option<"rank", "r", "int64_t", "8", "adapter rank">,
    Option<"alpha", "alpha", "double", "8.0", "scaling numerator">,
    Option<"rslora", "rslora", "bool", "false", "scale by alpha / sqrt(r)">,
    Option<"init", "init", "std::string", "\"default\"",
           "default (Kaiming-uniform A) | gaussian | pissa | olora | loftq (the last three rewrite the base weight)">,
    Option<"loftqIter", "loftq-iter", "int64_t", "1", "loftq: PEFT's loftq_iter, rounds of NF4 quantization and SVD">,
    Option<"seed", "seed", "int64_t", "0", "seed of the adapter initialization">,
    Option<"dropout", "dropout", "double", "0.0", "dropout probability on the adapter input (training only)">,
    Option<"dora", "dora", "bool", "false", "weight-decomposed LoRA (PEFT's use_dora): a trained magnitude per output">,
    Option<"bias", "bias", "std::string", "\"none\"",
           "PEFT's bias: none, all (every weight named like a bias trains too) or lora_only (the adapted layers' biases)">,
  ];
}

def RecipeSft : Pass<"sd-recipe-sft", "mlir::ModuleOp"> {
  let summary = "Add an eval_step entry: the infer graph plus causal-LM cross-entropy";
  let description = [{
    Clones `infer` into `eval_step`, adds a `labels` input shaped like the
    token input (recorded as the module's `sd.token_input`), and appends the SFT loss as sd ops: labels shifted left by
    one (the last position gets the ignore index -100), cross-entropy summed
    over positions whose label is not -100. Outputs `loss_sum` and `tokens`
    (the counted positions), so gradient accumulation can normalize over a
    whole window. With `loss-output`, the model's own scalar output is the
    loss and `tokens` is 1.
  }];
  let options = [
    Option<"logitsOutput", "logits-output", "std::string", "\"\"", "logits output (default: the only float output)">,
    Option<"lossOutput", "loss-output", "std::string", "\"\"", "use this scalar model output as the loss">,
    Option<"tokenInput", "token-input", "std::string", "\"\"",
           "the int64 [batch, seq] token input (default: the only one, or the only one indexing an embedding)">,
  ];
}

def RecipePreference : Pass<"sd-recipe-preference", "mlir::ModuleOp"> {
  let summary = "Add an eval_step entry: preference optimization (DPO, SimPO, ORPO over chosen/rejected row pairs; KTO over unpaired examples)";
  let description = [{
    Clones `infer` into `eval_step` with a `labels` input as sd-recipe-sft
    does. Rows 2i and 2i+1 are pair i's chosen and rejected completions
    (labels -100 on the prompt). Each row's log-probability of its labels
    gives TRL's losses: `dpo` (DPOTrainer) compares them with the reference
    model's, the forward repeated on `reference/<name>` copies of the
    trainable parameters (the model as training starts): sigmoid
    -log sigmoid(beta * margin), hinge relu(1 - beta * margin), or ipo
    (per-token margin - 1 / (2 beta))^2. `simpo` (CPOTrainer, loss_type
    simpo) takes per-token log-probabilities, -log sigmoid(beta * margin -
    gamma), plus cpo-alpha times the chosen rows' cross-entropy; `orpo`
    (ORPOTrainer) the chosen rows' cross-entropy plus -beta * log sigmoid of
    the log odds ratio. `kto` (KTOTrainer) takes unpaired examples: row 2i
    is example i's completion, row 2i+1 its prompt with another example's
    completion (the KL rows), and a `desirable` input [rows] says which
    examples are desirable (1) or not (0); against the reference as dpo,
    desirable-weight * (1 - sigmoid(beta * (log-ratio - KL))) or
    undesirable-weight * (1 - sigmoid(beta * (KL - log-ratio))), KL the KL
    rows' mean log-ratio, clamped at 0 and detached. Outputs `loss_sum` (over
    pairs or examples) and `tokens` (those counted).
  }];
  let options = [
    Option<"method", "method", "std::string", "\"dpo\"", "dpo, simpo, orpo or kto">,
    Option<"beta", "beta", "double", "0.1", "the loss's temperature (TRL's beta; ORPO's lambda)">,
    Option<"lossType", "loss-type", "std::string", "\"sigmoid\"", "dpo: sigmoid (DPO), ipo or hinge">,
    Option<"simpoGamma", "simpo-gamma", "double", "0.5", "simpo: the target reward margin (TRL's simpo_gamma)">,
    Option<"cpoAlpha", "cpo-alpha", "double", "1.0", "simpo: the chosen rows' cross-entropy weight (TRL's cpo_alpha)">,
    Option<"desirableWeight", "desirable-weight", "double", "1.0", "kto: the desirable examples' loss weight">,
    Option<"undesirableWeight", "undesirable-weight", "double", "1.0", "kto: the undesirable examples' loss weight">,
    Option<"logitsOutput", "logits-output", "std::string", "\"\"", "logits output (default: the only float output)">,
    Option<"tokenInput", "token-input", "std::string", "\"\"",
           "the int64 [batch, seq] token input (default: the only one, or the only one indexing an embedding)">,
  ];
}

def RecipeGrpo : Pass<"sd-recipe-grpo", "mlir::ModuleOp"> {
  let summary = "Add an eval_step entry: GRPO's clipped policy loss over groups of scored completions";
  let description = [{
    Clones `infer` into `eval_step` with a `labels` input as sd-recipe-sft
    does, and an f32 `rewards` input [rows]. Rows come in groups of
    num-generations completions of one prompt (labels -100 on the prompt).
    As TRL's GRPOTrainer computes it: each group's rewards give advantages
    (reward - group mean, over the group's std + 1e-4 unless scale-rewards
    is none); the importance weight exp(log p - log p_old), with p_old the
    step's own log-probabilities detached (TRL's num_iterations 1), per token
    or per sequence (GSPO), clipped to [1 - epsilon, 1 + epsilon-high];
    -min(w A, clip(w) A) per completion token, plus beta times the k3 KL
    estimate against the reference model (the forward on `reference/<name>`
    copies, as sd-recipe-preference's), times w (TRL's bias correction).
    Loss types: dapo sums over tokens and counts them (a mean over the
    optimizer window's tokens), grpo averages each completion's tokens and
    counts completions, bnpo averages the micro-batch's tokens and counts
    micro-batches, dr_grpo divides by max-completion-length and counts
    completions; cispo (-detach(min(w, epsilon_high)) A log p per token) counts
    tokens as dapo, sapo (-sigmoid(t (w - 1)) 4 / t A, t the temperature of
    A's sign) averages as grpo, and luspo sums each completion's tokens and
    counts completions, and vespo (-φ(w) A log p per token, φ VESPO's detached
    gamma weight of the completion's summed log-ratio) counts tokens. Outputs
    `loss_sum` and `tokens` (what the sum counts).
    With sampling-log-probs the sampling policy's log-probabilities come as an
    f32 `old_log_probs` [rows, seq] input instead (groups an earlier policy
    sampled), so the importance weight and its clipping act.
  }];
  let options = [
    Option<"numGenerations", "num-generations", "int64_t", "8", "completions per prompt (TRL's num_generations)">,
    Option<"lossType", "loss-type", "std::string", "\"dapo\"", "dapo, grpo, bnpo, dr_grpo, cispo, sapo, luspo or vespo">,
    Option<"vespoKPos", "vespo-k-pos", "double", "2.0", "vespo: k where A >= 0">,
    Option<"vespoLambdaPos", "vespo-lambda-pos", "double", "3.0", "vespo: lambda where A >= 0">,
    Option<"vespoKNeg", "vespo-k-neg", "double", "3.0", "vespo: k where A < 0">,
    Option<"vespoLambdaNeg", "vespo-lambda-neg", "double", "2.0", "vespo: lambda where A < 0">,
    Option<"sapoTemperaturePos", "sapo-temperature-pos", "double", "1.0", "sapo: the gate's temperature where A > 0">,
    Option<"sapoTemperatureNeg", "sapo-temperature-neg", "double", "1.05", "sapo: the gate's temperature elsewhere">,
    Option<"beta", "beta", "double", "0.0", "the KL term's weight (0: no reference model)">,
    Option<"epsilon", "epsilon", "double", "0.2", "the importance weight's lower clip">,
    Option<"epsilonHigh", "epsilon-high", "double", "-1.0", "the upper clip (negative: epsilon)">,
    Option<"delta", "delta", "double", "0.0", "two-sided clipping: the unclipped weight's cap (0: none)">,
    Option<"importanceSampling", "importance-sampling", "std::string", "\"token\"", "token or sequence (GSPO)">,
    Option<"scaleRewards", "scale-rewards", "std::string", "\"group\"", "group or none">,
    Option<"maxCompletionLength", "max-completion-length", "int64_t", "512", "dr_grpo's constant length">,
    Option<"samplingLogProbs", "sampling-log-probs", "bool", "false",
           "take the sampling policy's per-token log-probabilities as an old_log_probs input (else: this step's, detached)">,
    Option<"logitsOutput", "logits-output", "std::string", "\"\"", "logits output (default: the only float output)">,
    Option<"tokenInput", "token-input", "std::string", "\"\"",
           "the int64 [batch, seq] token input (default: the only one, or the only one indexing an embedding)">,
  ];
}

def RecipeClassify : Pass<"sd-recipe-classify", "mlir::ModuleOp"> {
  let summary = "Add a classification head and an eval_step entry with cross-entropy over one label per row";
  let description = [{
    Appends a trainable linear head (`classifier.weight` [num-labels, hidden],
    `classifier.bias`; nn.Linear's initialization, seeded) to the model's
    features: a float [batch, hidden] output, or a [batch, seq, hidden] one
    pooled by the mean over `attention_mask` (or the first token). `infer`
    then returns the class logits. Clones it into `eval_step` with a
    `labels` input [batch] (-100: a padding row) and the summed
    cross-entropy, outputs `loss_sum` and `tokens` (the counted rows).
    `attention_mask` stays an input; `token_type_ids` and `position_ids`
    take their defaults.
  }];
  let options = [
    Option<"numLabels", "num-labels", "int64_t", "0", "number of classes">,
    Option<"pooling", "pooling", "std::string", "\"mean\"", "mean | cls, for [batch, seq, hidden] features">,
    Option<"featuresOutput", "features-output", "std::string", "\"\"", "the features output (default: the only one)">,
    Option<"tokenInput", "token-input", "std::string", "\"\"", "the int64 [batch, seq] token input">,
    Option<"seed", "seed", "int64_t", "0", "seed of the head's initialization">,
  ];
}

def FuseProjections : Pass<"sd-fuse-projections", "mlir::ModuleOp"> {
  let summary = "Join linear layers on one input with frozen weights (q/k/v, gate/up) into one linear and a Split";
  let description = [{
    The weights (and biases) are concatenated along the output axis at
    compile time into one frozen global. A weight joins only when all of its
    uses, across entries, are groups with the same members, so the fused
    copy replaces the originals instead of adding to them. Runs before
    autodiff: the backward differentiates the fused linear and the Split.
  }];
}

def FuseLayerNorm : Pass<"sd-fuse-layernorm", "mlir::ModuleOp"> {
  let summary = "Replace LayerNorm decomposed by pre-opset-17 exporters with one sd.layer_normalization";
}

def FuseRmsNorm : Pass<"sd-fuse-rmsnorm", "mlir::ModuleOp"> {
  let summary = "Replace RMSNorm as exporters decompose it with one sd.rms_normalization";
  let description = [{
    x * (1 / sqrt(mean(x^2) + eps)) * scale over the last axis, with x^2 as
    Pow(x, 2) or x * x, the inverse as Div(1, s), Reciprocal(s) or x / s,
    and the identity Casts Hugging Face's LlamaRMSNorm exports around it.
  }];
}

def FuseAttention : Pass<"sd-fuse-attention", "mlir::ModuleOp"> {
  let summary = "Replace decomposed scaled-dot-product attention with one sd.attention";
  let description = [{
    MatMul(q, kt), an optional constant scale (Mul or Div), an optional
    Where(mask, constant, scores), Softmax over the last axis and MatMul with v,
    each feeding only the next, become sd.attention(q, kt, v, mask)
    {scale, mask_value}: one kernel forward, one backward.
  }];
}

def FuseSwiglu : Pass<"sd-fuse-swiglu", "mlir::ModuleOp"> {
  let summary = "Replace silu(gate) * up with one sd.swiglu";
  let description = [{
    Mul(silu(gate), up), silu written as gate * Sigmoid(gate) or Swish with
    alpha 1, each intermediate used only there, and gate and up of one type,
    becomes sd.swiglu(gate, up): one kernel forward, one backward.
  }];
}

def FuseRotary : Pass<"sd-fuse-rotary", "mlir::ModuleOp"> {
  let summary = "Replace the decomposed rotary position embedding with one sd.rotary";
  let description = [{
    x * cos + rotate_half(x) * sin, rotate_half(x) = Concat(-x[..., D/2:],
    x[..., :D/2]) as Hugging Face's apply_rotary_pos_emb exports it, with cos
    and sin broadcasting over every axis of x [B, ..., S, D] but B, S and D,
    becomes sd.rotary(x, cos, sin): one kernel forward, one backward.
  }];
}

def Specialize : Pass<"sd-specialize", "mlir::ModuleOp"> {
  let summary = "Clone each entry per shape bucket with static input shapes";
  let options = [
    ListOption<"shapes", "shapes", "std::string",
               "INPUT=DxD[,DxD...] per input; several values make several buckets">,
    ListOption<"dims", "dims", "std::string",
               "NAME=N[,N...] binds an ONNX dim_param">,
    ListOption<"inferShapes", "infer-shapes", "std::string",
               "shapes for the infer entry only (training plans: the generation bucket)">,
    Option<"inferBatchOne", "infer-batch-one", "bool", "false",
           "without infer-shapes: infer takes the shapes with batch 1, or the batch the model fixes">,
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

def BoundedExtents : Pass<"sd-bounded-extents", "mlir::ModuleOp"> {
  let summary = "Follow the run-time counts of selections (NonMaxSuppression) to the outputs, or refuse";
  let description = [{
    A selection's result is sized for the most it can select and comes with a
    count of the real slices. Consumers that work slice by slice along the
    counted dim pass the count on; any other consumer is refused, naming both
    nodes. Entry results that carry a count return it as an extra result and
    are listed in `sd.output_extents` as [result, count result, axis].
  }];
}

def CheckStatic : Pass<"sd-check-static", "mlir::ModuleOp"> {
  let summary = "Fail, naming the node, if a dynamic dim or a shape op survives";
}

def KvEntries : Pass<"sd-kv-entries", "mlir::ModuleOp"> {
  let summary = "--kv-cache: prefill and decode entries cloned from the model's forward";
  let description = [{
    Clones the infer entry into prefill [batch, chunk], decode [batch, 1],
    with speculate > 0 verify [batch, speculate + 1] (speculative decoding:
    a row's token and its guessed successors in one call), and
    a kv_probe [1, max-length] (for sd-kv-cache's position tables), marked
    sd.kv_shape for sd-specialize, each returning only the logits. An
    attention_mask input becomes ones; other inputs but the tokens and
    position_ids are refused. Runs before sd-specialize.
  }];
  let options = [
    Option<"maxLength", "max-length", "int64_t", "0", "cache positions per row (0: no generation entries)">,
    Option<"batch", "batch", "int64_t", "0", "rows generated together (0: the model's fixed batch, else 1)">,
    Option<"chunk", "chunk", "int64_t", "1", "prompt tokens per prefill call">,
    Option<"speculate", "speculate", "int64_t", "0", "guessed tokens a verify entry checks per row (0: no verify entry)">,
    Option<"tokenInput", "token-input", "std::string", "\"\"", "the token input (empty: found)">,
    Option<"logitsOutput", "logits-output", "std::string", "\"\"", "the logits output (empty: found)">,
    Option<"keepInfer", "keep-infer", "bool", "true", "keep the infer entry (false: a generation-only plan)">,
  ];
}

def KvCache : Pass<"sd-kv-cache", "mlir::ModuleOp"> {
  let summary = "Prefill/decode entries attend through key/value caches in plan state";
  let description = [{
    In the specialized prefill and decode entries, every fused causal
    self-attention becomes sd.cached_attention over kv_cache globals
    [batch, kv_heads, max_length, d], shared by both entries (grouped-query
    heads are cached once: the repeat-kv expansion is looked through). The
    entries take an int64 [batch, seq] position_ids input, which indexes the
    learned position embedding and the rotary cos/sin tables (read from the
    kv_probe entry, then erased). Runs after sd-fuse-rotary.
  }];
}

def PackSequences : Pass<"sd-pack-sequences", "mlir::ModuleOp"> {
  let summary = "Training entries take position_ids, so several sequences share a row";
  let description = [{
    Each eval_step gets an int64 [batch, seq] `position_ids` input (each
    token's position in its own sequence). It replaces the learned
    position-embedding lookup of arange(seq) and becomes every fused
    attention's `positions` operand, which keeps a query to the keys of its
    own sequence. A packed row then computes what its sequences would one by
    one. Runs after specialization, before sd-autodiff.
  }];
}

def Autodiff : Pass<"sd-autodiff", "mlir::ModuleOp"> {
  let summary = "Reverse-mode differentiation: an accumulate entry per eval_step";
  let description = [{
    For each specialized `eval_step`, builds `accumulate`: the same forward,
    then the backward of `loss_sum` with respect to every trainable global,
    added into the global's gradient (`grad/<name>`, role gradient), and the
    token count added into `tokens_seen`. Activity analysis: only values that
    depend on a trainable global and reach the loss get gradients, so frozen
    prefixes cost no backward work and frozen weights no weight-gradient GEMM.
    Each op's rule comes from its DifferentiableOpInterface model. A module
    that sd-autocast marked for fp16 (sd.loss_scale_init) gets the
    `loss_scale` state global, and the backward is seeded with its value.
  }];
}

def TrainingDropout : Pass<"sd-training-dropout", "mlir::ModuleOp"> {
  let summary = "Keep seeded dropout in training entries (advancing its counter), drop it elsewhere";
  let description = [{
    accumulate entries keep their `sd.seeded_dropout` ops and store
    dropout_rng + [0, 1] before returning, so every micro-batch draws new
    masks and the backward pass regenerates the forward's from the same
    [seed, counter] value. In eval_step and infer entries dropout is the
    identity: the ops are removed.
  }];
}

def TrainingBatchNorm : Pass<"sd-training-batch-norm", "mlir::ModuleOp"> {
  let summary = "Batch statistics in training entries (updating the running ones), running statistics elsewhere";
  let description = [{
    For each BatchNormalization the importer tagged sd.running_statistics (a
    train-mode export): accumulate keeps the batch's mean and variance and
    stores running * momentum + batch * (1 - momentum) into the running
    weights before returning; eval_step and infer normalize by the running
    weights. Those weights take the `statistics` role.
  }];
}

def Optimizer : Pass<"sd-optimizer", "mlir::ModuleOp"> {
  let summary = "Add the apply entry (optimizer update) and train_step = accumulate + apply";
  let description = [{
    `apply(lr, weight_decay, max_grad_norm)` scales the accumulated gradients
    by 1/tokens and the global-norm clip factor (one GradScale), advances the
    step counter and runs one fused update per parameter (AdamW or SGD), which
    also zeroes the gradient. Weight decay applies to parameters of rank >= 2
    (weights), not to biases and norm parameters. `train_step` is one
    micro-batch's accumulate followed by apply.
  }];
  let options = [
    Option<"optimizer", "optimizer", "std::string", "\"adamw\"", "adamw | sgd">,
    Option<"beta1", "beta1", "double", "0.9", "AdamW beta1">,
    Option<"beta2", "beta2", "double", "0.999", "AdamW beta2">,
    Option<"epsilon", "epsilon", "double", "1e-8", "AdamW epsilon">,
    Option<"momentum", "momentum", "double", "0.0", "SGD momentum">,
    Option<"nesterov", "nesterov", "bool", "false", "SGD Nesterov momentum">,
  ];
}

def AccumulateWhereProduced : Pass<"sd-accumulate-where-produced", "mlir::ModuleOp"> {
  let summary = "Add each gradient into its accumulator right after the backward computes it";
  let description = [{
    In accumulate and train_step, each grad/<p> = grad/<p> + delta moves up
    to just after delta's producer: the delta's buffer is freed there, not
    held to the end of the backward, and each gradient is final where it is
    produced, in the backward's order (what sd-data-parallel buckets by).
  }];
}

def DataParallel : Pass<"sd-data-parallel", "mlir::ModuleOp"> {
  let summary = "Sum the counted tokens and gradients over the ranks before each GradScale";
  let description = [{
    Inserts AllReduce steps (one per gradient bucket of about bucket-mb,
    gradients in the order the backward finishes them, the token count in the
    first) in apply and train_step, each stored back into its global so the
    reduction runs in place. In train_step (overlap) each bucket's reduction
    starts where its last gradient is final and one WaitCollectives precedes
    GradScale. A plan run alone reduces over a world of one: nothing.
  }];
  let options = [
    Option<"bucketMb", "bucket-mb", "double", "25.0",
           "gradient bytes per AllReduce step, in MiB (0: one step per gradient)">,
    Option<"shard", "shard", "std::string", "\"none\"",
           "none | optimizer (ZeRO-1: each parameter's update and optimizer state on one rank) | grads (ZeRO-2: its gradient too) | params (rows of every weight; sd-shard-params)">,
    Option<"overlap", "overlap", "bool", "true",
           "in train_step, start each bucket's reduction where its last gradient is final (async) and wait before GradScale">,
  ];
}

def ShardParams : Pass<"sd-shard-params", "mlir::ModuleOp"> {
  let summary = "Shard weights by rows over the ranks (FSDP2's Shard(0)): gather before each use, reduce-scatter gradients";
  let description = [{
    sdc compile --shard params. Every float weight (trainable, or frozen with
    at least two rows), and the gradient and optimizer state of each trainable
    one, is held as rows split over the ranks (sd::rowBlock). Each op that
    reads such a weight gets it whole from an AllGatherRows step just before
    it, so the arena frees the copy after that op (the backward gathers again,
    as FSDP does). Each micro-batch's gradient goes into the rows this rank
    keeps by a ReduceScatterRows step; the optimizer updates and GradScale
    work on those rows alone. The list of sharded globals is recorded in the
    module attribute sd.row_sharded (the plan config's row_sharded).
  }];
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
