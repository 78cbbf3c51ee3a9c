// Attribute map shared by the compiler (from MLIR attributes), the plan file and
// the kernels. Defaults live with the readers (shape rules and kernels), as in ONNX.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

struct Attr {
  enum class Kind : uint8_t { Int, Float, String, Ints, Floats };
  Kind kind = Kind::Int;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

class AttrMap {
public:
  void setInt(const std::string &n, int64_t v);
  void setFloat(const std::string &n, double v);
  void setString(const std::string &n, std::string v);
  void setInts(const std::string &n, std::vector<int64_t> v);
  void setFloats(const std::string &n, std::vector<double> v);

  const Attr *find(const std::string &n) const;
  bool has(const std::string &n) const { return find(n) != nullptr; }
  int64_t getInt(const std::string &n, int64_t def) const;
  double getFloat(const std::string &n, double def) const;
  std::string getString(const std::string &n, const std::string &def) const;
  // Empty when missing.
  std::vector<int64_t> getInts(const std::string &n) const;
  std::vector<double> getFloats(const std::string &n) const;

  const std::vector<std::pair<std::string, Attr>> &entries() const {
    return entries_;
  }

private:
  Attr &slot(const std::string &n);
  std::vector<std::pair<std::string, Attr>> entries_;
};

} // namespace sd
