// TfIdfVectorizer (opset 9) on integer tokens, as onnx/reference counts: the
// n-grams of pool_int64s (ngram_counts gives where each length starts) with
// lengths in [min_gram_length, max_gram_length] are looked up at every start
// and every skip distance 1..max_skip_count+1; unigrams count at distance 1
// only. Counts become TF, IDF (weight where present) or TFIDF (weight * count).
#include "cpu_util.h"
#include <map>
#include <vector>

namespace sd::cpu {
namespace {

struct NgramTable {
  std::map<std::vector<int64_t>, int64_t> slotOf; // n-gram -> output column
  int64_t longest = 0;
};

Status buildTable(const AttrMap &a, NgramTable &table) {
  std::vector<int64_t> pool = a.getInts("pool_int64s"), counts = a.getInts("ngram_counts"),
                       indexes = a.getInts("ngram_indexes");
  int64_t lo = a.getInt("min_gram_length", 1), hi = a.getInt("max_gram_length", 1);
  int64_t id = 0;
  for (size_t len = 1; len <= counts.size(); ++len) {
    int64_t begin = counts[len - 1], end = len < counts.size() ? counts[len] : int64_t(pool.size());
    SD_CHECK_ARG(begin >= 0 && begin <= end && end <= int64_t(pool.size()), "TfIdfVectorizer ngram_counts do not "
                 "fit pool_int64s");
    for (int64_t at = begin; at + int64_t(len) <= end; at += int64_t(len), ++id) {
      if (int64_t(len) < lo || int64_t(len) > hi) continue;
      SD_CHECK_ARG(id < int64_t(indexes.size()), "TfIdfVectorizer has fewer ngram_indexes than n-grams");
      table.slotOf[std::vector<int64_t>(pool.begin() + at, pool.begin() + at + int64_t(len))] = indexes[size_t(id)];
      table.longest = std::max<int64_t>(table.longest, int64_t(len));
    }
  }
  return Status::ok();
}

Status TfIdfKernel(const KernelContext &c) {
  const TensorView &x = c.inputs[0], &o = c.outputs[0];
  NgramTable table;
  SD_RETURN_IF_ERROR(buildTable(c.attrs, table));
  std::vector<int64_t> tokens;
  SD_CHECK_ARG(readIntegers(x, tokens), "TfIdfVectorizer takes integer tokens");
  int64_t rows = x.rank() == 2 ? x.dims[0] : 1, len = x.dims.back(), width = o.dims.back();
  int64_t minLen = c.attrs.getInt("min_gram_length", 1), maxLen = c.attrs.getInt("max_gram_length", 1);
  int64_t maxSkip = c.attrs.getInt("max_skip_count", 0);
  std::vector<double> weights = c.attrs.getFloats("weights");
  std::string mode = c.attrs.getString("mode", "TF");
  float *po = o.as<float>();
  std::fill(po, po + o.numElements(), 0.0f);
  std::vector<int64_t> gram;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t *row = tokens.data() + r * len;
    float *count = po + r * width;
    int64_t shortest = minLen;
    for (int64_t skip = 1; skip <= maxSkip + 1; ++skip) {
      for (int64_t start = 0; start + skip * (shortest - 1) < len; ++start) {
        gram.clear();
        for (int64_t at = start; at < len && int64_t(gram.size()) < std::min(maxLen, table.longest); at += skip) {
          gram.push_back(row[at]);
          if (int64_t(gram.size()) < shortest) continue;
          auto hit = table.slotOf.find(gram);
          if (hit != table.slotOf.end()) count[hit->second] += 1.0f;
        }
      }
      if (shortest == 1 && ++shortest > maxLen) break;
    }
    for (int64_t j = 0; j < width; ++j) {
      double w = j < int64_t(weights.size()) ? weights[size_t(j)] : 1.0;
      if (mode == "IDF") count[j] = count[j] > 0 ? float(weights.empty() ? 1.0 : w) : 0.0f;
      else if (mode == "TFIDF" && !weights.empty()) count[j] = float(w * double(count[j]));
    }
  }
  return Status::ok();
}

} // namespace

void registerTfIdfKernels() {
  registerCpuKernel("TfIdfVectorizer", TfIdfKernel, TypeSet{DType::I32, DType::I64});
}

} // namespace sd::cpu
