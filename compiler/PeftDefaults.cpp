// PEFT's default target_modules per transformers model_type, as its
// configs fill them in when target_modules is not given. The tables are
// data: PEFT 0.21.2's mappings in peft/utils/constants.py, written
// out here (sdc reads no Python); an entry is a comma list of module name
// endings, or a regex matching whole names, as --target-modules takes them.
#include "PeftDefaults.h"
#include <cstring>

namespace sd {
namespace {

struct ModelTargets {
  const char *modelType, *modules;
};

// LoraConfig (LoHa, LoKr and DyLoRA take LoRA's too)
const ModelTargets kLora[] = {
    {"t5", R"(q,v)"},
    {"mt5", R"(q,v)"},
    {"bart", R"(q_proj,v_proj)"},
    {"gpt2", R"(c_attn)"},
    {"bloom", R"(query_key_value)"},
    {"blip-2", R"(q,v,q_proj,v_proj)"},
    {"opt", R"(q_proj,v_proj)"},
    {"gptj", R"(q_proj,v_proj)"},
    {"gpt_neox", R"(query_key_value)"},
    {"gpt_neo", R"(q_proj,v_proj)"},
    {"bert", R"(query,value)"},
    {"roberta", R"(query,value)"},
    {"xlm-roberta", R"(query,value)"},
    {"electra", R"(query,value)"},
    {"deberta-v2", R"(query_proj,value_proj)"},
    {"deberta", R"(in_proj)"},
    {"layoutlm", R"(query,value)"},
    {"llama", R"(q_proj,v_proj)"},
    {"llama4", R"(q_proj,v_proj)"},
    {"chatglm", R"(query_key_value)"},
    {"gpt_bigcode", R"(c_attn)"},
    {"mpt", R"(Wqkv)"},
    {"RefinedWebModel", R"(query_key_value)"},
    {"RefinedWeb", R"(query_key_value)"},
    {"falcon", R"(query_key_value)"},
    {"btlm", R"(c_proj,c_attn)"},
    {"codegen", R"(qkv_proj)"},
    {"mistral", R"(q_proj,v_proj)"},
    {"mixtral", R"(q_proj,v_proj)"},
    {"stablelm", R"(q_proj,v_proj)"},
    {"phi", R"(q_proj,v_proj,fc1,fc2)"},
    {"gemma", R"(q_proj,v_proj)"},
    {"gemma2", R"(q_proj,v_proj)"},
    {"gemma3_text", R"(q_proj,v_proj)"},
    {"gemma4", R"(.*language_model\..*\.(q_proj|v_proj))"},
    {"qwen2", R"(q_proj,v_proj)"},
    {"qwen3", R"(q_proj,v_proj)"},
    {"nemotron_h", R"(q_proj,k_proj,v_proj,o_proj)"},
    {"rwkv", R"(key,value,receptance,output)"},
    {"rwkv7", R"(r_proj,k_proj,v_proj,o_proj,key,value)"},
};
// VeraConfig: LoRA's, but for these.
const ModelTargets kVeraOverLora[] = {
    {"phi", R"(q_proj,v_proj)"},
};
// AdaLoraConfig
const ModelTargets kAdalora[] = {
    {"t5", R"(q,k,v,o,wi,wo)"},
    {"mt5", R"(q,k,v,o,wi_0,wi_1,wo)"},
    {"bart", R"(q_proj,k_proj,v_proj,out_proj,fc1,fc2)"},
    {"gpt2", R"(c_attn)"},
    {"bloom", R"(query_key_value)"},
    {"opt", R"(q_proj,k_proj,v_proj,out_proj,fc1,fc2)"},
    {"gptj", R"(q_proj,v_proj)"},
    {"gpt_neox", R"(query_key_value)"},
    {"gpt_neo", R"(q_proj,v_proj)"},
    {"llama", R"(q_proj,v_proj)"},
    {"llama4", R"(q_proj,v_proj)"},
    {"bert", R"(query,value)"},
    {"roberta", R"(query,key,value,dense)"},
    {"deberta-v2", R"(query_proj,key_proj,value_proj,dense)"},
    {"gpt_bigcode", R"(c_attn)"},
    {"deberta", R"(in_proj)"},
    {"gemma", R"(q_proj,v_proj)"},
    {"gemma2", R"(q_proj,v_proj)"},
    {"gemma3_text", R"(q_proj,v_proj)"},
    {"gemma4", R"(.*language_model\..*\.(q_proj|v_proj))"},
    {"qwen2", R"(q_proj,v_proj)"},
    {"qwen3", R"(q_proj,v_proj)"},
    {"nemotron_h", R"(q_proj,k_proj,v_proj,o_proj)"},
};
// IA3Config's target_modules
const ModelTargets kIa3[] = {
    {"t5", R"(k,v,wo)"},
    {"mt5", R"(k,v,wi_1)"},
    {"gpt2", R"(c_attn,mlp.c_proj)"},
    {"bloom", R"(query_key_value,mlp.dense_4h_to_h)"},
    {"roberta", R"(key,value,output.dense)"},
    {"opt", R"(q_proj,k_proj,fc2)"},
    {"gptj", R"(q_proj,v_proj,fc_out)"},
    {"gpt_neox", R"(query_key_value,dense_4h_to_h)"},
    {"gpt_neo", R"(q_proj,v_proj,c_proj)"},
    {"bart", R"(q_proj,v_proj,fc2)"},
    {"gpt_bigcode", R"(c_attn,mlp.c_proj)"},
    {"llama", R"(k_proj,v_proj,down_proj)"},
    {"llama4", R"(q_proj,v_proj,down_proj)"},
    {"mistral", R"(k_proj,v_proj,down_proj)"},
    {"mixtral", R"(k_proj,v_proj,w2)"},
    {"bert", R"(key,value,output.dense)"},
    {"deberta-v2", R"(key_proj,value_proj,output.dense)"},
    {"deberta", R"(in_proj,output.dense)"},
    {"RefinedWebModel", R"(query_key_value,dense_4h_to_h)"},
    {"RefinedWeb", R"(query_key_value,dense_4h_to_h)"},
    {"falcon", R"(query_key_value,dense_4h_to_h)"},
    {"phi", R"(q_proj,v_proj,fc2)"},
    {"gemma", R"(q_proj,v_proj,down_proj)"},
    {"gemma2", R"(q_proj,v_proj,down_proj)"},
    {"gemma3_text", R"(q_proj,v_proj,down_proj)"},
    {"qwen2", R"(q_proj,v_proj,down_proj)"},
    {"qwen3", R"(q_proj,v_proj,down_proj)"},
};
// IA3Config's feedforward_modules
const ModelTargets kIa3Feedforward[] = {
    {"t5", R"(wo)"},
    {"mt5", R"()"},
    {"gpt2", R"(mlp.c_proj)"},
    {"bloom", R"(mlp.dense_4h_to_h)"},
    {"roberta", R"(output.dense)"},
    {"opt", R"(fc2)"},
    {"gptj", R"(fc_out)"},
    {"gpt_neox", R"(dense_4h_to_h)"},
    {"gpt_neo", R"(c_proj)"},
    {"bart", R"(fc2)"},
    {"gpt_bigcode", R"(mlp.c_proj)"},
    {"llama", R"(down_proj)"},
    {"llama4", R"(down_proj)"},
    {"mistral", R"(down_proj)"},
    {"mixtral", R"(w2)"},
    {"bert", R"(output.dense)"},
    {"deberta-v2", R"(output.dense)"},
    {"deberta", R"(output.dense)"},
    {"RefinedWeb", R"(dense_4h_to_h)"},
    {"RefinedWebModel", R"(dense_4h_to_h)"},
    {"falcon", R"(dense_4h_to_h)"},
    {"phi", R"(fc2)"},
    {"gemma", R"(down_proj)"},
    {"gemma2", R"(down_proj)"},
    {"gemma3_text", R"(down_proj)"},
    {"qwen2", R"(down_proj)"},
    {"qwen3", R"(down_proj)"},
};
// OSFConfig
const ModelTargets kOsf[] = {
    {"llama", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"llama4", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"mistral", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"mixtral", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"gemma", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"gemma2", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"gemma3_text", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"qwen2", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"qwen3", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"phi", R"(q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj,up_proj)"},
    {"gpt2", R"(c_attn,c_proj)"},
    {"bloom", R"(query_key_value,dense_4h_to_h)"},
    {"opt", R"(q_proj,k_proj,v_proj,out_proj,fc1,fc2)"},
    {"gptj", R"(q_proj,k_proj,v_proj,out_proj,fc_in,fc_out)"},
    {"gpt_neox", R"(query_key_value,dense_4h_to_h)"},
    {"falcon", R"(query_key_value,dense_4h_to_h)"},
    {"gpt_bigcode", R"(c_attn,c_proj)"},
};

template <size_t N>
const char *lookUp(const ModelTargets (&table)[N], const std::string &modelType) {
  for (const ModelTargets &t : table)
    if (modelType == t.modelType) return t.modules;
  return nullptr;
}

} // namespace

std::optional<PeftDefaultTargets> peftDefaultTargets(const std::string &peft, const std::string &modelType) {
  const char *targets = peft == "lora" || peft == "loha" || peft == "lokr" || peft == "dylora" ? lookUp(kLora, modelType)
                        : peft == "vera" ? (lookUp(kVeraOverLora, modelType) ? lookUp(kVeraOverLora, modelType)
                                                                             : lookUp(kLora, modelType))
                        : peft == "adalora"                                                   ? lookUp(kAdalora, modelType)
                        : peft == "ia3"                                                       ? lookUp(kIa3, modelType)
                        : peft == "osft"                                                      ? lookUp(kOsf, modelType)
                                                                                              : nullptr;
  if (!targets && peft == "osft") targets = "all-linear"; // OSF's fallback for a model_type it does not list
  if (!targets) return std::nullopt;
  PeftDefaultTargets d{targets, ""};
  if (peft == "ia3") {
    const char *feedforward = lookUp(kIa3Feedforward, modelType);
    if (!feedforward) return std::nullopt; // PEFT needs both for IA3
    d.feedforward = feedforward;
  }
  return d;
}

} // namespace sd
