// The files of a SOK checkpoint, read as sok-core's sparse_operation_kit/checkpoint/format.py reads
// them (its spec: docs/design/checkpoint-format.md): the 296-byte headers of NVIDIA SOK, a table's key
// and weight files checked against each other and against manifest.json (checkpoint_manifest.hpp),
// the key file read whole and checked against its CRC-32. Only what the C++ server's model files
// (model_files.hpp) read: no writing, no optimizer state. Every message is format.py's, word for word
// (tests/test_model_files_cpp.py holds them equal); the constants mirror format.py's, named beside
// each.
//
// A file is opened as format.open_file opens it: relative to the checkpoint directory opened once
// (checkpoint_directory.hpp), never through a symbolic link, and only when it is a regular file.
//
// Example:
//   auto [key_info, weight_info, rows] = table_files("ckpt", "emb_0", dir_fd);
//   std::vector<int64_t> keys = read_keys(key_info, "fc11b5d4");
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace sok::hps::checkpoint {

// format.HEADER_BYTES: NVIDIA SOK's header before each file's payload.
constexpr int64_t kHeaderBytes = 296;
// format.FILE_KEY, FILE_WEIGHT, FILE_STATE: the header's file types.
constexpr uint32_t kFileKey = 0, kFileWeight = 1, kFileState = 2;
// format.INDEX_DTYPE: the header's data type indices -> dtype names (and their sizes in bytes).
constexpr const char* kIndexDtype[] = {"int32", "int64", "uint32", "uint64", "float16", "float32", "float64"};
constexpr int64_t kIndexItemsize[] = {4, 8, 4, 8, 2, 4, 8};
// format.KEY_FILE_DTYPES: the dtypes a key file may hold.
constexpr const char* kKeyFileDtypes[] = {"int32", "int64", "uint32", "uint64"};
// The suffixes of format.key_file and format.weight_file: <table>-key, <table>-weight.
constexpr char kKeySuffix[] = "-key";
constexpr char kWeightSuffix[] = "-weight";

// format.CheckpointError: a checkpoint file is missing, truncated, corrupt or inconsistent.
class CheckpointError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// format.CheckpointChanged: another sok.dump replaced the checkpoint while it was read.
class CheckpointChanged : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// A file descriptor, closed with its owner.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release();

 private:
  int fd_;
};

// format.FileInfo: what a file's header and size say (dir_fd: the directory it is opened in, or -1).
struct FileInfo {
  std::string path;
  uint32_t file_type = 0;
  std::string dtype;
  int64_t itemsize = 0;
  int64_t elements = 0;
  int dir_fd = -1;
};

// The names, comma-separated (as Python's ", ".join(names)).
template <size_t N>
std::string joined(const char* const (&names)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) out += (i ? ", " : "") + std::string(names[i]);
  return out;
}

std::string key_file(const std::string& table);
std::string weight_file(const std::string& table);

// format.check_name: `name` when it is a plain name inside one directory, else CheckpointError.
const std::string& check_name(const std::string& name, const std::string& what, const std::string& where);

// format.open_file: `path` (basename(path) relative to dir_fd when dir_fd >= 0), read-only, never
// through a symbolic link, a regular file. CheckpointError: missing, a symbolic link or a special
// file; OsError (py_errors.hpp): a directory (EISDIR, as Python's os.fdopen says it) or another error
// of the system.
Fd open_file(const std::string& path, int dir_fd);

// format.exists: whether `path` (basename(path) relative to dir_fd when >= 0) names an entry (a
// symbolic link too: not followed).
bool exists(const std::string& path, int dir_fd);

// format.read_header: the file's header and size, checked.
FileInfo read_header(const std::string& path, int dir_fd);

// format.table_files: the key and weight files of `table` in the checkpoint `path`, checked against
// each other: (key info, weight info, rows).
std::tuple<FileInfo, FileInfo, int64_t> table_files(const std::string& path, const std::string& table, int dir_fd);

// format.read_payload(key_info, 1, expected_crc): every key of a key file with rows, as int64 (uint64
// keeps its bits, int32 and uint32 widen), checked against the manifest's CRC-32 (8 hex digits) when
// one is given.
std::vector<int64_t> read_keys(const FileInfo& key_info, const std::optional<std::string>& expected_crc);

}  // namespace sok::hps::checkpoint
