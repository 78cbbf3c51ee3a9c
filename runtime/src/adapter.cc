// LoRA and OSF adapters between a session's globals and PEFT-layout files.
#include "sd/runtime/adapter.h"
#include "sd/runtime/lora_slots.h"
#include "sd/format/json.h"
#include "sd/format/safetensors.h"
#include "sd/format/training_abi.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <cerrno>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd {

// Links the files of the old folder that are not ours (a README, a tokenizer)
// into the staged one, so replacing the adapter keeps them.
static void carryOverOtherFiles(const std::string &from, const std::string &to) {
  DIR *d = ::opendir(from.c_str());
  if (!d) return;
  while (dirent *e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == ".." || n == kAdapterWeightsFile || n == kAdapterHubWeightsFile || n == kAdapterConfigFile)
      continue;
    struct stat st;
    std::string src = from + "/" + n;
    if (::lstat(src.c_str(), &st) == 0 && S_ISREG(st.st_mode)) (void)::link(src.c_str(), (to + "/" + n).c_str());
  }
  ::closedir(d);
}

// A --prefix-projection plan's prefix, as PEFT saves it: its MLP's output
// tanh(E W0ᵀ + b0) W2ᵀ + b2 [N, 2 L token_dim] (f32, with double sums).
static StatusOr<HostTensor> projectedPrefix(const Session &session) {
  std::vector<HostTensor> parts;
  for (const char *name : kPrefixEncoderNames) {
    int64_t g = session.findGlobal(name);
    if (g < 0) return sdError("the plan has no global '", name, "'");
    auto v = session.readGlobal(size_t(g));
    if (!v.isOk()) return v.status();
    if (v.value().dtype != DType::F32) return sdError("global '", name, "' is not f32");
    parts.push_back(std::move(v.value()));
  }
  const HostTensor &e = parts[0], &w0 = parts[1], &b0 = parts[2], &w2 = parts[3], &b2 = parts[4];
  if (e.dims.size() != 2 || w0.dims.size() != 2 || w2.dims.size() != 2 || w0.dims[1] != e.dims[1] ||
      b0.dims != Dims{w0.dims[0]} || w2.dims[1] != w0.dims[0] || b2.dims != Dims{w2.dims[0]})
    return sdError("the plan's prefix MLP has inconsistent shapes");
  const int64_t n = e.dims[0], dim = e.dims[1], hidden = w0.dims[0], out = w2.dims[0];
  auto f = [](const HostTensor &t) { return reinterpret_cast<const float *>(t.data.data()); };
  std::vector<float> h(static_cast<size_t>(hidden)), y(static_cast<size_t>(n * out));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < hidden; ++j) {
      double s = f(b0)[j];
      for (int64_t k = 0; k < dim; ++k) s += double(f(e)[i * dim + k]) * f(w0)[j * dim + k];
      h[size_t(j)] = float(std::tanh(s));
    }
    for (int64_t j = 0; j < out; ++j) {
      double s = f(b2)[j];
      for (int64_t k = 0; k < hidden; ++k) s += double(h[size_t(k)]) * f(w2)[j * hidden + k];
      y[size_t(i * out + j)] = float(s);
    }
  }
  HostTensor t{kPromptEmbeddings, DType::F32, {n, out}, {}};
  t.data.resize(y.size() * sizeof(float));
  std::memcpy(t.data.data(), y.data(), t.data.size());
  return t;
}

Status saveAdapter(const std::string &dirGiven, const Session &session, const LoraConfig &cfg,
                   const std::map<size_t, std::vector<uint8_t>> *gathered) {
  if (cfg.maxLoras > 0)
    return sdError("the plan serves adapters in slots (sdc compile --max-loras) and trains none to save");
  std::string dir = dirGiven;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::vector<HostTensor> values;
  for (auto &[module, name] : cfg.tensors()) {
    if (cfg.isPrefixTuning() && cfg.prefixProjection && name == kPromptEmbeddings) {
      auto prefix = projectedPrefix(session);
      if (!prefix.isOk()) return prefix.status();
      values.push_back(std::move(prefix.value()));
      continue;
    }
    int64_t g = session.findGlobal(name);
    if (g < 0) return sdError("the plan has no global '", name, "'");
    if (gathered && !session.holdsGlobal(size_t(g))) {
      auto it = gathered->find(size_t(g));
      if (it == gathered->end()) return sdError("global '", name, "' is not held whole on this rank and was not gathered");
      const GlobalDesc &d = session.plan().globals[size_t(g)];
      values.push_back(HostTensor{d.name, d.dtype, d.dims, it->second});
      continue;
    }
    auto v = session.readGlobal(size_t(g));
    if (!v.isOk()) return v.status();
    values.push_back(std::move(v.value()));
  }
  std::vector<NamedTensor> tensors;
  for (const HostTensor &v : values) tensors.push_back({cfg.key(v.name), v.dtype, v.dims, v.data.data(), v.byteSize()});
  // Weights and config must change together (a new A/B with an old r or
  // alpha merges into a wrong model): both are written into a staged folder
  // that replaces the old one in one atomic step.
  std::string parent = parentDirectory(dir), base = dir.substr(dir.find_last_of('/') + 1);
  std::string tempBase = "." + base + ".tmp.", staged = parent + "/" + tempBase + std::to_string(::getpid());
  removeStaleTemps(parent, tempBase);
  removeTree(staged);
  if (::mkdir(staged.c_str(), 0755) != 0) return sdError(dir, ": cannot create a folder beside it (", std::strerror(errno), ")");
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (cfg.isOsf() && !cfg.baseChecksum.empty()) metadata[kOsfBaseChecksumKey] = cfg.baseChecksum;
  Status s = writeSafetensors(staged + "/" + cfg.weightsFile(), tensors, metadata);
  if (s.isOk()) s = writeFileAtomic(staged + "/" + kAdapterConfigFile, adapterConfigJson(cfg));
  if (s.isOk()) carryOverOtherFiles(dir, staged);
  if (s.isOk()) s = syncDirectory(staged);
  if (s.isOk()) s = replaceDirectory(staged, dir);
  if (!s.isOk()) removeTree(staged);
  return s;
}

// An AdaLoRA tensor PEFT cut to its module's kept triplets (rank_pattern),
// back at the plan's r: the kept rows of lora_A and lora_E, or columns of
// lora_B, where the pattern puts them, zeros for the pruned (an E of 0
// computes nothing, as the pruned triplet did).
static StatusOr<std::vector<float>> uncutAdalora(const NamedTensor &t, const std::vector<bool> &kept, const Dims &full,
                                                 const std::string &path, const std::string &key) {
  int64_t k = std::count(kept.begin(), kept.end(), true);
  bool columns = key.size() > 7 && key.compare(key.size() - 7, 7, ".lora_B") == 0;
  Dims cut = full;
  cut[columns ? 1 : 0] = k;
  if (t.dtype != DType::F32 || t.dims != cut)
    return sdError(path, ": '", key, "' is ", dtypeName(t.dtype), "[", formatDims(t.dims), "], its rank_pattern keeps ", k,
                   " triplets: f32[", formatDims(cut), "]");
  std::vector<float> out(size_t(full[0] * full[1]), 0.0f);
  const float *in = static_cast<const float *>(t.data);
  int64_t slot = 0;
  for (int64_t j = 0; j < int64_t(kept.size()); ++j) {
    if (!kept[size_t(j)]) continue;
    if (columns)
      for (int64_t row = 0; row < full[0]; ++row) out[size_t(row * full[1] + j)] = in[row * k + slot];
    else
      std::copy(in + slot * full[1], in + (slot + 1) * full[1], out.begin() + j * full[1]);
    ++slot;
  }
  return out;
}

Status loadAdapter(const std::string &dir, Session &session, const LoraConfig &cfg) {
  if (cfg.maxLoras > 0) { // a serving plan's own adapter: slot 0
    auto slots = LoraSlots::create(session);
    if (!slots.isOk()) return slots.status();
    auto adapter = slots.value()->read(dir);
    if (!adapter.isOk()) return adapter.status();
    return slots.value()->write(0, adapter.value());
  }
  std::string cfgPath = dir + "/" + kAdapterConfigFile;
  auto given = readAdapterConfig(dir);
  if (!given.isOk()) return given.status();
  if (given.value().peftType != cfg.peftType || given.value().useDora != cfg.useDora)
    return sdError(cfgPath, ": the adapter is ", given.value().kindName(), given.value().useDora ? " (use_dora)" : "",
                   ", the plan trains ", cfg.kindName(), " (", cfg.compileFlags(), ")");
  if (cfg.isBottleneck())
    if (std::string differs = bottleneckMismatch(given.value(), cfg); !differs.empty())
      return sdError(cfgPath, ": ", differs);
  // The file's keys: a bottleneck adapter's carry its own name (AdapterHub's load_as renames the same way).
  LoraConfig fileCfg = cfg;
  fileCfg.adapterName = given.value().adapterName;
  if (cfg.isIa3() && given.value().feedforwardRuleKnown())
    for (const std::string &m : cfg.modules) {
      bool planSide = std::find(cfg.feedforward.begin(), cfg.feedforward.end(), m) != cfg.feedforward.end();
      if (given.value().feedforwardByRule(m) != planSide)
        return sdError(cfgPath, ": 'feedforward_modules' ", planSide ? "leaves out" : "takes in", " '", m,
                       "', which the plan scales on its ", planSide ? "input" : "output",
                       " (sdc compile --feedforward-modules)");
    }
  if (cfg.isVera() && (given.value().r != cfg.r || given.value().projectionKey != cfg.projectionKey))
    return sdError(cfgPath, ": VeRA r=", given.value().r, " projection_prng_key=", given.value().projectionKey,
                   ", the plan's r=", cfg.r, " projection_prng_key=", cfg.projectionKey,
                   " (sdc compile --lora-r R --seed KEY): the shared projections differ");
  if (cfg.isPrefixTuning() && cfg.prefixProjection)
    return sdError(dir, ": a --prefix-projection plan trains the prefix's MLP, which a saved prefix (its output) ",
                   "does not hold; run the adapter with a plan compiled without --prefix-projection (as PEFT, "
                   "which loads such an adapter without the MLP)");
  if ((cfg.isPromptTuning() || cfg.isPrefixTuning()) && given.value().numVirtualTokens != cfg.numVirtualTokens)
    return sdError(cfgPath, ": num_virtual_tokens=", given.value().numVirtualTokens, ", the plan's ",
                   cfg.numVirtualTokens, " (sdc compile --num-virtual-tokens N)");
  if (cfg.isLora() || cfg.isLoha() || cfg.isLokr() || cfg.isAdalora()) {
    if (given.value().r != cfg.r)
      return sdError(cfgPath, ": adapter rank r=", given.value().r, " differs from the plan's r=", cfg.r);
    if (std::fabs(given.value().alpha - cfg.alpha) > 1e-9 * std::fabs(cfg.alpha))
      return sdError(cfgPath, cfg.isLora() || cfg.isAdalora() ? ": lora_alpha" : ": alpha", " differs from the plan's ", cfg.alpha);
    if (given.value().rslora != cfg.rslora) return sdError(cfgPath, ": use_rslora differs from the plan's");
    if (given.value().bias != cfg.bias)
      return sdError(cfgPath, ": bias is '", given.value().bias, "', the plan's '", cfg.bias, "' (sdc compile --bias)");
    // PiSSA, OLoRA and LoftQ adapters fit the base weights their start left.
    auto start = [](const LoraConfig &c) {
      return c.baseInit.empty() ? std::string("a default start (base weights as they are)")
                                : "init_lora_weights '" + c.baseInit + "'" +
                                      (c.baseInit == "loftq" ? " (loftq_iter " + std::to_string(c.loftqIter) + ")" : "");
    };
    if (given.value().baseInit != cfg.baseInit || (cfg.baseInit == "loftq" && given.value().loftqIter != cfg.loftqIter))
      return sdError(cfgPath, ": the adapter has ", start(given.value()), ", the plan ", start(cfg),
                     ": their base weights differ (sdc compile --lora-init)");
  }
  // LoKr: these two decide each factor's shape and whether it is whole.
  if (cfg.isLokr() && (given.value().decomposeBoth != cfg.decomposeBoth ||
                       given.value().decomposeFactor != cfg.decomposeFactor))
    return sdError(cfgPath, ": decompose_both=", given.value().decomposeBoth ? "true" : "false",
                   " decompose_factor=", given.value().decomposeFactor, ", the plan's decompose_both=",
                   cfg.decomposeBoth ? "true" : "false", " decompose_factor=", cfg.decomposeFactor,
                   " (sdc compile --decompose-both, --decompose-factor N)");
  std::set<std::string> saved(given.value().modulesToSave.begin(), given.value().modulesToSave.end()),
      planSaved(cfg.modulesToSave.begin(), cfg.modulesToSave.end());
  for (const std::string &m : saved)
    if (!planSaved.count(m))
      return sdError(cfgPath, ": 'modules_to_save' lists '", m, "', which this plan does not train");
  for (const std::string &m : planSaved)
    if (!saved.count(m))
      return sdError(cfgPath, ": the plan trains '", m, "' in full (its classification head), but the adapter's ",
                     "'modules_to_save' does not list it");
  std::string wPath = dir + "/" + cfg.weightsFile();
  auto file = readSafetensors(wPath, /*requireFinite=*/true);
  if (!file.isOk()) return file.status();
  // OSF low factors only mean something next to the high part of the same
  // base weights: an adapter split from other weights is refused (PEFT's own
  // adapters carry no checksum, and then only the shapes are checked).
  if (cfg.isOsf()) {
    auto it = file.value().metadata.find(kOsfBaseChecksumKey);
    if (it != file.value().metadata.end() && !cfg.baseChecksum.empty() && it->second != cfg.baseChecksum)
      return sdError(wPath, ": the adapter was split from different base weights (CRC32C ", it->second,
                     ") than this plan's (", cfg.baseChecksum, "); compile the plan from the adapter's base model");
  }
  std::set<std::string> expected;
  std::vector<std::pair<int64_t, const NamedTensor *>> copies;
  std::vector<std::pair<int64_t, std::vector<float>>> uncut;
  for (auto &[m, name] : cfg.tensors()) {
    std::string key = fileCfg.key(name);
    expected.insert(key);
    auto it = file.value().tensors.find(key);
    bool shared = m.empty() && cfg.isVera(); // VeRA's projections: the plan draws them as PEFT does
    if (shared && it == file.value().tensors.end() && !given.value().saveProjection) continue;
    if (it == file.value().tensors.end())
      return m.empty() ? sdError(wPath, ": no tensor '", key, "'; the plan trains it", cfg.isLora() ? " (bias " + cfg.bias + ")" : "")
                       : sdError(wPath, ": no tensor for module '", m, "' (", key, "); the plan adapts it");
    int64_t g = session.findGlobal(name);
    if (g < 0) return sdError("the plan has no global '", name, "'");
    const GlobalDesc &gd = session.plan().globals[size_t(g)];
    if (auto cut = given.value().rankPattern.find(m); cfg.isAdalora() && cut != given.value().rankPattern.end()) {
      auto full = uncutAdalora(it->second, cut->second, gd.dims, wPath, key);
      if (!full.isOk()) return full.status();
      uncut.push_back({g, std::move(full.value())});
      continue;
    }
    if (it->second.dtype != gd.dtype || it->second.dims != gd.dims)
      return sdError(wPath, ": '", key, "' is ", dtypeName(it->second.dtype), "[", formatDims(it->second.dims),
                     "], the plan needs ", dtypeName(gd.dtype), "[", formatDims(gd.dims), "]");
    if (shared) { // frozen plan weights, not overwritten: the same key and dims give the same values
      auto mine = session.readGlobal(size_t(g));
      if (!mine.isOk()) return mine.status();
      if (mine.value().data.size() != it->second.bytes ||
          std::memcmp(mine.value().data.data(), it->second.data, it->second.bytes) != 0)
        return sdError(wPath, ": '", key, "' differs from the plan's projection (projection_prng_key ",
                       cfg.projectionKey, "): the adapter was made for other target modules");
      continue;
    }
    copies.push_back({g, &it->second});
  }
  for (auto &[key, t] : file.value().tensors)
    if (!expected.count(key))
      return sdError(wPath, ": tensor '", key, "' targets a module the plan does not adapt");
  for (auto &[m, kept] : given.value().rankPattern)
    if (std::find(cfg.modules.begin(), cfg.modules.end(), m) == cfg.modules.end())
      return sdError(cfgPath, ": rank_pattern names '", m, "', a module the plan does not adapt");
  for (auto &[g, t] : copies) SD_RETURN_IF_ERROR(session.writeGlobal(size_t(g), t->data, t->bytes));
  for (auto &[g, values] : uncut) SD_RETURN_IF_ERROR(session.writeGlobal(size_t(g), values.data(), values.size() * 4));
  return Status::ok();
}

Status setAdapterRank(Session &session, const LoraConfig &cfg, int64_t ranks) {
  if (!cfg.isDylora())
    return sdError("--adapter-rank needs a DyLoRA plan (sdc compile --peft dylora); this plan's adapter is ",
                   cfg.kindName(), ", trained at one rank");
  if (ranks < 1 || ranks > cfg.r || ranks % cfg.dyloraBlockSize != 0)
    return sdError("--adapter-rank must be a multiple of the plan's DyLoRA block size (", cfg.dyloraBlockSize,
                   ") from ", cfg.dyloraBlockSize, " to its r (", cfg.r, "), got ", ranks);
  int64_t g = session.findGlobal(abi::kDyloraEvalBlocks);
  if (g < 0) return sdError("the plan has no global '", abi::kDyloraEvalBlocks, "'");
  const float blocks = float(ranks / cfg.dyloraBlockSize);
  return session.writeGlobal(size_t(g), &blocks, sizeof blocks);
}

} // namespace sd
