// The directory update source (update_source.hpp), updates.py's DirectoryUpdateSource step for step.
#include "update_source.hpp"

#include <cxxabi.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <typeinfo>

#include "py_errors.hpp"
#include "py_path.hpp"
#include "py_text.hpp"

namespace sok::hps {
namespace {

// The longest single wait of a timer: longer pauses are waited in steps of it.
constexpr double kLongestWaitS = 86400.0;

// Python's "%g" % value.
std::string py_g(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

// repr() of a tuple of strs: ('.+',), ('foo', 'ba.').
std::string tuple_repr(const std::vector<std::string>& items) {
  std::string out = "(";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + py_repr(items[i]);
  return out + (items.size() == 1 ? ",)" : ")");
}

// os.listdir(path): the names in the directory, but . and .. (OsError naming `path`).
std::vector<std::string> list_directory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) throw OsError(errno, path);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int error = errno;
  ::closedir(dir);
  if (error != 0) throw OsError(error, path);
  return names;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Waits on `changed` until done() or `seconds` (any length, inf: no limit) have passed; done()'s
// last answer.
template <class Done>
bool wait_seconds(std::condition_variable& changed, std::unique_lock<std::mutex>& lock, double seconds, Done done) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    const double left = seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!(left > 0)) return false;
    changed.wait_for(lock, std::chrono::duration<double>(std::min(left, kLongestWaitS)));
  }
  return true;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

LogSink stderr_log_sink(LogLevel min_level) {
  return [min_level](LogLevel level, const std::string& message, const std::exception_ptr& error) {
    if (static_cast<int>(level) < static_cast<int>(min_level)) return;
    std::string line = std::string("sok-hps updates ") + log_level_name(level) + ": " + message + "\n";
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        line += error_type_name(e) + ": " + e.what() + "\n";
      } catch (...) {
        line += "an exception of no std::exception type\n";
      }
    }
    std::fwrite(line.data(), 1, line.size(), stderr);
  };
}

// The exception `error` holds as a T (the object itself, alive while `error` is), or null.
template <class T>
const T* exception_as(const std::exception_ptr& error) {
  if (error == nullptr) return nullptr;
  try {
    std::rethrow_exception(error);
  } catch (const T& e) {
    return &e;
  } catch (...) {
  }
  return nullptr;
}

std::string error_type_name(const std::exception& error) {
  if (const auto* foreign = dynamic_cast<const ForeignError*>(&error)) return foreign->type_name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(typeid(error).name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : typeid(error).name();
  std::free(demangled);
  const size_t colons = name.rfind("::");
  return colons == std::string::npos ? name : name.substr(colons + 2);
}

// One run of the background loop: stop() sets `stop`, the loop sets `ended` (under run_mutex).
struct Run {
  std::atomic<bool> stop{false};
  bool ended = false;
};

struct DirectoryUpdateSource::State {
  // What a warning was given for: a file that cannot be read, an update apply failed on.
  enum class Failure { kRead, kApply };
  // An incomplete file's size and modification time (ns), and since when it has kept them.
  struct Waiting {
    std::pair<int64_t, int64_t> state;
    double since;
  };
  // What makes two files the same update: tag, writer, sequence (version 1: none) and checksum, rows.
  using Fingerprint = std::tuple<std::string, uint64_t, bool, uint64_t, uint32_t, uint64_t>;

  State(std::string directory_, UpdateSourceOptions options_);

  // A line to options.log. Inside a catch handler (an exception being handled) the line waits for
  // flush_logs(), which the poll's end and the next line outside a handler call: a sink that calls
  // into Python may end this thread there (the interpreter finalizing: pthread_exit's forced unwind),
  // and a forced unwind caught while another exception is being handled calls std::terminate.
  void log(LogLevel level, const std::string& message, const std::exception_ptr& error = nullptr) const {
    if (std::current_exception() != nullptr) {
      pending_logs.push_back({level, message, error});
      return;
    }
    flush_logs();
    options.log(level, message, error);
  }
  // The lines log() held back, in order. Outside any catch handler.
  void flush_logs() const {
    std::vector<PendingLog> lines;
    lines.swap(pending_logs);
    for (const PendingLog& line : lines) options.log(line.level, line.message, line.error);
  }
  bool wanted(const std::string& model) const;
  std::vector<std::string> new_names();
  template <class Read>
  auto open(const std::string& name, Read read) -> std::optional<decltype(read(name))>;
  template <class Each>
  void for_each_update(Each each);
  void wait(const std::string& path, const struct stat& info, const UpdateIncomplete& error);
  std::optional<std::string> refusal(const Update& update) const;
  bool admit(Update& update);
  void record(const Update& update);
  void reject(const std::string& path, const std::string& why);
  void refuse(const Update& update, const std::string& why);
  void warn_once(Failure failure, const std::string& path, const std::string& message);
  bool apply_one(Update& update, const Apply& apply);
  void step(const Run& run, const Apply& apply);
  void loop(Run& run, const Apply& apply);

  static Fingerprint fingerprint(const Update& u) {
    return {u.tag, u.writer, u.version >= 2, u.version >= 2 ? u.sequence : 0, u.checksum, u.count};
  }

  const std::string directory;
  UpdateSourceOptions options;
  ModelFilters filters;
  std::string filters_repr;  // repr() of the filters' tuple, as updates.py's lines show them

  // The poll's state, under `mutex`.
  mutable std::recursive_mutex mutex;
  struct PendingLog {
    LogLevel level;
    std::string message;
    std::exception_ptr error;
  };
  mutable std::vector<PendingLog> pending_logs;  // log()'s lines from catch handlers, under `mutex`
  std::set<std::string> seen;                                   // names applied, filtered out, rejected, refused
  std::map<std::string, std::string> unapplied;                 // name -> why apply refused it
  std::map<std::string, Waiting> waiting;                       // name -> its incomplete state
  std::map<std::pair<uint64_t, std::string>, uint64_t> newest;  // (writer, tag) -> newest sequence applied
  std::map<Fingerprint, std::string> applied;                   // -> the name it was applied from
  std::set<std::pair<Failure, std::string>> warned;             // (what, path) that failed and is retried
  bool unlisted = false;                                        // the last look at the directory failed

  // The background loop, under `run_mutex`.
  std::mutex run_mutex;
  std::condition_variable run_changed;
  std::shared_ptr<Run> current;  // the run stop() stops
  std::thread thread;            // start()'s own thread, where no launch made one
};

// `options`, after std::invalid_argument where its interval or timeout is out of range (checked before
// the filters, as updates.py checks them).
static UpdateSourceOptions checked_options(UpdateSourceOptions options) {
  if (!(options.poll_interval_s > 0)) {
    throw std::invalid_argument("poll_interval_s must be > 0, got " + py_repr(options.poll_interval_s));
  }
  if (!(options.incomplete_timeout_s >= 0)) {
    throw std::invalid_argument("incomplete_timeout_s must be >= 0, got " + py_repr(options.incomplete_timeout_s));
  }
  return options;
}

DirectoryUpdateSource::State::State(std::string directory_, UpdateSourceOptions options_)
    : directory(std::move(directory_)),
      options(checked_options(std::move(options_))),
      filters(options.model_filters, "model filter") {
  filters_repr = tuple_repr(options.model_filters);
  if (!options.log) options.log = stderr_log_sink();
  if (!options.clock) options.clock = steady_seconds;
  if (!options.allocate) options.allocate = allocate_rows;
  make_directories(directory);
}

bool DirectoryUpdateSource::State::wanted(const std::string& model) const {
  return filters.match(model);
}

std::vector<std::string> DirectoryUpdateSource::State::new_names() {
  std::vector<std::string> names;
  try {
    names = list_directory(directory);
  } catch (const OsError& error) {
    if (!unlisted) {
      log(LogLevel::kWarning, "the update directory " + directory + " cannot be listed (" + error.what() +
                                  "); trying again at every poll");
    }
    unlisted = true;
    return {};
  }
  if (unlisted) {
    log(LogLevel::kWarning, "the update directory " + directory + " can be listed again");
    unlisted = false;
  }
  names.erase(std::remove_if(names.begin(), names.end(),
                             [&](const std::string& n) { return !ends_with(n, kUpdateSuffix) || seen.count(n); }),
              names.end());
  std::sort(names.begin(), names.end(), py_less);
  return names;
}

// updates._open: read(path) of the file `name` (its header or its update), or none: rejected,
// incomplete, gone, or unreadable for now.
template <class Read>
auto DirectoryUpdateSource::State::open(const std::string& name, Read read) -> std::optional<decltype(read(name))> {
  const std::string path = posixpath::join(directory, name);
  struct stat info;
  // What failed, acted on after the handler: the actions call the sinks and the clock, which may
  // call into Python (see log()).
  std::exception_ptr failed;
  try {
    if (::lstat(path.c_str(), &info) != 0) throw OsError(errno, path);
    if (!S_ISREG(info.st_mode)) {
      reject(path, not_regular_file(path, info.st_mode));
      return std::nullopt;
    }
    auto result = read(path);
    waiting.erase(name);
    warned.erase({Failure::kRead, path});
    return result;
  } catch (const UpdateFileError&) {  // UpdateIncomplete among them
    failed = std::current_exception();
  } catch (const OsError&) {
    failed = std::current_exception();
  }
  const auto* incomplete = exception_as<UpdateIncomplete>(failed);
  const auto* bad = exception_as<UpdateFileError>(failed);
  const auto* os = exception_as<OsError>(failed);
  if (incomplete != nullptr) {
    wait(path, info, *incomplete);
  } else if (bad != nullptr) {
    reject(path, bad->what());
  } else if (os != nullptr && os->code() == ENOENT) {  // another source moved it aside meanwhile
    waiting.erase(name);
  } else if (os != nullptr) {
    warn_once(Failure::kRead, path,
              "update file " + path + " cannot be read (" + os->what() + "); trying again at every poll");
  }
  return std::nullopt;
}

// updates._updates: the complete, wanted updates of the files not seen before, in order, each to
// each(Update&&) until it returns false. The headers of all are read to order them, then each file
// whole when its turn comes (one in memory at a time). A name joins the seen ones when its update is
// applied, rejected, refused or filtered out, never before: a file left when each() stops (or an
// error stops the poll) is read again at the next poll.
template <class Each>
void DirectoryUpdateSource::State::for_each_update(Each each) {
  std::vector<UpdateHeader> heads;
  for (const std::string& name : new_names()) {
    std::optional<UpdateHeader> head = open(name, [](const std::string& path) { return UpdateFile(path).header(); });
    if (!head) continue;
    if (wanted(head->model())) {
      heads.push_back(std::move(*head));
    } else {
      log(LogLevel::kDebug, "update " + name + " of tag " + head->tag + " matches no filter " + filters_repr);
      seen.insert(name);
    }
  }
  std::sort(heads.begin(), heads.end(), [](const UpdateHeader& a, const UpdateHeader& b) {
    if (a.sequence != b.sequence) return a.sequence < b.sequence;
    return py_less(posixpath::basename(a.path), posixpath::basename(b.path));
  });
  const auto read = [&](const std::string& path) { return read_update(path, options.allocate); };
  for (const UpdateHeader& head : heads) {
    std::optional<Update> update = open(posixpath::basename(head.path), read);
    if (update && !each(std::move(*update))) return;  // not held while the next file is read
  }
}

// updates._wait: keep the incomplete file for a later poll; reject it once it has kept its size too long.
void DirectoryUpdateSource::State::wait(const std::string& path, const struct stat& info,
                                        const UpdateIncomplete& error) {
  const std::string name = posixpath::basename(path);
  const std::pair<int64_t, int64_t> state{info.st_size,
                                          int64_t{info.st_mtim.tv_sec} * 1000000000 + info.st_mtim.tv_nsec};
  const double now = options.clock();
  auto previous = waiting.find(name);
  if (previous == waiting.end()) {
    log(LogLevel::kInfo, std::string(error.what()) + "; reading it again until it is complete");
  }
  if (previous == waiting.end() || previous->second.state != state) {
    previous = waiting.insert_or_assign(name, Waiting{state, now}).first;
  }
  if (now - previous->second.since >= options.incomplete_timeout_s) {
    reject(path, std::string(error.what()) + "; its size has not changed for " + py_g(options.incomplete_timeout_s) +
                     " s");
  }
}

// Why `update` may not apply now: a duplicate, or older than an update of its writer and table
// applied; none where it may.
std::optional<std::string> DirectoryUpdateSource::State::refusal(const Update& update) const {
  const auto original = applied.find(fingerprint(update));
  if (original != applied.end()) {
    return "update file " + update.path + ": a duplicate of " + original->second +
           ", applied already (the same writer " + py_hex(update.writer, 18) + ", sequence " +
           std::to_string(update.sequence) + " and checksum " + py_hex(update.checksum, 10) +
           "); write its rows again to apply them again";
  }
  const auto newest_of = newest.find({update.writer, update.tag});
  if (newest_of != newest.end() && update.sequence < newest_of->second) {
    return "update file " + update.path + ": its sequence " + std::to_string(update.sequence) + " is older than " +
           std::to_string(newest_of->second) + ", that of the newest update of " + update.tag +
           " by the same writer (" + py_hex(update.writer, 18) +
           ") applied: it arrived late; applied now it would undo newer rows (and a replay would apply it before "
           "them). Write its rows again with write_update to apply them";
  }
  return std::nullopt;
}

// updates._admit: whether `update` may apply now; otherwise its rows are dropped (before the error
// line) and its file is rejected.
bool DirectoryUpdateSource::State::admit(Update& update) {
  const std::optional<std::string> why = refusal(update);
  if (!why) return true;
  update.keys = nullptr;
  update.values = nullptr;
  update.rows.reset();
  reject(update.path, *why);
  return false;
}

// updates._record: take `update` as applied.
void DirectoryUpdateSource::State::record(const Update& update) {
  const auto [newest_of, made] = newest.try_emplace({update.writer, update.tag}, update.sequence);
  if (!made) newest_of->second = std::max(newest_of->second, update.sequence);
  const std::string name = posixpath::basename(update.path);
  applied[fingerprint(update)] = name;
  seen.insert(name);
  if (warned.erase({Failure::kApply, update.path}) > 0) {
    log(LogLevel::kWarning, "update " + update.path + " applied after it failed");
  }
}

// updates._reject: move the file at `path` to rejected/ (never seen again; a suffix .1, .2, ...
// when its name is taken there), with one error line.
void DirectoryUpdateSource::State::reject(const std::string& path, const std::string& why) {
  const std::string name = posixpath::basename(path);
  seen.insert(name);
  waiting.erase(name);
  warned.erase({Failure::kRead, path});
  warned.erase({Failure::kApply, path});
  const std::string folder = posixpath::join(directory, kRejectedFolder);
  std::string target;
  try {
    make_directories(folder);
    target = posixpath::join(folder, name);
    struct stat st;
    for (int suffix = 1; ::lstat(target.c_str(), &st) == 0; ++suffix) {
      target = posixpath::join(folder, name + "." + std::to_string(suffix));
    }
    if (::rename(path.c_str(), target.c_str()) != 0) throw OsError(errno, path, target);
  } catch (const OsError& error) {
    log(LogLevel::kError, why + "; skipped (moving it to " + folder + " failed: " + error.what() + ")");
    return;
  }
  log(LogLevel::kError, why + "; moved it to " + target);
}

// updates._refuse: apply refused `update`: leave its file for other readers and never try it again.
void DirectoryUpdateSource::State::refuse(const Update& update, const std::string& why) {
  const std::string name = posixpath::basename(update.path);
  seen.insert(name);
  warned.erase({Failure::kApply, update.path});
  unapplied[name] = why;
  log(LogLevel::kError, "update file " + update.path + " cannot be applied by this server: " + why +
                            "; nothing of it applied, the file left in place for other readers and not tried "
                            "again by this source (restart the server to try it again)");
}

// updates._warn_once: `message` as a warning the first time (failure, path) happens, then as a debug line.
void DirectoryUpdateSource::State::warn_once(Failure failure, const std::string& path, const std::string& message) {
  const bool first = warned.insert({failure, path}).second;
  log(first ? LogLevel::kWarning : LogLevel::kDebug, message);
}

// updates._apply: apply `update`, or reject or refuse it; false when it is to be tried again at the next poll.
bool DirectoryUpdateSource::State::apply_one(Update& update, const Apply& apply) {
  if (!admit(update)) return true;
  try {
    apply(update);
  } catch (const std::invalid_argument& error) {  // UpdateRejected and its like: this server can never apply it
    refuse(update, error.what());
    return true;
  } catch (const std::exception& error) {  // e.g. a database down: tried again later
    warn_once(Failure::kApply, update.path,
              "applying update " + update.path + " failed (" + error_type_name(error) + ": " + error.what() +
                  "); trying it again at every poll");
    return false;
  }
  record(update);
  return true;
}

// updates._step: one poll: the new updates are applied in order, until one fails or the source stops.
void DirectoryUpdateSource::State::step(const Run& run, const Apply& apply) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  for_each_update([&](Update&& update) { return !run.stop && apply_one(update, apply); });
  flush_logs();
}

void DirectoryUpdateSource::State::loop(Run& run, const Apply& apply) {
  while (true) {
    try {
      step(run, apply);
    } catch (const std::exception&) {
      log(LogLevel::kError, "the update source of " + directory + " failed; it goes on at the next poll",
          std::current_exception());
    }
    {
      std::lock_guard<std::recursive_mutex> lock(mutex);
      flush_logs();
    }
    std::unique_lock<std::mutex> lock(run_mutex);
    if (wait_seconds(run_changed, lock, options.poll_interval_s, [&] { return run.stop.load(); })) break;
  }
  std::lock_guard<std::mutex> lock(run_mutex);
  run.ended = true;
  run_changed.notify_all();
}

DirectoryUpdateSource::DirectoryUpdateSource(std::string directory, UpdateSourceOptions options)
    : state_(std::make_shared<State>(std::move(directory), std::move(options))) {}

DirectoryUpdateSource::~DirectoryUpdateSource() {
  bool own_thread;
  {
    std::lock_guard<std::mutex> lock(state_->run_mutex);
    own_thread = state_->thread.joinable();
  }
  if (own_thread) stop();
}

std::vector<Update> DirectoryUpdateSource::poll() {
  State& s = *state_;
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  std::vector<Update> ready;
  s.for_each_update([&](Update&& update) {
    if (s.admit(update)) {
      s.record(update);
      ready.push_back(std::move(update));
    }
    return true;
  });
  s.flush_logs();
  return ready;
}

std::map<std::string, std::string> DirectoryUpdateSource::unapplied() const {
  std::lock_guard<std::recursive_mutex> lock(state_->mutex);
  return state_->unapplied;
}

void DirectoryUpdateSource::start(Apply apply, const Launch& launch) {
  State& s = *state_;
  auto run = std::make_shared<Run>();
  std::function<void()> loop = [state = state_, run, apply = std::move(apply)] { state->loop(*run, apply); };
  std::unique_lock<std::mutex> lock(s.run_mutex);
  if (s.current) throw std::logic_error("the update source of " + s.directory + " runs already; stop() it first");
  s.current = run;
  if (!launch) {
    s.thread = std::thread(std::move(loop));
    return;
  }
  lock.unlock();  // launch may wait for its thread, which may take the lock
  try {
    launch(std::move(loop));
  } catch (...) {
    run->stop = true;
    lock.lock();
    if (s.current == run) s.current.reset();
    throw;
  }
}

bool DirectoryUpdateSource::stop(double timeout_s) {
  State& s = *state_;
  std::shared_ptr<Run> run;
  std::thread thread;
  bool ended;
  {
    std::unique_lock<std::mutex> lock(s.run_mutex);
    run = std::move(s.current);
    thread = std::move(s.thread);
    if (!run) return true;
    run->stop = true;
    s.run_changed.notify_all();
    ended = wait_seconds(s.run_changed, lock, timeout_s, [&] { return run->ended; });
  }
  if (ended) {
    if (thread.joinable()) thread.join();
    return true;
  }
  s.log(LogLevel::kError, "the update thread of " + s.directory + " did not stop within " + py_g(timeout_s) +
                              " s (an apply still runs); left to end on its own");
  if (thread.joinable()) thread.detach();
  return false;
}

}  // namespace sok::hps
