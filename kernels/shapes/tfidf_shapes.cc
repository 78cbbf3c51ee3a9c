// Shape rule of TfIdfVectorizer: integer tokens [L] or [B, L] give f32
// [max(ngram_indexes) + 1] or [B, max(ngram_indexes) + 1].
#include "shape_util.h"
#include <algorithm>

namespace sd {

static Status tfIdfShape(ShapeContext &c) {
  const TensorInfo &x = c.inputs[0];
  SD_RETURN_IF_ERROR(checkChoice(c.attrs, "mode", {"TF", "IDF", "TFIDF"}));
  SD_CHECK_ARG(x.dtype == DType::I32 || x.dtype == DType::I64, "TfIdfVectorizer takes int32 or int64 tokens "
               "(string tokens are out of scope)");
  SD_CHECK_ARG(x.rank() == 1 || x.rank() == 2, "TfIdfVectorizer takes [L] or [B, L]");
  std::vector<int64_t> indexes = c.attrs.getInts("ngram_indexes"), counts = c.attrs.getInts("ngram_counts");
  SD_CHECK_ARG(!indexes.empty() && !counts.empty() && !c.attrs.getInts("pool_int64s").empty(),
               "TfIdfVectorizer needs pool_int64s, ngram_counts and ngram_indexes");
  int64_t lo = c.attrs.getInt("min_gram_length", 0), hi = c.attrs.getInt("max_gram_length", 0);
  SD_CHECK_ARG(lo >= 1 && lo <= hi && c.attrs.getInt("max_skip_count", 0) >= 0,
               "TfIdfVectorizer needs 1 <= min_gram_length <= max_gram_length and max_skip_count >= 0");
  for (int64_t i : indexes) SD_CHECK_ARG(i >= 0, "TfIdfVectorizer ngram_indexes must be nonnegative");
  int64_t width = *std::max_element(indexes.begin(), indexes.end()) + 1;
  std::vector<double> weights = c.attrs.getFloats("weights");
  SD_CHECK_ARG(weights.empty() || int64_t(weights.size()) >= width, "TfIdfVectorizer needs a weight per output column");
  TensorInfo out{DType::F32, {width}};
  if (x.rank() == 2) out.dims.insert(out.dims.begin(), x.dims[0]);
  c.outputs = {out};
  return Status::ok();
}

void registerTfIdfShapes() { registerShapeRule("TfIdfVectorizer", tfIdfShape); }

} // namespace sd
