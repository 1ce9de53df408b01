// The log sink (log.hpp).
#include "log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

namespace sok {
namespace hps {
const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "LOG";
}

namespace {

// SOK_HPS_LOG_LEVEL's level, WARNING where it is unset or not a level's name.
LogLevel threshold() {
  const char* value = std::getenv("SOK_HPS_LOG_LEVEL");
  for (LogLevel level : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (value != nullptr && std::strcmp(value, log_level_name(level)) == 0) return level;
  }
  return LogLevel::kWarning;
}

void to_stderr(LogLevel level, const std::string& message) {
  static const LogLevel from = threshold();
  if (level < from) return;
  std::fprintf(stderr, "[sok-hps] %s: %s\n", log_level_name(level), message.c_str());
}

std::mutex mu;
std::shared_ptr<const LineSink> sink;  // null: to_stderr

}  // namespace

void set_log_sink(LineSink s) {
  auto made = s ? std::make_shared<const LineSink>(std::move(s)) : nullptr;
  std::lock_guard<std::mutex> lock(mu);
  sink = std::move(made);
}

void log(LogLevel level, const std::string& message) {
  std::shared_ptr<const LineSink> current;
  {
    std::lock_guard<std::mutex> lock(mu);
    current = sink;
  }
  if (current != nullptr) {
    (*current)(level, message);
  } else {
    to_stderr(level, message);
  }
}

}  // namespace hps
}  // namespace sok
