// The HTTP/1.1 that `sdrun serve` speaks: requests parsed from bytes as they
// arrive (limits on header and body sizes, so a hostile client gets an error
// status, never a crash or unbounded memory), responses as bytes, and a
// listening socket. One request per connection (responses close it).
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace sdrun::http {

struct Request {
  std::string method, path; // path without its query
  std::vector<std::pair<std::string, std::string>> headers; // names lower-cased
  std::string body;
  bool expectContinue = false; // the client waits for "100 Continue" before its body
  const std::string *header(const std::string &lowerName) const;
};

struct Limits {
  size_t maxHeader = 64 * 1024;
  size_t maxBody = 8 * 1024 * 1024;
};

enum class Parse {
  NeedMore,    // the request is not all there yet
  HeadersDone, // headers complete, body still coming (answer 100 Continue when asked)
  Complete,    // `out` holds the request
  Bad,         // `status` and `error` say what is wrong
};

// Parses the request at the start of `in`.
Parse parseRequest(const std::string &in, const Limits &limits, Request &out, int &status, std::string &error);

// A whole response with a Content-Length; `extraHeaders` are "Name: value\r\n" lines.
std::string response(int status, const std::string &contentType, const std::string &body,
                     const std::string &extraHeaders = "");
// The head of a server-sent-events response (the body is events until the connection closes).
std::string eventStreamHead();
// One server-sent event carrying `data`.
std::string event(const std::string &data);
const char *reason(int status);

// A listening TCP socket on host:port (port 0: any free one); -1 and `error` when not.
int listenOn(const std::string &host, int port, std::string &error);
// The port a listening socket is bound to.
int boundPort(int fd);

} // namespace sdrun::http
