// HTTP/1.1 request parsing, responses and the listening socket of sdrun serve.
#include "http.h"
#include <arpa/inet.h>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace sdrun::http {
namespace {

std::string lower(std::string s) {
  for (char &c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string &s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

Parse bad(int code, const std::string &msg, int &status, std::string &error) {
  status = code;
  error = msg;
  return Parse::Bad;
}

bool isToken(const std::string &s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("!#$%&'*+-.^_`|~", c)) return false;
  return true;
}

} // namespace

const std::string *Request::header(const std::string &lowerName) const {
  for (const auto &h : headers)
    if (h.first == lowerName) return &h.second;
  return nullptr;
}

Parse parseRequest(const std::string &in, const Limits &limits, Request &out, int &status, std::string &error) {
  size_t end = in.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (in.size() > limits.maxHeader)
      return bad(431, "the request's headers exceed " + std::to_string(limits.maxHeader) + " bytes", status, error);
    return Parse::NeedMore;
  }
  if (end > limits.maxHeader)
    return bad(431, "the request's headers exceed " + std::to_string(limits.maxHeader) + " bytes", status, error);
  out = Request();
  size_t lineEnd = in.find("\r\n");
  const std::string line = in.substr(0, lineEnd);
  size_t sp1 = line.find(' '), sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.find(' ', sp2 + 1) != std::string::npos)
    return bad(400, "malformed request line (expected METHOD PATH HTTP/1.1)", status, error);
  out.method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1), version = line.substr(sp2 + 1);
  if (!isToken(out.method)) return bad(400, "malformed request method", status, error);
  if (version != "HTTP/1.1" && version != "HTTP/1.0")
    return bad(505, "unsupported protocol '" + version.substr(0, 16) + "' (HTTP/1.1 or HTTP/1.0)", status, error);
  out.http10 = version == "HTTP/1.0";
  if (target.empty() || target[0] != '/') return bad(400, "the request target must be a path starting with /", status, error);
  out.path = target.substr(0, target.find_first_of("?#"));
  for (size_t at = lineEnd + 2; at < end + 2;) {
    size_t next = in.find("\r\n", at);
    const std::string h = in.substr(at, next - at);
    at = next + 2;
    size_t colon = h.find(':');
    if (colon == std::string::npos || !isToken(h.substr(0, colon)))
      return bad(400, "malformed header line '" + h.substr(0, 40) + "'", status, error);
    out.headers.emplace_back(lower(h.substr(0, colon)), trim(h.substr(colon + 1)));
  }
  if (out.header("transfer-encoding"))
    return bad(501, "chunked request bodies are not supported: send the body with a Content-Length", status, error);
  size_t length = 0;
  bool haveLength = false;
  for (const auto &h : out.headers) {
    if (h.first != "content-length") continue;
    if (h.second.empty() || h.second.size() > 18 || h.second.find_first_not_of("0123456789") != std::string::npos)
      return bad(400, "Content-Length '" + h.second.substr(0, 20) + "' is not a byte count", status, error);
    size_t n = std::stoull(h.second);
    if (haveLength && n != length) return bad(400, "two different Content-Length headers", status, error);
    length = n;
    haveLength = true;
  }
  if (length > limits.maxBody)
    return bad(413, "the request body is " + std::to_string(length) + " bytes, more than the server's " +
                        std::to_string(limits.maxBody),
               status, error);
  if (const std::string *expect = out.header("expect"); expect && lower(*expect) == "100-continue")
    out.expectContinue = true;
  out.keepAlive = !out.http10;
  if (const std::string *connection = out.header("connection")) { // a list of options
    const std::string options = lower(*connection);
    if (options.find("close") != std::string::npos) out.keepAlive = false;
    else if (options.find("keep-alive") != std::string::npos) out.keepAlive = true;
  }
  if (in.size() < end + 4 + length) return Parse::HeadersDone;
  out.body = in.substr(end + 4, length);
  out.length = end + 4 + length;
  return Parse::Complete;
}

const char *reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 200: return "OK";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 413: return "Payload Too Large";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 503: return "Service Unavailable";
  case 505: return "HTTP Version Not Supported";
  default: return "Error";
  }
}

std::string response(int status, const std::string &contentType, const std::string &body, const std::string &extraHeaders,
                     bool keepAlive) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\nContent-Type: " + contentType +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: " +
         (keepAlive ? "keep-alive" : "close") + "\r\n" + extraHeaders + "\r\n" + body;
}

std::string eventStreamHead(bool chunked) {
  return std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n") +
         (chunked ? "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n");
}

std::string event(const std::string &data, bool chunked) {
  const std::string e = "data: " + data + "\n\n";
  if (!chunked) return e;
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", e.size());
  return size + e + "\r\n";
}

const char *lastChunk() { return "0\r\n\r\n"; }

int listenOn(const std::string &host, int port, std::string &error) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    error = "--host " + host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo *a = found; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) break;
    why = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    error = "cannot listen on " + host + ":" + service + ": " + why;
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

int boundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6 *>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in *>(&addr)->sin_port);
}

} // namespace sdrun::http
