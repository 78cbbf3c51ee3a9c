// --profile FILE.json: a session's per-kernel timeline as a Chrome trace
// (chrome://tracing, Perfetto): one complete event per kernel run, named by
// op, with the entry and the ONNX location as arguments.
#pragma once
#include "sd/runtime/session.h"
#include <string>

namespace sdrun {

// Turns profiling on for the whole run when `path` is set (runs are then
// eager, and on a GPU each kernel is waited for, so times are the op's own).
void startTrace(sd::Session &session, const std::string &path);
// Writes the trace (atomically) when `path` is set.
sd::Status writeTrace(const sd::Session &session, const std::string &path);

} // namespace sdrun
