// From examples to micro-batches: the resumable data cursor, the sequence
// packer and the [batch, seq] token tensors a training entry takes.
#pragma once
#include "sd/format/tensor_io.h"
#include "sd/train/dataset.h"
#include <map>
#include <string>
#include <vector>

namespace sd::train {

// The examples of each row of a micro-batch: one per row when padding,
// several when the plan packs (compiled with --packing).
using Rows = std::vector<std::vector<const Example *>>;

// First-fit decreasing: `examples` into at most `rows` rows of `seq` tokens
// (longest first, each into the first row with room; ties keep data order).
// False if they do not fit.
bool firstFitDecreasing(std::vector<const Example *> examples, int64_t rows, int64_t seq, Rows &out);

// Up to `rows` rows of at most `seq` tokens from a stream (peek: the next
// example or null at the end; take: consume it). Without packing, one example
// per row. Packing takes the longest run of next examples that first-fit
// decreasing fits into the rows: a micro-batch is a function of where it
// starts in the stream, so a checkpoint's data position resumes exactly.
template <class Peek, class Take> Rows packRows(int64_t rows, int64_t seq, bool pack, Peek peek, Take take) {
  Rows out;
  if (!pack) {
    while (int64_t(out.size()) < rows && peek()) out.push_back({take()});
    return out;
  }
  std::vector<const Example *> taken;
  Rows trial;
  while (peek()) {
    taken.push_back(peek());
    if (!firstFitDecreasing(taken, rows, seq, trial)) break;
    take();
    out.swap(trial);
  }
  return out;
}

// Walks the data in (seeded) epoch orders; the position is (epoch, index), so
// a checkpoint that records it resumes on the same example. Never runs dry:
// after the last example the next epoch begins in a new order.
struct DataCursor {
  const std::vector<Example> *data = nullptr;
  bool shuffle = true;
  uint64_t seed = 0;
  int64_t epoch = 0, index = 0;
  std::vector<size_t> order;

  void reorder(); // the order of `epoch`
  const Example *peek();
  const Example *take();
  Rows next(int64_t rows, int64_t seq, bool pack) {
    return packRows(rows, seq, pack, [&] { return peek(); }, [&] { return take(); });
  }
  // Examples consumed since epoch 0 began.
  int64_t consumed() const { return epoch * int64_t(data->size()) + index; }
};

// Token inputs of `rows` as [batch, seq] tensors: ids (pad 0), labels (pad
// -100) and position_ids (each example's own 0, 1, ...). Each packed example
// after a row's first gets label -100 at its first token: that label would be
// predicted from the previous example's last token (labels shift inside the
// plan), so a packed row counts exactly the tokens its examples count alone.
//
// Classification rows hold one example each: labels are [batch], the rows'
// classes (-100 for padding rows), and attention_mask marks each row's
// tokens (a padding row keeps one, so no row is masked whole).
//
// Preference pairs fill two rows each: entry r of `rows` (one pair) gives
// tensor row 2r its chosen sequence and row 2r + 1 its rejected one.
//
// Unpaired examples (KTO) fill two rows each too: row 2r example r, row
// 2r + 1 its prompt with the completion of the micro-batch's example r - 1
// (the last one's for r = 0), TRL's KL sequences, cut at `seq`; `desirable`
// [batch] gives both rows their example's label (1 or 0; -100 filler).
//
// A GRPO group fills G rows: entry r of `rows` (one prompt's group) gives
// rows [rG, (r+1)G) its completions, and `rewards` (f32 [batch]) theirs
// (0 in filler rows); with sampling log-probabilities, `oldLogProbs` (f32
// [batch, seq]) holds at position t the log-probability of token t + 1.
enum class RowLayout { Sequences, Classes, Pairs, Unpaired, Groups };
struct TokenBatch {
  HostTensor ids, labels, positions, mask, desirable, rewards, oldLogProbs;
  TokenBatch(const Rows &rows, int64_t batch, int64_t seq, const std::string &tokenInput,
             RowLayout layout = RowLayout::Sequences);
  std::map<std::string, const HostTensor *> inputs() const;
};

} // namespace sd::train
