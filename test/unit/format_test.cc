// The format library's readers and writers on their own: JSON, CRC32C,
// safetensors, .npy and TensorProto. Round trips, the values other tools
// write, and malformed bytes refused with an error (never a crash).
#include "sd/format/crc32c.h"
#include "sd/format/json.h"
#include "sd/format/peft.h"
#include "sd/format/safetensors.h"
#include "sd/format/tensor_io.h"
#include <cmath>
#include <cstdio>
#include <cstring>
#include <gtest/gtest.h>
#include <unistd.h>

namespace {

using namespace sd;

TEST(Json, ParsesEveryTypeAndKeepsKeyOrder) {
  auto j = parseJson(R"({"b": [1, -2.5e3, true, null], "a": {"s": "x\u00e9\n"}, "n": 9007199254740991})", "t");
  ASSERT_TRUE(j.isOk()) << j.status().message();
  const Json &v = j.value();
  ASSERT_EQ(v.obj.size(), 3u);
  EXPECT_EQ(v.obj[0].first, "b");
  EXPECT_EQ(v.obj[1].first, "a");
  const Json *b = v.get("b");
  ASSERT_TRUE(b && b->type == Json::Type::Array && b->arr.size() == 4);
  EXPECT_TRUE(b->arr[0].isInteger());
  EXPECT_EQ(b->arr[1].num, -2500.0);
  EXPECT_FALSE(b->arr[1].isInteger() && b->arr[1].num != -2500.0);
  EXPECT_TRUE(b->arr[2].b);
  EXPECT_EQ(b->arr[3].type, Json::Type::Null);
  EXPECT_EQ(v.get("a")->get("s")->str, "x\xc3\xa9\n");
  EXPECT_EQ(v.get("n")->num, 9007199254740991.0);
  EXPECT_EQ(v.get("missing"), nullptr);
}

TEST(Json, QuoteRoundTrips) {
  const std::string s = std::string("tab\t quote\" back\\ ctl\x01 ") + "\xe2\x82\xac";
  auto j = parseJson(jsonQuote(s), "q");
  ASSERT_TRUE(j.isOk()) << j.status().message();
  EXPECT_EQ(j.value().str, s);
}

TEST(Json, MalformedInputIsAnErrorNamingTheSource) {
  for (const char *bad : {"", "{", "[1,]", "{\"a\" 1}", "\"\\uZZZZ\"", "01", "1.", "-", "1e+", "1e999999",
                          "{\"a\":1}}", "nul", "\"unterminated", "\"\\x41\"", ".5"}) {
    auto j = parseJson(bad, "bad.json");
    EXPECT_FALSE(j.isOk()) << bad;
    if (!j.isOk()) EXPECT_NE(j.status().message().find("bad.json"), std::string::npos) << j.status().message();
  }
  std::string deep(100000, '[');
  EXPECT_FALSE(parseJson(deep, "deep").isOk()); // depth-limited, not a stack overflow
}

TEST(Crc32c, KnownValuesAndChaining) {
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u); // the CRC-32C check value
  const std::string a = "hello ", b = "world";
  EXPECT_EQ(crc32c(b.data(), b.size(), crc32c(a.data(), a.size())), crc32c("hello world", 11));
}

std::string tempPath(const char *name) {
  return std::string("/tmp/sd_format_test_") + std::to_string(::getpid()) + "_" + name;
}

TEST(Safetensors, RoundTripWithMetadata) {
  std::vector<float> w = {1.5f, -2.f, 0.f, 3.25f, 7.f, -0.5f};
  std::vector<int64_t> step = {42};
  std::vector<NamedTensor> tensors = {{"layer.weight", DType::F32, {2, 3}, w.data(), w.size() * 4},
                                      {"step", DType::I64, {}, step.data(), 8}};
  const std::string path = tempPath("rt.safetensors");
  ASSERT_TRUE(writeSafetensors(path, tensors, {{"format", "pt"}}).isOk());
  auto f = readSafetensors(path);
  std::remove(path.c_str());
  ASSERT_TRUE(f.isOk()) << f.status().message();
  const auto &t = f.value().tensors;
  ASSERT_EQ(t.size(), 2u);
  const NamedTensor &lw = t.at("layer.weight");
  EXPECT_EQ(lw.dtype, DType::F32);
  EXPECT_EQ(lw.dims, (Dims{2, 3}));
  EXPECT_EQ(std::memcmp(lw.data, w.data(), 24), 0);
  EXPECT_EQ(t.at("step").dims, Dims{});
  EXPECT_EQ(*static_cast<const int64_t *>(t.at("step").data), 42);
  EXPECT_EQ(f.value().metadata.at("format"), "pt");
}

// The bytes safetensors' own writer makes: an 8-byte header length, a JSON
// header with dtype, shape and data_offsets, then the data.
std::string image(const std::string &header, const std::string &data) {
  uint64_t n = header.size();
  return std::string(reinterpret_cast<const char *>(&n), 8) + header + data;
}

TEST(Safetensors, ReadsWhatOtherWritersWrite) {
  float v[2] = {1.f, 2.f};
  std::string bytes = image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})",
                            std::string(reinterpret_cast<const char *>(v), 8));
  std::map<std::string, NamedTensor> t;
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(parseSafetensors(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "x", t, &meta).isOk());
  EXPECT_EQ(static_cast<const float *>(t.at("x").data)[1], 2.f);
  EXPECT_EQ(meta.at("k"), "v");
}

TEST(Safetensors, MalformedImagesAreRefused) {
  const std::string eight(8, '\0');
  for (const std::string &bad :
       {std::string("short"), image("{", ""), image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", eight),
        image(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
        image(R"({"x":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", eight),
        image(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
        image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
        std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}"}) {
    std::map<std::string, NamedTensor> t;
    EXPECT_FALSE(parseSafetensors(reinterpret_cast<const uint8_t *>(bad.data()), bad.size(), "bad", t, nullptr).isOk())
        << bad.substr(8);
  }
}

TEST(Safetensors, NonFiniteWeightsAreRefusedWhenAsked) {
  float v[2] = {1.f, NAN};
  NamedTensor t{"w", DType::F32, {2}, v, 8};
  Status s = checkFiniteValues(t, "adapter");
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
}

HostTensor sample() {
  HostTensor t{"x", DType::F32, {2, 2}, {}};
  float v[4] = {1.f, -2.f, 3.5f, 0.f};
  t.data.assign(reinterpret_cast<uint8_t *>(v), reinterpret_cast<uint8_t *>(v) + 16);
  return t;
}

TEST(TensorFiles, NpyAndTensorProtoRoundTrip) {
  const HostTensor t = sample();
  for (bool npy : {true, false}) {
    const std::string bytes = npy ? encodeNpy(t) : encodeTensorProto(t);
    auto back = npy ? decodeNpy(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "t")
                    : decodeTensorProto(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "t");
    ASSERT_TRUE(back.isOk()) << back.status().message();
    EXPECT_EQ(back.value().dtype, DType::F32);
    EXPECT_EQ(back.value().dims, (Dims{2, 2}));
    EXPECT_EQ(back.value().data, t.data);
  }
}

TEST(TensorFiles, NpyAsNumpyWritesIt) {
  // np.save(f, np.array([[1, 2]], dtype='<i8')): version 1.0, a padded header.
  std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 2), }";
  header.append((10 + header.size() + 1 + 63) / 64 * 64 - 10 - header.size() - 1, ' ');
  header += '\n';
  uint16_t hl = uint16_t(header.size());
  int64_t v[2] = {1, 2};
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + std::string(reinterpret_cast<const char *>(&hl), 2) + header +
                      std::string(reinterpret_cast<const char *>(v), 16);
  auto t = decodeNpy(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "np");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t.value().dtype, DType::I64);
  EXPECT_EQ(t.value().dims, (Dims{1, 2}));
  EXPECT_EQ(reinterpret_cast<const int64_t *>(t.value().data.data())[1], 2);
}

TEST(TensorFiles, MalformedBytesAreRefused) {
  const std::string good = encodeNpy(sample());
  std::string truncated = good.substr(0, good.size() - 3), wrongMagic = good;
  wrongMagic[1] = 'X';
  for (const std::string &bad : {truncated, wrongMagic, std::string("\x93NUMPY")}) {
    EXPECT_FALSE(decodeNpy(reinterpret_cast<const uint8_t *>(bad.data()), bad.size(), "bad").isOk());
  }
  const std::string proto = encodeTensorProto(sample());
  for (size_t cut : {size_t(1), proto.size() / 2, proto.size() - 1}) {
    auto t = decodeTensorProto(reinterpret_cast<const uint8_t *>(proto.data()), cut, "bad");
    EXPECT_FALSE(t.isOk()) << "cut at " << cut;
  }
}

} // namespace

TEST(PeftConfig, Ia3FeedforwardFollowsPeftsRule) {
  // A list: a module is a feedforward one when its name ends with an entry
  // (PEFT's plain suffix test, no dot boundary).
  auto list = sd::parseAdapterConfig(R"({"peft_type": "IA3", "feedforward_modules": ["mlp.c_proj", "down_proj"]})", "a");
  ASSERT_TRUE(list.isOk()) << list.status().message();
  EXPECT_TRUE(list.value().isIa3());
  EXPECT_TRUE(list.value().feedforwardByRule("transformer.h.0.mlp.c_proj"));
  EXPECT_FALSE(list.value().feedforwardByRule("transformer.h.0.attn.c_proj"));
  EXPECT_TRUE(list.value().feedforwardByRule("model.layers.1.mlp.down_proj"));
  EXPECT_EQ(list.value().tensorNames("m"), std::vector<std::string>{"m.ia3_l"});
  // A string: a regex PEFT matches whole. It is kept, not run (a hostile
  // pattern could backtrack for ever); each vector's shape tells its side.
  auto regex = sd::parseAdapterConfig(R"({"peft_type": "IA3", "feedforward_modules": "(a*)*b"})", "a");
  ASSERT_TRUE(regex.isOk()) << regex.status().message();
  EXPECT_FALSE(regex.value().feedforwardRuleKnown());
  EXPECT_FALSE(regex.value().feedforwardByRule(std::string(40, 'a')));
  EXPECT_TRUE(list.value().feedforwardRuleKnown());
  auto none = sd::parseAdapterConfig(R"({"peft_type": "IA3", "feedforward_modules": null})", "a");
  ASSERT_TRUE(none.isOk());
  EXPECT_FALSE(none.value().feedforwardByRule("h.0.mlp.fc"));
}

TEST(PeftConfig, MalformedIa3FieldsAreOneLineErrors) {
  for (const char *bad : {R"({"peft_type": "IA3", "feedforward_modules": 3})",
                          R"({"peft_type": "IA3", "feedforward_modules": [1]})"}) {
    auto c = sd::parseAdapterConfig(bad, "cfg.json");
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_NE(c.status().message().find("cfg.json: 'feedforward_modules'"), std::string::npos) << c.status().message();
  }
}

TEST(PeftConfig, DoraRoundTripsThroughTheConfigSdrunWrites) {
  sd::LoraConfig cfg;
  cfg.r = 4;
  cfg.alpha = 8;
  cfg.useDora = true;
  cfg.modules = {"q"};
  auto back = sd::parseAdapterConfig(sd::adapterConfigJson(cfg), "a");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_TRUE(back.value().useDora);
  EXPECT_EQ(back.value().kindName(), "DoRA");
  EXPECT_EQ(cfg.tensorNames("q"),
            (std::vector<std::string>{"q.lora_A.weight", "q.lora_B.weight", "q.lora_magnitude_vector"}));
  sd::LoraConfig ia3;
  ia3.peftType = "IA3";
  ia3.modules = {"a.k", "a.down"};
  ia3.feedforward = {"a.down"};
  auto written = sd::parseAdapterConfig(sd::adapterConfigJson(ia3), "a");
  ASSERT_TRUE(written.isOk()) << written.status().message();
  EXPECT_TRUE(written.value().feedforwardByRule("a.down"));
  EXPECT_FALSE(written.value().feedforwardByRule("a.k"));
}

TEST(PeftConfig, StartsThatRewriteTheBaseWeightRoundTripAndTheOthersAreRefused) {
  sd::LoraConfig cfg;
  cfg.r = 4;
  cfg.alpha = 8;
  cfg.modules = {"q"};
  cfg.baseInit = "loftq";
  cfg.loftqIter = 3;
  std::string json = sd::adapterConfigJson(cfg);
  EXPECT_NE(json.find("\"init_lora_weights\": \"loftq\""), std::string::npos) << json;
  auto back = sd::parseAdapterConfig(json, "a");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value().baseInit, "loftq");
  EXPECT_EQ(back.value().loftqIter, 3);
  EXPECT_EQ(back.value().compileFlags(), "--peft lora --lora-init loftq");
  cfg.baseInit = "";
  auto plain = sd::parseAdapterConfig(sd::adapterConfigJson(cfg), "a");
  ASSERT_TRUE(plain.isOk()) << plain.status().message();
  EXPECT_EQ(plain.value().baseInit, "");
  const std::string base = R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, )";
  auto pissa = sd::parseAdapterConfig(base + R"("init_lora_weights": "pissa"})", "a");
  ASSERT_TRUE(pissa.isOk()) << pissa.status().message();
  EXPECT_EQ(pissa.value().baseInit, "pissa");
  auto gaussian = sd::parseAdapterConfig(base + R"("init_lora_weights": "gaussian"})", "a");
  ASSERT_TRUE(gaussian.isOk());
  EXPECT_EQ(gaussian.value().baseInit, "");
  for (const char *refused : {"pissa_niter_4", "corda", "eva", "lora_ga"}) {
    auto r = sd::parseAdapterConfig(base + R"("init_lora_weights": ")" + refused + R"("})", "a");
    ASSERT_FALSE(r.isOk()) << refused;
    EXPECT_NE(r.status().message().find(refused), std::string::npos) << r.status().message();
  }
  auto eightBits = sd::parseAdapterConfig(
      base + R"("init_lora_weights": "loftq", "loftq_config": {"loftq_bits": 8, "loftq_iter": 1}})", "a");
  ASSERT_FALSE(eightBits.isOk());
  EXPECT_NE(eightBits.status().message().find("loftq_bits"), std::string::npos);
  auto noIter = sd::parseAdapterConfig(base + R"("init_lora_weights": "loftq", "loftq_config": {"loftq_bits": 4}})", "a");
  ASSERT_FALSE(noIter.isOk());
  EXPECT_NE(noIter.status().message().find("loftq_iter"), std::string::npos);
  auto fromPlan = sd::loraConfigFromPlanConfig(
      R"({"lora": {"r": 4, "lora_alpha": 8.0, "modules": ["q"], "init_lora_weights": "olora"}})");
  ASSERT_TRUE(fromPlan.isOk()) << fromPlan.status().message();
  EXPECT_EQ(fromPlan.value().baseInit, "olora");
}

TEST(PeftConfig, AdaloraKeysItsTripletsWithoutWeightSuffixAndRoundTripsItsSchedule) {
  sd::LoraConfig cfg;
  cfg.peftType = "ADALORA";
  cfg.r = 6;
  cfg.alpha = 8;
  cfg.targetR = 3, cfg.tinit = 2, cfg.tfinal = 3, cfg.deltaT = 2, cfg.totalStep = 12;
  cfg.modules = {"m.q"};
  EXPECT_EQ(cfg.tensorNames("m.q"), (std::vector<std::string>{"m.q.lora_A", "m.q.lora_E", "m.q.lora_B"}));
  EXPECT_EQ(cfg.key("m.q.lora_E"), "base_model.model.m.q.lora_E");
  auto back = sd::parseAdapterConfig(sd::adapterConfigJson(cfg), "a");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_TRUE(back.value().isAdalora());
  EXPECT_EQ(back.value().r, 6); // init_r, not LoraConfig's r
  EXPECT_EQ(back.value().targetR, 3);
  EXPECT_EQ(back.value().totalStep, 12);
  EXPECT_EQ(back.value().deltaT, 2);
  EXPECT_EQ(back.value().compileFlags(), "--peft adalora");
  auto cut = sd::parseAdapterConfig(
      R"({"peft_type": "ADALORA", "init_r": 6, "lora_alpha": 8, "rank_pattern": {"m.q.lora_E": [true, false]}})", "a");
  ASSERT_FALSE(cut.isOk());
  EXPECT_NE(cut.status().message().find("rank_pattern"), std::string::npos);
  auto pruned = sd::parseAdapterConfig(R"({"peft_type": "ADALORA", "init_r": 3, "lora_alpha": 8, "rank_pattern": )"
                                       R"({"m.q.lora_E": [true, false, true]}})",
                                       "a");
  ASSERT_TRUE(pruned.isOk()) << pruned.status().message();
  EXPECT_EQ(pruned.value().rankPattern.at("m.q"), (std::vector<bool>{true, false, true}));
  auto noRank = sd::parseAdapterConfig(R"({"peft_type": "ADALORA", "lora_alpha": 8})", "a");
  ASSERT_FALSE(noRank.isOk());
  EXPECT_NE(noRank.status().message().find("init_r"), std::string::npos);
}

TEST(PeftConfig, LohaNeedsItsRankAndAlphaAndRefusesPerModulePatterns) {
  auto ok = sd::parseAdapterConfig(R"({"peft_type": "LOHA", "r": 4, "alpha": 8, "rank_pattern": {}})", "a");
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_TRUE(ok.value().isLoha());
  EXPECT_EQ(ok.value().r, 4);
  EXPECT_EQ(ok.value().tensorNames("m"),
            (std::vector<std::string>{"m.hada_w1_a", "m.hada_w1_b", "m.hada_w2_a", "m.hada_w2_b"}));
  auto back = sd::parseAdapterConfig(sd::adapterConfigJson(ok.value()), "a");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value().alpha, 8);
  for (const char *bad : {R"({"peft_type": "LOHA", "alpha": 8})", R"({"peft_type": "LOHA", "r": 4})",
                          R"({"peft_type": "LOHA", "r": 4, "alpha": 8, "rank_pattern": {"q": 2}})"}) {
    auto c = sd::parseAdapterConfig(bad, "cfg.json");
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_EQ(c.status().message().rfind("cfg.json: ", 0), 0u) << c.status().message();
  }
}

TEST(PeftConfig, LokrKeepsItsDecompositionAndEachModulesFactors) {
  auto ok = sd::parseAdapterConfig(
      R"({"peft_type": "LOKR", "r": 4, "alpha": 8, "decompose_both": true, "decompose_factor": 16, "rank_dropout": 0.1})",
      "a");
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_TRUE(ok.value().isLokr());
  EXPECT_EQ(ok.value().kindName(), "LoKr");
  EXPECT_TRUE(ok.value().decomposeBoth);
  EXPECT_EQ(ok.value().decomposeFactor, 16);
  auto back = sd::parseAdapterConfig(sd::adapterConfigJson(ok.value()), "a");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value().alpha, 8);
  EXPECT_TRUE(back.value().decomposeBoth);
  EXPECT_EQ(back.value().decomposeFactor, 16);
  // PEFT's defaults when the fields are absent.
  auto plain = sd::parseAdapterConfig(R"({"peft_type": "LOKR", "r": 2, "alpha": 2})", "a");
  ASSERT_TRUE(plain.isOk()) << plain.status().message();
  EXPECT_FALSE(plain.value().decomposeBoth);
  EXPECT_EQ(plain.value().decomposeFactor, -1);
  // A plan's config names each module's factors: whole or rank-r halves.
  auto plan = sd::loraConfigFromPlanConfig(
      R"({"lokr": {"peft_type": "LOKR", "r": 4, "alpha": 8, "decompose_both": false, "decompose_factor": -1,
          "modules": ["q", "down"], "factors": ["lokr_w1,lokr_w2", "lokr_w1,lokr_w2_a,lokr_w2_b"]}})");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  EXPECT_EQ(plan.value().tensorNames("q"), (std::vector<std::string>{"q.lokr_w1", "q.lokr_w2"}));
  EXPECT_EQ(plan.value().tensorNames("down"),
            (std::vector<std::string>{"down.lokr_w1", "down.lokr_w2_a", "down.lokr_w2_b"}));
  EXPECT_EQ(plan.value().tensors().size(), 5u);
  EXPECT_FALSE(sd::loraConfigFromPlanConfig(R"({"lokr": {"r": 4, "alpha": 8, "decompose_factor": -1,
      "modules": ["q"], "factors": []}})").isOk());
  for (const char *bad : {R"({"peft_type": "LOKR", "alpha": 8})", R"({"peft_type": "LOKR", "r": 4})",
                          R"({"peft_type": "LOKR", "r": 4, "alpha": 8, "decompose_factor": 0})",
                          R"({"peft_type": "LOKR", "r": 4, "alpha": 8, "decompose_factor": 2.5})",
                          R"({"peft_type": "LOKR", "r": 4, "alpha": 8, "decompose_both": "yes"})",
                          R"({"peft_type": "LOKR", "r": 4, "alpha": 8, "alpha_pattern": {"q": 2}})"}) {
    auto c = sd::parseAdapterConfig(bad, "cfg.json");
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_EQ(c.status().message().rfind("cfg.json: ", 0), 0u) << c.status().message();
  }
}

TEST(PeftConfig, PromptTuningKeepsItsVirtualTokensAndAnUnprefixedKey) {
  // What PEFT 0.21 writes for a causal LM (num_layers and heads filled from the model).
  auto ok = sd::parseAdapterConfig(
      R"({"peft_type": "PROMPT_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": 20, "token_dim": 64,
          "num_transformer_submodules": 1, "num_attention_heads": 4, "num_layers": 2,
          "prompt_tuning_init": "RANDOM", "prompt_tuning_init_text": null})",
      "a");
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_TRUE(ok.value().isPromptTuning());
  EXPECT_EQ(ok.value().kindName(), "prompt tuning");
  EXPECT_EQ(ok.value().compileFlags(), "--peft prompt");
  EXPECT_EQ(ok.value().numVirtualTokens, 20);
  EXPECT_EQ(ok.value().tokenDim, 64);
  EXPECT_EQ(ok.value().tensors(), (std::vector<std::pair<std::string, std::string>>{{"", "prompt_embeddings"}}));
  EXPECT_EQ(sd::adapterKey("prompt_embeddings"), "prompt_embeddings");
  auto plan = sd::loraConfigFromPlanConfig(
      R"({"prompt_tuning": {"peft_type": "PROMPT_TUNING", "num_virtual_tokens": 8, "token_dim": 32,
          "prompt_tuning_init": "SAMPLE_VOCAB", "first_virtual_id": 256}})");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  auto back = sd::parseAdapterConfig(sd::adapterConfigJson(plan.value()), "a");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value().numVirtualTokens, 8);
  EXPECT_EQ(back.value().tokenDim, 32);
  EXPECT_EQ(back.value().promptInit, "SAMPLE_VOCAB");
  EXPECT_EQ(plan.value().firstVirtualId, 256);
  EXPECT_FALSE(sd::loraConfigFromPlanConfig(R"({"prompt_tuning": {"num_virtual_tokens": 8}})").isOk());
  for (const char *bad : {R"({"peft_type": "PROMPT_TUNING"})",
                          R"({"peft_type": "PROMPT_TUNING", "num_virtual_tokens": 0})",
                          R"({"peft_type": "PROMPT_TUNING", "num_virtual_tokens": 2.5})",
                          R"({"peft_type": "PROMPT_TUNING", "num_virtual_tokens": 4, "num_transformer_submodules": 2})",
                          R"({"peft_type": "PROMPT_TUNING", "num_virtual_tokens": 4, "task_type": "SEQ_2_SEQ_LM"})",
                          R"({"peft_type": "PROMPT_TUNING", "num_virtual_tokens": 4, "token_dim": -1})"}) {
    auto c = sd::parseAdapterConfig(bad, "cfg.json");
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_EQ(c.status().message().rfind("cfg.json: ", 0), 0u) << c.status().message();
  }
}

TEST(PeftConfig, LoraBiasKeysAnAdaptedLayersBiasAsPeftsWrappedLayer) {
  auto given = sd::parseAdapterConfig(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "lora_only"})", "a");
  ASSERT_TRUE(given.isOk()) << given.status().message();
  EXPECT_EQ(given.value().bias, "lora_only");
  auto bad = sd::parseAdapterConfig(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "some"})", "cfg.json");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("'bias'"), std::string::npos) << bad.status().message();
  auto plan = sd::loraConfigFromPlanConfig(
      R"({"lora": {"r": 4, "lora_alpha": 8, "modules": ["h.0.attn.c_attn"], "bias": "all",
          "trained_biases": ["h.0.attn.c_attn.bias", "h.0.ln_1.bias"]}})");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  EXPECT_EQ(plan.value().tensors().size(), 4u); // two biases, lora_A, lora_B
  EXPECT_EQ(plan.value().key("h.0.attn.c_attn.bias"), "base_model.model.h.0.attn.c_attn.base_layer.bias");
  EXPECT_EQ(plan.value().key("h.0.ln_1.bias"), "base_model.model.h.0.ln_1.bias");
  EXPECT_EQ(plan.value().key("h.0.attn.c_attn.lora_A.weight"), "base_model.model.h.0.attn.c_attn.lora_A.weight");
  EXPECT_NE(sd::adapterConfigJson(plan.value()).find("\"bias\": \"all\""), std::string::npos);
}

TEST(PeftConfig, PrefixTuningKeepsItsLayersAndKeyValueHeads) {
  // What PEFT 0.21 writes for a Llama with 2 key/value heads of 16 (token_dim 32).
  auto ok = sd::parseAdapterConfig(
      R"({"peft_type": "PREFIX_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": 3, "token_dim": 32,
          "num_transformer_submodules": 1, "num_attention_heads": 2, "num_layers": 2, "encoder_hidden_size": 32,
          "prefix_projection": false, "init_weights": null})",
      "a");
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_TRUE(ok.value().isPrefixTuning());
  EXPECT_EQ(ok.value().kindName(), "prefix tuning");
  EXPECT_EQ(ok.value().compileFlags(), "--peft prefix");
  EXPECT_EQ(ok.value().numLayers, 2);
  EXPECT_EQ(ok.value().numAttentionHeads, 2);
  EXPECT_EQ(ok.value().tensors(), (std::vector<std::pair<std::string, std::string>>{{"", "prompt_embeddings"}}));
  auto plan = sd::loraConfigFromPlanConfig(
      R"({"prefix_tuning": {"peft_type": "PREFIX_TUNING", "num_virtual_tokens": 3, "token_dim": 32, "num_layers": 2,
          "num_attention_heads": 2, "first_virtual_id": 256}})");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  auto back = sd::parseAdapterConfig(sd::adapterConfigJson(plan.value()), "a");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_TRUE(back.value().isPrefixTuning());
  EXPECT_EQ(back.value().tokenDim, 32);
  EXPECT_EQ(back.value().numLayers, 2);
  EXPECT_FALSE(sd::loraConfigFromPlanConfig(
                   R"({"prefix_tuning": {"num_virtual_tokens": 3, "token_dim": 32, "first_virtual_id": 256}})")
                   .isOk());
  // A prefix trained through PEFT's MLP is saved as the MLP's output: it loads as any prefix.
  auto mlp = sd::parseAdapterConfig(R"({"peft_type": "PREFIX_TUNING", "num_virtual_tokens": 3, "prefix_projection": true})",
                                    "cfg.json");
  ASSERT_TRUE(mlp.isOk()) << mlp.status().message();
  EXPECT_TRUE(mlp.value().prefixProjection);
  EXPECT_EQ(mlp.value().tensors(), (std::vector<std::pair<std::string, std::string>>{{"", "prompt_embeddings"}}));
  // A --prefix-projection plan writes prefix_projection and its MLP's width.
  auto projected = sd::loraConfigFromPlanConfig(
      R"({"prefix_tuning": {"peft_type": "PREFIX_TUNING", "num_virtual_tokens": 3, "token_dim": 32, "num_layers": 2,
          "num_attention_heads": 2, "first_virtual_id": 256, "prefix_projection": true, "encoder_hidden_size": 24}})");
  ASSERT_TRUE(projected.isOk()) << projected.status().message();
  EXPECT_EQ(projected.value().compileFlags(), "--peft prefix --prefix-projection");
  std::string json = sd::adapterConfigJson(projected.value());
  EXPECT_NE(json.find("\"prefix_projection\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"encoder_hidden_size\": 24"), std::string::npos) << json;
  EXPECT_FALSE(sd::loraConfigFromPlanConfig(
                   R"({"prefix_tuning": {"num_virtual_tokens": 3, "token_dim": 32, "num_layers": 2,
                       "num_attention_heads": 2, "first_virtual_id": 256, "prefix_projection": true}})")
                   .isOk());
}

TEST(PeftConfig, VeraKeysItsSharedProjectionsUnderBaseModel) {
  auto c = sd::parseAdapterConfig(R"({"peft_type": "VERA", "r": 4, "projection_prng_key": 3, "save_projection": false})",
                                  "a");
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_TRUE(c.value().isVera());
  EXPECT_EQ(c.value().projectionKey, 3);
  EXPECT_FALSE(c.value().saveProjection);
  EXPECT_EQ(sd::adapterKey("vera_A"), "base_model.vera_A");
  EXPECT_EQ(sd::adapterKey("m.vera_lambda_b"), "base_model.model.m.vera_lambda_b");
  sd::LoraConfig plan = c.value();
  plan.saveProjection = true;
  plan.modules = {"m"};
  auto tensors = plan.tensors();
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_EQ(tensors[0].second, "vera_A");
  EXPECT_EQ(tensors[3].second, "m.vera_lambda_d");
  auto back = sd::parseAdapterConfig(sd::adapterConfigJson(plan), "a");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value().projectionKey, 3);
  EXPECT_TRUE(back.value().saveProjection);
  for (const char *bad : {R"({"peft_type": "VERA"})", R"({"peft_type": "VERA", "r": 4, "projection_prng_key": -1})",
                          R"({"peft_type": "VERA", "r": 4, "bias": "all"})"})
    EXPECT_FALSE(sd::parseAdapterConfig(bad, "cfg.json").isOk()) << bad;
}
