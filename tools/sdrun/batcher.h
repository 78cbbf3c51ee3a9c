// The rows of one served model (`sdrun serve`): the choices of every request
// wait, take free rows of the plan (the row whose cache already holds most of
// the prompt), and advance one token per step together (or several, when
// speculation guesses them right); a row that ends frees for the next waiting
// choice (continuous batching). Knows nothing of sockets: text, ends and
// failures go to the server's callbacks.
#pragma once
#include "openai_api.h"
#include "tool_calls.h"
#include "text_rows.h"
#include "sd/generate/generator.h"
#include "sd/generate/speculation.h"
#include "sd/runtime/lora_slots.h"
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sdrun {

// One generated continuation (an OpenAI "choice").
struct Choice {
  Row row;
  sd::generate::RowSampler sampler;
  int64_t generated = 0, maxNew = 0;
  std::string text;   // all its text (sent at the end unless streamed; streamed: an echo not yet sent)
  std::string finish; // "" while running
  std::vector<openai::LogprobEntry> logprobs; // with logprobs: all (streamed: those not yet sent)
  size_t offset = 0;                          // streamed: the text_offset of the next entry
  std::string callId;                         // a tool choice's first call id
  size_t sent = 0;                            // tool_choice auto, streamed: bytes of text sent as content
  openai::RequiredCallReader calls;           // tool_choice required, streamed: its calls as they come
  std::vector<std::string> callIds;           // tool_choice required, streamed: the ids sent
  size_t adapter = 0;                         // a plan of adapter slots: Batcher::serveAdapters' index
  size_t passedOver = 0;                      // choices that took a row first while its adapter found no slot
};

struct Job {
  int conn = -1;    // the connection it answers
  size_t model = 0; // the served model (its Batcher)
  openai::Head head;
  std::string path;
  bool stream = false, includeUsage = false, echo = false;
  int64_t logprobs = -1;
  std::vector<std::string> stop;
  openai::ToolChoice toolChoice = openai::ToolChoice::None;
  std::string toolName; // ToolChoice::Named's function
  std::vector<Choice> choices;
  int64_t promptTokens = 0;
  size_t finished = 0;
  double started = 0;
};

class Batcher {
public:
  struct Events {
    // New text of a choice, and its finish reason when it ends ("" while not).
    std::function<void(Job &, size_t choice, const std::string &text, const std::string &finish)> text;
    std::function<void(Job &)> done;                       // every choice has ended
    std::function<void(Job &, const std::string &)> failed; // generation failed (the job is cancelled)
  };
  // speculate: tokens guessed a row and step by prompt lookup, or by `draft`
  // (0: none; at most the generator's speculation()), checked when expected
  // to pay, or always.
  Batcher(sd::generate::Generator &gen, const TextCodec &codec, Events events, size_t speculate = 0,
          bool speculateAlways = false, sd::generate::DraftModel *draft = nullptr);

  sd::generate::Generator &generator() { return gen_; }
  // A plan of adapter slots (sdc compile --max-loras): the adapters choices
  // name (Choice::adapter; 0 is the plan's own, in slot 0, and
  // adapters[0] is unused). An adapter goes into a slot when a choice of it
  // takes a row and it is in none; the slot least recently used by a
  // running row makes room. A waiting choice whose adapter finds no slot
  // lets later ones go first, up to twice the rows' count of them; then no
  // one passes it until a slot drains for it.
  void serveAdapters(std::unique_ptr<sd::LoraSlots> slots, std::vector<sd::SlotAdapter> adapters);
  // Reads and checks the adapter in `dir` (a plan of adapter slots); its index.
  sd::StatusOr<size_t> addAdapter(const std::string &dir);
  // Forgets adapter `index`, which no choice may use any more.
  void dropAdapter(size_t index);
  // Adapters written into slots so far.
  uint64_t adapterLoads() const { return adapterLoads_; }
  // Tokens a row holds: the cache less prompt or prefix tuning's virtual
  // tokens, or the largest window.
  int64_t context() const;
  void add(const std::shared_ptr<Job> &job); // queues its choices
  void cancel(Job &job);                     // its choices leave the queue and free their rows
  bool busy() const;
  // Choices waiting for a row, and rows generating: all, or those of served model `model` (Job::model).
  size_t waiting(size_t model = SIZE_MAX) const;
  size_t running(size_t model = SIZE_MAX) const;
  void step(); // a token or more for every running choice; waiting choices take the free rows first
  // Speculation so far: tokens guessed, and those the model confirmed.
  uint64_t guessed() const { return speculator_.guessed(); }
  uint64_t confirmed() const { return speculator_.confirmed(); }

private:
  using Slot = std::pair<std::shared_ptr<Job>, size_t>; // a job and its choice index
  void endChoice(Job &job, size_t index, const std::string &reason, bool byStopText);
  // Free rows take waiting choices (the row whose cache holds most of the prompt).
  void admit();
  // The slot holding `adapter`, written there if needed (-1: every slot is in use).
  sd::StatusOr<int64_t> slotFor(size_t adapter);
  size_t room(const Choice &ch, const sd::generate::RowSampler &sampler) const;
  // Takes one drawn token into the choice: its reason to end, "" to go on.
  std::string take(Job &job, Choice &ch, int64_t t, const sd::generate::RowSampler &sampler, size_t drawn,
                   bool &byStopText);
  openai::LogprobEntry entry(const sd::generate::TokenLogprobs &lp, const std::vector<int64_t> &tokens, size_t at) const;

  sd::generate::Generator &gen_;
  const TextCodec &codec_;
  Events events_;
  std::deque<Slot> waiting_;
  std::vector<Slot> slots_;
  std::vector<sd::generate::RowSampler> samplers_;
  sd::generate::Speculator speculator_;
  std::unique_ptr<sd::LoraSlots> loraSlots_;
  std::vector<sd::SlotAdapter> adapters_;
  std::vector<size_t> slotHolds_;    // per adapter slot: the adapter in it (SIZE_MAX: none)
  std::vector<uint64_t> slotUsed_;   // per adapter slot: when a row last took it (clock_; 0: empty)
  std::vector<int64_t> rowSlots_;    // per row: its adapter slot
  uint64_t clock_ = 0, adapterLoads_ = 0;
};

} // namespace sdrun
