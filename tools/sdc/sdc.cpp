// sdc: the compiler driver. `sdc compile MODEL -o PLAN` imports ONNX, runs the
// pass pipeline and writes a plan.
#include "Driver.h"
#include "Merge.h"
#include "PeftDefaults.h"
#include "sd/format/json.h"
#include "sd/format/file_io.h"
#include "sd/format/peft.h"
#include "sd/tokenize/tokenizer.h"
#include <sys/stat.h>
#include <algorithm>
#include <new>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char *kUsage =
    "usage: sdc compile MODEL.onnx|MODEL.onnxtxt -o PLAN.sdp [options]\n"
    "       sdc merge MODEL.onnx (--adapter DIR | --weights FILE) -o MERGED.onnx\n"
    "\n"
    "Compiles an ONNX model into a shape-specialized plan for sdrun.\n"
    "\n"
    "options:\n"
    "  -o, --output PLAN.sdp    output plan file (required unless --emit mlir)\n"
    "  --shapes INPUT=DxD[,DxD] static shape of a graph input; repeat the flag or\n"
    "                           give several values to compile several buckets\n"
    "  --dim NAME=N[,N]         value of an ONNX dim_param (symbolic dimension); a training\n"
    "                           plan given neither binds the model's named batch dims to 8\n"
    "                           and sequence dims to 512 (or config.json's positions, if fewer)\n"
    "  --bind INPUT=FILE.pb     fix a graph input to a constant tensor (inputs that\n"
    "                           determine shapes, e.g. a Reshape target)\n"
    "  --external-weights       write weights to PLAN.safetensors next to the plan\n"
    "  --tokenizer DIR          the model's Hugging Face tokenizer, carried in the plan (by\n"
    "                           default the tokenizer.json beside the model, as Optimum's\n"
    "                           export folder has it, with tokenizer_config.json,\n"
    "                           chat_template.jinja and generation_config.json): sdrun then\n"
    "                           tokenizes text data, chats and stops without --tokenizer\n"
    "  --no-tokenizer           carry no tokenizer\n"
    "  --max-trip N             bound of an ONNX Loop whose trip count or stop is run-time\n"
    "                           data: it runs at most N times and the run fails if it needs more\n"
    "  --max-unroll N           a Loop or Scan of at most N iterations unrolls; a longer one\n"
    "                           runs as a loop step over its body (64; 0: never unroll)\n"
    "  --max-select N           an If on run-time data computes both branches and selects\n"
    "                           while the cheaper one costs at most N (multiply-adds, or\n"
    "                           result elements); above it an inference plan runs only the\n"
    "                           taken branch, as an If step (65536; 0: whenever it can)\n"
    "  --emit mlir|plan|import  mlir: print the final IR instead of writing a plan;\n"
    "                           import: print the sd IR straight after import\n"
    "  --print-ir-after-all     print the IR after every pass (to stderr)\n"
    "\n"
    "training (adds train_step, accumulate, apply and eval_step entries):\n"
    "  --peft none              full fine-tuning of every float weight (or --trainable)\n"
    "  --peft lora              LoRA adapters on --target-modules (other weights frozen)\n"
    "  --peft osft              orthogonal subspace fine-tuning on --target-modules: each\n"
    "                           weight split by SVD, the top singular directions frozen,\n"
    "                           the rest trained and kept orthogonal to them (PEFT's OSF)\n"
    "  --peft ia3               (IA)³: a trained vector scales each --target-modules layer's\n"
    "                           output, or its input for --feedforward-modules (PEFT's IA3)\n"
    "  --peft bitfit            BitFit: only the bias terms train (every layer's and\n"
    "                           normalization's stored bias; sdrun train --save-weights writes\n"
    "                           them, sdc merge --weights puts them back in the model)\n"
    "  --peft bottleneck        bottleneck adapters (AdapterHub's adapters library):\n"
    "                           up(act(down(u))) added to each feed-forward block's residual\n"
    "                           sum (and each attention block's, double_seq_bn) of a pre-LN or\n"
    "                           post-LN transformer; sdrun train --save-adapter writes AdapterHub's\n"
    "                           layout\n"
    "  --leave-out N,...        bottleneck: layers left without adapters (AdapterHub's leave_out)\n"
    "  --bottleneck-config C    seq_bn (Pfeiffer, the default: u the sum), double_seq_bn\n"
    "                           (Houlsby: u the block's output, swish), par_bn (parallel: u the\n"
    "                           block's input stream, scaling 4, mam_adapter start)\n"
    "  --reduction-factor R     hidden size / bottleneck size (16; par_bn 2)\n"
    "  --non-linearity F        relu, swish, silu, gelu, gelu_new, tanh, sigmoid or leakyrelu\n"
    "                           (the config's)\n"
    "  --adapter-scaling S      factor of the adapter's output (the config's: 1, par_bn 4), or\n"
    "                           learned (one trained factor) or channel (one per feature)\n"
    "  --use-gating             bottleneck: AdapterHub's gate, the output times the sequence\n"
    "                           mean of sigmoid(a linear map of the adapter's input)\n"
    "  --bottleneck-init I      bert (N(0, 0.02)), mam_adapter (up zero) or houlsby\n"
    "  --peft loha              LoHa: ΔW = (w1_a w1_b) ⊙ (w2_a w2_b) · alpha/r added to each\n"
    "                           --target-modules layer (PEFT's LoHa; --lora-r, --lora-alpha)\n"
    "  --quantize int4          an inference plan's linear layers as 4-bit weights (blocks of 32,\n"
    "                           symmetric), read by onnxruntime's MatMulNBits as the int4 models\n"
    "                           of onnxruntime-genai's builder are (activations in int8 per\n"
    "                           block where the CPU has AVX-512 VNNI); not with --peft\n"
    "  --quantize nf4           QLoRA: the frozen weight of every linear layer but the head\n"
    "                           stored as 4-bit NormalFloat (bitsandbytes' NF4, blocks of 64,\n"
    "                           bit for bit), dequantized where each op reads it; with an\n"
    "                           adapter method (--peft lora, ia3, loha, lokr, vera)\n"
    "  --peft dylora            DyLoRA: LoRA on each --target-modules layer trained at a rank\n"
    "                           drawn each step, block b of --lora-r/--dylora-block-size\n"
    "                           training, the blocks below it in play, scale alpha/(b+1)\n"
    "                           (LyCORIS's DyLoraModule), so any first k ranks work alone;\n"
    "                           saved as a PEFT LoRA (lora_alpha = alpha x block size)\n"
    "  --dylora-block-size N    dylora: ranks per block (1; must divide --lora-r)\n"
    "  --peft lokr              LoKr: ΔW = (W1 ⊗ W2) · alpha/r added to each --target-modules\n"
    "                           layer, W1 [a, c] and W2 [b, d] for out = a·b, in = c·d, W2 a\n"
    "                           rank-r product when r < max(b, d)/2 (PEFT's LoKr; --lora-r,\n"
    "                           --lora-alpha)\n"
    "  --decompose-both         lokr: W1 also a rank-r product when r < max(a, c)/2\n"
    "                           (PEFT's decompose_both)\n"
    "  --decompose-factor N     lokr: split each dimension as N x dim/N when N divides it\n"
    "                           (PEFT's decompose_factor; -1, the default: near the square root)\n"
    "  --peft vera              VeRA: one frozen random pair of projections shared by the\n"
    "                           --target-modules layers, two trained vectors per layer\n"
    "                           (PEFT's VeRA, its projections bit for bit; --lora-r, --seed as\n"
    "                           projection_prng_key)\n"
    "  --peft adalora           AdaLoRA: SVD-form adapters (lora_A, lora_E, lora_B) on\n"
    "                           --target-modules whose triplets a budget schedule prunes from\n"
    "                           --lora-r to --target-r per module over --total-step steps\n"
    "  --peft prompt            prompt tuning: trained embeddings of --num-virtual-tokens tokens\n"
    "                           put before every row's own (PEFT's prompt tuning); the logits\n"
    "                           cover the virtual tokens too, as PEFT's do; sft recipe only\n"
    "  --peft prefix            prefix tuning: trained keys and values of --num-virtual-tokens\n"
    "                           tokens before every row's own, in each attention layer\n"
    "                           (PEFT's prefix tuning, without prefix_projection); sft recipe only\n"
    "  --num-virtual-tokens N   prompt, prefix: how many virtual tokens (20)\n"
    "  --prefix-projection      prefix: train the keys and values through PEFT's two-layer MLP\n"
    "                           (prefix_projection); the adapter holds its output, as PEFT's\n"
    "  --encoder-hidden-size H  prefix-projection: the MLP's width (the key/value width)\n"
    "  --prompt-init random|vocab|text  prompt: N(0, 1) (PEFT's RANDOM, the default), the\n"
    "                           embeddings of random vocabulary tokens (SAMPLE_VOCAB), or\n"
    "                           of --prompt-init-text's tokens, repeated to fill (TEXT)\n"
    "  --prompt-init-text TEXT, --tokenizer DIR  prompt, text start: the text and the\n"
    "                           tokenizer (a folder holding tokenizer.json) that makes its tokens\n"
    "  --feedforward-modules LIST  ia3: the target layers whose input is scaled (PEFT's rule:\n"
    "                           a name ending in an entry, or a regex matching the whole name)\n"
    "  --target-modules LIST    comma list of sd.linear module names (a name matches\n"
    "                           itself or a suffix after a dot, as in PEFT), a regex\n"
    "                           that must match the whole name, or all-linear (every\n"
    "                           linear layer but the output head); not given: PEFT's\n"
    "                           default for the model's model_type (--model-type T, or\n"
    "                           the config.json beside the model, as Optimum exports it)\n"
    "  --model-type T           the transformers model_type (llama, gpt2, bert, qwen2, ...)\n"
    "                           whose PEFT default --target-modules to take\n"
    "  --osft-preserved-ratio R fraction of min(out, in) kept frozen, in (0, 1) (0.5;\n"
    "                           PEFT's effective_rank)\n"
    "  --osft-rank-pattern NAME=K|R,...  per-module preserved rank K or ratio R (NAME a\n"
    "                           regex searched in the module name; the first match wins)\n"
    "  --osft-strategy auto|factored|dense  factored layer, or W rebuilt once per step\n"
    "                           and one GEMM; auto picks the cheaper per module (auto)\n"
    "  --osft-v-rule gather|allreduce  under --shard params, how the V side's coefficients\n"
    "                           are completed: gather V_high (gather, right) or all-reduce\n"
    "                           per-rank products (allreduce: known wrong, for tests only)\n"
    "  --lora-r R, --lora-alpha A   rank (8) and scaling alpha (8): scale = A/R (LoRA, LoHa,\n"
    "                           LoKr; VeRA takes the rank; AdaLoRA: init_r (12), scale A/(R+1e-5))\n"
    "  --target-r N, --total-step N  adalora: the average triplets each module keeps (8) over\n"
    "                           the optimizer steps its budget spans (required; PEFT's names)\n"
    "  --tinit N, --tfinal N, --delta-t N  adalora: steps before the budget shrinks (0), at the\n"
    "                           end with a fixed pattern (0), between allocations (1)\n"
    "  --adalora-beta1 B, --adalora-beta2 B, --orth-reg-weight W  adalora: sensitivity and\n"
    "                           uncertainty EMAs (0.85, 0.85), orthogonality penalty (0.5)\n"
    "  --use-rslora             scale = A/sqrt(R)\n"
    "  --bias none|all|lora_only  lora: which of the model's biases train beside the adapters\n"
    "                           (PEFT's bias): none, every weight named like a bias (all,\n"
    "                           LayerNorm's too), or the adapted layers' own (lora_only)\n"
    "  --use-dora               weight-decomposed LoRA (DoRA, PEFT's use_dora): each layer\n"
    "                           also trains a magnitude per output, W's row norms at first\n"
    "  --lora-init default|gaussian|pissa|olora|loftq  how the adapters start (PEFT's\n"
    "                           init_lora_weights): A Kaiming-uniform or N(0, 1/r) and B = 0;\n"
    "                           or from each weight W, which is rewritten: pissa (W's top r\n"
    "                           singular triplets), olora (W's QR), loftq (NF4 quantization\n"
    "                           of W and an SVD of its error; use with --quantize nf4)\n"
    "  --loftq-iter N           loftq: rounds of quantization and SVD (1; PEFT's loftq_iter)\n"
    "  --lora-dropout P         dropout on each adapter's input while training (0; LoRA, DoRA,\n"
    "                           and VeRA's vera_dropout); masks are keyed by sdrun train\n"
    "                           --seed and saved in checkpoints\n"
    "  --seed S                 seed of the adapter initialization (0)\n"
    "  --dry-run                list what would train, the parameter count and the control\n"
    "                           flow decisions (If folded or selected, loops unrolled); write nothing\n"
    "  --infer-shapes INPUT=DxD shapes of the infer entry (default for training plans:\n"
    "                           --shapes with batch 1, the bucket sdrun generate uses,\n"
    "                           or the model's batch where the model fixes it)\n"
    "  --trainable REGEX        full fine-tuning of the weights whose name matches\n"
    "  --freeze REGEX           full fine-tuning: keep the weights whose name matches\n"
    "                           frozen (PyTorch's requires_grad=False, which exports\n"
    "                           do not record: Whisper's and Marian's sinusoidal positions)\n"
    "  --recipe sft|classify|dpo|simpo|orpo|kto|grpo\n"
    "                           sft: causal-LM cross-entropy on the logits (the default);\n"
    "                           classify: a new linear head (classifier, trained in full) on\n"
    "                           the model's features, cross-entropy against one label per\n"
    "                           row; data lines {\"text\": ..., \"label\": K}\n"
    "                           dpo, simpo, orpo: preference pairs, data lines {\"prompt\": ...,\n"
    "                           \"chosen\": ..., \"rejected\": ...}, each pair two rows of the batch;\n"
    "                           TRL's losses: dpo (DPOTrainer) against the model as training\n"
    "                           starts (the reference), simpo (CPOTrainer's simpo) and orpo\n"
    "                           (ORPOTrainer) without one\n"
    "                           kto: unpaired examples, data lines {\"prompt\": ..., \"completion\":\n"
    "                           ..., \"label\": true|false}, each two rows (the example, and its prompt\n"
    "                           with the previous example's completion for the KL estimate);\n"
    "                           TRL's KTOTrainer loss against the reference\n"
    "                           grpo: groups of scored completions of one prompt, data lines\n"
    "                           {\"prompt\": ..., \"completions\": [...], \"rewards\": [...]}, each\n"
    "                           --num-generations rows; TRL's GRPOTrainer loss (its default\n"
    "                           num_iterations 1: the completions' own step is the sampling policy)\n"
    "  --beta B                 dpo, simpo, orpo, kto: the loss's temperature (0.1, TRL's beta);\n"
    "                           grpo: the KL term's weight against the reference (0: none)\n"
    "  --num-generations G      grpo: completions per prompt (8); the plan's rows are groups of G\n"
    "  --grpo-loss dapo|grpo|bnpo|dr_grpo|cispo|sapo|luspo|vespo  grpo: TRL's loss_type (dapo: a mean\n"
    "                           over the optimizer step's tokens; grpo: over each completion's,\n"
    "                           then completions; bnpo: over each micro-batch's tokens; dr_grpo:\n"
    "                           sums over --max-completion-length per completion; cispo: the\n"
    "                           weight clipped at --grpo-epsilon-high and detached, times A log p,\n"
    "                           as dapo; sapo: a soft gate for the clip, as grpo; luspo: each\n"
    "                           completion's sum, then completions; vespo: VESPO's detached gamma\n"
    "                           weight of the completion's ratio times A log p, as dapo)\n"
    "  --vespo-k-pos K, --vespo-lambda-pos L, --vespo-k-neg K, --vespo-lambda-neg L  grpo loss\n"
    "                           vespo: the gamma weight's k and lambda by the advantage's sign\n"
    "                           (2, 3, 3, 2: TRL's)\n"
    "  --sapo-temperature-pos T, --sapo-temperature-neg T  grpo loss sapo: the gate's temperature\n"
    "                           for positive and other advantages (1, 1.05: TRL's)\n"
    "  --importance-sampling token|sequence  grpo: per-token weights, or GSPO's per sequence\n"
    "  --scale-rewards group|none  grpo: advantages over the group's std (the default) or not\n"
    "  --max-completion-length N  grpo: dr_grpo's constant length (512, TRL's)\n"
    "  --sampling-log-probs     grpo: the data gives the sampling policy's log-probability of each\n"
    "                           completion token (\"completion_logps\"), for groups an earlier policy\n"
    "                           sampled; the importance weight is then exp(log p - that), clipped:\n"
    "  --grpo-epsilon E, --grpo-epsilon-high E  to [1 - E, 1 + E_high] (0.2; E_high: E, DAPO's 0.28)\n"
    "  --grpo-delta D           and two-sided: the weight capped at D (> 1; off)\n"
    "  --desirable-weight W, --undesirable-weight W  kto: each kind's loss weight (1, 1)\n"
    "  --dpo-loss sigmoid|ipo|hinge  dpo: DPO's loss (the default), IPO's or the hinge\n"
    "  --simpo-gamma G          simpo: the target reward margin (0.5)\n"
    "  --cpo-alpha A            simpo: weight of the chosen completions' cross-entropy (1;\n"
    "                           0 is SimPO's paper)\n"
    "  --num-labels N           classes of --recipe classify\n"
    "  --pooling mean|cls       classify on [batch, seq, hidden] features: the mean over\n"
    "                           attention_mask's tokens (sentence-transformers) or the first\n"
    "                           token (mean)\n"
    "  --features-output NAME   classify: the features output, when the model has several\n"
    "  --logits-output NAME     the logits output, when the model has several\n"
    "  --token-input NAME       the int64 [batch, seq] token input sdrun train feeds (default:\n"
    "                           the only one, or the only one indexing an embedding)\n"
    "  --loss-output NAME       train on this scalar model output instead (a model that takes\n"
    "                           its labels and computes its loss; sdrun train feeds its\n"
    "                           inputs from a folder of NAME.npy arrays)\n"
    "  --optimizer adamw|sgd    default adamw (lr, weight decay and clipping are\n"
    "                           given to sdrun train at run time)\n"
    "  --adam-beta1 B, --adam-beta2 B, --adam-epsilon E   AdamW (0.9, 0.999, 1e-8)\n"
    "  --momentum M, --nesterov SGD momentum (0) and Nesterov\n"
    "  --bucket-mb MB           gradients reduced across ranks per step of about MB MiB,\n"
    "                           last layers first (25; 0: one step per gradient); each\n"
    "                           bucket's reduction starts as soon as the backward has\n"
    "                           finished its gradients and runs while the backward goes on\n"
    "  --no-overlap-reduction   reduce every bucket after the backward instead (blocking)\n"
    "  --shard none|optimizer|grads|params  optimizer: each parameter's AdamW/SGD state and\n"
    "                           update on one rank (ZeRO-1), which then broadcasts it; grads:\n"
    "                           its gradient too, reduced to that rank each micro-batch (ZeRO-2);\n"
    "                           params: every weight, gradient and optimizer state split by\n"
    "                           rows over the ranks, weights gathered just before each op that\n"
    "                           reads them (FSDP) (default none)\n"
    "  --packing                training rows hold several sequences: adds a position_ids\n"
    "                           input (positions restart per sequence; attention stays\n"
    "                           within each); sdrun train then packs instead of padding\n"
    "  --precision fp32|bf16|fp16  bf16/fp16: matrix products and attention in that type (f32\n"
    "                           accumulation), everything else, master weights and optimizer\n"
    "                           state in f32, as torch.autocast (default fp32); fp16 training\n"
    "                           adds dynamic loss scaling as torch.amp.GradScaler\n"
    "  --loss-scale-init S      fp16: the loss scale's first value (65536); it multiplies the\n"
    "                           summed loss (sdc divides by the token count after unscaling)\n"
    "  --loss-scale-window N    fp16: clean optimizer steps before the scale doubles (2000)\n"
    "  --kv-cache MAX_LENGTH    generation entries with key/value caches of MAX_LENGTH\n"
    "                           positions per row in plan state: prefill (a chunk of prompt\n"
    "                           tokens per row) and decode (one token per row), both taking\n"
    "                           position_ids; sdrun generate then decodes through the cache\n"
    "  --kv-batch B             rows generated together (default: the batch a model exported\n"
    "                           with fixed shapes has, else 1)\n"
    "  --prefill-chunk P        prompt tokens per prefill call (min(64, MAX_LENGTH)); longer\n"
    "                           prompts take several calls\n"
    "  --speculate K            a verify entry taking K + 1 tokens a row: sdrun generate and\n"
    "                           serve then guess up to K next tokens from the text so far\n"
    "                           (prompt lookup) and check them in one call when that pays\n"
    "                           (speculative decoding; the same tokens as without it)\n"
    "  --max-loras N            a serving plan for N LoRA adapters at once (vLLM's --max-loras):\n"
    "                           each row of a batch goes through its own adapter, of rank up\n"
    "                           to --lora-r on --target-modules; sdrun serve --lora-modules and\n"
    "                           generate --adapter load PEFT adapters into it; no training entries\n"
    "  --no-fuse LIST           leave these fusions out, to compare (on the CPU the plan computes\n"
    "                           the same bits either way, but for the gradients of grouped key/value\n"
    "                           heads, rounded once, the input gradient under joined-lora, the sums\n"
    "                           of gemm-accumulate (added in another order) and half-epilogues):\n"
    "                           joined-lora (LoRA adapters on the parts of one fused projection as one\n"
    "                           adapter on the whole, before its Split), gemm-epilogues (a GELU and\n"
    "                           its gradient folded into the matrix products around them),\n"
    "                           half-epilogues (those in bf16/fp16 plans, where the GELU then reads\n"
    "                           the unrounded product: bits differ from the unfused plan's),\n"
    "                           elementwise (chains of arithmetic, activations and half casts in one\n"
    "                           step), casts\n"
    "                           (half casts moved across transposes, splits and concats, and\n"
    "                           half-steps), half-steps (SwiGLU, rotary, norms and cross-entropy\n"
    "                           between casts run on the half values), attention-layout (attention on\n"
    "                           token-major q, k, v: no transposes or repeated key/value heads),\n"
    "                           attention-stats (the backward takes the forward's output and row\n"
    "                           statistics instead of recomputing them), swiglu (SwiGLU reads a\n"
    "                           fused gate/up projection as it is: no Split, no Concat), qkv-attention\n"
    "                           (attention reads a fused q|k|v projection as it is: no Split, no\n"
    "                           Concat), gemm-scale (LoRA's backward products scale by alpha\n"
    "                           instead of reading a scaled copy of the gradient), gemm-accumulate\n"
    "                           (a sum of matrix products, such as LoRA's base + scale * adapter,\n"
    "                           accumulated by the GEMMs onto their C, not written and added),\n"
    "                           norm-grad-sum\n"
    "                           (a norm's input gradient added to the residual gradient by the\n"
    "                           norm's backward step, not by an Add), grouped-updates (the\n"
    "                           optimizer's AdamW updates as one step per group of tensors),\n"
    "                           grouped-casts (the half copies of small weights made in one step\n"
    "                           at an entry's start), all\n"
    "  --verbose                print libonnx checker and shape-inference notes\n"
    "  -h, --help               show this help\n";

// The names --no-fuse takes and the pipeline switch each turns off
// (half-steps goes with casts too: the half steps read the moved casts).
struct NoFuse {
  const char *name;
  bool sd::PipelineOptions::*flag;
  const char *alsoBy = nullptr;
};
const NoFuse kNoFuse[] = {
    {"gemm-epilogues", &sd::PipelineOptions::gemmEpilogues},
    {"half-epilogues", &sd::PipelineOptions::halfEpilogues},
    {"elementwise", &sd::PipelineOptions::elementwiseFusion},
    {"casts", &sd::PipelineOptions::castMotion},
    {"half-steps", &sd::PipelineOptions::halfSteps, "casts"},
    {"attention-layout", &sd::PipelineOptions::attentionLayout},
    {"attention-stats", &sd::PipelineOptions::attentionStats},
    {"swiglu", &sd::PipelineOptions::packSwiglu},
    {"qkv-attention", &sd::PipelineOptions::qkvAttention},
    {"joined-lora", &sd::PipelineOptions::joinLora},
    {"gemm-scale", &sd::PipelineOptions::gemmScale},
    {"gemm-accumulate", &sd::PipelineOptions::gemmAccumulate},
    {"norm-grad-sum", &sd::PipelineOptions::normGradSum},
    {"grouped-updates", &sd::PipelineOptions::groupUpdates},
    {"grouped-casts", &sd::PipelineOptions::groupCasts},
};

std::string noFuseNames() {
  std::string names;
  for (const NoFuse &f : kNoFuse) names += std::string(f.name) + ", ";
  return names + "or all";
}

const char *kMergeUsage =
    "usage: sdc merge MODEL.onnx (--adapter DIR [--adapter-rank K] | --weights FILE.safetensors) -o MERGED.onnx\n"
    "\n"
    "Folds trained weights into the source model and writes a plain ONNX model\n"
    "that any ONNX runtime runs: an adapter in HF PEFT layout (LoRA: W += alpha/r *\n"
    "B A; DoRA: then each output row scaled to its magnitude; OSF: the low part\n"
    "replaced; IA3: W's rows and bias scaled, or its columns on a feedforward\n"
    "module; LoHa: W += (w1_a w1_b) * (w2_a w2_b) alpha/r; LoKr: W += kron(W1, W2) alpha/r; a weight shared by several layers, such as a tied embedding and head,\n"
    "is untied first so only the adapted layer changes), or the parameters saved by\n"
    "`sdrun train --save-weights` (full fine-tuning, matched by initializer name).\n"
    "--adapter-rank K merges a LoRA's first K ranks only, scaled alpha/K: a DyLoRA\n"
    "adapter (sdc compile --peft dylora) at rank K.\n";

// The value of flag argv[i]: after '=' in --flag=value, else the next
// argument (advancing i). False when there is none.
bool flagValue(int argc, char **argv, int &i, std::string &out) {
  std::string arg = argv[i];
  size_t eq = arg.find('=');
  if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
    out = arg.substr(eq + 1);
    return true;
  }
  if (i + 1 >= argc) return false;
  out = argv[++i];
  return true;
}

int fail(const std::string &msg) {
  std::fprintf(stderr, "sdc: error: %s\n", msg.c_str());
  return 1;
}

struct Args {
  std::string model, output, emit = "plan";
  std::string modelType; // --model-type (else config.json beside the model): PEFT's default targets
  std::vector<std::pair<std::string, std::string>> binds;
  sd::PipelineOptions pipeline;
  bool externalWeights = false, verbose = false, dryRun = false, noTokenizer = false;
  int64_t maxTrip = 0, maxUnroll = 64, maxSelect = 65536;
};

// The files of the tokenizer a plan carries: --tokenizer DIR's, else those of
// a tokenizer.json beside the model (Optimum's export folder), with the
// generation_config.json beside the tokenizer, else beside the model. None with --no-tokenizer, and a
// warning (not an error) when the one found beside the model cannot be read:
// the plan is still the model's.
bool tokenizerToCarry(const Args &a, std::vector<std::pair<std::string, std::string>> &files) {
  if (a.noTokenizer) return true;
  const std::string modelDir = a.model.find('/') == std::string::npos ? "." : a.model.substr(0, a.model.find_last_of('/'));
  std::string path = a.pipeline.promptTokenizer;
  const bool named = !path.empty();
  struct stat st;
  if (!named && ::stat((modelDir + "/tokenizer.json").c_str(), &st) == 0) path = modelDir;
  if (path.empty()) return true;
  auto read = sd::TokenizerFiles::read(path);
  sd::Status status = read.status();
  if (read.isOk()) status = sd::Tokenizer::fromFiles(read.value()).status();
  if (!status.isOk()) {
    if (named) return fail("--tokenizer: " + status.message()), false;
    std::fprintf(stderr, "sdc: warning: the plan carries no tokenizer: %s\n", status.message().c_str());
    return true;
  }
  sd::TokenizerFiles &t = read.value();
  const std::string tokDir = sd::parentDirectory(t.jsonName);
  if (t.generationConfigName.empty() && ::stat((modelDir + "/generation_config.json").c_str(), &st) == 0) {
    auto text = sd::readWholeFile(modelDir + "/generation_config.json"); // the model's, beside it
    if (!text.isOk()) return fail(text.status().message()), false;
    t.generationConfig = text.value();
    t.generationConfigName = modelDir + "/generation_config.json";
  }
  files = t.named();
  std::string names;
  for (const auto &f : files) names += (names.empty() ? "" : ", ") + f.first;
  std::fprintf(stderr, "sdc: the plan carries the tokenizer of %s (%s); --no-tokenizer leaves it out\n",
               tokDir == "." || tokDir.empty() ? "the current folder" : tokDir.c_str(), names.c_str());
  return true;
}

// What a transformers config.json beside the model (Optimum's export
// folder) says: its model_type and its longest position (max_position_embeddings,
// GPT-2's n_positions); empty and 0 without one, and `error` set when it is
// not JSON.
struct ModelConfig {
  std::string modelType, path, error;
  int64_t maxPositions = 0;
};
ModelConfig modelConfigOf(const std::string &model) {
  ModelConfig c;
  std::string dir = model.find('/') == std::string::npos ? "." : model.substr(0, model.find_last_of('/'));
  c.path = dir + "/config.json";
  struct stat st;
  if (::stat(c.path.c_str(), &st) != 0) return c;
  auto text = sd::readWholeFile(c.path);
  auto doc = text.isOk() ? sd::parseJson(text.value(), c.path) : sd::StatusOr<sd::Json>(text.status());
  if (!doc.isOk()) return c.error = doc.status().message(), c;
  if (const sd::Json *type = doc.value().get("model_type"); type && type->type == sd::Json::Type::String)
    c.modelType = type->str;
  for (const char *key : {"max_position_embeddings", "n_positions"})
    if (const sd::Json *n = doc.value().get(key); n && n->isInteger() && n->num > 0 && c.maxPositions == 0)
      c.maxPositions = int64_t(n->num);
  return c;
}

// Whether --peft takes --target-modules (and so has PEFT defaults for them).
bool takesTargets(const std::string &peft) {
  return peft == "lora" || peft == "loha" || peft == "lokr" || peft == "dylora" || peft == "vera" ||
         peft == "adalora" || peft == "ia3" || peft == "osft";
}
bool wantsDefaultTargets(const Args &a) {
  return a.pipeline.targetModules.empty() && takesTargets(a.pipeline.peft);
}
bool wantsDefaultBucket(const Args &a) {
  return a.pipeline.training() && a.pipeline.shapes.empty() && a.pipeline.dims.empty();
}

// A training plan given neither --shapes nor --dim: batches of 8 rows (GRPO:
// whole groups, at least 8 rows) of 512 tokens (fewer when the config.json
// says positions end sooner; one that is not JSON only loses that cap), bound
// by the driver to the model's named batch and sequence dims.
void defaultBucket(Args &a, const ModelConfig &config) {
  // GRPO's rows come in groups: a whole number of them.
  const int64_t group = a.pipeline.grpo() ? std::max<int64_t>(1, a.pipeline.numGenerations) : 1;
  a.pipeline.defaultBatch = (8 + group - 1) / group * group;
  a.pipeline.defaultSeq = config.maxPositions > 0 ? std::min<int64_t>(512, config.maxPositions) : 512;
}

// No --target-modules: PEFT's default for the model's model_type
// (--model-type, else the config.json's), as its configs pick it, said on
// stderr. Non-zero: the exit code of an error.
int defaultTargets(Args &a, const ModelConfig &config) {
  const std::string &peft = a.pipeline.peft;
  std::string type = a.modelType, from = "--model-type";
  if (type.empty()) {
    if (!config.error.empty()) return fail(config.error), 2;
    type = config.modelType, from = config.path;
  }
  if (type.empty()) return 0; // the per-method "needs --target-modules" errors follow
  auto d = sd::peftDefaultTargets(peft, type);
  if (!d)
    return fail("--peft " + peft + ": PEFT has no default target_modules for model_type '" + type + "' (" + from +
                "): give --target-modules (names, a regex or all-linear)"),
           2;
  a.pipeline.targetModules = d->targets;
  std::string note = "sdc: --target-modules " + d->targets;
  if (peft == "ia3" && a.pipeline.feedforwardModules.empty()) {
    a.pipeline.feedforwardModules = d->feedforward;
    if (!d->feedforward.empty()) note += " --feedforward-modules " + d->feedforward;
  }
  std::fprintf(stderr, "%s: PEFT's default for model_type '%s' (%s)\n", note.c_str(), type.c_str(), from.c_str());
  return 0;
}

int parseArgs(int argc, char **argv, Args &a) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return -1;
  }
  if (cmd == "--version") {
    std::printf("sdc %s\n", SD_VERSION);
    return -1;
  }
  if (cmd != "compile") return fail("unknown command '" + cmd + "' (commands: compile, merge)"), 2;
  bool lossScaleGiven = false, lokrGiven = false, dyloraGiven = false, bottleneckGiven = false, promptGiven = false, promptInitGiven = false, loftqIterGiven = false,
       adaloraGiven = false, loraRGiven = false;
  std::vector<std::string> preferenceFlags; // --beta, --dpo-loss, ... as given
  std::vector<std::string> grpoFlags;       // --num-generations, --grpo-loss, ... as given
  std::vector<std::string> clipFlags;       // --grpo-epsilon, --grpo-epsilon-high, --grpo-delta
  bool sapoFlags = false, vespoFlags = false; // --sapo-temperature-*, --vespo-* given
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string &out) { return flagValue(argc, argv, i, out); };
    std::string flag = arg.substr(0, arg.find('='));
    std::string v;
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return -1;
    } else if (flag == "-o" || flag == "--output") {
      if (!value(a.output)) return fail(flag + " needs a value"), 2;
    } else if (flag == "--shapes") {
      if (!value(v)) return fail("--shapes needs INPUT=DxD"), 2;
      a.pipeline.shapes.push_back(v);
    } else if (flag == "--infer-shapes") {
      if (!value(v)) return fail("--infer-shapes needs INPUT=DxD"), 2;
      a.pipeline.inferShapes.push_back(v);
    } else if (flag == "--dim") {
      if (!value(v)) return fail("--dim needs NAME=N"), 2;
      a.pipeline.dims.push_back(v);
    } else if (flag == "--bind") {
      if (!value(v) || v.find('=') == std::string::npos || v.find('=') == 0) return fail("--bind needs INPUT=FILE.pb"), 2;
      a.binds.push_back({v.substr(0, v.find('=')), v.substr(v.find('=') + 1)});
    } else if (flag == "--emit") {
      if (!value(a.emit) || (a.emit != "mlir" && a.emit != "plan" && a.emit != "import"))
        return fail("--emit takes 'mlir', 'plan' or 'import'"), 2;
    } else if (flag == "--peft") {
      if (!value(a.pipeline.peft) || (a.pipeline.peft != "none" && a.pipeline.peft != "lora" && a.pipeline.peft != "osft" &&
                                      a.pipeline.peft != "ia3" && a.pipeline.peft != "loha" && a.pipeline.peft != "lokr" &&
                                      a.pipeline.peft != "dylora" && a.pipeline.peft != "vera" && a.pipeline.peft != "prompt" &&
                                      a.pipeline.peft != "prefix" && a.pipeline.peft != "adalora" &&
                                      a.pipeline.peft != "bottleneck" && a.pipeline.peft != "bitfit"))
        return fail("--peft takes 'none', 'lora', 'osft', 'ia3', 'loha', 'lokr', 'dylora', 'vera', 'adalora', 'prompt', "
                    "'prefix', 'bottleneck' or 'bitfit'"), 2;
    } else if (flag == "--feedforward-modules") {
      if (!value(a.pipeline.feedforwardModules) || a.pipeline.feedforwardModules.empty())
        return fail("--feedforward-modules needs module names or a regex"), 2;
    } else if (flag == "--osft-preserved-ratio") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      if (v.empty() || *end || !(d > 0 && d < 1)) return fail("--osft-preserved-ratio must be a number in (0, 1)"), 2;
      a.pipeline.osftRatio = d;
    } else if (flag == "--osft-rank-pattern") {
      if (!value(a.pipeline.osftRankPattern) || a.pipeline.osftRankPattern.empty())
        return fail("--osft-rank-pattern needs NAME=K|R[,NAME=K|R...]"), 2;
    } else if (flag == "--osft-v-rule") {
      std::string &r = a.pipeline.osftVRule;
      if (!value(r) || (r != "gather" && r != "allreduce")) return fail("--osft-v-rule takes 'gather' or 'allreduce'"), 2;
    } else if (flag == "--osft-strategy") {
      std::string &st = a.pipeline.osftStrategy;
      if (!value(st) || (st != "auto" && st != "factored" && st != "dense"))
        return fail("--osft-strategy takes 'auto', 'factored' or 'dense'"), 2;
    } else if (flag == "--model-type") {
      if (!value(a.modelType) || a.modelType.empty()) return fail("--model-type needs a transformers model_type"), 2;
    } else if (flag == "--target-modules") {
      if (!value(a.pipeline.targetModules) || a.pipeline.targetModules.empty())
        return fail("--target-modules needs module names or a regex"), 2;
    } else if (flag == "--lora-r" || flag == "--seed") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : -1;
      if (v.empty() || *end || n < (flag == "--seed" ? 0 : 1) || n > (1 << 20))
        return fail(flag + " needs a " + (flag == "--seed" ? "non-negative" : "positive") + " integer"), 2;
      (flag == "--seed" ? a.pipeline.seed : a.pipeline.loraR) = n;
      loraRGiven |= flag == "--lora-r";
    } else if (flag == "--dylora-block-size") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : -1;
      if (v.empty() || *end || n < 1 || n > (1 << 20)) return fail("--dylora-block-size needs a positive integer"), 2;
      a.pipeline.dyloraBlockSize = n;
      dyloraGiven = true;
    } else if (flag == "--kv-cache" || flag == "--kv-batch" || flag == "--prefill-chunk" || flag == "--speculate" ||
               flag == "--max-loras") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : -1;
      if (v.empty() || *end || n < 1 || n > (1 << 24)) return fail(flag + " needs a positive integer"), 2;
      (flag == "--kv-cache"        ? a.pipeline.kvCache
       : flag == "--kv-batch"      ? a.pipeline.kvBatch
       : flag == "--prefill-chunk" ? a.pipeline.prefillChunk
       : flag == "--max-loras"     ? a.pipeline.maxLoras
                                   : a.pipeline.speculate) = n;
    } else if (flag == "--lora-alpha" || flag == "--lora-dropout") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      if (v.empty() || *end || !(d >= 0 && d < 1e6)) return fail(flag + " needs a non-negative number"), 2;
      if (flag == "--lora-dropout" && !(d < 1)) return fail("--lora-dropout must be below 1"), 2;
      (flag == "--lora-alpha" ? a.pipeline.loraAlpha : a.pipeline.loraDropout) = d;
    } else if (flag == "--quantize") {
      if (!value(a.pipeline.quantize) || (a.pipeline.quantize != "nf4" && a.pipeline.quantize != "int4"))
        return fail("--quantize takes 'nf4' (QLoRA's base weights) or 'int4' (an inference plan's)"), 2;
    } else if (flag == "--target-r" || flag == "--tinit" || flag == "--tfinal" || flag == "--delta-t" ||
               flag == "--total-step") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : -1;
      if (v.empty() || *end || n < 0 || n > (1LL << 40)) return fail(flag + " needs a whole number"), 2;
      (flag == "--target-r"  ? a.pipeline.adaloraTargetR
       : flag == "--tinit"   ? a.pipeline.adaloraTinit
       : flag == "--tfinal"  ? a.pipeline.adaloraTfinal
       : flag == "--delta-t" ? a.pipeline.adaloraDeltaT
                             : a.pipeline.totalStep) = n;
      adaloraGiven = true;
    } else if (flag == "--adalora-beta1" || flag == "--adalora-beta2" || flag == "--orth-reg-weight") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      if (v.empty() || *end || !(d >= 0 && d < 1e6)) return fail(flag + " needs a non-negative number"), 2;
      (flag == "--adalora-beta1"   ? a.pipeline.adaloraBeta1
       : flag == "--adalora-beta2" ? a.pipeline.adaloraBeta2
                                   : a.pipeline.orthRegWeight) = d;
      adaloraGiven = true;
    } else if (flag == "--prefix-projection") {
      a.pipeline.prefixProjection = true;
    } else if (flag == "--encoder-hidden-size") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : 0;
      if (v.empty() || *end || n < 1 || n > (1 << 20)) return fail("--encoder-hidden-size needs a positive integer"), 2;
      a.pipeline.encoderHiddenSize = n;
    } else if (flag == "--num-virtual-tokens") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : 0;
      if (v.empty() || *end || n < 1 || n > 65536) return fail("--num-virtual-tokens needs an integer from 1 to 65536"), 2;
      a.pipeline.virtualTokens = n;
      promptGiven = true;
    } else if (flag == "--prompt-init") {
      std::string &init = a.pipeline.promptInit;
      if (!value(init) || (init != "random" && init != "vocab" && init != "text"))
        return fail("--prompt-init takes 'random', 'vocab' or 'text'"), 2;
      promptInitGiven = true;
    } else if (flag == "--prompt-init-text") {
      if (!value(a.pipeline.promptInitText) || a.pipeline.promptInitText.empty())
        return fail("--prompt-init-text needs the text whose tokens start the prompt"), 2;
    } else if (flag == "--tokenizer") {
      if (!value(a.pipeline.promptTokenizer) || a.pipeline.promptTokenizer.empty())
        return fail("--tokenizer needs a folder holding tokenizer.json"), 2;
    } else if (flag == "--bottleneck-config") {
      if (!value(a.pipeline.bottleneckConfig) || !sd::bottleneckDefaults(a.pipeline.bottleneckConfig))
        return fail("--bottleneck-config takes seq_bn, double_seq_bn or par_bn"), 2;
      bottleneckGiven = true;
    } else if (flag == "--adapter-scaling") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      if (v == "learned" || v == "channel") a.pipeline.bottleneckScalingKind = v;
      else if (v.empty() || *end || !(d > 0) || !std::isfinite(d))
        return fail("--adapter-scaling needs a positive number, learned or channel"), 2;
      else a.pipeline.bottleneckScaling = d;
      bottleneckGiven = true;
    } else if (arg == "--use-gating") {
      a.pipeline.bottleneckGating = true;
      bottleneckGiven = true;
    } else if (flag == "--reduction-factor") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      if (v.empty() || *end || !(d > 0) || !std::isfinite(d)) return fail(flag + " needs a positive number"), 2;
      a.pipeline.reductionFactor = d;
      bottleneckGiven = true;
    } else if (flag == "--non-linearity") {
      const auto &known = sd::kBottleneckActivations;
      if (!value(a.pipeline.nonLinearity) || !std::count(std::begin(known), std::end(known), a.pipeline.nonLinearity))
        return fail("--non-linearity takes relu, swish, silu, gelu, gelu_new, tanh, sigmoid or leakyrelu"), 2;
      bottleneckGiven = true;
    } else if (flag == "--leave-out") {
      if (!value(a.pipeline.bottleneckLeaveOut) || a.pipeline.bottleneckLeaveOut.empty() ||
          a.pipeline.bottleneckLeaveOut.find_first_not_of("0123456789,") != std::string::npos)
        return fail("--leave-out takes layer numbers separated by commas (0,3)"), 2;
      bottleneckGiven = true;
    } else if (flag == "--bottleneck-init") {
      const std::string &i = a.pipeline.bottleneckInit;
      if (!value(a.pipeline.bottleneckInit) || (i != "bert" && i != "mam_adapter" && i != "houlsby"))
        return fail("--bottleneck-init takes bert, mam_adapter or houlsby"), 2;
      bottleneckGiven = true;
    } else if (arg == "--decompose-both") {
      a.pipeline.decomposeBoth = true;
      lokrGiven = true;
    } else if (flag == "--decompose-factor") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : 0;
      if (v.empty() || *end || n == 0 || n < -1 || n > (1 << 24))
        return fail("--decompose-factor needs a positive integer or -1"), 2;
      a.pipeline.decomposeFactor = n;
      lokrGiven = true;
    } else if (arg == "--use-rslora") {
      a.pipeline.rslora = true;
    } else if (arg == "--use-dora") {
      a.pipeline.useDora = true;
    } else if (flag == "--bias") {
      std::string &b = a.pipeline.bias;
      if (!value(b) || (b != "none" && b != "all" && b != "lora_only"))
        return fail("--bias takes 'none', 'all' or 'lora_only'"), 2;
    } else if (flag == "--lora-init") {
      const std::string &init = a.pipeline.loraInit;
      if (!value(a.pipeline.loraInit) || (init != "default" && init != "gaussian" && init != "pissa" &&
                                          init != "olora" && init != "loftq"))
        return fail("--lora-init takes default, gaussian, pissa, olora or loftq"), 2;
    } else if (flag == "--loftq-iter") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : 0;
      if (v.empty() || *end || n < 1 || n > 1000) return fail("--loftq-iter needs an integer from 1 to 1000"), 2;
      a.pipeline.loftqIter = n;
      loftqIterGiven = true;
    } else if (flag == "--max-select") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : -1;
      if (v.empty() || *end || n < 0 || n > (1LL << 62))
        return fail("--max-select needs an integer from 0 to " + std::to_string(1LL << 62)), 2;
      a.maxSelect = n;
    } else if (flag == "--max-trip" || flag == "--max-unroll") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : -1;
      // A bound only counts iterations; an unrolled copy costs compile time and plan size.
      const long long lo = flag == "--max-trip" ? 1 : 0, hi = flag == "--max-trip" ? INT32_MAX : (1 << 20);
      if (v.empty() || *end || n < lo || n > hi)
        return fail(flag + " needs an integer from " + std::to_string(lo) + " to " + std::to_string(hi)), 2;
      (flag == "--max-trip" ? a.maxTrip : a.maxUnroll) = n;
    } else if (arg == "--dry-run") {
      a.dryRun = true;
    } else if (flag == "--trainable") {
      if (!value(a.pipeline.trainable)) return fail("--trainable needs a regex"), 2;
      a.pipeline.peft = "none";
    } else if (flag == "--freeze") {
      if (!value(a.pipeline.freeze) || a.pipeline.freeze.empty()) return fail("--freeze needs a regex"), 2;
    } else if (flag == "--recipe") {
      if (!value(a.pipeline.recipe) || (a.pipeline.recipe != "sft" && a.pipeline.recipe != "classify" &&
                                        !a.pipeline.preference() && !a.pipeline.grpo()))
        return fail("--recipe takes 'sft', 'classify', 'dpo', 'simpo', 'orpo', 'kto' or 'grpo'"), 2;
    } else if (flag == "--beta" || flag == "--simpo-gamma" || flag == "--cpo-alpha" || flag == "--desirable-weight" ||
               flag == "--undesirable-weight") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      if (v.empty() || *end || !(d >= 0) || !(d < 1e6)) return fail(flag + " needs a non-negative number"), 2;
      (flag == "--beta"                 ? a.pipeline.beta
       : flag == "--simpo-gamma"        ? a.pipeline.simpoGamma
       : flag == "--cpo-alpha"          ? a.pipeline.cpoAlpha
       : flag == "--desirable-weight"   ? a.pipeline.desirableWeight
                                        : a.pipeline.undesirableWeight) = d;
      preferenceFlags.push_back(flag);
    } else if (flag == "--dpo-loss") {
      std::string &l = a.pipeline.dpoLoss;
      if (!value(l) || (l != "sigmoid" && l != "ipo" && l != "hinge"))
        return fail("--dpo-loss takes 'sigmoid', 'ipo' or 'hinge'"), 2;
      preferenceFlags.push_back(flag);
    } else if (flag == "--num-generations" || flag == "--max-completion-length") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : -1;
      const bool groups = flag == "--num-generations";
      if (v.empty() || *end || n < (groups ? 2 : 1) || n > (groups ? 4096 : (1 << 30)))
        return fail(flag + (groups ? " needs an integer from 2 to 4096 (a group's advantages compare its completions)"
                                   : " needs a positive integer")),
               2;
      (groups ? a.pipeline.numGenerations : a.pipeline.maxCompletionLength) = n;
      grpoFlags.push_back(flag);
    } else if (flag == "--sampling-log-probs") {
      a.pipeline.samplingLogProbs = true;
      grpoFlags.push_back(flag);
    } else if (flag == "--grpo-epsilon" || flag == "--grpo-epsilon-high" || flag == "--grpo-delta") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      const bool delta = flag == "--grpo-delta", low = flag == "--grpo-epsilon";
      if (v.empty() || *end || !(delta ? d > 1 && d < 1e6 : d >= 0 && d < (low ? 1 : 1e6)))
        return fail(flag + (delta ? " needs a number above 1" : low ? " needs a number in [0, 1)" : " needs a non-negative number")),
               2;
      (delta ? a.pipeline.grpoDelta : low ? a.pipeline.grpoEpsilon : a.pipeline.grpoEpsilonHigh) = d;
      grpoFlags.push_back(flag);
      clipFlags.push_back(flag);
    } else if (flag == "--vespo-k-pos" || flag == "--vespo-lambda-pos" || flag == "--vespo-k-neg" ||
               flag == "--vespo-lambda-neg") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      const bool lambda = flag.find("lambda") != std::string::npos;
      if (v.empty() || *end || !(lambda ? d > 0 && d < 1e6 : d >= 0 && d < 1e6))
        return fail(flag + (lambda ? " needs a positive number" : " needs a non-negative number")), 2;
      (flag == "--vespo-k-pos"        ? a.pipeline.vespoKPos
       : flag == "--vespo-lambda-pos" ? a.pipeline.vespoLambdaPos
       : flag == "--vespo-k-neg"      ? a.pipeline.vespoKNeg
                                      : a.pipeline.vespoLambdaNeg) = d;
      grpoFlags.push_back(flag);
      vespoFlags = true;
    } else if (flag == "--sapo-temperature-pos" || flag == "--sapo-temperature-neg") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      if (v.empty() || *end || !(d > 0 && d < 1e6)) return fail(flag + " needs a positive number"), 2;
      (flag == "--sapo-temperature-pos" ? a.pipeline.sapoTemperaturePos : a.pipeline.sapoTemperatureNeg) = d;
      grpoFlags.push_back(flag);
      sapoFlags = true;
    } else if (flag == "--grpo-loss" || flag == "--importance-sampling" || flag == "--scale-rewards") {
      std::string &to = flag == "--grpo-loss"             ? a.pipeline.grpoLoss
                        : flag == "--importance-sampling" ? a.pipeline.importanceSampling
                                                          : a.pipeline.scaleRewards;
      const char *choices = flag == "--grpo-loss"             ? "'dapo', 'grpo', 'bnpo', 'dr_grpo', 'cispo', 'sapo', 'luspo' or 'vespo'"
                            : flag == "--importance-sampling" ? "'token' or 'sequence'"
                                                              : "'group' or 'none'";
      if (!value(to) || std::string(choices).find("'" + to + "'") == std::string::npos)
        return fail(flag + " takes " + choices +
                    (flag == "--scale-rewards" && to == "batch"
                         ? " (TRL's 'batch' takes the std over its whole generation batch, which a micro-batch does "
                           "not see)"
                         : "")),
               2;
      grpoFlags.push_back(flag);
    } else if (flag == "--num-labels") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : -1;
      if (v.empty() || *end || n < 2 || n > (1 << 20)) return fail("--num-labels needs an integer from 2 to 1048576"), 2;
      a.pipeline.numLabels = n;
    } else if (flag == "--pooling") {
      if (!value(a.pipeline.pooling) || (a.pipeline.pooling != "mean" && a.pipeline.pooling != "cls"))
        return fail("--pooling takes 'mean' or 'cls'"), 2;
    } else if (flag == "--features-output") {
      if (!value(a.pipeline.featuresOutput) || a.pipeline.featuresOutput.empty())
        return fail("--features-output needs an output name"), 2;
    } else if (flag == "--token-input") {
      if (!value(a.pipeline.tokenInput) || a.pipeline.tokenInput.empty()) return fail("--token-input needs an input name"), 2;
    } else if (flag == "--loss-output" || flag == "--logits-output") {
      if (!value(flag == "--loss-output" ? a.pipeline.lossOutput : a.pipeline.logitsOutput))
        return fail(flag + " needs an output name"), 2;
    } else if (flag == "--optimizer") {
      if (!value(a.pipeline.optimizer) || (a.pipeline.optimizer != "adamw" && a.pipeline.optimizer != "sgd"))
        return fail("--optimizer takes 'adamw' or 'sgd'"), 2;
    } else if (flag == "--adam-beta1" || flag == "--adam-beta2" || flag == "--adam-epsilon" || flag == "--momentum") {
      double *dst = flag == "--adam-beta1" ? &a.pipeline.beta1 : flag == "--adam-beta2" ? &a.pipeline.beta2
                  : flag == "--adam-epsilon" ? &a.pipeline.epsilon : &a.pipeline.momentum;
      char *end = nullptr;
      if (!value(v) || v.empty() || (*dst = std::strtod(v.c_str(), &end), *end) || !(*dst >= 0 && *dst < 1e3))
        return fail(flag + " needs a non-negative number"), 2;
      // A decay rate of 1 or more never forgets (Adam's bias correction divides by 1 - beta^t).
      if ((flag == "--adam-beta1" || flag == "--adam-beta2" || flag == "--momentum") && !(*dst < 1))
        return fail(flag + " must be below 1, got " + v), 2;
      if (flag == "--adam-epsilon" && !(*dst > 0)) return fail("--adam-epsilon must be positive, got " + v), 2;
    } else if (flag == "--bucket-mb") {
      char *end = nullptr;
      if (!value(v) || v.empty() || (a.pipeline.bucketMb = std::strtod(v.c_str(), &end), *end) ||
          !(a.pipeline.bucketMb >= 0 && a.pipeline.bucketMb <= 1e6))
        return fail("--bucket-mb needs a size in MiB from 0 to 1e6, got '" + v + "'"), 2;
    } else if (arg == "--no-overlap-reduction") {
      a.pipeline.overlapReduction = false;
    } else if (flag == "--shard") {
      if (!value(a.pipeline.shard)) return fail("--shard needs none, optimizer, grads or params"), 2;
      if (a.pipeline.shard != "none" && a.pipeline.shard != "optimizer" && a.pipeline.shard != "grads" &&
          a.pipeline.shard != "params")
        return fail("--shard takes none, optimizer, grads or params, got '" + a.pipeline.shard + "'"), 2;
    } else if (arg == "--nesterov") {
      a.pipeline.nesterov = true;
    } else if (arg == "--packing") {
      a.pipeline.packing = true;
    } else if (flag == "--no-fuse") {
      if (!value(v)) return fail("--no-fuse needs a list: " + noFuseNames()), 2;
      for (size_t at = 0; at <= v.size();) {
        size_t comma = std::min(v.find(',', at), v.size());
        std::string item = v.substr(at, comma - at);
        at = comma + 1;
        const bool all = item == "all";
        bool known = all;
        for (const NoFuse &f : kNoFuse)
          if (all || item == f.name || (f.alsoBy && item == f.alsoBy)) {
            a.pipeline.*f.flag = false;
            known = true;
          }
        if (!known) return fail("--no-fuse takes " + noFuseNames() + ", got '" + item + "'"), 2;
      }
    } else if (arg == "--precision") {
      if (!value(a.pipeline.precision)) return fail("--precision needs fp32, bf16 or fp16"), 2;
      if (a.pipeline.precision != "fp32" && a.pipeline.precision != "bf16" && a.pipeline.precision != "fp16")
        return fail("--precision takes fp32, bf16 or fp16, got '" + a.pipeline.precision + "'"), 2;
    } else if (flag == "--loss-scale-init") {
      char *end = nullptr;
      double d = value(v) ? std::strtod(v.c_str(), &end) : -1;
      if (v.empty() || *end || !(d > 0 && d <= 1e30)) return fail("--loss-scale-init needs a positive number"), 2;
      a.pipeline.lossScaleInit = d;
      lossScaleGiven = true;
    } else if (flag == "--loss-scale-window") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : 0; // the f32 step tracker counts exactly to 2^24
      if (v.empty() || *end || n < 1 || n > (1ll << 24))
        return fail("--loss-scale-window needs a whole number of steps from 1 to 16777216"), 2;
      a.pipeline.lossScaleWindow = n;
      lossScaleGiven = true;
    } else if (arg == "--external-weights") {
      a.externalWeights = true;
    } else if (arg == "--no-tokenizer") {
      a.noTokenizer = true;
    } else if (arg == "--print-ir-after-all") {
      a.pipeline.printIrAfterAll = true;
    } else if (arg == "--verbose") {
      a.verbose = true;
    } else if (!arg.empty() && arg[0] == '-') {
      return fail("unknown option '" + arg + "' (see sdc compile --help)"), 2;
    } else if (a.model.empty()) {
      a.model = arg;
    } else {
      return fail("unexpected argument '" + arg + "'"), 2;
    }
  }
  if (a.model.empty()) return fail("no model given (see sdc compile --help)"), 2;
  if (a.pipeline.maxLoras > 0) { // a serving plan of LoRA slots: what it leaves out
    if (a.pipeline.peft.empty()) a.pipeline.peft = "lora";
    if (a.pipeline.kvCache == 0) return fail("--max-loras makes a plan for cached generation: it needs --kv-cache MAX_LENGTH"), 2;
    const char *refused = a.pipeline.peft != "lora"         ? "--peft other than lora"
                          : a.pipeline.useDora               ? "--use-dora (a magnitude per adapter)"
                          : a.pipeline.loraInit != "default" && a.pipeline.loraInit != "gaussian"
                              ? "--lora-init pissa, olora or loftq (they rewrite the base weights the adapters share)"
                          : a.pipeline.bias != "none"        ? "--bias (biases per adapter)"
                          : a.pipeline.recipe != "sft"       ? "--recipe (it has no training entries)"
                          : a.pipeline.loraDropout > 0       ? "--lora-dropout (it has no training entries)"
                                                             : nullptr;
    if (refused) return fail(std::string("--max-loras does not take ") + refused), 2;
  }
  if (!a.pipeline.training() && a.pipeline.kvCache == 0 &&
      (!a.pipeline.lossOutput.empty() || !a.pipeline.logitsOutput.empty()))
    return fail("--loss-output/--logits-output need a training plan: add --peft none"), 2;
  if (a.emit == "plan" && a.output.empty() && !a.dryRun) return fail("no output given: use -o PLAN.sdp"), 2;
  if (!a.modelType.empty() && a.pipeline.targetModules.empty() && !takesTargets(a.pipeline.peft))
    return fail("--model-type picks PEFT's default --target-modules: it needs an adapter method that takes them "
                "(--peft lora, loha, lokr, dylora, vera, adalora, ia3 or osft)"),
           2;
  if (wantsDefaultTargets(a) || wantsDefaultBucket(a)) { // config.json read once, for both
    const ModelConfig config = modelConfigOf(a.model);
    if (wantsDefaultTargets(a))
      if (int rc = defaultTargets(a, config); rc) return rc;
    if (wantsDefaultBucket(a)) defaultBucket(a, config);
  }
  if (a.pipeline.peft == "lora" && a.pipeline.targetModules.empty())
    return fail("--peft lora needs --target-modules, or --model-type (or a config.json beside the model) for PEFT's "
                "default (see sdc compile --dry-run --peft lora --target-modules .*)"), 2;
  if (a.pipeline.peft == "osft" && a.pipeline.targetModules.empty())
    return fail("--peft osft needs --target-modules (all-linear, names or a regex), or --model-type for PEFT's default"), 2;
  if ((a.pipeline.peft == "ia3" || a.pipeline.peft == "loha" || a.pipeline.peft == "lokr" || a.pipeline.peft == "vera" ||
       a.pipeline.peft == "dylora" ||
       a.pipeline.peft == "adalora") &&
      a.pipeline.targetModules.empty())
    return fail("--peft " + a.pipeline.peft + " needs --target-modules (all-linear, names or a regex), or --model-type "
                "for PEFT's default"), 2;
  if (a.pipeline.peft == "bitfit" && !a.pipeline.targetModules.empty())
    return fail("--peft bitfit trains every bias term; --target-modules does not apply"), 2;
  if (a.pipeline.peft == "bitfit" && !a.pipeline.quantize.empty())
    return fail("--peft bitfit does not take --quantize yet"), 2;
  if ((a.pipeline.peft == "none" || a.pipeline.peft.empty()) && !a.pipeline.targetModules.empty())
    return fail("--target-modules needs --peft lora, osft, ia3, loha, lokr, dylora, vera or adalora"), 2;
  if (dyloraGiven && a.pipeline.peft != "dylora") return fail("--dylora-block-size needs --peft dylora"), 2;
  if (a.pipeline.peft == "dylora") {
    if (a.pipeline.loraR % a.pipeline.dyloraBlockSize != 0)
      return fail("--dylora-block-size (" + std::to_string(a.pipeline.dyloraBlockSize) + ") must divide --lora-r (" +
                  std::to_string(a.pipeline.loraR) + ")"), 2;
    // What is built: f32 adapters, each block an optimizer step of its own, over replicated ranks.
    const char *refused = a.pipeline.shard != "none" ? "--shard (each block steps on its own; ranks hold whole adapters)"
                          : !a.pipeline.quantize.empty() ? "--quantize"
                                                         : nullptr;
    if (refused) return fail(std::string("--peft dylora does not take ") + refused + " yet"), 2;
  }
  if (bottleneckGiven && a.pipeline.peft != "bottleneck")
    return fail("--bottleneck-config, --reduction-factor, --non-linearity, --adapter-scaling, --use-gating, "
                "--bottleneck-init and --leave-out need --peft bottleneck"), 2;
  if (a.pipeline.peft == "bottleneck") {
    // What is built: the adapters of a pre-LN transformer, in f32, replicated over ranks.
    if (!a.pipeline.targetModules.empty())
      return fail("--peft bottleneck adapts whole blocks, not the layers --target-modules names; --leave-out N,... "
                  "leaves layers out"), 2;
    const char *refused = !a.pipeline.quantize.empty()      ? "--quantize"
                          : a.pipeline.recipe != "sft" && a.pipeline.recipe != "classify"
                              ? "--recipe other than sft or classify"
                              : nullptr;
    if (refused) return fail(std::string("--peft bottleneck does not take ") + refused + " yet"), 2;
  }
  if (lokrGiven && a.pipeline.peft != "lokr") return fail("--decompose-both and --decompose-factor need --peft lokr"), 2;
  if (adaloraGiven && a.pipeline.peft != "adalora")
    return fail("--target-r, --tinit, --tfinal, --delta-t, --total-step, --adalora-beta1/2 and --orth-reg-weight "
                "need --peft adalora"), 2;
  if (a.pipeline.peft == "adalora") {
    if (!loraRGiven) a.pipeline.loraR = 12; // PEFT's init_r
    // What is built: the allocation over whole tensors (replicated ranks), no adapter dropout.
    const char *refused = a.pipeline.shard != "none"    ? "--shard (the allocation ranks every triplet at once)"
                          : a.pipeline.loraDropout > 0 ? "--lora-dropout"
                                                       : nullptr;
    if (refused) return fail(std::string("--peft adalora does not take ") + refused + " yet"), 2;
    if (a.pipeline.totalStep < 1)
      return fail("--peft adalora needs --total-step N: the optimizer steps its budget schedule spans (PEFT's "
                  "total_step)"), 2;
  }
  const bool promptLearning = a.pipeline.peft == "prompt" || a.pipeline.peft == "prefix";
  if (promptGiven && !promptLearning) return fail("--num-virtual-tokens needs --peft prompt or prefix"), 2;
  if (a.pipeline.prefixProjection && a.pipeline.peft != "prefix")
    return fail("--prefix-projection needs --peft prefix (PEFT's prefix_projection)"), 2;
  if (a.pipeline.encoderHiddenSize > 0 && !a.pipeline.prefixProjection)
    return fail("--encoder-hidden-size is the prefix MLP's width: it needs --prefix-projection"), 2;
  if (a.pipeline.prefixProjection && a.pipeline.shard == "params")
    return fail("--prefix-projection does not take --shard params yet"), 2;
  if (promptInitGiven && a.pipeline.peft != "prompt")
    return fail("--prompt-init needs --peft prompt (prefix tuning starts from N(0, 1), as PEFT's)"), 2;
  const bool textInit = a.pipeline.promptInit == "text";
  if (textInit && (a.pipeline.promptInitText.empty() || a.pipeline.promptTokenizer.empty()))
    return fail("--prompt-init text needs --prompt-init-text TEXT and --tokenizer DIR (PEFT's prompt_tuning_init_text "
                "and tokenizer_name_or_path)"),
           2;
  if (!textInit && !a.pipeline.promptInitText.empty())
    return fail("--prompt-init-text needs --prompt-init text"), 2;
  if (a.noTokenizer && !a.pipeline.promptTokenizer.empty() && !textInit)
    return fail("--no-tokenizer and --tokenizer DIR contradict each other"), 2;
  if (promptLearning) {
    // What is built: the sft recipe's cross-entropy on whole rows, each behind the prompt.
    const char *refused = !a.pipeline.targetModules.empty() ? "--target-modules (it adapts no layer)"
                          : a.pipeline.recipe != "sft"     ? "--recipe other than sft"
                          : !a.pipeline.lossOutput.empty() ? "--loss-output (the recipe scores the logits)"
                          : a.pipeline.packing             ? "--packing (one prompt per row, not per sequence)"
                          : !a.pipeline.quantize.empty()   ? "--quantize"
                                                           : nullptr;
    if (refused)
      return fail("--peft " + a.pipeline.peft + " (" + a.pipeline.peft + " tuning) does not take " + refused + " yet"), 2;
  }
  if (a.pipeline.quantize == "int4") {
    // MatMulNBits has no backward: int4 weights are for plans that only run the model.
    const char *refused = a.pipeline.training()          ? "--peft (it has no backward; QLoRA is --quantize nf4)"
                          : a.pipeline.maxLoras > 0      ? "--max-loras"
                          : a.pipeline.precision != "fp32" ? "--precision other than fp32"
                                                           : nullptr;
    if (refused) return fail(std::string("--quantize int4 makes an inference plan: it does not take ") + refused), 2;
  } else if (!a.pipeline.quantize.empty() &&
             (a.pipeline.peft.empty() || a.pipeline.peft == "none" || a.pipeline.peft == "osft"))
    return fail("--quantize nf4 quantizes the frozen base weights under adapters: it needs --peft lora, ia3, loha, lokr "
                "or vera" + std::string(a.pipeline.peft == "osft" ? " (OSFT trains part of each weight itself)" : "")),
           2;
  if (!a.pipeline.feedforwardModules.empty() && a.pipeline.peft != "ia3")
    return fail("--feedforward-modules needs --peft ia3"), 2;
  if (a.pipeline.useDora && a.pipeline.peft != "lora") return fail("--use-dora needs --peft lora"), 2;
  if (a.pipeline.loraInit != "default" && a.pipeline.peft != "lora")
    return fail("--lora-init " + a.pipeline.loraInit + " starts LoRA adapters: it needs --peft lora"), 2;
  if (a.pipeline.useDora && (a.pipeline.loraInit == "pissa" || a.pipeline.loraInit == "olora" ||
                             a.pipeline.loraInit == "loftq"))
    return fail("--lora-init " + a.pipeline.loraInit + " with --use-dora is not supported: DoRA's magnitude starts "
                "from the base weight, which " + a.pipeline.loraInit + " rewrites"), 2;
  if (loftqIterGiven && a.pipeline.loraInit != "loftq") return fail("--loftq-iter needs --lora-init loftq"), 2;
  if (a.pipeline.bias != "none" && a.pipeline.peft != "lora")
    return fail("--bias " + a.pipeline.bias + " trains biases beside LoRA adapters: it needs --peft lora"), 2;
  if (a.pipeline.loraDropout > 0 && a.pipeline.peft != "lora" && a.pipeline.peft != "vera")
    return fail("--lora-dropout needs --peft lora or vera (" + (a.pipeline.peft.empty() ? std::string("no --peft") :
                "--peft " + a.pipeline.peft) + " has no adapter dropout)"), 2;
  if (!a.pipeline.freeze.empty() && a.pipeline.peft != "none")
    return fail("--freeze keeps weights out of full fine-tuning: it needs --peft none (adapters freeze the model)"), 2;
  if (lossScaleGiven && a.pipeline.precision != "fp16")
    return fail("--loss-scale-init and --loss-scale-window are for --precision fp16 (bf16 and fp32 need no loss scaling)"), 2;
  if (a.pipeline.shard != "none" && !a.pipeline.training())
    return fail("--shard " + a.pipeline.shard + " shards training state: it needs a training plan (--peft)"), 2;
  if (a.pipeline.packing && (!a.pipeline.training() || !a.pipeline.lossOutput.empty()))
    return fail("--packing needs a training plan with the sft recipe's cross-entropy (--peft, no --loss-output)"), 2;
  bool classify = a.pipeline.recipe == "classify";
  if (classify && !a.pipeline.training()) return fail("--recipe classify needs a training plan: add --peft"), 2;
  if (classify && a.pipeline.numLabels == 0) return fail("--recipe classify needs --num-labels N"), 2;
  if (!classify && (a.pipeline.numLabels || !a.pipeline.featuresOutput.empty() || a.pipeline.pooling != "mean"))
    return fail("--num-labels, --pooling and --features-output need --recipe classify"), 2;
  if (classify && (a.pipeline.packing || a.pipeline.kvCache || !a.pipeline.lossOutput.empty() ||
                   !a.pipeline.logitsOutput.empty()))
    return fail("--recipe classify takes no --packing, --kv-cache, --loss-output or --logits-output (they are for "
                "the sft recipe)"),
           2;
  const bool grpo = a.pipeline.grpo();
  const bool preference = a.pipeline.preference() || grpo;
  const std::string recipe = "--recipe " + a.pipeline.recipe;
  for (const std::string &f : grpoFlags)
    if (!grpo) return fail(f + " needs --recipe grpo"), 2;
  if (sapoFlags && a.pipeline.grpoLoss != "sapo")
    return fail("--sapo-temperature-pos and --sapo-temperature-neg need --grpo-loss sapo"), 2;
  if (vespoFlags && a.pipeline.grpoLoss != "vespo")
    return fail("--vespo-k-pos, --vespo-lambda-pos, --vespo-k-neg and --vespo-lambda-neg need --grpo-loss vespo"), 2;
  for (const std::string &f : clipFlags) // the weight is exactly 1 when the sampling policy is the step's own
    if (!a.pipeline.samplingLogProbs && !(f == "--grpo-epsilon-high" && a.pipeline.grpoLoss == "cispo"))
      return fail(f + " clips the importance weight, which is 1 unless the data gives the sampling policy's "
                      "log-probabilities: add --sampling-log-probs"),
             2;
  const bool betaGiven = std::find(preferenceFlags.begin(), preferenceFlags.end(), "--beta") != preferenceFlags.end();
  if (grpo && !betaGiven) a.pipeline.beta = 0.0; // TRL's GRPOConfig: no KL term, no reference model
  if (!grpo && betaGiven && !(a.pipeline.beta > 0)) return fail("--beta needs a positive number with " + recipe), 2;
  for (const std::string &f : preferenceFlags) {
    const char *needs = f == "--beta"       ? nullptr
                        : f == "--dpo-loss" ? "dpo"
                        : f == "--desirable-weight" || f == "--undesirable-weight" ? "kto"
                                                                                   : "simpo";
    if (needs ? a.pipeline.recipe != needs : !preference)
      return fail(f + " needs --recipe " + (needs ? needs : "dpo, simpo, orpo, kto or grpo")), 2;
  }
  if (preference && !a.pipeline.training()) return fail(recipe + " needs a training plan: add --peft"), 2;
  if (preference && (a.pipeline.packing || !a.pipeline.lossOutput.empty()))
    return fail(recipe + " takes no --packing or --loss-output (a pair's or example's rows are whole sequences, scored by "
                "the recipe)"),
           2;
  for (const std::string &shape : preference ? a.pipeline.shapes : std::vector<std::string>{}) {
    // Each bucket's rows: "NAME=BxS[,BxS]" (a dimension may also be "?").
    for (size_t at = shape.find('=') + 1; at && at < shape.size();) {
      size_t end = shape.find(',', at);
      std::string rows = shape.substr(at, shape.find('x', at) - at);
      const int64_t group = grpo ? a.pipeline.numGenerations : 2;
      if (!rows.empty() && std::isdigit((unsigned char)rows[0]) && std::strtoll(rows.c_str(), nullptr, 10) % group)
        return fail("--shapes " + shape + ": a " + recipe + " plan's batch counts rows, " +
                    (grpo ? "--num-generations " + std::to_string(group) + " per prompt (a group of completions), so "
                            "it must be a multiple of " + std::to_string(group)
                          : std::string("two per ") +
                                (a.pipeline.recipe == "kto" ? "example (the example, its KL row)"
                                                            : "pair (chosen, rejected)") +
                                ", so it must be even")),
               2;
      at = end == std::string::npos ? std::string::npos : end + 1;
    }
  }
  if (preference && a.pipeline.loraDropout > 0)
    return fail(recipe + " trains without dropout, as TRL's preference trainers do (disable_dropout): drop "
                "--lora-dropout"),
           2;
  bool kvFlags = a.pipeline.kvBatch != 0 || a.pipeline.prefillChunk != 0 || a.pipeline.speculate != 0;
  if (kvFlags && a.pipeline.kvCache == 0)
    return fail("--kv-batch, --prefill-chunk and --speculate need --kv-cache MAX_LENGTH"), 2;
  if (a.pipeline.speculate >= a.pipeline.kvCache && a.pipeline.kvCache > 0)
    return fail("--speculate " + std::to_string(a.pipeline.speculate) + ": a row's token and its guessed successors must fit the cache (--kv-cache " +
                std::to_string(a.pipeline.kvCache) + ")"),
           2;
  if (a.pipeline.prefillChunk > a.pipeline.kvCache && a.pipeline.kvCache > 0)
    return fail("--prefill-chunk " + std::to_string(a.pipeline.prefillChunk) + " is longer than the cache (--kv-cache " +
                std::to_string(a.pipeline.kvCache) + ")"),
           2;
  if (!a.pipeline.tokenInput.empty() && a.pipeline.kvCache == 0 &&
      (!a.pipeline.training() || !a.pipeline.lossOutput.empty()))
    return fail("--token-input needs a training plan with the sft recipe's cross-entropy (--peft, no --loss-output)"), 2;
  return 0;
}

} // namespace

int mergeMain(int argc, char **argv) {
  sd::MergeRequest req;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    std::string flag = arg.substr(0, arg.find('=')), v;
    auto value = [&](std::string &out) { return flagValue(argc, argv, i, out); };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kMergeUsage, stdout);
      return 0;
    } else if (flag == "-o" || flag == "--output") {
      if (!value(req.output)) return fail(flag + " needs a value"), 2;
    } else if (flag == "--adapter") {
      if (!value(req.adapterDir)) return fail("--adapter needs a folder"), 2;
    } else if (flag == "--weights") {
      if (!value(req.weightsFile)) return fail("--weights needs a safetensors file"), 2;
    } else if (flag == "--adapter-rank") {
      char *end = nullptr;
      long long n = value(v) ? std::strtoll(v.c_str(), &end, 10) : 0;
      if (v.empty() || *end || n < 1 || n > (1 << 20)) return fail("--adapter-rank needs a positive integer"), 2;
      req.adapterRank = n;
    } else if (!arg.empty() && arg[0] == '-') {
      return fail("unknown option '" + arg + "' (see sdc merge --help)"), 2;
    } else if (req.model.empty()) {
      req.model = arg;
    } else {
      return fail("unexpected argument '" + arg + "'"), 2;
    }
  }
  if (req.model.empty()) return fail("no model given (see sdc merge --help)"), 2;
  if (req.output.empty()) return fail("no output given: use -o MERGED.onnx"), 2;
  if (req.adapterDir.empty() && req.weightsFile.empty()) return fail("give --adapter DIR or --weights FILE"), 2;
  if (req.adapterRank > 0 && req.adapterDir.empty()) return fail("--adapter-rank needs --adapter DIR"), 2;
  std::string error;
  // The output's folder is checked before the model is read and merged.
  if (sd::Status st = sd::checkOutputFile(req.output, "-o"); !st.isOk()) return fail(st.message());
  if (!sd::mergeModel(req, error)) return fail(error);
  return 0;
}

static int compileMain(int argc, char **argv);

int main(int argc, char **argv) {
  sd::ignoreFileSizeSignal();
  // Built without exceptions (as LLVM is): an allocation that fails ends here
  // with a message instead of an abort. A temp file it leaves behind is
  // removed by the next write of the same output.
  std::set_new_handler([] {
    std::fputs("sdc: error: out of memory (is a memory limit such as ulimit -v in effect?)\n", stderr);
    std::_Exit(1);
  });
  return compileMain(argc, argv);
}

static int compileMain(int argc, char **argv) {
  if (argc >= 2 && std::string(argv[1]) == "merge") return mergeMain(argc, argv);
  Args args;
  if (int rc = parseArgs(argc, argv, args)) return rc < 0 ? 0 : rc;
  sd::CompileRequest req;
  req.model = args.model;
  req.output = args.output;
  req.emit = args.emit;
  req.pipeline = args.pipeline;
  req.binds = args.binds;
  req.externalWeights = args.externalWeights;
  req.verbose = args.verbose;
  req.dryRun = args.dryRun;
  req.maxTrip = args.maxTrip;
  req.maxUnroll = args.maxUnroll;
  req.maxSelect = args.maxSelect;
  std::string error, ir;
  if (req.pipeline.promptInit == "text") {
    // PEFT's TEXT start: the text's tokens as the tokenizer gives them (its BOS included).
    auto tokenizer = sd::Tokenizer::load(req.pipeline.promptTokenizer);
    if (!tokenizer.isOk()) return fail("--tokenizer: " + tokenizer.status().message());
    for (int32_t id : tokenizer.value()->encode(req.pipeline.promptInitText)) req.pipeline.promptInitIds.push_back(id);
    if (req.pipeline.promptInitIds.empty())
      return fail("--prompt-init-text '" + req.pipeline.promptInitText + "' gives no tokens");
  }
  // A plan's folder is checked before compiling, which can take minutes.
  if (!req.dryRun && !req.output.empty() && req.output != "-")
    if (sd::Status st = sd::checkOutputFile(req.output, "-o"); !st.isOk()) return fail(st.message());
  if (req.emit == "plan" && !req.dryRun && !tokenizerToCarry(args, req.files)) return 1;
  std::vector<std::string> warnings;
  if (!sd::compileModel(req, error, &ir, &warnings)) return fail(error);
  for (const std::string &w : warnings) std::fprintf(stderr, "sdc: warning: %s\n", w.c_str());
  if (!ir.empty()) std::fputs(ir.c_str(), stdout);
  return 0;
}
