// Every name that ties a training plan to its host: the entries the compiler's
// training passes create, their scalar inputs and outputs, and the state
// globals. The compiler writes these names and the runtime's trainer looks
// them up, so both include this header and neither spells them itself.
#pragma once
#include <string>
#include <string_view>

namespace sd::abi {

// Entries (the value of a function's sd.entry attribute and the plan entry name).
constexpr const char *kInfer = "infer";          // the model's graph
constexpr const char *kEvalStep = "eval_step";   // inputs + labels -> loss_sum, tokens
constexpr const char *kAccumulate = "accumulate"; // eval_step + backward into the gradient globals
constexpr const char *kApply = "apply";          // (lr, weight_decay, max_grad_norm) -> grad_norm
constexpr const char *kTrainStep = "train_step"; // accumulate then apply: one micro-batch, one call
// Generation with a key/value cache (sdc --kv-cache): tokens + position_ids ->
// logits, the caches in kv_cache globals. prefill takes a chunk of prompt
// tokens per row, decode one token per row.
constexpr const char *kPrefill = "prefill";
constexpr const char *kDecode = "decode";
constexpr const char *kVerify = "verify"; // speculative decoding: a row's token and guessed successors at once
// sdc --max-loras N: int64 [batch], each row's adapter slot (0: the plan's
// own adapter, 1..N: those sdrun loads), an input of every generation entry.
constexpr const char *kLoraIds = "lora_ids";
constexpr const char *kKvProbe = "kv_probe"; // compile-time only: the position tables at the maximum length
constexpr const char *kKvCachePrefix = "kv_cache/"; // + layer + "/key" or "/value"

// Inputs the training entries add to the model's own.
constexpr const char *kLabels = "labels"; // int64 [batch, seq] (sft) or [batch] (classify); -100 = not counted
// kto: int64 [batch], per row 1 (a desirable example's rows), 0 (an undesirable one's) or -100 (filler).
constexpr const char *kDesirable = "desirable";
// grpo: f32 [batch], each completion's reward (0 in filler rows).
constexpr const char *kRewards = "rewards";
// grpo --sampling-log-probs: f32 [batch, seq], at position t the sampling
// policy's log-probability of token t + 1 (0 where that token is not counted).
constexpr const char *kOldLogProbs = "old_log_probs";
constexpr const char *kAttentionMask = "attention_mask"; // int64 [batch, seq], 1 = a token, 0 = padding (classify)
constexpr const char *kPositionIds = "position_ids"; // int64 [batch, seq] in packed plans
constexpr const char *kLr = "lr";                    // f32 scalars of apply / train_step
constexpr const char *kWeightDecay = "weight_decay";
constexpr const char *kMaxGradNorm = "max_grad_norm";
// The token input of models that do not name theirs otherwise (plan config "token_input").
constexpr const char *kDefaultTokenInput = "input_ids";

// Outputs.
constexpr const char *kLossSum = "loss_sum"; // f32: summed loss over counted tokens
constexpr const char *kTokens = "tokens";    // f32: counted tokens
constexpr const char *kGradNorm = "grad_norm";

// The classification head sd-recipe-classify adds (PEFT's modules_to_save).
constexpr const char *kClassifierModule = "classifier";
constexpr const char *kClassifierWeight = "classifier.weight"; // f32 [num_labels, hidden]
constexpr const char *kClassifierBias = "classifier.bias";     // f32 [num_labels]

// State globals.
constexpr const char *kTokensSeen = "tokens_seen";       // counted tokens of the open accumulation window
constexpr const char *kOptimizerStep = "optimizer_step"; // optimizer steps done (AdamW bias correction)
// fp16 training (sdc compile --precision fp16): the dynamic loss scale the
// backward is seeded with, and the optimizer steps since it last changed, as
// PyTorch's GradScaler keeps them (x2 after a window of clean
// steps, x0.5 and the step skipped on an Inf/NaN gradient).
constexpr const char *kLossScale = "loss_scale";
constexpr const char *kLossScaleGrowth = "loss_scale_growth_tracker";
// int64[4] [seed, counter, row_offset, rows] keying training-time randomness
// (sd/ops/counter_rng.h): the trainer sets the seed, each accumulate call
// advances the counter, and before each micro-batch the trainer says which
// global rows it holds (the first, and the entry's batch), so that a mask
// depends on the global row, not on which rank holds it. Plans compiled
// before row offsets have int64[2] [seed, counter].
constexpr const char *kDropoutRng = "dropout_rng";
constexpr int64_t kDropoutRngSize = 4;
// Per-parameter state: prefix + parameter name.
constexpr const char *kGradPrefix = "grad/";
constexpr const char *kAdamExpAvgPrefix = "adamw.exp_avg/";
constexpr const char *kAdamExpAvgSqPrefix = "adamw.exp_avg_sq/";
constexpr const char *kSgdMomentumPrefix = "sgd.momentum/";
// DyLoRA plans (sdc compile --peft dylora): the blocks of ranks in play
// outside training (f32 scalar; all of them unless the runtime chooses
// fewer, sdrun --adapter-rank), and per module (prefix + module name) the
// blocks a micro-batch drew since the last optimizer step (f32 flags) and
// each block's optimizer steps so far (f32 counts, AdamW's bias correction).
constexpr const char *kDyloraEvalBlocks = "dylora.eval_blocks";
constexpr const char *kDyloraDrawnPrefix = "dylora.drawn/";
constexpr const char *kDyloraStepsPrefix = "dylora.steps/";
// Preference plans (sdc compile --recipe dpo): the reference model's copy of a
// trainable parameter, scalar state (checkpointed, never optimized). The
// trainer refreshes the copies from the parameters when a run starts from an
// adapter, so the reference is always the model training started from.
constexpr const char *kReferencePrefix = "reference/";

// The plan config's map of tied parameters (an LM head's weight that is the
// input embedding's) to their other names in the model's state_dict:
// trained weights are saved under each, so they load strictly into PyTorch.
constexpr const char *kTiedNamesConfigKey = "tied_names";

inline std::string gradientOf(std::string_view param) { return kGradPrefix + std::string(param); }

} // namespace sd::abi
