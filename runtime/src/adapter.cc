// LoRA adapters between a session's globals and PEFT-layout files.
#include "sd/runtime/adapter.h"
#include "sd/format/json.h"
#include "sd/format/safetensors.h"
#include <cmath>
#include <cstring>
#include <set>
#include <sys/stat.h>

namespace sd {

Status saveAdapter(const std::string &dir, const Session &session, const LoraConfig &cfg) {
  ::mkdir(dir.c_str(), 0755);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return sdError(dir, ": cannot create adapter folder");
  std::vector<HostTensor> values;
  for (const std::string &m : cfg.modules)
    for (const char *part : {kLoraASuffix, kLoraBSuffix}) {
      int64_t g = session.findGlobal(m + part);
      if (g < 0) return sdError("the plan has no global '", m, part, "'");
      auto v = session.readGlobal(size_t(g));
      if (!v.isOk()) return v.status();
      values.push_back(std::move(v.value()));
    }
  std::vector<NamedTensor> tensors;
  for (const HostTensor &v : values) tensors.push_back({adapterKey(v.name), v.dtype, v.dims, v.data.data(), v.byteSize()});
  SD_RETURN_IF_ERROR(writeSafetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}}));
  SD_RETURN_IF_ERROR(writeFileAtomic(dir + "/adapter_config.json", adapterConfigJson(cfg)));
  return syncDirectory(dir);
}

Status loadAdapter(const std::string &dir, Session &session, const LoraConfig &cfg) {
  std::string cfgPath = dir + "/adapter_config.json";
  auto given = readAdapterConfig(dir);
  if (!given.isOk()) return given.status();
  if (given.value().r != cfg.r)
    return sdError(cfgPath, ": adapter rank r=", given.value().r, " differs from the plan's r=", cfg.r);
  if (std::fabs(given.value().alpha - cfg.alpha) > 1e-9 * std::fabs(cfg.alpha))
    return sdError(cfgPath, ": lora_alpha differs from the plan's ", cfg.alpha);
  if (given.value().rslora != cfg.rslora) return sdError(cfgPath, ": use_rslora differs from the plan's");
  std::string wPath = dir + "/adapter_model.safetensors";
  auto file = readSafetensors(wPath);
  if (!file.isOk()) return file.status();
  std::set<std::string> expected;
  std::vector<std::pair<int64_t, const NamedTensor *>> copies;
  for (const std::string &m : cfg.modules)
    for (const char *part : {kLoraASuffix, kLoraBSuffix}) {
      std::string key = adapterKey(m + part);
      expected.insert(key);
      auto it = file.value().tensors.find(key);
      if (it == file.value().tensors.end())
        return sdError(wPath, ": no tensor for module '", m, "' (", key, "); the plan adapts it");
      int64_t g = session.findGlobal(m + part);
      if (g < 0) return sdError("the plan has no global '", m, part, "'");
      const GlobalDesc &gd = session.plan().globals[size_t(g)];
      if (it->second.dtype != gd.dtype || it->second.dims != gd.dims)
        return sdError(wPath, ": '", key, "' is ", dtypeName(it->second.dtype), "[", formatDims(it->second.dims),
                       "], the plan needs ", dtypeName(gd.dtype), "[", formatDims(gd.dims), "]");
      copies.push_back({g, &it->second});
    }
  for (auto &[key, t] : file.value().tensors)
    if (!expected.count(key))
      return sdError(wPath, ": tensor '", key, "' targets a module the plan does not adapt");
  for (auto &[g, t] : copies) SD_RETURN_IF_ERROR(session.writeGlobal(size_t(g), t->data, t->bytes));
  return Status::ok();
}

} // namespace sd
