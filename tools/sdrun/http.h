// The HTTP/1.1 that `sdrun serve` speaks: requests parsed from bytes as they
// arrive (limits on header and body sizes, so a hostile client gets an error
// status, never a crash or unbounded memory), responses as bytes, and a
// listening socket. Connections stay open for the next request (HTTP/1.1's
// default; HTTP/1.0 asks with Connection: keep-alive), and streams are sent in
// chunks so that their end is known without closing.
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
  bool keepAlive = true;       // the client will send more on this connection (HTTP/1.1 unless Connection: close)
  bool http10 = false;         // HTTP/1.0: no chunked responses
  size_t length = 0;           // bytes of the whole request (Complete)
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
                     const std::string &extraHeaders = "", bool keepAlive = false);
// The head of a server-sent-events response: chunked (its end a last chunk,
// the connection kept), or else events until the connection closes.
std::string eventStreamHead(bool chunked);
// One server-sent event carrying `data` (as a chunk when chunked).
std::string event(const std::string &data, bool chunked = false);
// The end of a chunked body.
const char *lastChunk();
const char *reason(int status);

// A listening TCP socket on host:port (port 0: any free one); -1 and `error` when not.
int listenOn(const std::string &host, int port, std::string &error);
// The port a listening socket is bound to.
int boundPort(int fd);

} // namespace sdrun::http
