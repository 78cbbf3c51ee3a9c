// Decoders, each a function on the list of token strings, as in the
// tokenizers library (decoders/*.rs there).
#include "decoders.h"
#include "byte_level.h"
#include "unicode.h"
#include <cstring>

namespace sd::tok {
namespace {

std::string typeOf(const Json &j) {
  const Json *t = j.get("type");
  return t && t->type == Json::Type::String ? t->str : "";
}

// A continuation loses its prefix, any other token but the first gets a
// space before it, then the library's clean-up of spaces before punctuation
// and in contractions.
std::string wordPiece(const std::string &token, bool first, const std::string &prefix, bool cleanup) {
  std::string t = token;
  if (!first) t = t.compare(0, prefix.size(), prefix) == 0 ? t.substr(prefix.size()) : " " + t;
  if (!cleanup) return t;
  static const std::pair<const char *, const char *> rules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
      {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto &[from, to] : rules) t = replaceAll(t, from, to);
  return t;
}

// The byte of a "<0xXX>" token, or -1.
int byteToken(const std::string &t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Byte tokens in a row become their UTF-8 text, or one U+FFFD per byte when
// the bytes are not valid UTF-8.
std::vector<std::string> byteFallback(const std::vector<std::string> &tokens, bool raw) {
  std::vector<std::string> out;
  std::string bytes;
  size_t count = 0;
  auto flush = [&] {
    if (!count) return;
    if (raw || toValidUtf8(bytes) == bytes) out.push_back(bytes);
    else
      for (size_t i = 0; i < count; ++i) out.push_back("\xEF\xBF\xBD");
    bytes.clear();
    count = 0;
  };
  for (const std::string &t : tokens) {
    int b = byteToken(t);
    if (b >= 0) {
      bytes += char(b);
      ++count;
    } else {
      flush();
      out.push_back(t);
    }
  }
  flush();
  return out;
}

// Removes up to `start` leading and `stop` trailing copies of the character `c`.
std::string strip(const std::string &t, const std::string &c, int64_t start, int64_t stop) {
  size_t b = 0, e = t.size();
  for (int64_t i = 0; i < start && t.compare(b, c.size(), c) == 0 && b + c.size() <= e; ++i) b += c.size();
  for (int64_t i = 0; i < stop && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++i) e -= c.size();
  return t.substr(b, e - b);
}

} // namespace

Status DecoderChain::add(const Json &d, const std::string &what) {
  const std::string type = typeOf(d);
  auto str = [&](const char *key, const std::string &def) {
    const Json *v = d.get(key);
    return v && v->type == Json::Type::String ? v->str : def;
  };
  auto boolean = [&](const char *key, bool def) {
    const Json *v = d.get(key);
    return v && v->type == Json::Type::Bool ? v->b : def;
  };
  Step s{Step::Kind::Fuse, "", "", 0, 0, false};
  if (type == "Sequence") {
    const Json *list = d.get("decoders");
    if (!list || list->type != Json::Type::Array) return sdError(what, ": a Sequence decoder without decoders");
    for (const Json &q : list->arr) SD_RETURN_IF_ERROR(add(q, what));
    return Status::ok();
  } else if (type == "ByteLevel") {
    s.kind = Step::Kind::ByteLevel;
  } else if (type == "WordPiece") {
    s = {Step::Kind::WordPiece, str("prefix", "##"), "", 0, 0, boolean("cleanup", true)};
  } else if (type == "Replace") {
    const Json *pattern = d.get("pattern");
    const Json *literal = pattern ? pattern->get("String") : nullptr;
    if (!literal || literal->type != Json::Type::String)
      return sdError(what, ": a Replace decoder with a regex pattern is not supported yet");
    s = {Step::Kind::Replace, literal->str, str("content", ""), 0, 0, false};
  } else if (type == "ByteFallback") {
    s.kind = Step::Kind::ByteFallback;
  } else if (type == "Fuse") {
    s.kind = Step::Kind::Fuse;
  } else if (type == "Strip") {
    const Json *start = d.get("start"), *stop = d.get("stop");
    s = {Step::Kind::Strip, str("content", " "), "", start && start->isInteger() ? int64_t(start->num) : 0,
         stop && stop->isInteger() ? int64_t(stop->num) : 0, false};
  } else if (type == "Metaspace") {
    std::string scheme = str("prepend_scheme", boolean("add_prefix_space", true) ? "always" : "never");
    s = {Step::Kind::Metaspace, str("replacement", "\xE2\x96\x81"), "", 0, 0, scheme != "never"};
  } else {
    return sdError(what, ": decoder type '", type, "' is not supported yet");
  }
  steps_.push_back(std::move(s));
  return Status::ok();
}

Status DecoderChain::load(const Json *decoder, const std::string &what) {
  if (!decoder || decoder->type == Json::Type::Null) return Status::ok();
  join_ = false;
  return add(*decoder, what);
}

std::string DecoderChain::run(std::vector<std::string> tokens, bool raw) const {
  auto valid = [raw](std::string s) { return raw ? s : toValidUtf8(s); };
  if (join_) { // no decoder: the library joins the tokens with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return valid(std::move(out));
  }
  for (const Step &s : steps_) {
    switch (s.kind) {
    case Step::Kind::ByteLevel: {
      std::string bytes;
      for (const std::string &t : tokens)
        if (!fromByteLevel(t, bytes)) bytes += t;
      tokens = {valid(std::move(bytes))};
      break;
    }
    case Step::Kind::WordPiece:
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = wordPiece(tokens[i], i == 0, s.a, s.flag);
      break;
    case Step::Kind::Replace:
      for (std::string &t : tokens) t = replaceAll(t, s.a, s.b);
      break;
    case Step::Kind::ByteFallback: tokens = byteFallback(tokens, raw); break;
    case Step::Kind::Fuse: {
      std::string all;
      for (const std::string &t : tokens) all += t;
      tokens = {all};
      break;
    }
    case Step::Kind::Strip:
      for (std::string &t : tokens) t = strip(t, s.a, s.start, s.stop);
      break;
    case Step::Kind::Metaspace: // the first token's replacement characters all go when a space was prepended
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = replaceAll(tokens[i], s.a, i == 0 && s.flag ? "" : " ");
      break;
    }
  }
  std::string out;
  for (const std::string &t : tokens) out += t;
  return valid(std::move(out));
}

} // namespace sd::tok
