// Where the C++ server's log lines go: a sink the process sets (the Python binding forwards them to
// the logging module; a process with no Python keeps the default, standard error). One line per
// call, what Python's logger of the same module would print.
//
// Example:
//   log(LogLevel::kWarning, "HPS lookup: redis_cluster is unavailable (...)");
#ifndef SOK_HPS_SERVING_LOG_HPP_
#define SOK_HPS_SERVING_LOG_HPP_

#include <functional>
#include <string>

namespace sok {
namespace hps {

enum class LogLevel { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40 };  // Python's logging levels

// (level, message). Called from any thread; must not throw.
using LogSink = std::function<void(LogLevel, const std::string&)>;

// Replaces the sink (nullptr: the default, which writes warnings and errors to standard error, and
// every level from SOK_HPS_LOG_LEVEL's on: DEBUG, INFO, WARNING or ERROR).
void set_log_sink(LogSink sink);

void log(LogLevel level, const std::string& message);

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_LOG_HPP_
