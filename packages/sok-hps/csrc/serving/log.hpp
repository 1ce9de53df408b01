// The log levels of sok-hps's C++ code (Python logging's numbers, which the Python bindings pass to
// the logging module as they are), and where the C++ server's lines go: a sink the process sets,
// else standard error. One line per call, what Python's logger of the same module would print.
// (The update source takes a sink of its own, update_source.hpp's LogSink, per source.)
//
// Example:
//   log(LogLevel::kWarning, "HPS lookup: redis_cluster is unavailable (...)");
#ifndef SOK_HPS_SERVING_LOG_HPP_
#define SOK_HPS_SERVING_LOG_HPP_

#include <functional>
#include <string>

namespace sok {
namespace hps {

enum class LogLevel : int { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40 };

// "DEBUG", "INFO", "WARNING", "ERROR": Python logging's names of the levels.
const char* log_level_name(LogLevel level);

// (level, message). Called from any thread; must not throw.
using LineSink = std::function<void(LogLevel, const std::string&)>;

// Replaces the server's sink (nullptr: the default, which writes standard error the lines from
// SOK_HPS_LOG_LEVEL's level on: DEBUG, INFO, WARNING or ERROR; WARNING where unset).
void set_log_sink(LineSink sink);

void log(LogLevel level, const std::string& message);

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_LOG_HPP_
