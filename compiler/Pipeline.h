// The compile pipeline, shared by sdc and the tests: model-level passes,
// specialization, bufferization and arena planning, in order.
#pragma once
#include "mlir/Pass/PassManager.h"
#include <string>
#include <vector>

namespace sd {

struct PipelineOptions {
  std::vector<std::string> shapes; // INPUT=DxD[,DxD]
  std::vector<std::string> dims;   // NAME=N[,N]
  std::vector<std::string> inferShapes; // infer entry only; empty: same as shapes
  // A training plan given neither shapes nor dims: the sizes bound to the
  // model's named batch and sequence dims (0: none; the driver says which).
  int64_t defaultBatch = 0, defaultSeq = 0;
  bool printIrAfterAll = false;

  // Training (empty peft: an inference-only plan).
  std::string peft;              // "none" (full fine-tuning) | "lora" | "osft" | "ia3" | "loha" | "dylora" | "lokr" | "vera" | "prompt" | "prefix" | "bottleneck" | "bitfit"
  std::string trainable = ".*";  // --peft none: regex over weight names
  std::string freeze;            // --peft none: regex over weight names kept frozen (none when empty)
  std::string targetModules;     // --peft lora
  int64_t loraR = 8;
  double loraAlpha = 8.0;
  int64_t dyloraBlockSize = 1; // --peft dylora: ranks per block (LyCORIS's block_size)
  bool rslora = false;
  bool useDora = false;          // --use-dora: DoRA, a trained magnitude per output
  std::string bias = "none";      // --peft lora: PEFT's bias (none | all | lora_only)
  std::string quantize;           // "nf4": the frozen linear weights as bitsandbytes' NF4 (QLoRA); "" none
  // --peft adalora (PEFT's AdaLoraConfig; --lora-r is init_r): target_r, the schedule, the
  // sensitivity EMAs and the orthogonality penalty's weight.
  int64_t adaloraTargetR = 8, adaloraTinit = 0, adaloraTfinal = 0, adaloraDeltaT = 1, totalStep = 0;
  double adaloraBeta1 = 0.85, adaloraBeta2 = 0.85, orthRegWeight = 0.5;
  bool decomposeBoth = false;     // --peft lokr: W1 a rank-r product too (PEFT's decompose_both)
  int64_t decomposeFactor = -1;   // --peft lokr: PEFT's decompose_factor
  int64_t virtualTokens = 20;     // --peft prompt: PEFT's num_virtual_tokens
  bool prefixProjection = false;  // --peft prefix: through PEFT's MLP (prefix_projection)
  int64_t encoderHiddenSize = 0;  // its width (0: token_dim, PEFT's encoder_hidden_size default)
  std::string promptInit = "random"; // --peft prompt: random (PEFT's RANDOM) | vocab (SAMPLE_VOCAB) | text (TEXT)
  std::string promptInitText, promptTokenizer; // text: PEFT's prompt_tuning_init_text, tokenizer_name_or_path
  std::vector<int64_t> promptInitIds;           // text: the text's tokens (sdc tokenizes it)
  // --peft bottleneck (AdapterHub's BnConfig): seq_bn | double_seq_bn | par_bn, hidden / bottleneck
  // size, the activation, the output's factor (negative: the config's) and the start.
  std::string bottleneckConfig = "seq_bn", nonLinearity, bottleneckInit;
  std::string bottleneckLeaveOut; // layer numbers without adapters, "0,3" (AdapterHub's leave_out)
  double reductionFactor = -1.0, bottleneckScaling = -1.0; // negative: the config's
  std::string bottleneckScalingKind; // learned | channel: a trained factor (AdapterHub's scaling); empty: fixed
  bool bottleneckGating = false;     // AdapterHub's use_gating
  std::string feedforwardModules; // --peft ia3: modules whose input, not output, is scaled
  double loraDropout = 0.0;
  std::string loraInit = "default"; // default | gaussian | pissa | olora | loftq (PEFT's init_lora_weights)
  int64_t loftqIter = 1;              // --loftq-iter: PEFT's loftq_iter
  double osftRatio = 0.5;         // --peft osft: preserved fraction of min(out, in)
  std::string osftRankPattern;    // NAME=K|R,...
  std::string osftStrategy = "auto"; // auto | factored | dense
  std::string osftVRule = "gather";  // gather | allreduce (known wrong; tests only): sd-osft-project under --shard params
  int64_t seed = 0;
  std::string recipe = "sft"; // sft | classify | dpo | simpo | orpo | kto | grpo
  // Preference recipes (dpo, simpo, orpo): TRL's beta, DPO's loss, SimPO's
  // target margin and chosen cross-entropy weight (TRL's defaults).
  double beta = 0.1;
  std::string dpoLoss = "sigmoid"; // sigmoid | ipo | hinge
  double simpoGamma = 0.5, cpoAlpha = 1.0;
  double desirableWeight = 1.0, undesirableWeight = 1.0; // kto: TRL's KTOConfig
  bool preference() const { return recipe == "dpo" || recipe == "simpo" || recipe == "orpo" || recipe == "kto"; }
  // grpo: TRL's GRPOConfig (num_generations, loss_type, epsilon, epsilon_high,
  // delta, importance_sampling_level, scale_rewards, max_completion_length);
  // its beta is `beta` above, 0 unless given. The clipping (epsilon, delta)
  // acts only on an importance weight other than 1, which needs the sampling
  // policy's log-probabilities (--sampling-log-probs; TRL's num_iterations > 1).
  int64_t numGenerations = 8;
  std::string grpoLoss = "dapo"; // dapo | grpo | bnpo | dr_grpo | cispo | sapo | luspo | vespo
  double sapoTemperaturePos = 1.0, sapoTemperatureNeg = 1.05; // grpo loss sapo: TRL's defaults
  double vespoKPos = 2.0, vespoLambdaPos = 3.0, vespoKNeg = 3.0, vespoLambdaNeg = 2.0; // grpo loss vespo: TRL's
  double grpoEpsilon = 0.2, grpoEpsilonHigh = -1.0, grpoDelta = 0.0; // negative: epsilon; 0: no delta
  std::string importanceSampling = "token", scaleRewards = "group";
  int64_t maxCompletionLength = 512;
  bool samplingLogProbs = false; // --sampling-log-probs: the data gives the sampling policy's log-probabilities
  bool grpo() const { return recipe == "grpo"; }
  int64_t numLabels = 0;      // --recipe classify
  std::string pooling = "mean", featuresOutput;
  std::string lossOutput, logitsOutput;
  std::string tokenInput; // the int64 [batch, seq] input sdrun train feeds; empty: found by the recipe
  std::string optimizer = "adamw";
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8, momentum = 0.0;
  bool nesterov = false;
  double bucketMb = 25.0; // gradient bytes per cross-rank reduction step (sd-data-parallel)
  bool overlapReduction = true; // train_step reduces each bucket while the backward goes on
  std::string shard = "none"; // none | optimizer | grads | params (sd-data-parallel, sd-shard-params)
  bool packing = false; // training entries take position_ids (several sequences per row)
  // Fusions that only change how a plan computes, not what (sdc --no-fuse turns them off, to compare).
  bool gemmEpilogues = true;      // sd-fuse-gemm-epilogues
  bool halfEpilogues = true;      // sd-fuse-gemm-epilogues in half plans (the GELU on the unrounded product)
  bool elementwiseFusion = true;  // sd-fuse-elementwise
  bool castMotion = true;         // sd-move-casts
  bool halfSteps = true;          // sd-half-elementwise
  bool attentionLayout = true;    // sd-attention-layout
  bool attentionStats = true;     // sd-attention-stats
  bool packSwiglu = true;         // sd-pack-swiglu
  bool joinLora = true;           // sd-join-lora
  bool qkvAttention = true;       // sd-qkv-attention
  bool gemmScale = true;          // sd-scale-into-gemm
  bool gemmAccumulate = true;     // sd-accumulate-into-gemm
  bool normGradSum = true;        // sd-norm-grad-sum
  bool groupUpdates = true;       // sd-group-updates
  bool groupCasts = true;         // sd-group-weight-casts
  std::string precision = "fp32"; // fp32 | bf16 | fp16 (sd-autocast)
  double lossScaleInit = 65536.0;  // fp16: the dynamic loss scale's first value
  int64_t lossScaleWindow = 2000;  // fp16: clean steps before the scale doubles (GradScaler's growth_interval)
  // Generation entries (sd-kv-entries, sd-kv-cache): prefill and decode with
  // key/value caches of kvCache positions per row (0: none).
  int64_t kvCache = 0;
  int64_t kvBatch = 0; // 0: the batch the model fixes, else 1
  int64_t prefillChunk = 0; // 0: min(64, kvCache)
  // > 0: a serving plan of LoRA adapter slots, rows of one batch each with
  // its own adapter (sd-lora-slots); no training entries.
  int64_t maxLoras = 0;
  int64_t speculate = 0;    // > 0: a verify entry of speculate + 1 tokens per row (speculative decoding)
  bool training() const { return !peft.empty() && maxLoras == 0; }
};

void registerSdPasses();
// Model-level passes up to (and including) shape specialization and checks.
void buildTensorPipeline(mlir::OpPassManager &pm, const PipelineOptions &opts);
// The model-level passes that decide what trains (for --dry-run).
void buildPeftPipeline(mlir::OpPassManager &pm, const PipelineOptions &opts);
// Bufferization and memory planning.
void buildPlanPipeline(mlir::OpPassManager &pm);

} // namespace sd
