// A small JSON reader and writer helpers: safetensors headers, data lines,
// manifests. Depth- and size-limited so hostile input gets an error, not a crash.
#pragma once
#include "sd/format/status.h"
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sd {

struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj; // insertion order kept

  const Json *get(const std::string &key) const;
  bool isInteger() const;
};

// Parses one JSON document; `what` names the source in errors.
StatusOr<Json> parseJson(const std::string &text, const std::string &what);
std::string jsonQuote(const std::string &s);
// A finite number as JSON text that reads back as the same double.
std::string jsonNumber(double v);
// A value as compact JSON text (no white space; keys in their order).
std::string jsonCompact(const Json &v);

} // namespace sd
