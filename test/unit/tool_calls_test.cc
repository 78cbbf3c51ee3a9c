// The tool-call parsers of sdrun serve (--tool-call-parser): the calls and
// the content they find in replies written in each model family's format,
// and text they must leave as content.
#include "tool_calls.h"
#include <gtest/gtest.h>

using namespace sdrun::openai;

namespace {

struct Parsed {
  bool found = false;
  std::vector<std::pair<std::string, std::string>> calls; // name, arguments
  std::string content;
};

Parsed parse(const std::string &parser, const std::string &text) {
  Parsed p;
  std::vector<ToolCall> calls;
  p.found = callParser(parser)(text, calls, p.content);
  for (const ToolCall &c : calls) p.calls.emplace_back(c.name, c.arguments);
  return p;
}

} // namespace

TEST(ToolCallParsers, Hermes) {
  Parsed p = parse("hermes", "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                             "\"days\": [1, 2]}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}"
                             "</tool_call>");
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.content, "Let me look.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0], (std::pair<std::string, std::string>{"get_weather", R"({"city":"Paris","days":[1,2]})"}));
  EXPECT_EQ(p.calls[1], (std::pair<std::string, std::string>{"get_time", "{}"}));
  // A reply cut inside its last call's closing tag is read to its end.
  EXPECT_TRUE(parse("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}").found);
  EXPECT_FALSE(parse("hermes", "no calls here").found);
  EXPECT_FALSE(parse("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": </tool_call>").found);
  EXPECT_FALSE(parse("hermes", "<tool_call>{\"arguments\": {}}</tool_call>").found); // no name
}

TEST(ToolCallParsers, Llama3Json) {
  Parsed p = parse("llama3_json", "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a;b}\"}}; "
                                  "{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}");
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0], (std::pair<std::string, std::string>{"get_weather", R"({"city":"a;b}"})"}));
  EXPECT_EQ(p.calls[1], (std::pair<std::string, std::string>{"get_time", R"({"zone":"utc"})"}));
  EXPECT_TRUE(parse("llama3_json", "  {\"name\": \"f\", \"parameters\": {}}  ").found);
  EXPECT_FALSE(parse("llama3_json", "The answer is {\"name\": \"f\", \"parameters\": {}}").found); // text first
  EXPECT_FALSE(parse("llama3_json", "{\"name\": \"f\", \"parameters\": {}} and more").found);
  EXPECT_FALSE(parse("llama3_json", "{\"city\": \"Paris\"}").found); // JSON, but no call
  EXPECT_FALSE(parse("llama3_json", "{\"name\": \"f\", \"parameters\": {").found);
}

TEST(ToolCallParsers, Mistral) {
  Parsed p = parse("mistral", "Sure. [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, "
                              "{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"utc\\\"}\"}]");
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.content, "Sure.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0], (std::pair<std::string, std::string>{"get_weather", R"({"city":"Rome"})"}));
  EXPECT_EQ(p.calls[1], (std::pair<std::string, std::string>{"get_time", R"({"zone": "utc"})"})); // text kept as sent
  EXPECT_FALSE(parse("mistral", "[TOOL_CALLS][]").found);
  EXPECT_FALSE(parse("mistral", "[TOOL_CALLS] not json").found);
  EXPECT_FALSE(parse("mistral", "plain text").found);
  EXPECT_EQ(callParser("granite_20b"), nullptr);
}

TEST(ToolCallParsers, WhereCallsMayBegin) {
  // What streams as content before the reply ends: text up to where a call (or its marker's start) may begin.
  EXPECT_EQ(callTextStart("hermes", "abc"), 3u);
  EXPECT_EQ(callTextStart("hermes", "abc<tool"), 3u);
  EXPECT_EQ(callTextStart("hermes", "abc<tool_call>{\"na"), 3u);
  EXPECT_EQ(callTextStart("hermes", "a<b"), 3u);
  EXPECT_EQ(callTextStart("mistral", "x[TOOL"), 1u);
  EXPECT_EQ(callTextStart("llama3_json", "  {\"name\""), 0u);
  EXPECT_EQ(callTextStart("llama3_json", "<|pyth"), 0u);
  EXPECT_EQ(callTextStart("llama3_json", ""), 0u);
  EXPECT_EQ(callTextStart("llama3_json", "Hi {"), 4u); // text first: never a call
  EXPECT_EQ(callTextStart("granite", "ok <|tool"), 3u);
  EXPECT_EQ(callTextStart("granite", "ok <tool_call>["), 3u);
  EXPECT_EQ(callTextStart("pythonic", " [get_"), 0u);
  EXPECT_EQ(callTextStart("pythonic", "<|python_st"), 0u);
  EXPECT_EQ(callTextStart("pythonic", "It is [1]"), 9u);
}

TEST(ToolCallParsers, Granite) {
  Parsed p = parse("granite", "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Boston\"}}]");
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0], (std::pair<std::string, std::string>{"get_weather", R"({"city":"Boston"})"}));
  p = parse("granite", "Sure.\n<tool_call>[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {}}]");
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.content, "Sure.");
  EXPECT_EQ(p.calls.size(), 2u);
  EXPECT_FALSE(parse("granite", "<|tool_call|>[{\"name\": \"f\"").found);
  EXPECT_FALSE(parse("granite", "no calls").found);
}

TEST(ToolCallParsers, Pythonic) {
  Parsed p = parse("pythonic", "[get_weather(city='San Francisco', days=[1, 2,], metric=\"c\"), get_time()]");
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0], (std::pair<std::string, std::string>{"get_weather",
                                                              R"({"city":"San Francisco","days":[1,2],"metric":"c"})"}));
  EXPECT_EQ(p.calls[1], (std::pair<std::string, std::string>{"get_time", "{}"}));
  // Python's literals as JSON: escapes, True/False/None, tuples, dicts, big and odd numbers.
  p = parse("pythonic", "<|python_start|>[f(s='it\\'s \\u00e9\\x41\\101\\n', b=True, n=None, t=(1, 'a'), "
                        "d={'k': [False, -0.5]}, big=123456789012345678901, z=0, e=1_000, x=.5e1)]<|python_end|>");
  ASSERT_TRUE(p.found);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, "{\"s\":\"it's \xc3\xa9" "AA\\n\",\"b\":true,\"n\":null,\"t\":[1,\"a\"],"
                               "\"d\":{\"k\":[false,-0.5]},\"big\":123456789012345678901,\"z\":0,\"e\":1000,\"x\":5.0}");
  // Not calls: text, positional arguments, a call not in a list, other expressions, something after.
  for (const char *text : {"Hello", "[f(1)]", "[f(a=007)]", "f(a=1)", "[f(a=1+2)]", "[f(a=1)] and more", "[f(a=1)", "[]",
                           "[f(a=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
                           "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])]"})
    EXPECT_FALSE(parse("pythonic", text).found) << text;
}

// tool_choice "required"'s list read as it comes: fed in one piece or byte by
// byte, the same calls; names as soon as whole, arguments as written.
TEST(RequiredCallReader, NamesThenArgumentsAsTheyCome) {
  const std::string text = R"([{"name":"get_weather","parameters":{"city":"Pa}ris\"]","days":[1,{"a":[]}]}},)"
                           R"({"name":"t\u00e9","parameters":{}}])";
  RequiredCallReader whole, bytes;
  std::vector<RequiredCallReader::Piece> pieces = whole.feed(text), each;
  for (char c : text)
    for (RequiredCallReader::Piece &p : bytes.feed(std::string(1, c))) each.push_back(p);
  for (const RequiredCallReader *r : {&whole, &bytes}) {
    ASSERT_TRUE(r->whole());
    ASSERT_EQ(r->calls().size(), 2u);
    EXPECT_EQ(r->calls()[0].name, "get_weather");
    EXPECT_EQ(r->calls()[0].arguments, R"({"city":"Pa}ris\"]","days":[1,{"a":[]}]})");
    EXPECT_EQ(r->calls()[1].name, "t\xc3\xa9"); // its escape decoded
    EXPECT_EQ(r->calls()[1].arguments, "{}");
  }
  // Whole: a name, the arguments in one piece, the next name, its arguments.
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_TRUE(pieces[0].name && pieces[2].name && pieces[2].call == 1);
  EXPECT_EQ(pieces[1].text, whole.calls()[0].arguments);
  // Byte by byte: the name once, after its closing quote; arguments byte by byte.
  std::string args;
  size_t names = 0;
  for (const RequiredCallReader::Piece &p : each) {
    names += p.name;
    if (!p.name && p.call == 0) args += p.text;
  }
  EXPECT_EQ(names, 2u);
  EXPECT_EQ(args, whole.calls()[0].arguments);
}

TEST(RequiredCallReader, CutShortOrNotAList) {
  RequiredCallReader cut;
  cut.feed(R"([{"name":"f","parameters":{"a":[1,)");
  EXPECT_FALSE(cut.whole());
  ASSERT_EQ(cut.calls().size(), 1u);
  EXPECT_EQ(cut.calls()[0].arguments, R"({"a":[1,)");
  RequiredCallReader early;
  early.feed(R"([{"name":"f)");
  EXPECT_TRUE(early.calls().empty());
  RequiredCallReader other;
  other.feed(R"({"name":"f","parameters":{}})");
  EXPECT_TRUE(other.calls().empty());
  EXPECT_FALSE(other.whole());
}
