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
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sd::generate {

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
  };

  JsonGrammar(); // holds node 0, a plain string (the keys of objects with any keys)
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const JsonGrammar> anyObject();
  // JSON Schema text. Supported: type (one or a list), properties, required,
  // additionalProperties, items, minItems, maxItems, minLength, maxLength,
  // enum, const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to
  // "#", "#/$defs/..." or "#/definitions/...", and the annotations (title,
  // description, default, examples, ...). Anything else is an error naming the
  // keyword and where it is (a JSON pointer), never silently ignored.
  static StatusOr<std::shared_ptr<const JsonGrammar>> fromSchema(const std::string &schemaText);
  static StatusOr<std::shared_ptr<const JsonGrammar>> fromSchema(const Json &schema);

  const Node &node(int32_t i) const { return nodes_[size_t(i)]; }
  int32_t root() const { return root_; }

  // Builds a grammar (the schema reader's and anyObject's business).
  int32_t add(Node n);
  Node &at(int32_t i) { return nodes_[size_t(i)]; }
  // Any JSON value; its object and array nodes refer back to it.
  int32_t addAnyValue();
  void setRoot(int32_t r) { root_ = r; }

private:
  std::vector<Node> nodes_;
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

  struct Frame {
    int32_t node = 0;
    uint8_t phase = 0;
    uint8_t lo = 0, hi = 0; // a string's next UTF-8 continuation byte range
    int32_t index = 0;      // object: next property; array: items; string: characters; literal: which
    int32_t pos = 0;        // object: the key being written; literal: bytes matched; string: bytes to come
    int32_t sub = 0;        // object: bytes of the key matched
    bool operator==(const Frame &o) const {
      return node == o.node && phase == o.phase && lo == o.lo && hi == o.hi && index == o.index && pos == o.pos &&
             sub == o.sub;
    }
  };
  using Stack = std::vector<Frame>;

private:
  bool step(std::vector<Stack> &stacks, unsigned char c) const;
  void feedStack(Stack s, unsigned char c, std::vector<Stack> &out, int depth) const;
  void startValue(Stack s, int32_t node, unsigned char c, std::vector<Stack> &out, int depth) const;
  void childDone(Stack &s) const;
  bool tryObject(Stack &s, unsigned char c, std::vector<Stack> &out, int depth) const;
  bool tryArray(Stack &s, unsigned char c, std::vector<Stack> &out, int depth) const;

  std::shared_ptr<const JsonGrammar> g_;
  std::vector<Stack> stacks_;
  mutable int starts_ = 0; // values started for the byte being fed (a bound on a schema's fan-out)
};

// A row's constraint: the matcher over a vocabulary's token texts. End
// tokens (EOS) are allowed once the document is whole; the row is finished
// when nothing may follow it.
class JsonConstraint : public TokenConstraint {
public:
  JsonConstraint(std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const TokenTable> tokens)
      : matcher_(std::move(grammar)), tokens_(std::move(tokens)) {}
  bool allows(int64_t token) const override;
  void accept(int64_t token) override;
  bool finished() const override { return matcher_.finished(); }

private:
  JsonMatcher matcher_;
  std::shared_ptr<const TokenTable> tokens_;
};

} // namespace sd::generate
