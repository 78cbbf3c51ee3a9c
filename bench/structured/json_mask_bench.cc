// The cost of one structured-output mask: for each JSON document (a line of
// DOCS, tokenized with the tokenizer), token by token, the time to decide
// which tokens of the whole vocabulary may come next
// (JsonConstraint::allowedTokens), the document's own token checked to be
// among them. bench/structured_bench.py runs it beside xgrammar's
// fill_next_token_bitmask on the same tokens.
//
//   sd_json_mask_bench TOKENIZER_DIR SCHEMA.json DOCS.jsonl
// prints one JSON line: tokens, mean_us, p50_us, p99_us.
#include "sd/format/file_io.h"
#include "sd/generate/json_grammar.h"
#include "sd/tokenize/tokenizer.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

int main(int argc, char **argv) {
  using namespace sd::generate;
  if (argc != 4) {
    std::fprintf(stderr, "usage: sd_json_mask_bench TOKENIZER_DIR SCHEMA.json DOCS.jsonl\n");
    return 2;
  }
  auto tok = sd::Tokenizer::load(argv[1]);
  auto schemaText = sd::readWholeFile(argv[2]);
  auto docs = sd::readWholeFile(argv[3]);
  if (!tok.isOk() || !schemaText.isOk() || !docs.isOk()) {
    std::fprintf(stderr, "sd_json_mask_bench: cannot read the tokenizer, schema or documents\n");
    return 1;
  }
  auto grammar = JsonGrammar::fromSchema(schemaText.value());
  if (!grammar.isOk()) {
    std::fprintf(stderr, "sd_json_mask_bench: %s\n", grammar.status().message().c_str());
    return 1;
  }
  auto table = std::make_shared<TokenTable>();
  std::vector<bool> special;
  table->bytes = tok.value()->tokenBytes(special);
  for (bool s : special) table->kinds.push_back(s ? TokenTable::Kind::Other : TokenTable::Kind::Text);
  if (tok.value()->eosId() >= 0) table->kinds[size_t(tok.value()->eosId())] = TokenTable::Kind::End;
  auto vocab = JsonVocabulary::make(table);
  std::vector<double> us;
  TokenMask mask(table->size());
  std::istringstream lines(docs.value());
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    sd::EncodeOptions eo;
    eo.addSpecialTokens = false;
    JsonConstraint c(grammar.value(), vocab);
    for (int32_t t : tok.value()->encode(line, eo)) {
      const auto start = std::chrono::steady_clock::now();
      c.allowedTokens(mask, table->size());
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
      if (std::getenv("SD_MASK_BENCH_SLOW") && us.back() > std::atof(std::getenv("SD_MASK_BENCH_SLOW")))
        std::fprintf(stderr, "%.1f us before token %d ('%s')\n", us.back(), t, table->bytes[size_t(t)].c_str());
      if (!mask.test(t)) {
        std::fprintf(stderr, "sd_json_mask_bench: token %d of '%.60s' is masked out\n", t, line.c_str());
        return 1;
      }
      c.accept(t);
    }
  }
  if (us.empty()) return std::fprintf(stderr, "sd_json_mask_bench: no documents\n"), 1;
  double total = 0;
  for (double u : us) total += u;
  std::sort(us.begin(), us.end());
  std::printf("{\"tokens\": %zu, \"mean_us\": %.2f, \"p50_us\": %.2f, \"p99_us\": %.2f}\n", us.size(), total / us.size(),
              us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]);
  return 0;
}
