// Generated text as it grows: decoding, partial characters, stop texts.
#include "text_rows.h"
#include "sd/format/json.h"
#include <algorithm>

namespace sdrun {
namespace {

// The earliest stop text that ends at or after byte `from` of `text` (it may
// have begun before, but not before `minBegin`): [begin, end) of it, or false.
bool stopAt(const std::string &text, size_t from, size_t minBegin, const std::vector<std::string> &stops, size_t &begin,
            size_t &end) {
  begin = end = std::string::npos;
  for (const std::string &s : stops) {
    size_t at = text.find(s, std::max(minBegin, from >= s.size() ? from - s.size() + 1 : 0));
    if (at == std::string::npos) continue;
    if (at + s.size() < end) end = at + s.size();
    begin = std::min(begin, at);
  }
  return end != std::string::npos;
}

// How many bytes at the end of `text` (after byte `from`) could be the start
// of a stop text: they wait until the next tokens say whether they are.
size_t stopPrefixAtEnd(const std::string &text, size_t from, const std::vector<std::string> &stops) {
  size_t most = 0;
  for (const std::string &s : stops)
    for (size_t n = std::min(s.size() - 1, text.size() - from); n > most; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        most = n;
        break;
      }
  return most;
}

} // namespace

std::vector<std::string> tokenTexts(const TextCodec &codec, const std::vector<int64_t> &before,
                                    const std::vector<int64_t> &tokens) {
  // Pieces alone lose a word's leading space; decoding them together keeps it.
  const std::string prior = codec.decode(before);
  std::vector<int64_t> ids = before;
  ids.push_back(0);
  std::vector<std::string> texts;
  for (int64_t token : tokens) {
    ids.back() = token;
    const std::string joined = codec.decode(ids);
    texts.push_back(joined.size() > prior.size() && joined.compare(0, prior.size(), prior) == 0
                        ? joined.substr(prior.size())
                        : codec.piece(token));
  }
  return texts;
}

void startRow(Row &r, const TextCodec &codec, size_t context) {
  r.start = r.tokens.size() > context ? r.tokens.size() - context : 0;
  r.base = r.printed = codec.decode(std::vector<int64_t>(r.tokens.begin() + long(r.start), r.tokens.end()));
}

bool appendToken(Row &r, int64_t token, const TextCodec &codec, const std::vector<std::string> &stops, StopText mode) {
  r.tokens.push_back(token);
  std::string now = codec.decode(std::vector<int64_t>(r.tokens.begin() + long(r.start), r.tokens.end()));
  size_t begin, end;
  // generate finds a stop text that began in the prompt too; a server only
  // one in what was generated, as OpenAI's and vLLM's do.
  const size_t minBegin = mode == StopText::Cut ? r.base.size() : 0;
  const bool stop = now.size() > r.base.size() &&
                    stopAt(now, std::max(r.base.size(), r.printed.size()), minBegin, stops, begin, end);
  if (stop) now.resize(std::max(mode == StopText::Shown ? end : begin, r.printed.size()));
  const bool partial = now.size() >= 3 && now.compare(now.size() - 3, 3, "\xEF\xBF\xBD") == 0;
  if (!stop && mode == StopText::Cut)
    now.resize(now.size() - stopPrefixAtEnd(now, std::max(r.base.size(), r.printed.size()), stops));
  if ((stop || !partial) && now.size() > r.printed.size() && now.compare(0, r.printed.size(), r.printed) == 0) {
    r.shown.append(now, r.printed.size(), std::string::npos);
    r.printed = now;
  }
  return stop;
}

void finishRow(Row &r, const TextCodec &codec) {
  std::string now = codec.decode(std::vector<int64_t>(r.tokens.begin() + long(r.start), r.tokens.end()));
  if (now.size() > r.printed.size() && now.compare(0, r.printed.size(), r.printed) == 0) {
    r.shown.append(now, r.printed.size(), std::string::npos);
    r.printed = now;
  }
  r.done = true;
}

sd::Status generationConfigEos(const std::string &text, const std::string &path, std::set<int64_t> &out) {
  auto doc = sd::parseJson(text, path);
  if (!doc.isOk()) return doc.status();
  const sd::Json *eos = doc.value().get("eos_token_id");
  if (!eos || eos->type == sd::Json::Type::Null) return sd::Status::ok();
  std::vector<const sd::Json *> ids;
  if (eos->type == sd::Json::Type::Array)
    for (const sd::Json &e : eos->arr) ids.push_back(&e);
  else
    ids.push_back(eos);
  for (const sd::Json *e : ids) {
    if (!e->isInteger() || e->num < 0) return sd::sdError(path, ": eos_token_id must be a token id or a list of them");
    out.insert(int64_t(e->num));
  }
  return sd::Status::ok();
}

} // namespace sdrun
