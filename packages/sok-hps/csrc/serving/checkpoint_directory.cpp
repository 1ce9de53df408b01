// A checkpoint directory opened once for reading, as directory.py (checkpoint_directory.hpp).
#include "checkpoint_directory.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "python_text.hpp"

namespace sok::hps::checkpoint {
namespace {

namespace text = python_text;

// directory._changed: the error `what`, raised reading `path` once a dump replaced it.
CheckpointChanged changed(const std::string& path, const std::string& what) {
  return CheckpointChanged(path + " changed while it was read: another sok.dump replaced it and deleted the files " +
                           "being read (" + what + "); read it again");
}

// os.path.isfile: a regular file, symbolic links followed.
bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// directory._refuse_staging: refuse `path` when it is a dump's staging directory (by its name, or
// `marked`: it holds the marker file).
void refuse_staging(const std::string& path, bool marked) {
  if (text::basename(text::abspath(path)).find(kStagingInfix) == std::string::npos && !marked) return;
  const bool complete = !marked && is_file(text::join(path, kManifest));
  throw CheckpointError(path + " is the staging directory of a sok.dump that did not finish (" +
                        (complete ? "its files are all written" : "it is incomplete") + "); " +
                        (complete ? "rename it to a name of your own to load it" : "it cannot be loaded"));
}

// format.read_manifest_bytes: the bytes of the manifest of the directory `dir_fd`, unchecked, or
// nothing (NVIDIA SOK's layout).
std::optional<std::string> read_manifest_bytes(const std::string& path, int dir_fd) {
  const std::string file = text::join(path, kManifest);
  if (!exists(file, dir_fd)) return std::nullopt;
  const std::string invalid = file + " is not a valid manifest (UTF-8 JSON): ";
  Fd fd;
  try {
    fd = open_file(file, dir_fd);
  } catch (const text::OsError& error) {
    throw CheckpointError(invalid + error.what());
  }
  std::string raw;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t count = ::read(fd.get(), buffer, sizeof(buffer));
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw CheckpointError(invalid + text::OsError(errno).what());
    if (count == 0) return raw;
    raw.append(buffer, static_cast<size_t>(count));
  }
}

}  // namespace

OpenCheckpoint::OpenCheckpoint(const std::string& path)
    : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
  if (fd_.get() < 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw CheckpointError("no checkpoint directory at " + path);
    throw text::OsError(errno, path);
  }
  try {
    refuse_staging(path, exists(kStagingMark, fd()));
    if (const auto raw = read_manifest_bytes(path, fd())) manifest_ = parse_manifest(*raw, text::join(path, kManifest));
  } catch (const CheckpointError& error) {
    if (!replaced()) throw;
    throw changed(path, error.what());
  } catch (const text::OsError& error) {
    if (!replaced()) throw;
    throw changed(path, error.what());
  }
}

bool OpenCheckpoint::replaced() const {
  struct stat at_path, opened;
  if (::stat(path_.c_str(), &at_path) != 0) return true;
  if (::fstat(fd(), &opened) != 0) throw text::OsError(errno);
  return at_path.st_dev != opened.st_dev || at_path.st_ino != opened.st_ino;
}

void read_consistently(const std::string& path, const std::function<void(const OpenCheckpoint&)>& read) {
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
      } catch (const text::OsError& error) {
        if (!ckpt.replaced()) throw;
        throw changed(path, error.what());
      }
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
