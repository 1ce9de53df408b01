// A checkpoint directory opened once for reading, as directory.py (checkpoint_directory.hpp).
#include "checkpoint_directory.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "py_errors.hpp"
#include "py_path.hpp"

namespace sok::hps::checkpoint {
namespace {

// directory._changed: the error `what`, raised reading `path` once a dump replaced it.
CheckpointChanged changed(const std::string& path, const std::string& what) {
  return CheckpointChanged(path + " changed while it was read: another sok.dump replaced it and deleted the files " +
                           "being read (" + what + "); read it again");
}

// directory._MissingDuringDump: `path` is missing and dumps' leftovers lie beside it.
class MissingDuringDump : public CheckpointChanged {
 public:
  using CheckpointChanged::CheckpointChanged;
};

// os.path.isfile: a regular file, symbolic links followed.
bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// os.path.exists and os.path.lexists.
bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool link_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// os.path.realpath: symbolic links resolved; the part of the path that does not exist kept as it is.
std::string real_path(const std::string& path) {
  const std::string absolute = posixpath::abspath(path);
  char resolved[PATH_MAX];
  if (::realpath(absolute.c_str(), resolved) != nullptr) return resolved;
  const auto [head, tail] = posixpath::split(absolute);
  if (head == absolute || tail.empty()) return absolute;
  return posixpath::join(real_path(head), tail);
}

// directory.leftovers: staging directories and set-aside checkpoints of dumps of `path` beside it.
std::vector<std::string> leftovers(const std::string& path) {
  const auto [parent, name] = posixpath::split(real_path(path));
  const std::string prefix = "." + name + kStagingInfix;
  std::vector<std::string> out;
  DIR* dir = ::opendir(parent.c_str());
  if (dir == nullptr) return out;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view entry_name = entry->d_name;
    if (entry_name.substr(0, prefix.size()) == prefix) out.push_back(posixpath::join(parent, entry_name));
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

// directory._lock_path: the dump lock file of `path`.
std::string lock_path(const std::string& path) {
  const auto [parent, name] = posixpath::split(real_path(path));
  return posixpath::join(parent, "." + name + kLockSuffix);
}

// directory._locked: whether a process holds a flock of `path` (False when it cannot be opened).
bool locked(const std::string& path) {
  const Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return false;
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return false;  // released with the descriptor
  return errno == EWOULDBLOCK;
}

// directory.is_complete: a leftover holding a whole checkpoint (its manifest, no marker).
bool is_complete(const std::string& path) {
  return is_file(posixpath::join(path, kManifest)) && !path_exists(posixpath::join(path, kStagingMark));
}

std::string comma_joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// directory._missing_error: `path` found missing, with leftovers beside it, at the last attempt.
[[noreturn]] void throw_missing_error(const std::string& path) {
  std::vector<std::string> running;
  for (const auto& leftover : leftovers(path)) {
    if (locked(leftover)) running.push_back(leftover);
  }
  if (locked(lock_path(path))) running.push_back(lock_path(path));
  if (!running.empty()) {
    throw CheckpointChanged("no checkpoint directory at " + path + " yet: a sok.dump of it is running (" +
                            comma_joined(running) + " locked); read it once that dump has ended");
  }
  if (link_exists(path)) {
    throw CheckpointChanged(path + " was missing and reappeared (a sok.dump swapped it in); read it again");
  }
  const std::vector<std::string> left = leftovers(path);
  std::vector<std::string> whole;
  for (const auto& leftover : left) {
    if (is_complete(leftover)) whole.push_back(leftover);
  }
  std::string hint = left.empty() ? "" : "; interrupted dumps of it left " + comma_joined(left);
  if (!whole.empty()) {
    hint += " (" + comma_joined(whole) + " holds a complete checkpoint: rename it to " + path + " to load it)";
  }
  throw CheckpointError("no checkpoint directory at " + path + hint);
}

// directory._refuse_staging: refuse `path` when it is a dump's staging directory (by its name, or
// `marked`: it holds the marker file).
void refuse_staging(const std::string& path, bool marked) {
  if (posixpath::basename(posixpath::abspath(path)).find(kStagingInfix) == std::string::npos && !marked) return;
  const bool complete = !marked && is_file(posixpath::join(path, kManifest));
  throw CheckpointError(path + " is the staging directory of a sok.dump that did not finish (" +
                        (complete ? "its files are all written" : "it is incomplete") + "); " +
                        (complete ? "rename it to a name of your own to load it" : "it cannot be loaded"));
}

// format.read_manifest_bytes: the bytes of the manifest of the directory `dir_fd`, unchecked, or
// nothing (NVIDIA SOK's layout).
std::optional<std::string> read_manifest_bytes(const std::string& path, int dir_fd) {
  const std::string file = posixpath::join(path, kManifest);
  if (!exists(file, dir_fd)) return std::nullopt;
  const std::string invalid = file + " is not a valid manifest (UTF-8 JSON): ";
  Fd fd;
  try {
    fd = open_file(file, dir_fd);
  } catch (const OsError& error) {
    throw CheckpointError(invalid + error.what());
  }
  std::string raw;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t count = ::read(fd.get(), buffer, sizeof(buffer));
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw CheckpointError(invalid + OsError(errno).what());
    if (count == 0) return raw;
    raw.append(buffer, static_cast<size_t>(count));
  }
}

}  // namespace

OpenCheckpoint::OpenCheckpoint(const std::string& path)
    : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
  if (fd_.get() < 0) {
    if (errno != ENOENT && errno != ENOTDIR) throw OsError(errno, path);
    if (link_exists(path) || leftovers(path).empty()) throw CheckpointError("no checkpoint directory at " + path);
    throw MissingDuringDump("no checkpoint directory at " + path +
                            ", and sok.dump staging directories lie beside it: a dump may be swapping a new "
                            "checkpoint in; read it again");
  }
  try {
    refuse_staging(path, exists(kStagingMark, fd()));
    if (const auto raw = read_manifest_bytes(path, fd())) {
      manifest_ = parse_manifest(*raw, posixpath::join(path, kManifest));
    }
  } catch (const CheckpointError& error) {
    if (!replaced()) throw;
    throw changed(path, error.what());
  } catch (const OsError& error) {
    if (!replaced()) throw;
    throw changed(path, error.what());
  }
}

bool OpenCheckpoint::replaced() const {
  struct stat at_path, opened;
  if (::stat(path_.c_str(), &at_path) != 0) return true;
  if (::fstat(fd(), &opened) != 0) throw OsError(errno);
  return at_path.st_dev != opened.st_dev || at_path.st_ino != opened.st_ino;
}

void read_consistently(const std::string& path, const std::function<void(const OpenCheckpoint&)>& read) {
  double delay = kLockPollS;
  for (int attempt = 1;; ++attempt) {
    try {
      const OpenCheckpoint ckpt(path);
      try {
        read(ckpt);
        return;
      } catch (const CheckpointChanged&) {
        throw;
      } catch (const CheckpointError& error) {
        if (!ckpt.replaced()) throw;
        throw changed(path, error.what());
      } catch (const OsError& error) {
        if (!ckpt.replaced()) throw;
        throw changed(path, error.what());
      }
    } catch (const MissingDuringDump&) {
      if (attempt >= kReadAttempts) throw_missing_error(path);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      delay = std::min(2 * delay, kLockPollMaxS);
    } catch (const CheckpointChanged&) {
      if (attempt >= kReadAttempts) {
        throw CheckpointChanged(path + " changed while it was read, " + std::to_string(kReadAttempts) +
                                " times in a row: other sok.dump calls keep replacing it; read it while no dump of it "
                                "runs");
      }
    }
  }
}

}  // namespace sok::hps::checkpoint
