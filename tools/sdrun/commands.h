// sdrun subcommands.
#pragma once
#include <string>
#include <vector>

namespace sdrun {
int inferCommand(const std::vector<std::string> &args);
int benchCommand(const std::vector<std::string> &args);
int inspectCommand(const std::vector<std::string> &args);
int trainCommand(const std::vector<std::string> &args);
int generateCommand(const std::vector<std::string> &args);
int fail(const std::string &msg);
} // namespace sdrun
