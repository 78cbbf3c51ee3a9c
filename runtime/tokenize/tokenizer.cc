// tokenizer.json: the pipeline the tokenizers library runs (added tokens ->
// pre-tokenizer -> model -> post-processor; decoder back), for the parts
// listed in sd/tokenize/tokenizer.h. Unsupported parts are load errors.
#include "sd/tokenize/tokenizer.h"
#include "bert.h"
#include "bpe.h"
#include "decoders.h"
#include "byte_level.h"
#include "split_patterns.h"
#include "sd/format/file_io.h"
#include "unicode.h"
#include "wordpiece.h"
#include <bitset>
#include <cstring>
#include <optional>
#include <map>
#include <sys/stat.h>

namespace sd {
namespace {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, singleWord = false;
};

std::string typeOf(const Json *j) {
  const Json *t = j ? j->get("type") : nullptr;
  return t && t->type == Json::Type::String ? t->str : "";
}

bool boolField(const Json &j, const char *key, bool def) {
  const Json *v = j.get(key);
  return v && v->type == Json::Type::Bool ? v->b : def;
}

bool isWordChar(char32_t cp) { return cp == '_' || tok::isLetter(cp) || tok::isNumber(cp); }

// The code point that ends just before byte i (valid UTF-8), or 0 at the start.
char32_t codePointBefore(std::string_view s, size_t i) {
  if (i == 0) return 0;
  size_t k = i - 1;
  while (k > 0 && (uint8_t(s[k]) & 0xC0) == 0x80) --k;
  return tok::nextCodePoint(s, k);
}

} // namespace

struct Tokenizer::Impl {
  std::unique_ptr<tok::VocabModel> model;
  // Normalizers in file order: BertNormalizer, Prepend (a, when the text is
  // not empty), Replace (a by b, a literal pattern).
  struct Normalizer {
    enum class Kind { Bert, Prepend, Replace } kind;
    tok::BertNormalizerOptions bert;
    std::string a, b;
  };
  std::vector<Normalizer> normalizers;
  enum class Split { None, Gpt2, Llama3, Bert, Metaspace } split = Split::None;
  int maxDigits = 3; // Llama3: digits per piece (Qwen2's pattern: 1)
  // Metaspace: spaces become `replacement`, one is prepended ("always": to
  // every segment, "first": to the one at the start of the text), and with
  // metaspaceSplit each replacement starts a new word.
  std::string replacement;
  enum class Prepend { Always, First, Never } prependScheme = Prepend::Always;
  bool metaspaceSplit = true;
  tok::DecoderChain decoder;
  bool byteLevel = false, addPrefixSpace = false;
  std::vector<AddedToken> added;
  std::map<int32_t, size_t> addedById;
  std::bitset<256> firstBytes; // the bytes an added token starts with
  std::vector<int32_t> prefix, suffix; // the post-processor's tokens around one sequence
  int32_t eos = -1;
  std::map<std::string, std::string> templateStrings; // bos_token, eos_token, ... for chat templates
  std::unique_ptr<ChatTemplate> chat;
  Status chatStatus = sdError("no chat template beside the tokenizer (tokenizer_config.json's chat_template, or chat_template.jinja)");

  Status loadNormalizer(const Json *n, const std::string &what);
  Status loadPreTokenizer(const Json *p, const std::string &what);
  Status loadPostProcessor(const Json *p, const std::string &what);
  // `atStart`: the segment begins the text (Metaspace's "first" scheme).
  void encodeSegment(std::string_view text, bool atStart, std::vector<int32_t> &out) const;
  // The added token matching at byte i of `text`, longest first, or null.
  const AddedToken *addedAt(std::string_view text, size_t i, bool parseSpecial) const;
};

Status Tokenizer::Impl::loadNormalizer(const Json *n, const std::string &what) {
  if (!n || n->type == Json::Type::Null) return Status::ok();
  const std::string type = typeOf(n);
  auto str = [&](const Json *v) { return v && v->type == Json::Type::String ? v->str : std::string(); };
  if (type == "Sequence") {
    const Json *list = n->get("normalizers");
    if (!list || list->type != Json::Type::Array) return sdError(what, ": a Sequence normalizer without normalizers");
    for (const Json &q : list->arr) SD_RETURN_IF_ERROR(loadNormalizer(&q, what));
    return Status::ok();
  }
  if (type == "BertNormalizer") {
    Normalizer b{Normalizer::Kind::Bert, {}, "", ""};
    b.bert.cleanText = boolField(*n, "clean_text", true);
    b.bert.chineseChars = boolField(*n, "handle_chinese_chars", true);
    b.bert.lowercase = boolField(*n, "lowercase", true);
    b.bert.stripAccents = boolField(*n, "strip_accents", b.bert.lowercase); // null: as lowercase
    normalizers.push_back(b);
    return Status::ok();
  }
  if (type == "Prepend") {
    normalizers.push_back({Normalizer::Kind::Prepend, {}, str(n->get("prepend")), ""});
    return Status::ok();
  }
  if (type == "Replace") {
    const Json *pattern = n->get("pattern");
    const Json *literal = pattern ? pattern->get("String") : nullptr;
    if (!literal || literal->type != Json::Type::String || literal->str.empty())
      return sdError(what, ": a Replace normalizer with a regex pattern is not supported yet");
    normalizers.push_back({Normalizer::Kind::Replace, {}, literal->str, str(n->get("content"))});
    return Status::ok();
  }
  return sdError(what, ": normalizer type '", type, "' is not supported yet (BertNormalizer, Prepend, Replace)");
}

Status Tokenizer::Impl::loadPreTokenizer(const Json *p, const std::string &what) {
  if (!p || p->type == Json::Type::Null) return Status::ok();
  std::string type = typeOf(p);
  if (type == "Sequence") {
    const Json *list = p->get("pretokenizers");
    if (!list || list->type != Json::Type::Array) return sdError(what, ": a Sequence pre_tokenizer without pretokenizers");
    for (const Json &q : list->arr) SD_RETURN_IF_ERROR(loadPreTokenizer(&q, what));
    return Status::ok();
  }
  if (type == "Metaspace") {
    if (split != Split::None || byteLevel) return sdError(what, ": Metaspace after another split");
    split = Split::Metaspace;
    const Json *r = p->get("replacement"), *scheme = p->get("prepend_scheme");
    replacement = r && r->type == Json::Type::String ? r->str : "\xE2\x96\x81";
    std::string sch = scheme && scheme->type == Json::Type::String ? scheme->str
                                                                   : (boolField(*p, "add_prefix_space", true) ? "always" : "never");
    if (sch != "always" && sch != "first" && sch != "never")
      return sdError(what, ": Metaspace prepend_scheme '", sch, "' is not always, first or never");
    prependScheme = sch == "always" ? Prepend::Always : sch == "first" ? Prepend::First : Prepend::Never;
    metaspaceSplit = boolField(*p, "split", true);
    return Status::ok();
  }
  if (type == "BertPreTokenizer") {
    if (split != Split::None || byteLevel) return sdError(what, ": BertPreTokenizer after another split");
    split = Split::Bert;
    return Status::ok();
  }
  if (type == "Split") {
    const Json *pattern = p->get("pattern"), *behavior = p->get("behavior");
    const Json *regex = pattern ? pattern->get("Regex") : nullptr;
    std::string text = regex && regex->type == Json::Type::String ? regex->str : "";
    const std::string llama3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    std::string qwen2 = llama3;
    qwen2.replace(qwen2.find("{1,3}"), 5, "");
    if ((text != llama3 && text != qwen2) || !behavior || behavior->str != "Isolated" || boolField(*p, "invert", false))
      return sdError(what, ": Split pre-tokenizer '", text.substr(0, 80),
                     "' is not supported yet (the Llama-3 and Qwen2 patterns, Isolated)");
    if (split != Split::None || byteLevel) return sdError(what, ": a Split after another split or ByteLevel");
    split = Split::Llama3;
    maxDigits = text == llama3 ? 3 : 1;
    return Status::ok();
  }
  if (type != "ByteLevel")
    return sdError(what, ": pre_tokenizer type '", type,
                   "' is not supported yet (ByteLevel, Split, Metaspace, BertPreTokenizer)");
  if (byteLevel) return sdError(what, ": two ByteLevel pre-tokenizers");
  byteLevel = true;
  addPrefixSpace = boolField(*p, "add_prefix_space", true);
  if (boolField(*p, "use_regex", true)) {
    if (split != Split::None) return sdError(what, ": ByteLevel with use_regex after a Split");
    split = Split::Gpt2;
  }
  return Status::ok();
}

// TemplateProcessing's single-sequence template, Bert/RobertaProcessing's
// [CLS] A [SEP], ByteLevel (offsets only: no tokens), and Sequences of these.
Status Tokenizer::Impl::loadPostProcessor(const Json *p, const std::string &what) {
  if (!p || p->type == Json::Type::Null) return Status::ok();
  std::string type = typeOf(p);
  if (type == "ByteLevel") return Status::ok();
  if (type == "Sequence") {
    const Json *list = p->get("processors");
    if (!list || list->type != Json::Type::Array) return sdError(what, ": a Sequence post_processor without processors");
    for (const Json &q : list->arr) SD_RETURN_IF_ERROR(loadPostProcessor(&q, what));
    return Status::ok();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto idOf = [&](const char *key, int32_t &id) -> Status {
      const Json *v = p->get(key);
      if (!v || v->type != Json::Type::Array || v->arr.size() != 2 || !v->arr[1].isInteger())
        return sdError(what, ": ", type, " needs ", key, " as [token, id]");
      id = int32_t(v->arr[1].num);
      return Status::ok();
    };
    int32_t cls, sep;
    SD_RETURN_IF_ERROR(idOf("cls", cls));
    SD_RETURN_IF_ERROR(idOf("sep", sep));
    prefix = {cls};
    suffix = {sep};
    return Status::ok();
  }
  if (type != "TemplateProcessing")
    return sdError(what, ": post_processor type '", type, "' is not supported yet");
  const Json *single = p->get("single"), *specials = p->get("special_tokens");
  if (!single || single->type != Json::Type::Array) return sdError(what, ": TemplateProcessing without a single template");
  bool afterSequence = false;
  for (const Json &piece : single->arr) {
    if (piece.get("Sequence")) {
      afterSequence = true;
      continue;
    }
    const Json *special = piece.get("SpecialToken");
    const Json *name = special ? special->get("id") : nullptr;
    const Json *entry = name && specials ? specials->get(name->str) : nullptr;
    const Json *ids = entry ? entry->get("ids") : nullptr;
    if (!ids || ids->type != Json::Type::Array)
      return sdError(what, ": TemplateProcessing names a special token missing from special_tokens");
    for (const Json &id : ids->arr) {
      if (!id.isInteger()) return sdError(what, ": TemplateProcessing special token ids must be integers");
      (afterSequence ? suffix : prefix).push_back(int32_t(id.num));
    }
  }
  return Status::ok();
}

const AddedToken *Tokenizer::Impl::addedAt(std::string_view text, size_t i, bool parseSpecial) const {
  const AddedToken *best = nullptr;
  for (const AddedToken &a : added) {
    if ((a.special && !parseSpecial) || a.content.empty() || text.compare(i, a.content.size(), a.content) != 0) continue;
    if (best && best->content.size() >= a.content.size()) continue;
    if (a.singleWord) {
      size_t end = i + a.content.size(), k = end;
      if (isWordChar(codePointBefore(text, i)) || (end < text.size() && isWordChar(tok::nextCodePoint(text, k))))
        continue;
    }
    best = &a;
  }
  return best;
}

void Tokenizer::Impl::encodeSegment(std::string_view raw, bool atStart, std::vector<int32_t> &out) const {
  if (raw.empty()) return;
  std::string text(raw);
  for (const Normalizer &n : normalizers) {
    switch (n.kind) {
    case Normalizer::Kind::Bert: text = tok::bertNormalize(text, n.bert); break;
    case Normalizer::Kind::Prepend:
      if (!text.empty()) text = n.a + text;
      break;
    case Normalizer::Kind::Replace: text = tok::replaceAll(text, n.a, n.b); break;
    }
  }
  if (byteLevel && addPrefixSpace && !text.empty() && text[0] != ' ') text = " " + text;
  auto word = [&](std::string_view piece) {
    model->encodeWord(byteLevel ? tok::toByteLevel(piece) : std::string(piece), out);
  };
  switch (split) {
  case Split::None:
    if (!text.empty()) word(text);
    return;
  case Split::Gpt2:
    for (std::string_view piece : tok::splitGpt2(text)) word(piece);
    return;
  case Split::Llama3:
    for (std::string_view piece : tok::splitLlama3(text, maxDigits)) word(piece);
    return;
  case Split::Bert:
    for (std::string_view piece : tok::bertSplit(text)) word(piece);
    return;
  case Split::Metaspace: {
    text = tok::replaceAll(text, " ", replacement);
    bool prepend = prependScheme == Prepend::Always || (prependScheme == Prepend::First && atStart);
    if (prepend && text.compare(0, replacement.size(), replacement) != 0) text = replacement + text;
    if (!metaspaceSplit) return word(text);
    // Each replacement character starts a word (the library's MergedWithNext).
    size_t start = 0;
    for (size_t at = text.find(replacement, 1); at != std::string::npos; at = text.find(replacement, at + 1)) {
      if (at > start) word(std::string_view(text).substr(start, at - start));
      start = at;
    }
    if (start < text.size()) word(std::string_view(text).substr(start));
    return;
  }
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::string toValidUtf8(std::string_view s) { return tok::toValidUtf8(s); }

namespace {

// The files beside tokenizer.json, by their usual names, and where each goes.
struct BesideFile {
  const char *name;
  std::string TokenizerFiles::*text, TokenizerFiles::*from;
};
const BesideFile kBesideFiles[] = {
    {"tokenizer_config.json", &TokenizerFiles::config, &TokenizerFiles::configName},
    {"chat_template.jinja", &TokenizerFiles::chatTemplate, &TokenizerFiles::chatTemplateName},
    {"generation_config.json", &TokenizerFiles::generationConfig, &TokenizerFiles::generationConfigName},
};

} // namespace

StatusOr<TokenizerFiles> TokenizerFiles::read(const std::string &path) {
  TokenizerFiles f;
  f.jsonName = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) f.jsonName = path + "/tokenizer.json";
  auto text = readWholeFile(f.jsonName);
  if (!text.isOk()) return text.status();
  f.json = std::move(text.value());
  const std::string dir = parentDirectory(f.jsonName);
  for (const BesideFile &b : kBesideFiles) {
    const std::string beside = dir + "/" + b.name;
    if (::stat(beside.c_str(), &st) != 0) continue;
    auto read = readWholeFile(beside);
    if (!read.isOk()) return read.status();
    f.*b.text = std::move(read.value());
    f.*b.from = beside;
  }
  return f;
}

bool TokenizerFiles::carried(const std::function<const std::string *(const std::string &)> &find,
                             const std::string &where, TokenizerFiles &out) {
  out = TokenizerFiles();
  const std::string *json = find("tokenizer.json");
  if (!json) return false;
  out.json = *json;
  out.jsonName = where + "'s tokenizer.json";
  for (const BesideFile &b : kBesideFiles)
    if (const std::string *bytes = find(b.name)) {
      out.*b.text = *bytes;
      out.*b.from = where + "'s " + b.name;
    }
  return true;
}

std::vector<std::pair<std::string, std::string>> TokenizerFiles::named() const {
  std::vector<std::pair<std::string, std::string>> files = {{"tokenizer.json", json}};
  for (const BesideFile &b : kBesideFiles)
    if (!(this->*b.from).empty()) files.emplace_back(b.name, this->*b.text);
  return files;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string &path) {
  auto files = TokenizerFiles::read(path);
  if (!files.isOk()) return files.status();
  return fromFiles(files.value());
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::fromFiles(const TokenizerFiles &files) {
  const std::string &file = files.jsonName;
  auto parsed = parseJson(files.json, file);
  if (!parsed.isOk()) return parsed.status();
  const Json &root = parsed.value();
  auto impl = std::make_unique<Impl>();
  const Json *model = root.get("model");
  if (!model || model->type != Json::Type::Object) return sdError(file, ": no model object");
  std::string type = typeOf(model);
  if (type.empty() && model->get("merges")) type = "BPE";
  if (type == "BPE") {
    auto bpe = std::make_unique<tok::Bpe>();
    SD_RETURN_IF_ERROR(bpe->load(*model, file));
    impl->model = std::move(bpe);
  } else if (type == "WordPiece") {
    auto wp = std::make_unique<tok::WordPiece>();
    SD_RETURN_IF_ERROR(wp->load(*model, file));
    impl->model = std::move(wp);
  } else {
    return sdError(file, ": model type '", type, "' is not supported yet (BPE, WordPiece)");
  }
  SD_RETURN_IF_ERROR(impl->loadNormalizer(root.get("normalizer"), file));
  SD_RETURN_IF_ERROR(impl->loadPreTokenizer(root.get("pre_tokenizer"), file));
  SD_RETURN_IF_ERROR(impl->loadPostProcessor(root.get("post_processor"), file));
  SD_RETURN_IF_ERROR(impl->decoder.load(root.get("decoder"), file));
  if (const Json *list = root.get("added_tokens"); list && list->type == Json::Type::Array) {
    for (const Json &a : list->arr) {
      const Json *id = a.get("id"), *content = a.get("content");
      if (!id || !id->isInteger() || id->num < 0 || !content || content->type != Json::Type::String)
        return sdError(file, ": an added token without an id and content");
      AddedToken t{content->str, int32_t(id->num), boolField(a, "special", false), boolField(a, "lstrip", false),
                   boolField(a, "rstrip", false), boolField(a, "single_word", false)};
      impl->addedById[t.id] = impl->added.size();
      if (!t.content.empty()) impl->firstBytes.set(uint8_t(t.content[0]));
      impl->added.push_back(std::move(t));
    }
  }
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer(std::move(impl)));
  // tokenizer_config.json (optional) names the special tokens: eos_token as a
  // string or as {"content": ...}.
  Impl &m = *tokenizer->impl_;
  const std::string &config = files.configName;
  Json cjson;
  if (!files.configName.empty()) {
    auto read = parseJson(files.config, config);
    if (!read.isOk()) return read.status();
    cjson = std::move(read.value());
    for (const char *key : {"bos_token", "eos_token", "unk_token", "pad_token"})
      if (const Json *t = cjson.get(key)) {
        const Json *content = t->type == Json::Type::Object ? t->get("content") : t;
        if (content && content->type == Json::Type::String) m.templateStrings[key] = content->str;
      }
    if (m.templateStrings.count("eos_token")) {
      m.eos = tokenizer->tokenId(m.templateStrings["eos_token"]);
      if (m.eos < 0) return sdError(config, ": eos_token '", m.templateStrings["eos_token"], "' is not a token of ", file);
    }
  }
  const Json *chat = cjson.get("chat_template");
  std::string source, where = config;
  if (chat && chat->type == Json::Type::String) source = chat->str;
  if (chat && chat->type == Json::Type::Array)
    for (const Json &named : chat->arr)
      if (const Json *n = named.get("name"); n && n->str == "default" && named.get("template"))
        source = named.get("template")->str;
  if (!files.chatTemplateName.empty()) source = files.chatTemplate, where = files.chatTemplateName;
  if (!source.empty()) {
    auto parsedTemplate = ChatTemplate::parse(source);
    if (parsedTemplate.isOk()) m.chat = std::move(parsedTemplate.value()), m.chatStatus = Status::ok();
    else m.chatStatus = parsedTemplate.status().withContext(where + ": ");
  } else if (chat && chat->type != Json::Type::Null) {
    m.chatStatus = sdError(config, ": chat_template is neither a string nor a list with a 'default' template");
  }
  return tokenizer;
}

std::vector<int32_t> Tokenizer::encode(std::string_view raw, const EncodeOptions &options) const {
  const Impl &m = *impl_;
  std::string text = tok::toValidUtf8(raw);
  std::string_view s = text;
  std::vector<int32_t> ids(m.prefix.begin(), m.prefix.end());
  if (!options.addSpecialTokens) ids.clear();
  // Split around added tokens (leftmost, longest); lstrip/rstrip take the
  // whitespace beside a token into it.
  size_t segment = 0;
  for (size_t i = 0; i < s.size();) {
    const AddedToken *a = m.firstBytes[uint8_t(s[i])] ? m.addedAt(s, i, options.parseSpecial) : nullptr;
    if (!a) {
      ++i;
      continue;
    }
    size_t start = i, end = i + a->content.size();
    while (a->lstrip && start > segment) {
      size_t k = start - 1;
      while (k > segment && (uint8_t(s[k]) & 0xC0) == 0x80) --k;
      size_t probe = k;
      if (!tok::isWhitespace(tok::nextCodePoint(s, probe))) break;
      start = k;
    }
    if (a->rstrip)
      for (size_t k = end; k < s.size();) {
        size_t next = k;
        if (!tok::isWhitespace(tok::nextCodePoint(s, next))) break;
        end = k = next;
      }
    m.encodeSegment(s.substr(segment, start - segment), segment == 0, ids);
    ids.push_back(a->id);
    segment = i = end;
  }
  m.encodeSegment(s.substr(segment), segment == 0, ids);
  if (options.addSpecialTokens) ids.insert(ids.end(), m.suffix.begin(), m.suffix.end());
  return ids;
}

StatusOr<std::string> Tokenizer::decode(const std::vector<int32_t> &ids, bool skipSpecialTokens) const {
  const Impl &m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto added = m.addedById.find(id);
    if (added != m.addedById.end()) {
      if (!(skipSpecialTokens && m.added[added->second].special)) tokens.push_back(m.added[added->second].content);
    } else if (id >= 0 && size_t(id) < m.model->idToToken.size() && !m.model->idToToken[size_t(id)].empty()) {
      tokens.push_back(m.model->idToToken[size_t(id)]);
    } else {
      return sdError("token id ", id, " is not in the tokenizer's vocabulary");
    }
  }
  return m.decoder.decode(std::move(tokens));
}

int32_t Tokenizer::eosId() const { return impl_->eos; }

StatusOr<const ChatTemplate *> Tokenizer::chatTemplate() const {
  if (!impl_->chatStatus.isOk()) return impl_->chatStatus;
  return static_cast<const ChatTemplate *>(impl_->chat.get());
}

StatusOr<std::string> Tokenizer::renderChat(const std::vector<ChatMessage> &messages, bool addGenerationPrompt,
                                            const Json *tools) const {
  auto chat = chatTemplate();
  if (!chat.isOk()) return chat.status();
  return chat.value()->render(messages, addGenerationPrompt, impl_->templateStrings, tools);
}

int32_t Tokenizer::vocabSize() const {
  int32_t n = int32_t(impl_->model->idToToken.size());
  for (const AddedToken &a : impl_->added) n = std::max(n, a.id + 1);
  return n;
}

std::vector<std::string> Tokenizer::tokenBytes(std::vector<bool> &special) const {
  const Impl &m = *impl_;
  const size_t n = size_t(vocabSize());
  std::vector<std::string> bytes(n);
  special.assign(n, true);
  // A token's text mid-way: decoded after a plain token, less that token's
  // own text (decoders treat the first token apart: Metaspace's prepended
  // space, Strip, WordPiece's "##").
  std::string lead;
  for (const std::string &t : m.model->idToToken)
    if (!t.empty() && !m.decoder.decodeBytes({t}).empty()) {
      lead = t;
      break;
    }
  const std::string leadBytes = lead.empty() ? "" : m.decoder.decodeBytes({lead});
  auto mid = [&](const std::string &t) {
    if (lead.empty()) return m.decoder.decodeBytes({t});
    std::string both = m.decoder.decodeBytes({lead, t});
    return both.compare(0, leadBytes.size(), leadBytes) == 0 ? both.substr(leadBytes.size()) : m.decoder.decodeBytes({t});
  };
  for (size_t id = 0; id < m.model->idToToken.size(); ++id)
    if (!m.model->idToToken[id].empty()) {
      bytes[id] = mid(m.model->idToToken[id]);
      special[id] = false;
    }
  for (const AddedToken &a : m.added) {
    if (a.id < 0 || size_t(a.id) >= n) continue;
    special[size_t(a.id)] = a.special;
    bytes[size_t(a.id)] = a.special ? "" : mid(a.content);
  }
  return bytes;
}

int32_t Tokenizer::tokenId(const std::string &token) const {
  for (const AddedToken &a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->model->tokenToId.find(token);
  return it == impl_->model->tokenToId.end() ? -1 : it->second;
}

} // namespace sd
