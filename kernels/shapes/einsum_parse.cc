// Einsum equation parsing: labels, ellipsis broadcasting, implicit output.
#include "sd/ops/einsum.h"
#include <algorithm>
#include <cctype>
#include <map>

namespace sd {

Status parseEinsum(const std::string &eqIn, const std::vector<Dims> &dims, EinsumSpec &spec) {
  std::string eq;
  for (char ch : eqIn)
    if (ch != ' ') eq += ch;
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow), rhs = arrow == std::string::npos ? "" : eq.substr(arrow + 2);
  std::vector<std::string> terms;
  size_t start = 0;
  for (size_t i = 0; i <= lhs.size(); ++i)
    if (i == lhs.size() || lhs[i] == ',') {
      terms.push_back(lhs.substr(start, i - start));
      start = i + 1;
    }
  if (terms.size() != dims.size())
    return sdError("Einsum equation '", eqIn, "' has ", terms.size(), " operands, got ", dims.size());
  std::map<char, int> ids;
  int ellipsisRank = 0;
  // Ellipsis dims get ids after the letters; compute the broadcast rank first.
  for (size_t t = 0; t < terms.size(); ++t) {
    size_t e = terms[t].find("...");
    int letters = int(terms[t].size()) - (e == std::string::npos ? 0 : 3);
    if (e == std::string::npos && letters != int(dims[t].size()))
      return sdError("Einsum term '", terms[t], "' has ", letters, " labels for rank ", dims[t].size());
    if (e != std::string::npos) ellipsisRank = std::max(ellipsisRank, int(dims[t].size()) - letters);
  }
  spec = EinsumSpec();
  std::vector<int> counts;
  auto idOf = [&](char ch) -> int {
    auto it = ids.find(ch);
    if (it != ids.end()) return it->second;
    int id = spec.numLabels++;
    ids[ch] = id;
    spec.labelSize.push_back(-1);
    counts.push_back(0);
    return id;
  };
  std::vector<int> ellipsisIds;
  for (int i = 0; i < ellipsisRank; ++i) {
    ellipsisIds.push_back(spec.numLabels++);
    spec.labelSize.push_back(1);
    counts.push_back(0);
  }
  for (size_t t = 0; t < terms.size(); ++t) {
    std::vector<int> labels;
    const std::string &s = terms[t];
    int rank = int(dims[t].size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (s.compare(i, 3, "...") == 0) {
        int letters = int(s.size()) - 3, er = rank - letters;
        if (er < 0) return sdError("Einsum term '", s, "' has more labels than rank ", rank);
        for (int k = 0; k < er; ++k) labels.push_back(ellipsisIds[size_t(ellipsisRank - er + k)]);
        i += 2;
        continue;
      }
      if (!std::isalpha(static_cast<unsigned char>(s[i]))) return sdError("Einsum label '", s[i], "' is not a letter");
      labels.push_back(idOf(s[i]));
    }
    if (int(labels.size()) != rank) return sdError("Einsum term '", s, "' does not match rank ", rank);
    for (int k = 0; k < rank; ++k) {
      int l = labels[size_t(k)];
      int64_t d = dims[t][size_t(k)];
      int64_t &known = spec.labelSize[size_t(l)];
      bool isEllipsis = std::find(ellipsisIds.begin(), ellipsisIds.end(), l) != ellipsisIds.end();
      if (isEllipsis) {
        if (d != 1 && known != 1 && known != d && d >= 0 && known >= 0)
          return sdError("Einsum broadcast dims ", known, " and ", d, " differ");
        if (d != 1) known = d;
      } else {
        if (known >= 0 && d >= 0 && known != d)
          return sdError("Einsum label '", s[k < int(s.size()) ? size_t(k) : 0], "' has sizes ", known, " and ", d);
        if (known < 0) known = d;
      }
      ++counts[size_t(l)];
    }
    spec.inputLabels.push_back(labels);
  }
  if (arrow == std::string::npos) {
    for (int l : ellipsisIds) spec.outputLabels.push_back(l);
    for (auto &[ch, id] : ids)
      if (counts[size_t(id)] == 1) spec.outputLabels.push_back(id);
  } else {
    for (size_t i = 0; i < rhs.size(); ++i) {
      if (rhs.compare(i, 3, "...") == 0) {
        for (int l : ellipsisIds) spec.outputLabels.push_back(l);
        i += 2;
        continue;
      }
      auto it = ids.find(rhs[i]);
      if (it == ids.end()) return sdError("Einsum output label '", rhs[i], "' appears in no input");
      spec.outputLabels.push_back(it->second);
    }
  }
  return Status::ok();
}

} // namespace sd
