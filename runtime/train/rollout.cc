// GRPO's sampled and scored groups (rollout.h).
#include "sd/train/rollout.h"
#include "sd/format/json.h"
#include "sd/generate/generator.h"
#include "sd/tokenize/tokenizer.h"
#include "../tokenize/unicode.h"
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace sd::train {

namespace {

std::string exitText(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status));
  return "stopped";
}

} // namespace

StatusOr<std::unique_ptr<RewardCommand>> RewardCommand::start(const std::string &command, double timeoutSeconds) {
  if (command.empty()) return sdError("--reward-cmd needs a command");
  // A command that exits while we write to it must give an error, not end
  // this process: writes to its closed pipe then fail with EPIPE instead.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  int in[2], out[2];
  if (pipe(in) != 0) return sdError("--reward-cmd: cannot make a pipe: ", std::strerror(errno));
  if (pipe(out) != 0) {
    close(in[0]), close(in[1]);
    return sdError("--reward-cmd: cannot make a pipe: ", std::strerror(errno));
  }
  const long maxFd = std::min(sysconf(_SC_OPEN_MAX), 65536L); // read before fork: the child calls only what is safe
  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
    return sdError("--reward-cmd: cannot start '", command, "': ", std::strerror(errno));
  }
  if (pid == 0) { // the child: stdin from in[0], stdout to out[1]; stderr stays ours
    dup2(in[0], 0);
    dup2(out[1], 1);
    // Nothing else of ours (plan files, a rank's sockets) stays open in it.
    for (int fd = 3; fd < maxFd; ++fd) close(fd);
    std::signal(SIGPIPE, SIG_DFL);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char *>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  fcntl(in[1], F_SETFD, FD_CLOEXEC);
  fcntl(out[0], F_SETFD, FD_CLOEXEC);
  std::unique_ptr<RewardCommand> r(new RewardCommand(command, timeoutSeconds));
  r->pid_ = pid;
  r->toChild_ = in[1];
  r->fromChild_ = out[0];
  return r;
}

RewardCommand::~RewardCommand() {
  if (toChild_ >= 0) close(toChild_); // end of input: the command's cue to exit
  if (fromChild_ >= 0) close(fromChild_);
  if (pid_ <= 0) return;
  for (int waited = 0; waited < 50; ++waited) { // up to 5 s
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    usleep(100000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

Status RewardCommand::readLine(std::string &line, size_t index) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
  for (;;) {
    if (size_t nl = buffered_.find('\n'); nl != std::string::npos) {
      line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return Status::ok();
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return sdError("--reward-cmd '", command_, "' gave no reward for completion ", index + 1, " within ", timeout_,
                     " s (it must write one line per line it reads, and flush it)");
    pollfd p{fromChild_, POLLIN, 0};
    int ready = poll(&p, 1, int(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) return sdError("--reward-cmd: ", std::strerror(errno));
    if (ready <= 0) continue;
    char buf[4096];
    ssize_t n = read(fromChild_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int status = 0;
      std::string how = waitpid(pid_, &status, 0) == pid_ ? exitText(status) : "closed its output";
      pid_ = -1;
      return sdError("--reward-cmd '", command_, "' ", how, " before scoring completion ", index + 1);
    }
    buffered_.append(buf, size_t(n));
  }
}

StatusOr<std::vector<float>> RewardCommand::score(const std::vector<std::string> &requests) {
  std::vector<float> rewards;
  // One line out, one line back: a command that answers as it reads never
  // blocks on a full pipe while we do.
  for (const std::string &request : requests) {
    const size_t index = scored_++;
    if (pid_ <= 0) return sdError("--reward-cmd '", command_, "' is no longer running");
    std::string out = request + "\n";
    for (size_t done = 0; done < out.size();) {
      ssize_t n = write(toChild_, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int status = 0;
        std::string how = waitpid(pid_, &status, 0) == pid_ ? exitText(status) : "stopped reading";
        pid_ = -1;
        return sdError("--reward-cmd '", command_, "' ", how, " before reading completion ", index + 1);
      }
      done += size_t(n);
    }
    std::string line;
    SD_RETURN_IF_ERROR(readLine(line, index));
    char *end = nullptr;
    const double v = std::strtod(line.c_str(), &end);
    while (end && (*end == ' ' || *end == '\t' || *end == '\r')) ++end;
    if (line.empty() || !end || *end || !std::isfinite(float(v)))
      return sdError("--reward-cmd '", command_, "': the reward of completion ", index + 1,
                     " is not a finite number: '", line.substr(0, 80), "'");
    rewards.push_back(float(v));
  }
  return rewards;
}

Status sampleGroups(Session &session, const RolloutOptions &o, uint64_t seed, int64_t groupSize, int64_t rowLength,
                    const Tokenizer *tokenizer, const RewardFunction &reward, std::vector<Example> &examples,
                    double &rewardSum) {
  generate::SamplingOptions sampling;
  sampling.temperature = o.temperature;
  sampling.topK = o.topK;
  sampling.topP = o.topP;
  sampling.seed = seed;
  auto created = generate::Generator::create(session, sampling);
  if (!created.isOk()) return created.status().withContext("--reward-cmd samples with the plan: ");
  generate::Generator &gen = *created.value();
  if (!gen.cached())
    return sdError("--reward-cmd samples each step's completions with the plan, which has no decode entries: "
                   "compile it with --kv-cache MAX_LENGTH (and --kv-batch ROWS)");
  const int64_t limit = std::min(rowLength, gen.maxContext());
  const int64_t eos = tokenizer ? tokenizer->eosId() : -1;
  struct Sample {
    Example *example;
    std::vector<int64_t> tokens;
    bool done = false;
  };
  std::vector<Sample> samples;
  for (Example &e : examples) {
    if (int64_t(e.ids.size()) >= limit)
      return sdError("a prompt of ", e.ids.size(), " tokens leaves no room for a completion in the plan's ", limit,
                     "-token rows");
    for (int64_t k = 0; k < groupSize; ++k) samples.push_back({&e, e.ids});
  }
  for (size_t first = 0; first < samples.size(); first += size_t(gen.batchSize())) {
    const size_t last = std::min(samples.size(), first + size_t(gen.batchSize()));
    for (;;) {
      std::vector<std::vector<int64_t>> rows;
      for (size_t i = first; i < last; ++i) rows.push_back(samples[i].done ? std::vector<int64_t>() : samples[i].tokens);
      if (std::all_of(rows.begin(), rows.end(), [](const auto &r) { return r.empty(); })) break;
      auto next = gen.nextBatch(rows);
      if (!next.isOk()) return next.status().withContext("sampling: ");
      for (size_t i = first; i < last; ++i) {
        Sample &s = samples[i];
        if (s.done) continue;
        s.tokens.push_back(next.value()[i - first]);
        s.done = s.tokens.back() == eos || int64_t(s.tokens.size()) >= limit ||
                 (o.maxNewTokens > 0 && int64_t(s.tokens.size() - s.example->ids.size()) >= o.maxNewTokens);
      }
    }
  }
  // JSON holds UTF-8: bytes (a byte-level model's) or a token cut inside a
  // character become U+FFFD, as Python's decode(errors="replace") makes them.
  auto text = [&](const std::vector<int64_t> &ids) {
    if (!tokenizer) return tok::toValidUtf8(std::string(ids.begin(), ids.end()));
    auto d = tokenizer->decode(std::vector<int32_t>(ids.begin(), ids.end()), true);
    return tok::toValidUtf8(d.isOk() ? d.value() : std::string());
  };
  auto list = [](const std::vector<int64_t> &ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
    return s + "]";
  };
  std::vector<std::string> requests;
  for (const Sample &s : samples) {
    const std::vector<int64_t> &prompt = s.example->ids;
    std::vector<int64_t> completion(s.tokens.begin() + std::ptrdiff_t(prompt.size()), s.tokens.end());
    requests.push_back("{\"prompt\":" + jsonQuote(text(prompt)) + ",\"completion\":" + jsonQuote(text(completion)) +
                       ",\"prompt_ids\":" + list(prompt) + ",\"completion_ids\":" + list(completion) + "}");
  }
  auto rewards = reward(requests);
  if (!rewards.isOk()) return rewards.status();
  if (rewards.value().size() != requests.size())
    return sdError("the reward function gave ", rewards.value().size(), " rewards for ", requests.size(),
                   " completions");
  for (size_t i = 0; i < requests.size(); ++i)
    if (!std::isfinite(rewards.value()[i]))
      return sdError("the reward function gave completion ", i + 1, " a reward that is not a finite number");
  for (size_t i = 0; i < samples.size(); ++i) {
    Example &e = *samples[i].example;
    std::vector<int64_t> labels(samples[i].tokens);
    std::fill(labels.begin(), labels.begin() + std::ptrdiff_t(e.ids.size()), kIgnoreLabel);
    e.groupIds.push_back(samples[i].tokens);
    e.groupLabels.push_back(std::move(labels));
    e.rewards.push_back(rewards.value()[i]);
    rewardSum += rewards.value()[i];
  }
  return Status::ok();
}

} // namespace sd::train
