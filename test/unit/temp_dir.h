// A folder under /tmp for one test's files, removed with everything in it
// when the owner goes out of scope, a failed assertion included, so test
// runs leave nothing behind in /tmp.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace sd {

class TempDir {
public:
  explicit TempDir(const std::string &prefix) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  // Empty when the folder could not be made (tests then fail on their first write).
  const std::string &path() const { return path_; }

private:
  std::string path_;
};

} // namespace sd
