// Structured output: JSON that follows a JSON Schema, as OpenAI's
// response_format json_schema (and json_object: any JSON object) asks for.
// The schema compiles to a small grammar of JSON values; a JsonConstraint
// follows the text generated so far byte by byte and allows a token only if
// the text stays the start of a document the grammar accepts, so every
// finished text parses and validates.
//
// The text is compact JSON, as OpenAI's structured outputs are: no white
// space outside strings, "," and ":" as separators. Object properties come in
// the schema's order; a required one is never skipped, an optional one may
// be; keys the schema does not list are generated only for an object schema
// with no `properties` (any keys, values after `additionalProperties`).
#pragma once
#include "sd/format/json.h"
#include "sd/format/status.h"
#include "sd/generate/token_constraint.h"
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sd::generate {

class Pattern; // a string's "pattern" or "format" (sd/generate/pattern.h)
using PatternState = std::bitset<128>;

class JsonGrammar {
public:
  struct Property {
    std::string key; // as JSON text, quotes included
    int32_t value = -1;
    bool required = false;
  };
  struct Node {
    enum class Kind : uint8_t { Object, Array, String, Number, Integer, Literal, Union } kind = Kind::Union;
    std::vector<Property> properties; // Object
    int32_t additional = -1;          // Object: the values of keys not listed (-1: none)
    int32_t items = -1;               // Array: its items
    int64_t minCount = 0, maxCount = -1; // Array: items; String: characters (-1: no limit)
    std::vector<std::string> literals;   // Literal: the texts it may be (enum, const, true, false, null)
    std::vector<int32_t> alternatives;   // Union: the nodes it may be
    std::shared_ptr<const Pattern> pattern; // String: what its text must match; Integer: its range (null: any)
  };

  JsonGrammar(); // holds node 0, a plain string (the keys of objects with any keys)
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const JsonGrammar> anyObject();
  // JSON Schema text. Supported: type (one or a list), properties, required,
  // additionalProperties, items, minItems, maxItems, minLength, maxLength,
  // pattern (sd/generate/pattern.h), format (date, time, date-time,
  // uuid, email, ipv4), an integer's minimum, maximum, exclusiveMinimum and
  // exclusiveMaximum (a pattern over its digits),
  // enum, const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to
  // "#", "#/$defs/..." or "#/definitions/...", and the annotations (title,
  // description, default, examples, ...). Anything else is an error naming the
  // keyword and where it is (a JSON pointer), never silently ignored.
  static StatusOr<std::shared_ptr<const JsonGrammar>> fromSchema(const std::string &schemaText);
  static StatusOr<std::shared_ptr<const JsonGrammar>> fromSchema(const Json &schema);
  // One of these texts exactly (vLLM's guided_choice): raw text, not JSON.
  static std::shared_ptr<const JsonGrammar> choice(const std::vector<std::string> &texts);
  // The parameters schema of a function that declares none: an object
  // with no properties, {}.
  static const Json &noParameters();
  // Tool calls as OpenAI's tool_choice "required" has them written: a list
  // of one or more (at most one unless `parallel`) {"name": NAME,
  // "parameters": {...}}, each tool's parameters following its own schema
  // (null: an empty object).
  static StatusOr<std::shared_ptr<const JsonGrammar>> toolCalls(
      const std::vector<std::pair<std::string, const Json *>> &tools, bool parallel);

  const Node &node(int32_t i) const { return nodes_[size_t(i)]; }
  int32_t root() const { return root_; }
  // The bytes a value of node `i` may start with.
  const std::bitset<256> &firstBytes(int32_t i) const { return firstBytes_[size_t(i)]; }

  // Builds a grammar (the schema reader's and anyObject's business).
  int32_t add(Node n);
  Node &at(int32_t i) { return nodes_[size_t(i)]; }
  // Any JSON value; its object and array nodes refer back to it.
  int32_t addAnyValue();
  // The last step of building: the root, and each node's first bytes.
  void finish(int32_t root);

private:
  std::vector<Node> nodes_;
  std::vector<std::bitset<256>> firstBytes_;
  int32_t root_ = -1;
};

// Follows text through a grammar: the set of parser stacks the text so far
// allows (a pushdown automaton run on every reading at once, so a union's
// alternatives are followed until the text tells them apart).
class JsonMatcher {
public:
  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> grammar);
  // Feeds bytes; false (and the matcher unchanged) when the text would stop
  // being the start of an accepted document.
  bool feed(std::string_view bytes);
  // Whether feeding `bytes` would succeed, leaving the matcher unchanged.
  bool accepts(std::string_view bytes) const;
  // The text so far is a whole document.
  bool canEnd() const;
  // The text is a whole document and no byte may follow.
  bool finished() const;
  // Where every reading is inside a string's text (no character begun): the
  // fewest and the most characters a reading may still take (INT64_MAX: no
  // limit); else {-1, -1}.
  std::pair<int64_t, int64_t> plainStringRoom() const;
  // The bytes that may come next (at least those; feed() decides).
  std::bitset<256> nextBytes() const;
  // Whether byte `c` may come next (at least; feed() decides).
  bool mayTake(unsigned char c) const;

  struct Frame {
    int32_t node = 0;
    uint8_t phase = 0;
    uint8_t lo = 0, hi = 0; // a string's next UTF-8 continuation byte range
    int32_t index = 0;      // object: next property; array: items; string: characters; literal: which
    int32_t pos = 0;        // object: the key being written; literal: bytes matched; string: bytes to come
    int32_t sub = 0;        // object: bytes of the key matched
    uint32_t cp = 0;        // a patterned string: the character being read (UTF-8 or \u escape)
    PatternState re;        // a patterned string: where its text is in the pattern
    bool operator==(const Frame &o) const {
      return node == o.node && phase == o.phase && lo == o.lo && hi == o.hi && index == o.index && pos == o.pos &&
             sub == o.sub && cp == o.cp && re == o.re;
    }
  };
  using Stack = std::vector<Frame>;

private:
  bool step(std::vector<Stack> &stacks, unsigned char c) const;
  void feedStack(Stack s, unsigned char c, std::vector<Stack> &out, int depth) const;
  void startValue(Stack s, int32_t node, unsigned char c, std::vector<Stack> &out, int depth) const;
  void childDone(Stack &s) const;
  void tryObject(Stack &s, unsigned char c, std::vector<Stack> &out, int depth) const;
  void tryArray(Stack &s, unsigned char c, std::vector<Stack> &out, int depth) const;
  bool takes(const Stack &s, size_t top, Frame f, unsigned char c) const;

  std::shared_ptr<const JsonGrammar> g_;
  std::vector<Stack> stacks_;
  mutable int starts_ = 0; // values started for the byte being fed (a bound on a schema's fan-out)
};

// A vocabulary indexed for JSON constraints, made once and shared by every
// row: a byte trie of the tokens (outside strings a state allows few
// branches), and the tokens that are plain string text (UTF-8 from a character's
// start, no quote, backslash or control byte), which a string takes while it
// has room for the characters they start, without following them byte by
// byte: inside strings, where most of the vocabulary is allowed, the mask is
// mostly whole words of bits.
struct JsonVocabulary {
  static constexpr int kPlainLevels = 32; // plainUpTo's levels
  std::shared_ptr<const TokenTable> table;
  std::vector<int32_t> plainChars;       // characters a plain-text token starts; -1: not one
  std::vector<TokenMask> plainUpTo;      // [k]: plain tokens of at most k characters (k < kPlainLevels)
  std::vector<std::vector<int32_t>> plainOf; // [k]: plain tokens of k characters (k < kPlainLevels)
  std::vector<int32_t> longPlain;        // plain tokens of kPlainLevels characters or more
  std::vector<std::vector<int32_t>> otherByFirstByte; // [256]: the text tokens not plain, by first byte
  std::vector<int32_t> ends;             // End tokens
  // The text tokens as a byte trie (node 0 the root): a state outside
  // strings follows the few branches it allows, not every token.
  struct TrieNode {
    std::vector<std::pair<unsigned char, int32_t>> children;
    std::vector<int32_t> tokens; // the tokens whose bytes end here
  };
  std::vector<TrieNode> trie;
  static std::shared_ptr<const JsonVocabulary> make(std::shared_ptr<const TokenTable> table);
};

// A row's constraint: the matcher over a vocabulary's token texts. End
// tokens (EOS) are allowed once the document is whole; the row is finished
// when nothing may follow it.
class JsonConstraint : public TokenConstraint {
public:
  JsonConstraint(std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const JsonVocabulary> vocab)
      : matcher_(std::move(grammar)), vocab_(std::move(vocab)) {}
  bool allows(int64_t token) const override;
  void allowedTokens(TokenMask &mask, int64_t tokens) const override;
  void accept(int64_t token) override;
  bool finished() const override { return matcher_.finished(); }

private:
  void prepare() const; // the bytes that may come next, and the string room, for this state
  bool allowsText(int64_t token) const;
  void walk(int32_t node, const JsonMatcher &m, TokenMask &mask, int64_t tokens) const;

  JsonMatcher matcher_;
  std::shared_ptr<const JsonVocabulary> vocab_;
  mutable bool prepared_ = false;
  mutable std::bitset<256> nextBytes_;
  mutable int64_t room_ = -1, mostRoom_ = -1; // plainStringRoom()
};

} // namespace sd::generate
