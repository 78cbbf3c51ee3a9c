// A plan that maps each row of tokens to one vector (a sentence embedding),
// as `sdrun serve` answers /v1/embeddings with it: an infer entry taking
// int64 [batch, seq] input_ids, with attention_mask and token_type_ids of the
// same shape when it has them, and giving f32 [batch, dim] (pooled in the
// graph, as examples/export_minilm.py exports a sentence-transformers model).
#pragma once
#include "sd/format/status.h"
#include "sd/runtime/session.h"
#include <memory>
#include <vector>

namespace sdrun {

class Embedder {
public:
  // An error names what the plan's infer entries lack.
  static sd::StatusOr<std::unique_ptr<Embedder>> create(sd::Session &session);
  int64_t dim() const { return dim_; }
  int64_t maxTokens() const; // the longest bucket's rows
  // One vector per row (each row at least one token), through the buckets:
  // the fewest rows' worth of the shortest bucket that holds them, a batch
  // filled up with copies of its first row.
  sd::StatusOr<std::vector<std::vector<float>>> embed(const std::vector<std::vector<int64_t>> &rows);

private:
  struct Bucket {
    size_t entry;
    int64_t batch, seq;
    std::vector<std::string> inputs; // in the entry's order: input_ids, attention_mask, token_type_ids
  };
  explicit Embedder(sd::Session &s) : session_(s) {}
  sd::Session &session_;
  std::vector<Bucket> buckets_; // by seq, then by batch (largest first)
  int64_t dim_ = 0;
};

} // namespace sdrun
