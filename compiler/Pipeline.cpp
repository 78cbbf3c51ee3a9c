// Pass pipeline construction.
#include "Pipeline.h"
#include "Passes.h"

namespace sd {

void registerSdPasses() { registerSDPasses(); }

void buildPeftPipeline(mlir::OpPassManager &pm, const PipelineOptions &opts) {
  pm.addPass(createFormLinear());
  pm.addPass(createFuseGelu());
  pm.addPass(createFuseSwiglu());
  pm.addPass(createFuseLayerNorm());
  pm.addPass(createFuseRmsNorm());
  pm.addPass(createFuseAttention());
  if (opts.peft == "lora") {
    PeftLoraOptions lora;
    lora.targetModules = opts.targetModules;
    lora.rank = opts.loraR;
    lora.alpha = opts.loraAlpha;
    lora.rslora = opts.rslora;
    lora.init = opts.loraInit;
    lora.loftqIter = opts.loftqIter;
    lora.seed = opts.seed;
    lora.dropout = opts.loraDropout;
    lora.dora = opts.useDora;
    lora.bias = opts.bias;
    pm.addPass(createPeftLora(lora));
  } else if (opts.peft == "adalora") {
    PeftAdaloraOptions ada;
    ada.targetModules = opts.targetModules;
    ada.rank = opts.loraR;
    ada.targetRank = opts.adaloraTargetR;
    ada.alpha = opts.loraAlpha;
    ada.seed = opts.seed;
    ada.tinit = opts.adaloraTinit;
    ada.tfinal = opts.adaloraTfinal;
    ada.deltaT = opts.adaloraDeltaT;
    ada.beta1 = opts.adaloraBeta1;
    ada.beta2 = opts.adaloraBeta2;
    ada.orthRegWeight = opts.orthRegWeight;
    ada.totalStep = opts.totalStep;
    pm.addPass(createPeftAdalora(ada));
  } else if (opts.peft == "dylora") {
    PeftDyloraOptions dylora;
    dylora.targetModules = opts.targetModules;
    dylora.rank = opts.loraR;
    dylora.alpha = opts.loraAlpha;
    dylora.blockSize = opts.dyloraBlockSize;
    dylora.seed = opts.seed;
    pm.addPass(createPeftDylora(dylora));
  } else if (opts.peft == "loha") {
    PeftLohaOptions loha;
    loha.targetModules = opts.targetModules;
    loha.rank = opts.loraR;
    loha.alpha = opts.loraAlpha;
    loha.seed = opts.seed;
    pm.addPass(createPeftLoha(loha));
  } else if (opts.peft == "lokr") {
    PeftLokrOptions lokr;
    lokr.targetModules = opts.targetModules;
    lokr.rank = opts.loraR;
    lokr.alpha = opts.loraAlpha;
    lokr.decomposeBoth = opts.decomposeBoth;
    lokr.decomposeFactor = opts.decomposeFactor;
    lokr.seed = opts.seed;
    pm.addPass(createPeftLokr(lokr));
  } else if (opts.peft == "vera") {
    PeftVeraOptions vera;
    vera.targetModules = opts.targetModules;
    vera.rank = opts.loraR;
    vera.projectionKey = opts.seed;
    vera.dropout = opts.loraDropout;
    pm.addPass(createPeftVera(vera));
  } else if (opts.peft == "prompt" || opts.peft == "prefix") {
    PeftPromptOptions prompt;
    prompt.prefix = opts.peft == "prefix";
    prompt.virtualTokens = opts.virtualTokens;
    prompt.init = opts.promptInit;
    prompt.initIds = opts.promptInitIds;
    prompt.initText = opts.promptInitText;
    prompt.tokenizerPath = opts.promptTokenizer;
    prompt.seed = opts.seed;
    prompt.tokenInput = opts.tokenInput;
    pm.addPass(createPeftPrompt(prompt));
  } else if (opts.peft == "bitfit") {
    pm.addPass(createPeftBitfit());
  } else if (opts.peft == "bottleneck") {
    PeftBottleneckOptions bn;
    bn.config = opts.bottleneckConfig;
    bn.reductionFactor = opts.reductionFactor;
    bn.nonLinearity = opts.nonLinearity;
    bn.scaling = opts.bottleneckScaling;
    bn.scalingKind = opts.bottleneckScalingKind;
    bn.useGating = opts.bottleneckGating;
    bn.init = opts.bottleneckInit;
    bn.leaveOut = opts.bottleneckLeaveOut;
    bn.seed = opts.seed;
    pm.addPass(createPeftBottleneck(bn));
  } else if (opts.peft == "ia3") {
    PeftIa3Options ia3;
    ia3.targetModules = opts.targetModules;
    ia3.feedforwardModules = opts.feedforwardModules;
    pm.addPass(createPeftIa3(ia3));
  } else if (opts.peft == "osft") {
    PeftOsftOptions osft;
    osft.targetModules = opts.targetModules;
    osft.ratio = opts.osftRatio;
    osft.rankPattern = opts.osftRankPattern;
    pm.addPass(createPeftOsft(osft));
  } else if (opts.training()) {
    pm.addPass(createMarkTrainable(MarkTrainableOptions{opts.trainable, opts.freeze}));
  }
  // QLoRA: the base weights the adapters left frozen, as NF4 codes.
  if (opts.quantize == "nf4") pm.addPass(createQuantizeNf4());
}

void buildTensorPipeline(mlir::OpPassManager &pm, const PipelineOptions &opts) {
  buildPeftPipeline(pm, opts);
  if (opts.training() && opts.recipe == "classify") {
    RecipeClassifyOptions recipe;
    recipe.numLabels = opts.numLabels;
    recipe.pooling = opts.pooling;
    recipe.featuresOutput = opts.featuresOutput;
    recipe.tokenInput = opts.tokenInput;
    recipe.seed = opts.seed;
    pm.addPass(createRecipeClassify(recipe));
  } else if (opts.training() && opts.grpo()) {
    RecipeGrpoOptions recipe;
    recipe.numGenerations = opts.numGenerations;
    recipe.lossType = opts.grpoLoss;
    recipe.sapoTemperaturePos = opts.sapoTemperaturePos;
    recipe.sapoTemperatureNeg = opts.sapoTemperatureNeg;
    recipe.vespoKPos = opts.vespoKPos;
    recipe.vespoLambdaPos = opts.vespoLambdaPos;
    recipe.vespoKNeg = opts.vespoKNeg;
    recipe.vespoLambdaNeg = opts.vespoLambdaNeg;
    recipe.beta = opts.beta;
    recipe.epsilon = opts.grpoEpsilon;
    recipe.epsilonHigh = opts.grpoEpsilonHigh;
    recipe.delta = opts.grpoDelta;
    recipe.importanceSampling = opts.importanceSampling;
    recipe.scaleRewards = opts.scaleRewards;
    recipe.maxCompletionLength = opts.maxCompletionLength;
    recipe.samplingLogProbs = opts.samplingLogProbs;
    recipe.logitsOutput = opts.logitsOutput;
    recipe.tokenInput = opts.tokenInput;
    pm.addPass(createRecipeGrpo(recipe));
  } else if (opts.training() && opts.preference()) {
    RecipePreferenceOptions recipe;
    recipe.method = opts.recipe;
    recipe.beta = opts.beta;
    recipe.lossType = opts.dpoLoss;
    recipe.simpoGamma = opts.simpoGamma;
    recipe.cpoAlpha = opts.cpoAlpha;
    recipe.desirableWeight = opts.desirableWeight;
    recipe.undesirableWeight = opts.undesirableWeight;
    recipe.logitsOutput = opts.logitsOutput;
    recipe.tokenInput = opts.tokenInput;
    pm.addPass(createRecipePreference(recipe));
  } else if (opts.training()) {
    RecipeSftOptions recipe;
    recipe.lossOutput = opts.lossOutput;
    recipe.logitsOutput = opts.logitsOutput;
    recipe.tokenInput = opts.tokenInput;
    pm.addPass(createRecipeSft(recipe));
  }
  KvEntriesOptions kv;
  kv.maxLength = opts.kvCache;
  kv.batch = opts.kvBatch;
  kv.chunk = opts.prefillChunk > 0 ? opts.prefillChunk : std::min<int64_t>(64, opts.kvCache);
  kv.speculate = opts.speculate;
  kv.tokenInput = opts.tokenInput;
  kv.logitsOutput = opts.logitsOutput;
  kv.keepInfer = opts.training() || !opts.shapes.empty() || !opts.inferShapes.empty();
  if (opts.kvCache > 0) pm.addPass(createKvEntries(kv));
  SpecializeOptions spec;
  spec.shapes = opts.shapes;
  spec.dims = opts.dims;
  spec.inferShapes = opts.inferShapes;
  spec.inferBatchOne = opts.training() && opts.inferShapes.empty();
  pm.addPass(createSpecialize(spec));
  pm.addPass(createPropagateShapes());
  pm.addPass(createFoldFrozenMasks());
  // Again, for attention masks that only became constants with the shapes
  // (an exporter's causal mask built from the sequence length, in plans whose
  // shapes are specialized after import); before autodiff and packing, which
  // rely on the fused op. Rotary embeddings too: their cos/sin take their
  // [.., S, D] form only with the shapes.
  pm.addPass(createFuseAttention());
  pm.addPass(createFuseRotary());
  // Prefix tuning's keys and values, with the shapes; before the cache takes them.
  if (opts.peft == "prefix") pm.addPass(createPrefixAttention(PrefixAttentionOptions{opts.seed, opts.prefixProjection, opts.encoderHiddenSize}));
  if (opts.kvCache > 0) pm.addPass(createKvCache());
  if (opts.maxLoras > 0) pm.addPass(createLoraSlots(LoraSlotsOptions{opts.maxLoras}));
  pm.addPass(createFuseProjections());
  if (opts.joinLora) pm.addPass(createJoinLora());
  if (opts.attentionLayout) pm.addPass(createAttentionLayout());
  if (opts.packSwiglu) pm.addPass(createPackSwiglu());
  if (opts.qkvAttention) pm.addPass(createQkvAttention());
  // After the layout passes, which read the projections as Linear ops.
  if (opts.quantize == "int4") pm.addPass(createQuantizeInt4());
  pm.addPass(createBoundedExtents());
  pm.addPass(createCheckStatic());
  if (opts.peft == "osft") pm.addPass(createOsftStrategy(OsftStrategyOptions{opts.osftStrategy}));
  if (opts.precision != "fp32") {
    pm.addPass(createAutocast(AutocastOptions{opts.precision, opts.lossScaleInit, opts.lossScaleWindow}));
    pm.addPass(createPropagateShapes());
  }
  if (opts.training()) {
    if (opts.packing) pm.addPass(createPackSequences());
    pm.addPass(createAutodiff());
    if (opts.attentionStats) pm.addPass(createAttentionStats());
    if (opts.peft == "dylora") pm.addPass(createDyloraDraws()); // before sd-training-dropout sees its draws
    pm.addPass(createTrainingDropout());
    pm.addPass(createTrainingBatchNorm());
    OptimizerOptions o;
    o.optimizer = opts.optimizer;
    o.beta1 = opts.beta1;
    o.beta2 = opts.beta2;
    o.epsilon = opts.epsilon;
    o.momentum = opts.momentum;
    o.nesterov = opts.nesterov;
    pm.addPass(createOptimizer(o));
    pm.addPass(createAccumulateWhereProduced());
    pm.addPass(createDataParallel(DataParallelOptions{opts.bucketMb, opts.shard, opts.overlapReduction}));
    if (opts.shard == "params") pm.addPass(createShardParams());
    pm.addPass(createOsftProject(OsftProjectOptions{opts.osftVRule}));
    if (opts.groupUpdates) pm.addPass(createGroupUpdates());
    pm.addPass(createPropagateShapes());
  }
  // Once the backward reads the weights too: a dequantization per reader.
  if (opts.quantize == "nf4") pm.addPass(createRematerializeDequant());
  pm.addPass(createFoldConvAffine());
  pm.addPass(createFuseHardSwish());
  pm.addPass(createFuseConvEpilogue());
  if (opts.gemmScale) pm.addPass(createScaleIntoGemm());
  pm.addPass(createFoldCastRoundTrips());
  // Before the cast motion and the half steps: a sum the GEMMs now write in
  // bf16 reaches a rotary through a widening cast they move and remove.
  if (opts.gemmAccumulate) pm.addPass(createAccumulateIntoGemm());
  if (opts.castMotion) {
    pm.addPass(createMoveCasts());
    pm.addPass(createFoldCastRoundTrips()); // the round trips moved casts meet
  }
  if (opts.halfSteps) pm.addPass(createHalfElementwise());
  if (opts.normGradSum) pm.addPass(createNormGradSum()); // before the Adds join elementwise chains
  if (opts.gemmEpilogues) pm.addPass(createFuseGemmEpilogues(FuseGemmEpiloguesOptions{opts.halfEpilogues}));
  if (opts.elementwiseFusion) pm.addPass(createFuseElementwise());
  if (opts.groupCasts) pm.addPass(createGroupWeightCasts()); // the casts no chain took in
  pm.addPass(createPropagateShapes()); // removes the ops they replaced
}

void buildPlanPipeline(mlir::OpPassManager &pm) {
  pm.addPass(createBufferize());
  pm.addPass(createInPlaceReuse());
  pm.addPass(createLiveness());
  pm.addPass(createPackArena());
}

} // namespace sd
