// A checkpoint directory opened once for reading, as sok-core's checkpoint/directory.py opens it
// (OpenCheckpoint, read_consistently): every file is opened relative to the directory's descriptor,
// so a sok.dump that swaps another checkpoint into the path meanwhile cannot mix the files of two; a
// read that fails once the path names another directory is read again, at most kReadAttempts times,
// and so is a path found missing with dumps' staging directories beside it (a dump may be between
// the two renames of its swap), after a wait of 5 ms, doubling up to 200 ms; after the last attempt
// the leftovers are named. A dump's staging directory is refused. Messages are directory.py's, word
// for word. Difference: no message is logged (Python warns of a checkpoint without manifest.json,
// NVIDIA SOK's layout, and logs each attempt again).
//
// Example:
//   read_consistently("ckpt", [&](const OpenCheckpoint& ckpt) {
//     auto [key_info, weight_info, rows] = table_files(ckpt.path(), "emb_0", ckpt.fd());
//   });
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "checkpoint_format.hpp"
#include "checkpoint_manifest.hpp"

namespace sok::hps::checkpoint {

// directory.READ_ATTEMPTS: times a reader opens a checkpoint that dumps keep replacing.
constexpr int kReadAttempts = 5;
// directory.STAGING_MARK: the file of a staging directory until its checkpoint is complete.
constexpr char kStagingMark[] = ".sok-staging";
// directory.STAGING_INFIX: the infix of staging directories' names (.<name>.sok-tmp-<random>).
constexpr char kStagingInfix[] = ".sok-tmp-";
// directory.LOCK_SUFFIX: the suffix of a path's dump lock file (.<name>.sok-lock beside it).
constexpr char kLockSuffix[] = ".sok-lock";
// directory._LOCK_POLL_S, _LOCK_POLL_MAX_S: a reader's first wait for a path found missing during a
// dump, and its longest (the wait doubles), in seconds.
constexpr double kLockPollS = 0.005, kLockPollMaxS = 0.2;

// directory.OpenCheckpoint: the directory (O_DIRECTORY) and its validated manifest.
class OpenCheckpoint {
 public:
  // CheckpointError: `path` is missing, a staging directory, or its manifest is invalid;
  // CheckpointChanged: that, once `path` names another directory.
  explicit OpenCheckpoint(const std::string& path);

  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }
  // The manifest, nullptr for NVIDIA SOK's layout (no manifest.json).
  const Manifest* manifest() const { return manifest_ ? &*manifest_ : nullptr; }
  // Whether `path` no longer names the directory opened (a dump swapped another one in).
  bool replaced() const;

 private:
  std::string path_;
  Fd fd_;
  std::optional<Manifest> manifest_;
};

// directory.read_consistently: read(checkpoint) on the checkpoint at `path`, opened and read again
// when a dump replaced it meanwhile (read must change nothing when it throws). An exception of read
// that is no CheckpointError nor OsError (py_errors.hpp) passes as it is.
void read_consistently(const std::string& path, const std::function<void(const OpenCheckpoint&)>& read);

}  // namespace sok::hps::checkpoint
