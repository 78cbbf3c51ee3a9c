// Status: the error type every fallible call in the op library and runtime returns.
// Nothing below the tools aborts on bad input; errors travel up as one clear line.
#pragma once
#include <sstream>
#include <string>
#include <utility>

namespace sd {

class Status {
public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string msg) {
    Status s;
    s.failed_ = true;
    s.msg_ = std::move(msg);
    return s;
  }
  bool isOk() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string &message() const { return msg_; }
  // Prefix context ("node 'x': ") to an error; no-op on success.
  Status withContext(const std::string &ctx) const {
    if (!failed_) return *this;
    return error(ctx + msg_);
  }

private:
  bool failed_ = false;
  std::string msg_;
};

// Builds an error message from streamable parts: sdError("bad axis ", axis).
template <typename... Args> Status sdError(Args &&...args) {
  std::ostringstream os;
  (os << ... << args);
  return Status::error(os.str());
}

template <typename T> class StatusOr {
public:
  StatusOr(T value) : value_(std::move(value)) {}
  StatusOr(Status status) : status_(std::move(status)) {}
  bool isOk() const { return status_.isOk(); }
  const Status &status() const { return status_; }
  T &value() { return value_; }
  const T &value() const { return value_; }
  T &operator*() { return value_; }
  T *operator->() { return &value_; }

private:
  Status status_;
  T value_{};
};

} // namespace sd

#define SD_RETURN_IF_ERROR(expr)                                               \
  do {                                                                         \
    ::sd::Status sd_status_ = (expr);                                          \
    if (!sd_status_.isOk()) return sd_status_;                                 \
  } while (0)

#define SD_CHECK_ARG(cond, ...)                                                \
  do {                                                                         \
    if (!(cond)) return ::sd::sdError(__VA_ARGS__);                            \
  } while (0)
