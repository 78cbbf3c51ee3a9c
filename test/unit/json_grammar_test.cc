// Structured output's JSON grammar: schemas compile (or are refused by
// name), the matcher accepts exactly the compact documents a schema allows,
// and constrained sampling draws only allowed tokens.
#include "sd/generate/generator.h"
#include "sd/generate/json_grammar.h"
#include "sd/generate/regex_constraint.h"
#include <gtest/gtest.h>
#include <set>

using namespace sd::generate;

namespace {

std::shared_ptr<const JsonGrammar> schema(const std::string &text) {
  auto g = JsonGrammar::fromSchema(text);
  EXPECT_TRUE(g.isOk()) << g.status().message();
  return g.isOk() ? g.value() : JsonGrammar::anyObject();
}

// Whether `doc` is accepted whole (fed in one piece and byte by byte alike).
bool whole(const std::shared_ptr<const JsonGrammar> &g, const std::string &doc) {
  JsonMatcher all(g), bytes(g);
  const bool fed = all.feed(doc);
  bool each = true;
  for (char c : doc) each = each && bytes.feed(std::string(1, c));
  EXPECT_EQ(fed, each) << doc;
  return fed && all.canEnd();
}

// Whether `text` is the start of an accepted document.
bool prefix(const std::shared_ptr<const JsonGrammar> &g, const std::string &text) { return JsonMatcher(g).accepts(text); }

std::string refusal(const std::string &text) {
  auto g = JsonGrammar::fromSchema(text);
  return g.isOk() ? "" : g.status().message();
}

} // namespace

TEST(JsonGrammar, AnyObjectIsCompactJson) {
  auto g = JsonGrammar::anyObject();
  EXPECT_TRUE(whole(g, R"({"a":[1,-2.5e-3,0,{"b":null}],"c":"x\u00e9\n\"é😀","d":true,"e":{}})"));
  EXPECT_TRUE(whole(g, "{}"));
  EXPECT_TRUE(whole(g, R"({"":[[],[[]]]})"));
  for (const char *bad : {"[1]", "1", "\"a\"", R"({"a" :1})", R"({ "a":1})", "{'a':1}", R"({"a":01})",
                          R"({"a":1,})", R"({"a":1}})", R"({"a":1} )", R"({"a":.5})", R"({"a":1.})", R"({"a":tru})",
                          "{\"a\":\"\x01\"}", R"({"a":"\x"})", R"({"a":"\u12G4"})", R"({"a":-})", R"({"a":1e})"})
    EXPECT_FALSE(whole(g, bad)) << bad;
  EXPECT_TRUE(prefix(g, R"({"a":[1,{"b":"unfinished)"));
  EXPECT_FALSE(prefix(g, "{]"));
}

TEST(JsonGrammar, Utf8InStringsIsValidated) {
  auto g = JsonGrammar::anyObject();
  EXPECT_TRUE(whole(g, "{\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\":1}"));
  for (const char *bad : {"{\"\xc3\x28\":1}", "{\"\xe0\x80\x80\":1}", "{\"\xed\xa0\x80\":1}", "{\"\xf5\x80\x80\x80\":1}",
                          "{\"\xc0\xaf\":1}", "{\"\x80\":1}"})
    EXPECT_FALSE(prefix(g, bad)) << bad;
}

TEST(JsonGrammar, FinishedOnlyWhenNothingMayFollow) {
  auto g = JsonGrammar::anyObject();
  JsonMatcher m(g);
  EXPECT_FALSE(m.canEnd());
  ASSERT_TRUE(m.feed(R"({"a":1)"));
  EXPECT_FALSE(m.canEnd());
  EXPECT_FALSE(m.finished());
  ASSERT_TRUE(m.feed("}"));
  EXPECT_TRUE(m.canEnd());
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.feed("x"));
  EXPECT_TRUE(m.finished()); // a refused feed changes nothing

  auto number = schema(R"({"type":"number"})"); // a root number may go on or end
  JsonMatcher n(number);
  ASSERT_TRUE(n.feed("12"));
  EXPECT_TRUE(n.canEnd());
  EXPECT_FALSE(n.finished());
  ASSERT_TRUE(n.feed(".5"));
  EXPECT_TRUE(n.canEnd());
  EXPECT_FALSE(n.feed("}"));
}

TEST(JsonGrammar, ObjectPropertiesInSchemaOrder) {
  auto g = schema(R"({"type":"object","title":"Person","properties":{
      "name":{"type":"string","minLength":1,"maxLength":3,"description":"short"},
      "age":{"type":"integer"},
      "tags":{"type":"array","items":{"enum":["a","b c",1,null]},"maxItems":2},
      "ok":{"type":"boolean"}},
    "required":["name","ok"],"additionalProperties":false})");
  EXPECT_TRUE(whole(g, R"({"name":"Bob","age":-4,"tags":["a",1],"ok":true})"));
  EXPECT_TRUE(whole(g, R"({"name":"é\"x","ok":false})")); // optional ones skipped; an escape is one character
  EXPECT_TRUE(whole(g, R"({"name":"B","tags":[],"ok":true})"));
  EXPECT_TRUE(whole(g, R"({"name":"B","tags":["b c",null],"ok":true})"));
  for (const char *bad : {R"({"age":4,"name":"B","ok":true})", // out of order
                          R"({"name":"B"})",                  // required ok missing
                          R"({"ok":true})",                   // required name skipped
                          R"({"name":"","ok":true})",         // minLength
                          R"({"name":"Bobby","ok":true})",    // maxLength
                          R"({"name":"B","age":4.5,"ok":true})", R"({"name":"B","tags":["a","a","a"],"ok":true})",
                          R"({"name":"B","tags":["d"],"ok":true})", R"({"name":"B","ok":true,"x":1})",
                          R"({"name":"B","ok":1})"})
    EXPECT_FALSE(whole(g, bad)) << bad;
}

TEST(JsonGrammar, UnionsRefsAndAnyKeys) {
  auto g = schema(R"({"$defs":{"Node":{"type":"object","properties":{
        "v":{"anyOf":[{"type":"integer"},{"type":"null"}]},
        "kids":{"type":"array","items":{"$ref":"#/$defs/Node"}}},"required":["v","kids"]}},
      "$ref":"#/$defs/Node"})");
  EXPECT_TRUE(whole(g, R"({"v":1,"kids":[{"v":null,"kids":[]},{"v":2,"kids":[{"v":3,"kids":[]}]}]})"));
  EXPECT_FALSE(whole(g, R"({"v":"1","kids":[]})"));

  auto two = schema(R"({"oneOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},
                                 {"type":"object","properties":{"a":{"type":"integer"},"b":{"const":[1,"x"]}},"required":["a","b"]}]})");
  EXPECT_TRUE(whole(two, R"({"a":"s"})"));
  EXPECT_TRUE(whole(two, R"({"a":5,"b":[1,"x"]})"));
  EXPECT_FALSE(whole(two, R"({"a":5})"));

  auto map = schema(R"({"type":"object","additionalProperties":{"type":["string","null"]}})");
  EXPECT_TRUE(whole(map, R"({"any key":"v","k2":null})"));
  EXPECT_FALSE(whole(map, R"({"k":1})"));
  auto empty = schema(R"({"type":"object","additionalProperties":false})");
  EXPECT_TRUE(whole(empty, "{}"));
  EXPECT_FALSE(whole(empty, R"({"k":1})"));
  EXPECT_TRUE(whole(schema("{}"), R"([1,"a",{"b":false}])"));
  EXPECT_TRUE(whole(schema(R"({"type":"array","minItems":2})"), R"([{},[]])"));
  EXPECT_FALSE(whole(schema(R"({"type":"array","minItems":2})"), R"([{}])"));
}

TEST(JsonGrammar, UnsupportedSchemasAreRefusedByName) {
  EXPECT_NE(refusal(R"({"type":"array","uniqueItems":true})").find("'uniqueItems' at /"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":2}}})")
                .find("'multipleOf' at /properties/n"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","properties":{"a":{}},"required":["b"]})").find("names 'b'"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"#/$defs/Missing"})").find("names no schema"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"date"})").find("'date'"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","items":[{}]})").find("tuple"), std::string::npos);
  EXPECT_NE(refusal(R"({"allOf":[{},{}]})").find("allOf"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","minLength":-1})").find("minLength"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","minItems":3,"maxItems":2})").find("at least 3"), std::string::npos);
  EXPECT_NE(refusal("false").find("allows no value"), std::string::npos);
  EXPECT_NE(refusal("{\"type\":").find("JSON schema"), std::string::npos);
  std::string deep = "{}";
  for (int i = 0; i < 80; ++i) deep = "{\"items\":" + deep + "}";
  EXPECT_NE(refusal(deep).find("too deep"), std::string::npos); // the JSON reader's limit comes first
  EXPECT_EQ(refusal(R"({"$ref":"#"})"), ""); // a schema that is only itself compiles; no text follows it
}

TEST(JsonGrammar, SelfReferringUnionsStayBounded) {
  // Each value start fans out into two readings of itself, 64 levels deep
  // unless bounded; the matcher must answer at once, and still match.
  auto g = schema(R"({"anyOf":[{"$ref":"#"},{"$ref":"#"},{"type":"array","items":{"$ref":"#"}}]})");
  JsonMatcher m(g);
  EXPECT_TRUE(m.feed("[[],[[]]]"));
  EXPECT_TRUE(m.canEnd());
  EXPECT_FALSE(JsonMatcher(g).accepts("1"));
}

TEST(JsonGrammar, PatternsAndFormats) {
  auto code = schema(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}(x|yz)?$"})");
  EXPECT_TRUE(whole(code, R"("AB-123")"));
  EXPECT_TRUE(whole(code, R"("QQ-000yz")"));
  for (const char *bad : {R"("AB-12")", R"("ab-123")", R"("AB-1234")", R"("AB-123y")", R"(" AB-123")"})
    EXPECT_FALSE(whole(code, bad)) << bad;
  EXPECT_FALSE(prefix(code, R"("A1)"));
  EXPECT_TRUE(prefix(code, R"("AB-12)"));
  // Unanchored: the match may sit anywhere; escapes and UTF-8 are read as characters.
  auto inside = schema(R"({"type":"string","pattern":"é\\.[0-9]"})");
  EXPECT_TRUE(whole(inside, "\"xx\u00e9.5yy\""));
  EXPECT_TRUE(whole(inside, "\"\xc3\xa9.7\""));
  EXPECT_FALSE(whole(inside, "\"e.5\""));
  // A lead byte may start only characters the pattern can take.
  auto ascii = schema(R"({"type":"string","pattern":"^[a-c]+$"})");
  EXPECT_FALSE(prefix(ascii, "\"\xc3"));
  EXPECT_TRUE(prefix(ascii, "\"\\u00"));  // U+0000-U+00FF holds a-c
  EXPECT_FALSE(prefix(ascii, "\"\\u01")); // U+0100-U+01FF does not
  EXPECT_TRUE(prefix(ascii, "\"\\u006"));
  EXPECT_TRUE(whole(ascii, "\"\\u0061b\""));
  auto date = schema(R"({"type":"object","properties":{"d":{"type":"string","format":"date"},
      "t":{"type":"string","format":"date-time"},"u":{"format":"uuid"},"e":{"type":"string","format":"email"},
      "ip":{"type":"string","format":"ipv4"}},"required":["d","t","u","e","ip"]})");
  EXPECT_TRUE(whole(date, R"({"d":"2026-12-01","t":"2026-12-01T05:30:00.5+01:00","u":"123e4567-e89b-12d3-a456-426614174000","e":"a.b@c-d.org","ip":"192.168.0.255"})"));
  EXPECT_FALSE(prefix(date, R"({"d":"2026-13)"));
  EXPECT_FALSE(prefix(date, R"({"d":"2026-12-01","t":"2026-12-01 )"));
  EXPECT_FALSE(prefix(date, R"({"d":"2026-12-01","t":"2026-12-01T05:30:00Z","u":"123e4567-e89b-12d3-a456-42661417400g)"));
  EXPECT_FALSE(whole(date, R"({"d":"2026-12-01","t":"2026-12-01T05:30:00Z","u":"123e4567-e89b-12d3-a456-426614174000","e":"a@b","ip":"1.2.3.4"})"));
  EXPECT_FALSE(prefix(date, R"({"d":"2026-12-01","t":"2026-12-01T05:30:00Z","u":"123e4567-e89b-12d3-a456-426614174000","e":"a@b.co","ip":"256)"));
  for (const char *bad : {R"j({"type":"string","pattern":"(?=a)"})j", R"j({"type":"string","pattern":"a\\1"})j",
                          R"j({"type":"string","pattern":"\\bword"})j", R"j({"type":"string","pattern":"a^b"})j",
                          R"j({"type":"string","pattern":"[a-"})j", R"j({"type":"string","pattern":"(ab"})j",
                          R"j({"type":"string","pattern":"\\d{200}"})j", R"j({"type":"string","format":"hostname"})j",
                          R"j({"type":"string","pattern":"a","format":"date"})j"})
    EXPECT_NE(refusal(bad), "") << bad;
  EXPECT_NE(refusal(R"({"type":"string","pattern":"\\d{200}"})").find("too long"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","format":"hostname"})").find("'hostname'"), std::string::npos);
}

TEST(JsonGrammar, IntegerRanges) {
  // Every integer from -1200 to 1200 against each range, whole and as a root value.
  struct Range {
    const char *schema;
    int64_t lo, hi;
  };
  const Range ranges[] = {{R"({"type":"integer","minimum":-5,"maximum":120})", -5, 120},
                          {R"({"type":"integer","minimum":0})", 0, INT64_MAX},
                          {R"({"type":"integer","exclusiveMinimum":7.5})", 8, INT64_MAX},
                          {R"({"type":"integer","maximum":-3})", INT64_MIN, -3},
                          {R"({"type":"integer","exclusiveMaximum":1000,"minimum":0.5})", 1, 999},
                          {R"({"type":"integer","minimum":-1100,"maximum":-17})", -1100, -17},
                          {R"({"type":"integer","minimum":19,"maximum":1001})", 19, 1001}};
  for (const Range &r : ranges) {
    auto g = schema(r.schema);
    for (int64_t v = -1200; v <= 1200; ++v)
      ASSERT_EQ(whole(g, std::to_string(v)), v >= r.lo && v <= r.hi) << r.schema << " " << v;
    EXPECT_FALSE(whole(g, "007"));
    EXPECT_FALSE(whole(g, "-0"));
  }
  auto in = schema(R"({"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":12}},"required":["n"]})");
  EXPECT_TRUE(whole(in, R"({"n":12})"));
  EXPECT_FALSE(prefix(in, R"({"n":13)"));
  EXPECT_FALSE(prefix(in, R"({"n":0)"));
  EXPECT_NE(refusal(R"({"type":"number","minimum":0})").find("on a number"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"integer","minimum":5,"maximum":4})").find("within"), std::string::npos);
}

namespace {

// Tokens: 0 "{", 1 "}", 2 "\"a\"", 3 ":", 4 "1", 5 "x", 6 EOS, 7 a special token, 8 "\"a\":1}".
std::shared_ptr<const JsonVocabulary> smallVocab() {
  auto t = std::make_shared<TokenTable>();
  t->bytes = {"{", "}", "\"a\"", ":", "1", "x", "", "", "\"a\":1}"};
  t->kinds.assign(9, TokenTable::Kind::Text);
  t->kinds[6] = TokenTable::Kind::End;
  t->kinds[7] = TokenTable::Kind::Other;
  return JsonVocabulary::make(t);
}

} // namespace

TEST(JsonGrammar, ConstraintAllowsTokensThatKeepTheTextValid) {
  JsonConstraint c(JsonGrammar::anyObject(), smallVocab());
  auto allowed = [&] {
    std::set<int64_t> s;
    TokenMask mask(9);
    c.allowedTokens(mask, 9);
    for (int64_t t = 0; t < 9; ++t) {
      EXPECT_EQ(c.allows(t), mask.test(t)) << t;
      if (c.allows(t)) s.insert(t);
    }
    return s;
  };
  EXPECT_EQ(allowed(), (std::set<int64_t>{0}));
  c.accept(0);
  EXPECT_EQ(allowed(), (std::set<int64_t>{1, 2, 8}));
  c.accept(2);
  EXPECT_EQ(allowed(), (std::set<int64_t>{3}));
  c.accept(3);
  EXPECT_EQ(allowed(), (std::set<int64_t>{0, 2, 4})); // a value: an object, the string "a", a number
  c.accept(4);
  EXPECT_EQ(allowed(), (std::set<int64_t>{1, 4}));
  EXPECT_FALSE(c.finished());
  c.accept(1);
  EXPECT_EQ(allowed(), (std::set<int64_t>{6})); // only the EOS
  EXPECT_TRUE(c.finished());
  EXPECT_FALSE(c.allows(-1));
  EXPECT_FALSE(c.allows(99));
}

TEST(JsonGrammar, ConstrainedSamplingDrawsOnlyAllowedTokens) {
  auto vocab = smallVocab();
  // Logits that favour tokens the grammar refuses at the start.
  const std::vector<float> logits = {0.5f, 3, 2, 1, 4, 5, 6, 7, 1.5f};
  std::mt19937_64 rng(7);
  auto draw = [&](SamplingOptions o, const std::shared_ptr<const JsonGrammar> &g, int64_t after) {
    JsonConstraint c(g, vocab);
    if (after >= 0) c.accept(after);
    return sampleToken(logits.data(), 9, o, rng, {}, &c);
  };
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(draw(greedy, JsonGrammar::anyObject(), -1), 0);
  EXPECT_EQ(draw(greedy, JsonGrammar::anyObject(), 0), 1); // "}" (3) over "\"a\"" (2) and the whole pair (1.5)
  for (int64_t k : {int64_t(0), int64_t(2)})
    for (double topP : {1.0, 0.8}) {
      SamplingOptions o;
      o.temperature = 1.0;
      o.topK = k;
      o.topP = topP;
      std::set<int64_t> seen;
      for (int i = 0; i < 200; ++i) seen.insert(draw(o, JsonGrammar::anyObject(), 0));
      // After "{": "}", "\"a\"", the whole pair; top-k 2 keeps the two likeliest allowed, top-p 0.8 drops the pair too.
      const std::set<int64_t> expect = k == 2 || topP < 1 ? std::set<int64_t>{1, 2} : std::set<int64_t>{1, 2, 8};
      EXPECT_EQ(seen, expect) << "top_k " << k << " top_p " << topP;
    }
  auto none = schema(R"({"type":"array"})"); // no token starts with "["
  EXPECT_EQ(draw(greedy, none, -1), -1);
  SamplingOptions o;
  EXPECT_EQ(draw(o, none, -1), -1);
}

TEST(JsonGrammar, IndexedVocabularyAgreesWithFollowingEachToken) {
  // Tokens of every sort: plain text (ASCII, whole and partial multi-byte
  // characters, one longer than the plain levels), continuation bytes,
  // quotes and escapes inside tokens, structure, numbers, literals.
  auto table = std::make_shared<TokenTable>();
  table->bytes = {"{", "}", "\"", "\"name\":\"", "ab", "abc", "\xc3\xa9", "\xc3", "\xa9", "x\"", "\"}", "\\", "n",
                  "\\n", ",\"ok\":", "true", "false", "1", "23", "-", ":", ",", "\"ok", "\x01", "", "\xe2\x82\xac!",
                  "\"}\"", "\",\"n\":", "[", "]", "]}", "1,", "0", ".5", "e3", "null", "nu", "ll", "{\"", "\":",
                  "cat", "\"cat\"", "\xe2\x82", "\x82\xac", std::string(40, 'z'), "\"kind\":", "\"pets\":[", "dog\"",
                  "},{", "\"tame\":", "7", "\"mood\":", "glad"};
  table->kinds.assign(table->bytes.size(), TokenTable::Kind::Text);
  table->kinds[24] = TokenTable::Kind::End;
  auto vocab = JsonVocabulary::make(table);
  const int64_t n = table->size();
  const char *schemas[] = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},
          "ok":{"type":"boolean"},"n":{"type":"integer"}},"required":["name","ok"]})",
      R"({"$defs":{"Pet":{"type":"object","properties":{"kind":{"enum":["cat","dog",7,null]},"tame":{"type":"boolean"}},
          "required":["kind"]}},"type":"object","properties":{"pets":{"type":"array","items":{"$ref":"#/$defs/Pet"},
          "minItems":1,"maxItems":2},"mood":{"anyOf":[{"type":"null"},{"type":"string","maxLength":50}]}},
          "required":["pets"]})",
      R"({"type":"array","items":{"type":"number"},"minItems":2})",
      R"({"type":"number"})",
      R"({"anyOf":[{"type":"string","maxLength":2},{"type":"string","minLength":3,"maxLength":45}]})",
      R"({"type":"object","properties":{"name":{"type":"string","pattern":"^(ab|z+|\\u00e9)*!?$"}}})",
      R"({"type":"array","items":{"type":"integer","minimum":-3,"maximum":25}})",
      "{}"};
  for (const char *text : schemas) {
    const auto g = schema(text);
    for (uint64_t seed = 0; seed < 30; ++seed) {
      std::mt19937_64 rng(seed);
      JsonConstraint c(g, vocab);
      JsonMatcher m(g);
      std::string doc;
      for (int step = 0; step < 40 && !c.finished(); ++step) {
        TokenMask mask(n);
        c.allowedTokens(mask, n);
        std::vector<int64_t> ok;
        for (int64_t t = 0; t < n; ++t) {
          const bool want = table->kinds[size_t(t)] == TokenTable::Kind::End ? m.canEnd()
                                                                             : m.accepts(table->bytes[size_t(t)]);
          EXPECT_EQ(c.allows(t), want) << text << " seed " << seed << " after " << doc << " token " << t;
          EXPECT_EQ(mask.test(t), want) << text << " seed " << seed << " after " << doc << " token " << t;
          if (want && table->kinds[size_t(t)] == TokenTable::Kind::Text) ok.push_back(t);
        }
        if (ok.empty()) break;
        const int64_t t = ok[rng() % ok.size()];
        c.accept(t);
        ASSERT_TRUE(m.feed(table->bytes[size_t(t)]));
        doc += table->bytes[size_t(t)];
      }
    }
  }
}

TEST(JsonGrammar, RegexConstraintAgreesWithItsPattern) {
  // vLLM's guided_regex: the whole text matches; tokens cut through UTF-8 characters.
  auto table = std::make_shared<TokenTable>();
  table->bytes = {"a", "b", "ab", "\xc3", "\xa9", "\xc3\xa9", "-", "1", "12", "x", "", "\xc3\xa9-9"};
  table->kinds.assign(table->bytes.size(), TokenTable::Kind::Text);
  table->kinds[10] = TokenTable::Kind::End;
  auto vocab = JsonVocabulary::make(table);
  auto pattern = Pattern::compile("^(ab|é)+-[0-9]{1,2}$", Pattern::Match::Whole);
  ASSERT_TRUE(pattern.isOk()) << pattern.status().message();
  const int64_t n = table->size();
  auto matches = [](const std::string &t) { // the pattern by hand: (ab|é)+-[0-9]{1,2}
    size_t i = 0, units = 0;
    while (true) {
      if (t.compare(i, 2, "ab") == 0 || t.compare(i, 2, "\xc3\xa9") == 0) i += 2, ++units;
      else break;
    }
    if (!units || i >= t.size() || t[i] != '-') return false;
    const size_t digits = t.size() - i - 1;
    if (digits < 1 || digits > 2) return false;
    for (size_t k = i + 1; k < t.size(); ++k)
      if (t[k] < '0' || t[k] > '9') return false;
    return true;
  };
  for (uint64_t seed = 0; seed < 40; ++seed) {
    std::mt19937_64 rng(seed);
    RegexConstraint c(pattern.value(), vocab);
    std::string text;
    for (int step = 0; step < 12 && !c.finished(); ++step) {
      TokenMask mask(n);
      c.allowedTokens(mask, n);
      std::vector<int64_t> ok;
      for (int64_t t = 0; t < n; ++t) {
        EXPECT_EQ(c.allows(t), mask.test(t)) << seed << " " << text << " " << t;
        if (mask.test(t) && table->kinds[size_t(t)] == TokenTable::Kind::Text) ok.push_back(t);
      }
      EXPECT_EQ(mask.test(10), matches(text)) << seed << " " << text; // the end only on a whole match
      if (ok.empty()) break;
      const int64_t t = ok[rng() % ok.size()];
      c.accept(t);
      text += table->bytes[size_t(t)];
    }
    EXPECT_TRUE(matches(text) || !c.finished()) << text;
  }
  EXPECT_FALSE(Pattern::compile("(?<=a)b", Pattern::Match::Whole).isOk());
  // Whole anchors both ends without ^ and $; Search matches anywhere.
  auto whole = Pattern::compile("ab", Pattern::Match::Whole), search = Pattern::compile("ab");
  ASSERT_TRUE(whole.isOk() && search.isOk());
  EXPECT_TRUE(whole.value()->step(whole.value()->start(), 'x').none());
  EXPECT_TRUE(search.value()->step(search.value()->start(), 'x').any());
}
