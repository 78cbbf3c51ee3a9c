// Chrome trace output of sdrun --profile FILE.json (see trace.h).
#include "trace.h"
#include "sd/format/file_io.h"
#include "sd/format/json.h"
#include "sd/runtime/plan.h"
#include <cstdio>

namespace sdrun {

void startTrace(sd::Session &session, const std::string &path) {
  if (!path.empty()) session.setProfiling(true);
}

sd::Status writeTrace(const sd::Session &session, const std::string &path) {
  if (path.empty()) return sd::Status::ok();
  const sd::Plan &plan = session.plan();
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"device\":" +
                    sd::jsonQuote(session.device().describe()) +
                    ",\"dropped_events\":" + std::to_string(session.droppedTraceEvents()) + "},\"traceEvents\":[";
  // One track per entry, named after it.
  for (size_t e = 0; e < plan.entries.size(); ++e)
    out += (e ? "," : "") + std::string("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":") +
           std::to_string(e) + ",\"args\":{\"name\":" + sd::jsonQuote(plan.entries[e].name) + "}}";
  char num[96];
  for (const sd::Session::TraceEvent &ev : session.trace()) {
    std::snprintf(num, sizeof num, "\"ts\":%.3f,\"dur\":%.3f", ev.startUs, ev.durationUs);
    out += ",{\"name\":" + sd::jsonQuote(ev.op) + ",\"cat\":\"kernel\",\"ph\":\"X\"," + num +
           ",\"pid\":1,\"tid\":" + std::to_string(ev.entry) + ",\"args\":{\"location\":" + sd::jsonQuote(ev.location) +
           "}}";
  }
  out += "]}\n";
  sd::Status st = sd::writeFileAtomic(path, out);
  return st.isOk() ? st : st.withContext("--profile: ");
}

} // namespace sdrun
