// sok::hps::DirectoryUpdateSource: the update files (update_files.hpp) of a directory, each applied
// once, in the order of their sequence per writer. The one implementation: updates.py's
// DirectoryUpdateSource is a thin layer over it (py_update_source.cpp), and the C++ server makes
// one directly. The rules are updates.py's docstring's, and every line it logs is worded as there:
// * Order: the files found at one poll apply in the order of their sequence (then name); a file
//   older than an update of the same writer and tag already applied arrived late and is refused, as
//   is a duplicate (the writer, sequence and checksum of one applied; version 1: the same content).
// * Rejected files (not an update, not a regular file, refused) are moved to <directory>/rejected/
//   (a suffix .1, .2, ... when the name is taken there) with one error line.
// * apply throwing UpdateRejected, or any std::invalid_argument (Python's: any ValueError), refuses
//   the update for this source: its file stays for other readers, one error line, unapplied()
//   records it, never tried again by this source. Any other error is retried at every poll, it and
//   the updates after it, with one warning.
// * An incomplete file (shorter than its header says) is read again at every poll; it is rejected
//   when its size and modification time have not changed for incomplete_timeout_s.
// * A poll reads the headers of the new files to order them, then each file whole when its turn
//   comes: start()'s loop holds one file's rows at a time (poll(), which returns them all, holds all).
//
// Threads: poll(), unapplied() and start()'s loop take one lock (recursive: apply and the log may
// call poll() or unapplied()); apply, the log and the RowAllocator are called under it, on the
// loop's thread. start() runs the loop in a std::thread of its own, or in the thread `launch` makes
// (Python's: a daemon threading.Thread, so the interpreter knows it); stop() waits for it.
//
// Where it differs from updates.py's Python source: a poll_interval_s or incomplete_timeout_s that
// is NaN is refused (Python's waited on it and failed); a poll_interval_s beyond what a timer holds
// waits that long; a model filter is run by std::regex (ECMAScript) after py_regex.hpp checked it
// as Python's re.compile does (the same errors), and one that std::regex cannot take (Python's
// extensions: (?P<name>...), inline flags, look-behind, \A, \Z) is refused with a ModelFilterError
// "ValueError" (model names are ASCII names, which both match alike).
//
// Example:
//   sok::hps::UpdateSourceOptions options;
//   options.poll_interval_s = 0.5;
//   options.model_filters = {"foo"};
//   sok::hps::DirectoryUpdateSource source("updates", options);
//   source.start([&](const sok::hps::Update& u) { tier.insert(u.tag, u.keys, u.count, u.values, u.dim); });
//   ...
//   source.stop();
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "log.hpp"
#include "model_filters.hpp"
#include "update_files.hpp"

namespace sok::hps {

// Receives each line a source logs. `error` is the exception a failed poll raised (the line
// Python's log.exception wrote with its traceback), else null. Called under the source's lock, on
// the thread that polls; must not throw.
using LogSink = std::function<void(LogLevel level, const std::string& message, const std::exception_ptr& error)>;

// A LogSink writing each line of `min_level` and above to stderr, one write a line:
// "sok-hps updates WARNING: <message>" (and a line "<type>: <what>" of `error`).
LogSink stderr_log_sink(LogLevel min_level = LogLevel::kInfo);

// A monotonic clock in seconds: what the incomplete-file timeout is measured on.
using Clock = std::function<double()>;

// updates.UpdateRejected: thrown by apply for an update this server can never apply (rows of
// another width than its table's, keys its table cannot hold; nothing of it applied).
class UpdateRejected : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// An error raised in another language by apply (the Python binding's), with the name of its type
// there (TierUnavailable), which the warning names.
class ForeignError : public std::runtime_error {
 public:
  ForeignError(std::string type_name, const std::string& message)
      : std::runtime_error(message), type_name_(std::move(type_name)) {}
  const std::string& type_name() const { return type_name_; }

 private:
  std::string type_name_;
};

// The name an error is reported by in a warning: a ForeignError's type_name(), else its C++ class's
// name without namespaces ("runtime_error").
std::string error_type_name(const std::exception& error);

struct UpdateSourceOptions {
  // The pause between looks at the directory in start()'s loop; > 0.
  double poll_interval_s = 1.0;
  // Regular expressions; an update applies when one matches its model name in full (".+": every
  // model; none: no update applies).
  std::vector<std::string> model_filters = {".+"};
  // How long a file shorter than its header says may keep the same size and modification time
  // before it is rejected (it may still be being copied in until then); >= 0.
  double incomplete_timeout_s = 300.0;
  LogSink log;            // empty: stderr_log_sink()
  Clock clock;            // empty: std::chrono::steady_clock
  RowAllocator allocate;  // the memory of each update's rows; empty: allocate_rows
};

class DirectoryUpdateSource {
 public:
  // Called on each update, in order, on the loop's thread; its keys and values are the caller's for
  // the call (a copy of update.rows keeps them longer). Throws UpdateRejected (or another
  // std::invalid_argument) to refuse it, anything else to have it tried again at the next poll.
  using Apply = std::function<void(const Update& update)>;
  // Runs `loop` in a thread it makes, and returns; the loop returns after stop().
  using Launch = std::function<void(std::function<void()> loop)>;

  // The source of the update files in `directory` (made when missing). Throws std::invalid_argument
  // (poll_interval_s not > 0, incomplete_timeout_s not >= 0), ModelFilterError, OsError (the
  // directory cannot be made).
  explicit DirectoryUpdateSource(std::string directory, UpdateSourceOptions options = {});
  // Stops a loop running in start()'s own thread (as stop()); a loop of a `launch` thread runs on
  // until it is stopped, holding what it needs.
  ~DirectoryUpdateSource();
  DirectoryUpdateSource(const DirectoryUpdateSource&) = delete;
  DirectoryUpdateSource& operator=(const DirectoryUpdateSource&) = delete;

  // The updates of the files not seen before, in sequence order, each taken as applied. Files bad
  // for every reader are moved to rejected/ with an error line; one whose model no filter matches
  // is skipped; an incomplete one is read again at a later poll. Passes on what the RowAllocator
  // throws (the files not yet returned are read again at the next poll).
  std::vector<Update> poll();

  // The files apply refused (left in the directory, never tried again by this source): name -> why.
  std::map<std::string, std::string> unapplied() const;

  // Polls every poll_interval_s in a background thread (std::thread, or the one `launch` makes) and
  // calls `apply` on each update, in order, reading one file at a time. An error of a poll (the
  // RowAllocator's) is logged with the error, and the loop goes on at the next poll. Throws
  // std::logic_error where the source runs already.
  void start(Apply apply, const Launch& launch = nullptr);

  // Stops the background loop (after the update it applies now), waiting at most `timeout_s` for it;
  // an error line and false where it has not ended then (left to end on its own), true otherwise
  // (also where none runs).
  bool stop(double timeout_s = 30.0);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace sok::hps
