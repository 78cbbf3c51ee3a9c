// Adapters in Hugging Face PEFT's layout: DIR/adapter_config.json and
// DIR/adapter_model.safetensors, so adapters move between sdc and PEFT both
// ways. LoRA: keys base_model.model.<module>.lora_A.weight ([r, in]) and
// .lora_B.weight ([out, r]), and with DoRA .lora_magnitude_vector ([out]). OSF (orthogonal subspace fine-tuning): keys
// base_model.model.<module>.osf_svd_params.{U_low,S_low,V_low}; PEFT rebuilds
// the frozen high part from the base weights when it loads one. The compiler (sdc merge,
// --peft lora) and the runtime (sdrun train/generate) share these.
#pragma once
#include "sd/format/status.h"
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace sd {

constexpr const char *kAdapterKeyPrefix = "base_model.model.";
// The two files of an adapter folder.
constexpr const char *kAdapterWeightsFile = "adapter_model.safetensors";
constexpr const char *kAdapterConfigFile = "adapter_config.json";
constexpr const char *kLoraASuffix = ".lora_A.weight";
constexpr const char *kLoraBSuffix = ".lora_B.weight";
constexpr const char *kDoraMagnitudeSuffix = ".lora_magnitude_vector"; // DoRA: [out]
constexpr const char *kIa3Suffix = ".ia3_l"; // IA3: [out, 1], or [1, in] on a feedforward module
// LoHa: w1_a, w2_a [out, r]; w1_b, w2_b [r, in].
// VeRA: per module vera_lambda_b [out] and vera_lambda_d [r]; the shared
// frozen projections vera_A [r, max in] and vera_B [max out, r] are keyed
// base_model.vera_A / base_model.vera_B (no "model.").
constexpr const char *kVeraSuffixes[] = {".vera_lambda_b", ".vera_lambda_d"};
constexpr const char *kVeraProjections[] = {"vera_A", "vera_B"};
constexpr const char *kLohaSuffixes[] = {".hada_w1_a", ".hada_w1_b", ".hada_w2_a", ".hada_w2_b"};
// LoKr: per module lokr_w1 [a, c] or lokr_w1_a [a, r] and lokr_w1_b [r, c];
// lokr_w2 [b, d] or lokr_w2_a [b, r] and lokr_w2_b [r, d] (out = a·b, in = c·d).
constexpr const char *kLokrSuffixes[] = {".lokr_w1", ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2", ".lokr_w2_a", ".lokr_w2_b"};
// Prompt tuning: the virtual tokens' embeddings [num_virtual_tokens, token_dim];
// prefix tuning: their keys and values in every layer [num_virtual_tokens,
// 2 num_layers token_dim]. Keyed as PEFT saves prompt-learning adapters (no
// "base_model.model." prefix).
constexpr const char *kPromptEmbeddings = "prompt_embeddings";
// Prefix tuning through PEFT's MLP (prefix_projection), a plan's trained
// tensors: the embedding [N, token_dim], transform.0 (weight [H, token_dim],
// bias [H]) and transform.2 (weight [2 L token_dim, H], bias). The adapter
// file holds their output as prompt_embeddings, as PEFT saves it.
constexpr const char *kPrefixEncoderNames[] = {"prompt_encoder.embedding.weight", "prompt_encoder.transform.0.weight",
                                               "prompt_encoder.transform.0.bias", "prompt_encoder.transform.2.weight",
                                               "prompt_encoder.transform.2.bias"};
// AdaLoRA's per-module tensors (PEFT's ParameterDicts: no ".weight").
constexpr const char *kAdaloraSuffixes[] = {".lora_A", ".lora_E", ".lora_B"};
// Bottleneck adapters in AdapterHub's layout (its `adapters` library):
// DIR/adapter_config.json ({"config": BnConfig fields, "name", ...}) and
// DIR/adapter.safetensors, keyed <layer>.<place>.adapters.<name>.adapter_down.0.weight
// ([n, hidden]) and .bias, .adapter_up.weight ([hidden, n]) and .bias. A
// plan names its tensors with the adapter name "bottleneck". A classification
// plan's head rides along under its own names (config: sdc_modules_to_save).
constexpr const char *kAdapterHubWeightsFile = "adapter.safetensors";
constexpr const char *kBottleneckName = "bottleneck";
constexpr const char *kBottleneckSuffixes[] = {".adapter_down.0.weight", ".adapter_down.0.bias", ".adapter_up.weight",
                                               ".adapter_up.bias"};
// AdapterHub's bottleneck configurations sdc builds (SeqBnConfig: Pfeiffer,
// DoubleSeqBnConfig: Houlsby, ParBnConfig) and their defaults, and the
// activations (its non_linearity names) sdc computes.
struct BottleneckDefaults {
  const char *name, *nonLinearity, *initWeights;
  bool mhAdapter, originalLnBefore, isParallel;
  double reductionFactor, scaling;
};
const BottleneckDefaults *bottleneckDefaults(const std::string &config); // null: not one of them
constexpr const char *kBottleneckActivations[] = {"relu", "swish", "silu", "gelu", "gelu_new", "tanh", "sigmoid",
                                                  "leakyrelu"};
constexpr const char *kOsfSuffixes[] = {".osf_svd_params.U_low", ".osf_svd_params.S_low", ".osf_svd_params.V_low"};
// adapter_model.safetensors metadata: CRC32C of the base weights an OSF
// adapter was split from (the config keeps only fields PEFT knows).
constexpr const char *kOsfBaseChecksumKey = "sdc.osf_base_weights_crc32c";

// PEFT's scaling of B A: alpha / r, or alpha / sqrt(r) with rsLoRA.
inline double loraScale(double alpha, int64_t r, bool rslora) {
  return alpha / (rslora ? std::sqrt(double(r)) : double(r));
}

struct LoraConfig {
  std::string peftType = "LORA"; // "LORA", "OSF", "IA3", "LOHA", "LOKR", "VERA", "ADALORA", "PROMPT_TUNING" or "PREFIX_TUNING"
  int64_t r = 0;
  double alpha = 0;
  bool rslora = false;
  bool useDora = false; // DoRA: each module also has lora_magnitude_vector [out]
  // LoRA: PEFT's bias ("none", "all", "lora_only"), and (a plan's) the biases
  // that train beside the adapters, by their weight names. Keyed
  // base_model.model.<name>, or <module>.base_layer.bias for an adapted
  // module's own (PEFT's wrapped layer).
  std::string bias = "none";
  std::vector<std::string> trainedBiases;
  // LoRA: PEFT's init_lora_weights when it rewrote the base weight ("pissa",
  // "olora" or "loftq", with loftq_iter rounds of NF4), "" otherwise. The
  // adapter then fits the base weights that initialization leaves, which sdc
  // merge and PEFT rebuild from the original model.
  std::string baseInit;
  int64_t loftqIter = 1;
  double dropout = 0; // PEFT's lora_dropout (training only; not compared on load)
  bool fanInFanOut = false; // the adapted weights are stored [in, out] (GPT-2's Conv1D)
  std::vector<std::string> modules; // adapted sd.linear modules
  // A plan compiled with sdc --max-loras: the adapter slots besides slot 0
  // (sd/runtime/lora_slots.h); 0 for a plan of one adapter.
  int64_t maxLoras = 0;
  // OSF: PEFT's effective_rank (a ratio), the preserved rank of each module,
  // and the CRC32C of the base weights the plan split ("" when unknown).
  double effectiveRank = 0;
  std::vector<int64_t> ranks;
  std::string baseChecksum;
  // IA3: the modules whose input (not output) is scaled (a plan's), and
  // PEFT's rule for them as an adapter_config.json gives it
  // (feedforward_modules: name endings, or a regex matching whole names).
  // A regex is never run: a backtracking match of a hostile pattern could
  // take forever, and each ia3_l's shape ([1, in] or [out, 1]) tells its side anyway.
  std::vector<std::string> feedforward;
  std::vector<std::string> feedforwardEndings;
  bool feedforwardIsRegex = false;
  // PEFT's modules_to_save: modules trained in full beside the adapters (the
  // classification head of sdc --recipe classify), stored as
  // base_model.model.<module>.weight and .bias.
  std::vector<std::string> modulesToSave;

  bool isOsf() const { return peftType == "OSF"; }
  bool isIa3() const { return peftType == "IA3"; }
  bool isLora() const { return peftType == "LORA"; }
  // DyLoRA (a plan's; its file is a PEFT LoRA): the ranks per block, 0 for
  // none. r and alpha are the LoRA's (alpha = DyLoRA's alpha x block size,
  // so alpha / r is DyLoRA's scale with every block in play).
  int64_t dyloraBlockSize = 0;
  bool isDylora() const { return dyloraBlockSize > 0; }
  bool isLoha() const { return peftType == "LOHA"; }
  bool isLokr() const { return peftType == "LOKR"; }
  bool isVera() const { return peftType == "VERA"; }
  bool isPromptTuning() const { return peftType == "PROMPT_TUNING"; }
  bool isPrefixTuning() const { return peftType == "PREFIX_TUNING"; }
  bool isAdalora() const { return peftType == "ADALORA"; }
  // Bottleneck adapters (AdapterHub's BnConfig; modules are the places,
  // "model.layers.0.output_adapters"): which of its configurations
  // (seq_bn, double_seq_bn, par_bn), the reduction factor, the activation,
  // the output's scaling, the start, the hidden size, and the adapter's name
  // in its tensor keys ("bottleneck" in a plan; a file's own on load).
  bool isBottleneck() const { return peftType == "BOTTLENECK"; }
  std::string bottleneckConfig, nonLinearity, initWeights, adapterName = kBottleneckName;
  double reductionFactor = 0, scaling = 1;
  // AdapterHub's scaling "learned" or "channel" (a trained `.scaling`, [1] or
  // [hidden]; "": the fixed `scaling`), and use_gating (`.gate.weight`, `.gate.bias`).
  std::string scalingKind;
  bool useGating = false;
  int64_t hiddenSize = 0;
  std::vector<int64_t> leaveOut; // AdapterHub's leave_out: layers without adapters, sorted
  // The weights file of the adapter folder: PEFT's, or AdapterHub's for bottleneck adapters.
  const char *weightsFile() const { return isBottleneck() ? kAdapterHubWeightsFile : kAdapterWeightsFile; }
  // AdaLoRA: r is init_r, alpha lora_alpha (scale alpha / (r + 1e-5)); the
  // schedule's fields as PEFT's AdaLoraConfig names them.
  int64_t targetR = 0, tinit = 0, tfinal = 0, deltaT = 1, totalStep = 0;
  double beta1 = 0.85, beta2 = 0.85, orthRegWeight = 0.5;
  // An AdaLoRA adapter PEFT saved after pruning: per module, which of its r
  // triplets the file holds (its tensors cut to those rows of lora_A and
  // lora_E and columns of lora_B); modules not listed hold all r.
  std::map<std::string, std::vector<bool>> rankPattern;
  // Prompt and prefix tuning: PEFT's num_virtual_tokens, token_dim (0: not
  // given; prefix tuning: key/value heads x head size), and prompt tuning's
  // prompt_tuning_init (RANDOM or SAMPLE_VOCAB; how training started).
  // Prefix tuning's prompt_embeddings are [N, 2 num_layers token_dim]; its
  // num_attention_heads are the key/value heads.
  int64_t numVirtualTokens = 0;
  int64_t tokenDim = 0;
  int64_t numLayers = 0, numAttentionHeads = 0;
  std::string promptInit = "RANDOM";
  // Prefix tuning: PEFT's prefix_projection and encoder_hidden_size. A plan
  // with the projection trains the MLP (kPrefixEncoderNames); every file holds
  // the prefix itself.
  bool prefixProjection = false;
  int64_t encoderHiddenSize = 0;
  std::string promptInitText, tokenizerPath; // TEXT: PEFT's prompt_tuning_init_text, tokenizer_name_or_path
  // A plan's: the token id of virtual token 0 (the embedding table's rows;
  // virtual token i is this + i, which the generator feeds before a prompt).
  int64_t firstVirtualId = 0;
  // LoKr: PEFT's decompose_both and decompose_factor, and (a plan's) each
  // module's factor names without the module, as "lokr_w1,lokr_w2_a,lokr_w2_b"
  // (which factors are whole depends on each module's shape).
  bool decomposeBoth = false;
  int64_t decomposeFactor = -1;
  std::vector<std::string> factors;
  // VeRA: PEFT's projection_prng_key, and whether the adapter file holds the
  // projections (save_projection).
  int64_t projectionKey = 0;
  bool saveProjection = true;
  // LoRA, LoHa and LoKr: a rank r and a scaling alpha / r (rsLoRA: LoRA only).
  // Whether PEFT's IA3 treats `module` as a feedforward module under the
  // adapter config's list of feedforward_modules; false under a regex (see
  // feedforwardRuleKnown).
  bool feedforwardByRule(const std::string &module) const;
  bool feedforwardRuleKnown() const { return !feedforwardIsRegex; }
  // "LoRA", "DoRA", "OSF", "IA3", "LoHa", "LoKr", "VeRA", "prompt tuning" or "prefix tuning", and the sdc compile
  // flags that train it.
  std::string kindName() const;
  std::string compileFlags() const;
  double scale() const { return loraScale(alpha, r, rslora); }
  // The adapter file's key of the tensor sdc names `name` (adapterKey, but an
  // adapted module's own bias is PEFT's <module>.base_layer.bias).
  std::string key(const std::string &name) const;
  // The names (sdc globals; PEFT keys without "base_model.model.") of one
  // module's adapter tensors.
  std::vector<std::string> tensorNames(const std::string &module) const;
  // Every tensor of the adapter, as (module, tensor name): the
  // modules_to_save' weight and bias, VeRA's shared projections, prompt
  // tuning's embeddings and LoRA's trained biases (module ""), then each
  // module's tensorNames.
  std::vector<std::pair<std::string, std::string>> tensors() const;
};

// Key of a tensor in adapter_model.safetensors: "base_model.model." + name
// (name = "<module>.lora_A.weight" / "<module>.lora_B.weight"),
// "base_model." + name for VeRA's shared projections, or prompt tuning's
// "prompt_embeddings" as it is.
std::string adapterKey(const std::string &name);

// The adapter configuration recorded in a plan's config JSON ("lora" or "osf").
StatusOr<LoraConfig> loraConfigFromPlanConfig(const std::string &configJson);
// DIR/adapter_config.json: LoRA's r, lora_alpha and use_rslora, or OSF's
// effective_rank, or IA3's feedforward_modules (modules stay empty). Fields that would change the
// adapter's semantics beyond what sdc computes (lora_bias, rank_pattern, ...)
// are an error naming the field; modules_to_save is read (loading checks it
// against the plan's).
StatusOr<LoraConfig> readAdapterConfig(const std::string &dir);
StatusOr<LoraConfig> parseAdapterConfig(const std::string &text, const std::string &path);
// The adapter_config.json text PEFT loads for `cfg` (AdapterHub's, for bottleneck adapters).
std::string adapterConfigJson(const LoraConfig &cfg);

// AdapterHub's side (adapterhub.cc): whether an adapter_config.json document
// is AdapterHub's ({"config": {...}, "name": ...}, no peft_type); its
// bottleneck configuration (anything sdc does not compute is an error naming
// the field); the plan config's "bottleneck" section; the config JSON
// AdapterHub loads; and what differs between an adapter and a plan ("" when
// nothing does).
struct Json;
bool isAdapterHubConfig(const Json &doc);
StatusOr<LoraConfig> parseAdapterHubConfig(const Json &doc, const std::string &path);
StatusOr<LoraConfig> bottleneckFromPlanConfig(const Json &section);
std::string adapterHubConfigJson(const LoraConfig &cfg);
std::string bottleneckMismatch(const LoraConfig &given, const LoraConfig &plan);

} // namespace sd
