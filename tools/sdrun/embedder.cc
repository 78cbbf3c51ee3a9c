// Sentence embeddings from an encoder plan's infer buckets.
#include "embedder.h"
#include "sd/format/training_abi.h"
#include <algorithm>
#include <cstring>

namespace sdrun {

sd::StatusOr<std::unique_ptr<Embedder>> Embedder::create(sd::Session &session) {
  std::unique_ptr<Embedder> e(new Embedder(session));
  const sd::Plan &plan = session.plan();
  std::string why = "the plan has no infer entry";
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const sd::EntryDesc &entry = plan.entries[i];
    if (entry.name != sd::abi::kInfer || entry.outputs.empty()) continue;
    Bucket b{i, 0, 0, {}};
    bool ok = true;
    for (const auto &[name, buffer] : entry.inputs) {
      const sd::BufferDesc &in = entry.buffers[size_t(buffer)];
      if (name != "input_ids" && name != "attention_mask" && name != "token_type_ids") {
        why = "its infer entry takes '" + name + "'; embeddings need input_ids (attention_mask, token_type_ids)";
        ok = false;
        break;
      }
      if (in.dtype != sd::DType::I64 || in.dims.size() != 2 || (b.batch && in.dims != sd::Dims{b.batch, b.seq})) {
        why = "its infer entry's '" + name + "' is not int64 [batch, seq] like the others";
        ok = false;
        break;
      }
      b.batch = in.dims[0];
      b.seq = in.dims[1];
      b.inputs.push_back(name);
    }
    if (!ok) continue;
    const sd::BufferDesc &out = entry.buffers[size_t(entry.outputs[0].second)];
    if (std::find(b.inputs.begin(), b.inputs.end(), "input_ids") == b.inputs.end()) {
      why = "its infer entry takes no input_ids";
      continue;
    }
    if (out.dtype != sd::DType::F32 || out.dims.size() != 2 || out.dims[0] != b.batch) {
      why = "its infer entry gives " + std::string(sd::dtypeName(out.dtype)) + "[" + sd::formatDims(out.dims) +
            "], not one f32 vector per row [batch, dim] (pool in the graph, as examples/export_minilm.py does)";
      continue;
    }
    if (e->dim_ && e->dim_ != out.dims[1]) return sd::sdError("the infer buckets disagree on the embedding size");
    e->dim_ = out.dims[1];
    e->buckets_.push_back(std::move(b));
  }
  if (e->buckets_.empty()) return sd::sdError("no embeddings: ", why);
  std::sort(e->buckets_.begin(), e->buckets_.end(),
            [](const Bucket &a, const Bucket &b) { return a.seq != b.seq ? a.seq < b.seq : a.batch > b.batch; });
  return e;
}

int64_t Embedder::maxTokens() const { return buckets_.back().seq; }

sd::StatusOr<std::vector<std::vector<float>>> Embedder::embed(const std::vector<std::vector<int64_t>> &rows) {
  std::vector<std::vector<float>> out;
  std::vector<sd::HostTensor> outs;
  for (size_t first = 0; first < rows.size();) {
    const Bucket *use = nullptr;
    size_t count = 0;
    for (const Bucket &b : buckets_) {
      const size_t n = std::min(rows.size() - first, size_t(b.batch));
      int64_t longest = 0;
      for (size_t r = first; r < first + n; ++r) longest = std::max<int64_t>(longest, int64_t(rows[r].size()));
      if (longest <= b.seq) {
        use = &b, count = n;
        break;
      }
    }
    if (!use) return sd::sdError("input ", first, " is ", rows[first].size(), " tokens, more than the plan's ",
                                 maxTokens(), " (sdc compile --shapes input_ids=BATCHxSEQ)");
    const size_t cells = size_t(use->batch * use->seq);
    std::vector<sd::HostTensor> inputs;
    for (const std::string &name : use->inputs)
      inputs.push_back({name, sd::DType::I64, {use->batch, use->seq}, std::vector<uint8_t>(cells * 8, 0)});
    for (int64_t b = 0; b < use->batch; ++b) {
      const std::vector<int64_t> &row = rows[first + (size_t(b) < count ? size_t(b) : 0)];
      for (sd::HostTensor &t : inputs) {
        auto *cell = reinterpret_cast<int64_t *>(t.data.data()) + b * use->seq;
        if (t.name == "input_ids") std::memcpy(cell, row.data(), row.size() * 8);
        if (t.name == "attention_mask") std::fill(cell, cell + row.size(), int64_t(1));
      }
    }
    std::vector<const sd::HostTensor *> ptrs;
    for (const sd::HostTensor &t : inputs) ptrs.push_back(&t);
    SD_RETURN_IF_ERROR(session_.run(use->entry, ptrs, outs));
    const float *v = reinterpret_cast<const float *>(outs[0].data.data());
    for (size_t b = 0; b < count; ++b) out.emplace_back(v + b * size_t(dim_), v + (b + 1) * size_t(dim_));
    first += count;
  }
  return out;
}

} // namespace sdrun
