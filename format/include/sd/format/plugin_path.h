// Where a plugin library of ours (the CUDA backend, the MPI and NCCL
// communicators) may be, in the order to try: the path in `envOverride` when
// that variable is set (then nothing else, so a test or a user can point at
// exactly one file); else beside the binary or library holding this code
// (sdrun, libsd.so, a Python module), its ../lib, and where the build put it.
#pragma once
#include <string>
#include <vector>

namespace sd {

std::vector<std::string> pluginCandidates(const char *file, const char *envOverride, const char *buildPath);

} // namespace sd
