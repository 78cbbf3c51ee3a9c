// Data cursor, packer and token tensors of the trainer.
#include "sd/train/batching.h"
#include "sd/format/training_abi.h"
#include <algorithm>

namespace sd::train {

bool firstFitDecreasing(std::vector<const Example *> examples, int64_t rows, int64_t seq, Rows &out) {
  std::stable_sort(examples.begin(), examples.end(),
                   [](const Example *a, const Example *b) { return a->ids.size() > b->ids.size(); });
  out.clear();
  std::vector<size_t> used;
  for (const Example *e : examples) {
    size_t r = 0;
    while (r < out.size() && used[r] + e->ids.size() > size_t(seq)) ++r;
    if (r == out.size()) {
      if (int64_t(r) == rows) return false;
      out.emplace_back();
      used.push_back(0);
    }
    out[r].push_back(e);
    used[r] += e->ids.size();
  }
  return true;
}

void DataCursor::reorder() {
  if (shuffle) {
    order = shuffledOrder(data->size(), seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch));
  } else {
    order.resize(data->size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  }
}

const Example *DataCursor::peek() {
  if (index >= int64_t(data->size())) {
    ++epoch;
    index = 0;
    reorder();
  }
  return &(*data)[order[size_t(index)]];
}

const Example *DataCursor::take() {
  const Example *e = peek();
  ++index;
  return e;
}

TokenBatch::TokenBatch(const Rows &rows, int64_t batch, int64_t seq, const std::string &tokenInput, RowLayout layout) {
  const bool classify = layout == RowLayout::Classes;
  for (auto [t, name] : {std::pair{&ids, tokenInput.c_str()},
                         {&labels, abi::kLabels},
                         {&positions, abi::kPositionIds},
                         {&mask, abi::kAttentionMask}}) {
    t->name = name;
    t->dtype = DType::I64;
    t->dims = {batch, seq};
    t->data.assign(size_t(batch * seq) * 8, 0);
  }
  if (classify) {
    labels.dims = {batch};
    labels.data.resize(size_t(batch) * 8);
  }
  auto *pi = reinterpret_cast<int64_t *>(ids.data.data());
  auto *pl = reinterpret_cast<int64_t *>(labels.data.data());
  auto *pp = reinterpret_cast<int64_t *>(positions.data.data());
  auto *pm = reinterpret_cast<int64_t *>(mask.data.data());
  std::fill(pl, pl + (classify ? batch : batch * seq), kIgnoreLabel);
  // Row r's sequences, one after another (several when packed).
  auto fill = [&](int64_t r,
                  const std::vector<std::pair<const std::vector<int64_t> *, const std::vector<int64_t> *>> &seqs,
                  int64_t classLabel) {
    int64_t at = r * seq, end = at + seq;
    if (classify)
      pl[r] = classLabel;
    for (auto [seqIds, seqLabels] : seqs)
      for (size_t j = 0; j < seqIds->size(); ++j, ++at) {
        pi[at] = (*seqIds)[j];
        pm[at] = 1;
        if (!classify)
          pl[at] = j == 0 && at != r * seq ? kIgnoreLabel : (*seqLabels)[j];
        pp[at] = int64_t(j);
      }
    for (int64_t j = 0; at < end; ++at, ++j)
      pp[at] = j; // padding: a sequence of its own
  };
  int64_t used = 0;
  if (layout == RowLayout::Unpaired) {
    desirable = HostTensor{abi::kDesirable, DType::I64, {batch}, std::vector<uint8_t>(size_t(batch) * 8)};
    auto *pd = reinterpret_cast<int64_t *>(desirable.data.data());
    std::fill(pd, pd + batch, kIgnoreLabel);
    std::vector<const Example *> examples;
    for (const auto &row : rows) examples.insert(examples.end(), row.begin(), row.end());
    std::vector<int64_t> klIds, klLabels;
    for (size_t r = 0; r < examples.size(); ++r) {
      const Example *e = examples[r], *other = examples[(r + examples.size() - 1) % examples.size()];
      auto prompt = size_t(e->promptLength), start = size_t(other->promptLength);
      klIds.assign(e->ids.begin(), e->ids.begin() + std::ptrdiff_t(prompt));
      klLabels.assign(prompt, kIgnoreLabel);
      klIds.insert(klIds.end(), other->ids.begin() + std::ptrdiff_t(start), other->ids.end());
      klLabels.insert(klLabels.end(), other->labels.begin() + std::ptrdiff_t(start), other->labels.end());
      klIds.resize(std::min(klIds.size(), size_t(seq)));
      klLabels.resize(klIds.size());
      pd[used] = pd[used + 1] = e->label;
      fill(used++, {{&e->ids, &e->labels}}, kIgnoreLabel);
      fill(used++, {{&klIds, &klLabels}}, kIgnoreLabel);
    }
  }
  if (layout == RowLayout::Groups) {
    rewards = HostTensor{abi::kRewards, DType::F32, {batch}, std::vector<uint8_t>(size_t(batch) * 4)};
    auto *pr = reinterpret_cast<float *>(rewards.data.data());
    bool logps = false;
    for (const auto &row : rows)
      for (const Example *e : row) logps = logps || !e->groupLogProbs.empty();
    float *po = nullptr;
    if (logps) {
      oldLogProbs = HostTensor{abi::kOldLogProbs, DType::F32, {batch, seq}, std::vector<uint8_t>(size_t(batch * seq) * 4)};
      po = reinterpret_cast<float *>(oldLogProbs.data.data());
    }
    for (const auto &row : rows)
      for (const Example *e : row)
        for (size_t k = 0; k < e->groupIds.size(); ++k) {
          pr[used] = e->rewards[k];
          // Position t scores token t + 1: its sampling log-probability goes there.
          if (po && k < e->groupLogProbs.size())
            for (size_t t = 0; t + 1 < e->groupLogProbs[k].size() && int64_t(t) < seq; ++t)
              po[used * seq + int64_t(t)] = e->groupLabels[k][t + 1] == kIgnoreLabel ? 0.0f : e->groupLogProbs[k][t + 1];
          fill(used++, {{&e->groupIds[k], &e->groupLabels[k]}}, kIgnoreLabel);
        }
  }
  const Rows none; // the unpaired rows and the groups are filled above
  for (const auto &row : layout == RowLayout::Unpaired || layout == RowLayout::Groups ? none : rows) {
    if (layout == RowLayout::Pairs) {
      for (const Example *e : row) {
        fill(used++, {{&e->ids, &e->labels}}, kIgnoreLabel);
        fill(used++, {{&e->rejectedIds, &e->rejectedLabels}}, kIgnoreLabel);
      }
      continue;
    }
    std::vector<std::pair<const std::vector<int64_t> *, const std::vector<int64_t> *>> seqs;
    for (const Example *e : row)
      seqs.push_back({&e->ids, &e->labels});
    fill(used++, seqs, row.empty() ? kIgnoreLabel : row.front()->label);
  }
  for (int64_t r = used; r < batch; ++r)
    pm[r * seq] = 1;
}

std::map<std::string, const HostTensor *> TokenBatch::inputs() const {
  std::map<std::string, const HostTensor *> out = {
      {ids.name, &ids}, {labels.name, &labels}, {positions.name, &positions}, {mask.name, &mask}};
  if (!desirable.name.empty()) out[desirable.name] = &desirable;
  if (!rewards.name.empty()) out[rewards.name] = &rewards;
  if (!oldLogProbs.name.empty()) out[oldLogProbs.name] = &oldLogProbs;
  return out;
}

} // namespace sd::train
