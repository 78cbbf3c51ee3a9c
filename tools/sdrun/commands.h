// sdrun subcommands.
#pragma once
#include "flags.h"
#include "sd/format/status.h"
#include <string>
#include <vector>

namespace sd {
class Session;
}

namespace sdrun {
int inferCommand(const std::vector<std::string> &args);
int benchCommand(const std::vector<std::string> &args);
int inspectCommand(const std::vector<std::string> &args);
int trainCommand(const std::vector<std::string> &args);
int generateCommand(const std::vector<std::string> &args);
int tokenizeCommand(const std::vector<std::string> &args);
int serveCommand(const std::vector<std::string> &args);
int runBatchCommand(const std::vector<std::string> &args);
int fail(const std::string &msg);
// --adapter DIR of infer and generate: loads the LoRA adapter into a session
// of a --peft lora plan (errors name PLAN_PATH or the adapter's files).
sd::Status loadAdapterFlag(const std::string &planPath, const std::string &dir, sd::Session &session);
// --adapter-rank K (a DyLoRA plan's first K ranks); nothing when not given.
sd::Status adapterRankFlag(const Flags &f, sd::Session &session);
} // namespace sdrun
