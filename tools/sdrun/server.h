// The OpenAI API server behind sdrun serve and sdrun run-batch: the models
// it answers for, and the Server that routes requests to them and batches
// every client's choices into the plan's rows (continuous batching).
#pragma once
#include "batcher.h"
#include "embedder.h"
#include "flags.h"
#include "generate_setup.h"
#include "http.h"
#include "openai_api.h"
#include "sd/runtime/lora_slots.h"
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace sdrun {

struct Connection {
  int fd = -1;
  std::string peer;
  std::string in, out;
  double since = 0, lastWrite = 0;
  bool continued = false; // 100 Continue sent
  bool complete = false;  // the whole response is in `out`
  bool keepAlive = false; // after it the connection waits for the next request (else it closes)
  bool chunked = false;   // a stream's events go as chunks (so the connection can stay)
  int served = 0;         // responses sent whole on this connection
  std::shared_ptr<Job> job;
  // A request without a socket (fd -1, sdrun run-batch): its response's status and body.
  int status = 0;
  std::string body;
};

// A model id the server answers to: the plan with no adapter (or --adapter's),
// or one of --lora-modules, each in its own session (its own adapter, rows and
// cache; the frozen weights stay in the one mapped plan), or, in a plan of
// adapter slots (sdc compile --max-loras), all in the first's session and
// rows, each row of a batch with its own adapter.
struct ServedModel {
  std::string name;
  std::unique_ptr<sd::Session> session;
  std::unique_ptr<sd::generate::Generator> generator; // a decoder's: completions and chats
  std::shared_ptr<Batcher> batcher;                    // its own, or the first model's (adapter slots)
  size_t adapter = 0;                                  // adapter slots: its index in the batcher's adapters
  std::unique_ptr<Embedder> embedder; // an encoder's: /v1/embeddings
};

// 'a', 'b': the served model ids, for messages.
std::string modelNames(const std::vector<ServedModel> &models);

// What serve and run-batch open from their shared flags (--tokenizer,
// --served-model-name, --lora-modules, --tool-call-parser, --speculate,
// --draft, --adapter, the session's flags).
struct ServedSetup {
  GenerationSetup g;
  std::vector<ServedModel> models;
  bool encoder = false;   // serves /v1/embeddings
  size_t speculate = 0;   // --speculate
  std::string toolParser; // --tool-call-parser
  // A plan of adapter slots: its slots and every --lora-modules adapter, read and checked.
  std::unique_ptr<sd::LoraSlots> loraSlots;
  std::vector<sd::SlotAdapter> slotAdapters;
};
// Opens the plan and its models; prints the error and returns 1 when one fails.
int openServed(const Flags &f, const sd::SessionOptions &so, ServedSetup &s);

struct ServerOptions {
  std::string apiKey;
  uint64_t seed = 0;
  double requestTimeout = 30, keepAlive = 5;
  bool speculateAlways = false;
};

class Server {
public:
  // Takes the setup's models (and adapters for a plan of adapter slots).
  Server(ServedSetup &s, const ServerOptions &o);
  // Serves clients on the listening socket until SIGINT or SIGTERM.
  int run(int listenFd);
  // Requests without a socket (sdrun run-batch): submit() answers one or
  // queues its choices, step() generates for every running choice, and a
  // request's response is whole when takeAnswer() gives it.
  int submit(const std::string &label, const http::Request &req);
  void step();
  bool busy() const;
  // Request `id`'s status and body once its response is whole (true; the
  // request is then forgotten), else false.
  bool takeAnswer(int id, int &status, std::string &body);
  void logRequests(bool on) { logRequests_ = on; }
  uint64_t promptTokens() const { return promptTokens_; }
  uint64_t generatedTokens() const { return generatedTokens_; }
  // Each model's rows once (models of adapter slots share the first's).
  std::vector<Batcher *> batchers() const {
    std::vector<Batcher *> out;
    for (const ServedModel &m : models_)
      if (m.batcher && std::find(out.begin(), out.end(), m.batcher.get()) == out.end()) out.push_back(m.batcher.get());
    return out;
  }

private:
  void acceptAll(int listenFd);
  void readFrom(int id, Connection &c);
  void parseInput(int id, Connection &c);
  void writeTo(int id, Connection &c);
  void handle(int id, Connection &c, const http::Request &req);
  void reply(Connection &c, int status, const std::string &body, const std::string &extraHeaders = "",
             const char *contentType = "application/json");
  void endStream(Connection &c);
  void replyError(Connection &c, const openai::Error &e, const std::string &what);
  bool startJob(int id, Connection &c, const openai::GenerationRequest &req, const std::string &path,
                openai::Error &err);
  void emit(Job &job, size_t index, const std::string &text, const std::string &finish);
  void finishJob(Job &job);
  void failJob(Job &job, const std::string &message);
  size_t findModel(const std::string &name, openai::Error &err) const;
  void modelNotFound(const std::string &name, openai::Error &err) const;
  std::string metrics() const;
  void embed(Connection &c, const std::string &body, const std::string &what);
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's), with
  // --allow-runtime-lora-updating on a plan of adapter slots.
  void updateAdapters(Connection &c, bool load, const std::string &body, const std::string &what);
  std::string newCallId();
  openai::ChoiceResult result(const Job &job, const Choice &ch);
  std::string modelsJson() const;
  void drop(int id);
  void log(const std::string &peer, const std::string &what);

  GenerationSetup &g_;
  std::vector<ServedModel> &models_;
  std::string apiKey_;
  std::map<int, uint64_t> responses_; // by status
  uint64_t promptTokens_ = 0, generatedTokens_ = 0, embeddedInputs_ = 0;
  std::mt19937_64 seeds_;
  double requestTimeout_, keepAlive_;
  int64_t created_;
  uint64_t connections_ = 0;
  uint64_t nextId_ = 1;
  int nextConn_ = 0;
  std::map<int, Connection> conns_;
  std::shared_ptr<const sd::generate::JsonVocabulary> tokens_; // made for the first structured-output request
  std::string toolParser_; // --tool-call-parser: how tool_choice "auto" reads calls from text ("": refused)
  bool loraUpdating_ = false; // --allow-runtime-lora-updating
  bool logRequests_ = true;   // a line on stderr for each request
public:
  void allowLoraUpdating() { loraUpdating_ = true; }
};

} // namespace sdrun
