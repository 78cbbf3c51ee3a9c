// sdrun: the lean runtime driver (no MLIR). Runs, times and inspects plans.
#include "commands.h"
#include "sd/format/file_io.h"
#include <exception>
#include <new>
#include <cstdio>
#include <cstring>

namespace {
const char *kUsage =
    "usage: sdrun COMMAND PLAN.sdp [options]\n"
    "\n"
    "commands:\n"
    "  infer    run the plan's infer entry on input tensors\n"
    "  train    train with a plan's train_step entries on JSON Lines data\n"
    "  generate continue a prompt (greedy or sampled; --tokenizer for text, --chat)\n"
    "  serve    serve the model over HTTP with the OpenAI API (completions, chat)\n"
    "  run-batch answer a file of OpenAI batch requests offline (vLLM's run-batch)\n"
    "  bench    time an entry in-process; the last line is JSON with median_ms\n"
    "  inspect  show entries, buckets, globals, arena size and weights\n"
    "  tokenize text lines to token ids (or back) with a Hugging Face tokenizer.json\n"
    "\n"
    "Run `sdrun COMMAND --help` for a command's options.\n";
}

static int run(int argc, char **argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("sdrun %s\n", SD_VERSION);
    return 0;
  }
  if (cmd == "infer") return sdrun::inferCommand(args);
  if (cmd == "bench") return sdrun::benchCommand(args);
  if (cmd == "inspect") return sdrun::inspectCommand(args);
  if (cmd == "train") return sdrun::trainCommand(args);
  if (cmd == "generate") return sdrun::generateCommand(args);
  if (cmd == "tokenize") return sdrun::tokenizeCommand(args);
  if (cmd == "serve") return sdrun::serveCommand(args);
  if (cmd == "run-batch") return sdrun::runBatchCommand(args);
  return sdrun::fail("unknown command '" + cmd + "' (try: sdrun --help)");
}

int main(int argc, char **argv) {
  sd::ignoreFileSizeSignal();
  // Out of memory (a ulimit -v, a huge input) is an error message, not an
  // abort: the libraries return Status, but the C++ runtime may still throw.
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc &) {
    return sdrun::fail("out of memory (is a memory limit such as ulimit -v in effect?)");
  } catch (const std::exception &e) {
    return sdrun::fail(std::string("internal error: ") + e.what());
  }
}
