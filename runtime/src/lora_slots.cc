// Adapters in and out of a --max-loras plan's slots (sd/runtime/lora_slots.h).
#include "sd/runtime/lora_slots.h"
#include "sd/format/safetensors.h"
#include "sd/format/tensor.h"
#include "sd/runtime/adapter.h"
#include <set>

namespace sd {

int64_t loraSlotCount(const Plan &plan) {
  auto cfg = loraConfigOf(plan);
  return cfg.isOk() ? cfg.value().maxLoras : 0;
}

StatusOr<std::unique_ptr<LoraSlots>> LoraSlots::create(Session &session) {
  auto cfg = loraConfigOf(session.plan());
  if (!cfg.isOk() || cfg.value().maxLoras < 1)
    return sdError("the plan has no adapter slots (compile it with sdc compile --max-loras N)");
  std::unique_ptr<LoraSlots> slots(new LoraSlots(session, std::move(cfg.value())));
  slots->count_ = slots->cfg_.maxLoras;
  for (const std::string &m : slots->cfg_.modules)
    for (bool isA : {true, false}) {
      const std::string name = m + (isA ? ".lora_A.slots" : ".lora_B.slots");
      const int64_t g = session.findGlobal(name);
      if (g < 0) return sdError("the plan has no global '", name, "'");
      const GlobalDesc &d = session.plan().globals[size_t(g)];
      if (d.dtype != DType::F32 || d.dims.size() != 3 || d.dims[0] != slots->count_ + 1 ||
          d.dims[isA ? 2 : 1] != slots->cfg_.r)
        return sdError("global '", name, "' is ", dtypeName(d.dtype), "[", formatDims(d.dims), "], not f32 [",
                       slots->count_ + 1, ", ..] stacks of rank ", slots->cfg_.r);
      slots->stacks_.push_back({size_t(g), m, isA, d.dims[1], d.dims[2]});
    }
  return slots;
}

StatusOr<SlotAdapter> LoraSlots::read(const std::string &dir) const {
  const std::string cfgPath = dir + "/" + kAdapterConfigFile;
  auto given = readAdapterConfig(dir);
  if (!given.isOk()) return given.status();
  const LoraConfig &a = given.value();
  if (!a.isLora() || a.useDora)
    return sdError(cfgPath, ": the adapter is ", a.kindName(), a.useDora ? " (use_dora)" : "",
                   "; the plan's slots take LoRA adapters");
  if (a.r < 1 || a.r > cfg_.r)
    return sdError(cfgPath, ": adapter rank r=", a.r, "; the plan's slots take ranks 1 to ", cfg_.r,
                   " (sdc compile --lora-r)");
  if (a.bias != "none") return sdError(cfgPath, ": bias is '", a.bias, "'; the plan's slots hold no biases");
  if (!a.baseInit.empty())
    return sdError(cfgPath, ": init_lora_weights '", a.baseInit, "' rewrote the base weights, which the slots share");
  if (!a.modulesToSave.empty()) return sdError(cfgPath, ": 'modules_to_save' lists modules the slots do not hold");
  const std::string wPath = dir + "/" + kAdapterWeightsFile;
  auto file = readSafetensors(wPath, /*requireFinite=*/true);
  if (!file.isOk()) return file.status();
  // The adapter's scale over the plan's, folded into B.
  const double ratio = loraScale(a.alpha, a.r, a.rslora) / cfg_.scale();
  SlotAdapter out;
  out.dir = dir;
  std::set<std::string> used;
  for (size_t i = 0; i < stacks_.size(); i += 2) { // A, then B, of each module
    const Stack &sa = stacks_[i], &sb = stacks_[i + 1];
    const std::string ka = adapterKey(sa.module + ".lora_A.weight"), kb = adapterKey(sa.module + ".lora_B.weight");
    auto ia = file.value().tensors.find(ka), ib = file.value().tensors.find(kb);
    std::vector<float> slotA(size_t(sa.rows * sa.cols), 0.0f), slotB(size_t(sb.rows * sb.cols), 0.0f);
    const bool hasA = ia != file.value().tensors.end(), hasB = ib != file.value().tensors.end();
    if (hasA != hasB) return sdError(wPath, ": '", hasA ? ka : kb, "' has no '", hasA ? kb : ka, "' beside it");
    if (hasA) {
      const int64_t in = sa.rows, outDim = sb.cols;
      for (const auto &[t, want] : {std::pair{&ia->second, Dims{a.r, in}}, std::pair{&ib->second, Dims{outDim, a.r}}})
        if ((t->dtype != DType::F32 && !dtypeIsHalf(t->dtype)) || t->dims != want)
          return sdError(wPath, ": '", t == &ia->second ? ka : kb, "' is ", dtypeName(t->dtype), "[",
                         formatDims(t->dims), "], the plan needs f32 [", formatDims(want), "]");
      std::vector<double> fa, fb; // f32, or bf16/f16 widened (exactly, as f32 would be)
      readDoubles(TensorView{const_cast<void *>(ia->second.data), ia->second.dtype, ia->second.dims}, fa);
      readDoubles(TensorView{const_cast<void *>(ib->second.data), ib->second.dtype, ib->second.dims}, fb);
      const int64_t r = cfg_.r;
      for (int64_t k = 0; k < a.r; ++k) {
        for (int64_t c = 0; c < in; ++c) slotA[size_t(c * r + k)] = float(fa[size_t(k * in + c)]);
        for (int64_t o = 0; o < outDim; ++o) slotB[size_t(k * outDim + o)] = float(fb[size_t(o * a.r + k)] * ratio);
      }
      used.insert(ka);
      used.insert(kb);
    }
    out.factors.push_back(std::move(slotA));
    out.factors.push_back(std::move(slotB));
  }
  for (const auto &[key, t] : file.value().tensors)
    if (!used.count(key)) return sdError(wPath, ": tensor '", key, "' is not a LoRA factor of a module the plan adapts");
  if (used.empty()) return sdError(wPath, ": no LoRA factor for the modules the plan adapts");
  return out;
}

Status LoraSlots::write(int64_t slot, const SlotAdapter &adapter) {
  if (slot < 0 || slot > count_) return sdError("adapter slot ", slot, " is outside 0 to ", count_);
  if (adapter.factors.size() != stacks_.size()) return sdError("the adapter from ", adapter.dir, " was read for another plan");
  for (size_t i = 0; i < stacks_.size(); ++i) {
    const size_t bytes = size_t(stacks_[i].rows * stacks_[i].cols) * sizeof(float);
    SD_RETURN_IF_ERROR(session_.writeGlobalPart(stacks_[i].global, size_t(slot) * bytes, adapter.factors[i].data(), bytes));
  }
  return Status::ok();
}

} // namespace sd
