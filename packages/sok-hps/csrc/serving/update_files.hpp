// The files of online updates: one file per table and dump, written by training and applied by
// every server that reads the update directory (update_source.hpp). This is the one implementation
// of the format: hierarchical_parameter_server/updates.py (its docstring is the format's spec)
// calls it through _serving (py_update_source.cpp), and the C++ server calls it directly. Every
// check and message is updates.py's as it was when Python read the files
// (tests/test_update_files_cpp.py holds them to a reader written after that spec).
//
// File format (version kUpdateFormatVersion; all little-endian):
//   u32   magic 0x52544348 (the bytes HCTR, as the Kafka payload of NVIDIA's HPS)
//   u32   value size in bytes (4 * dim)
//   u16   format version (2)
//   u16   key size in bytes (8: int64 keys; uint64 keys keep their bits)
//   u32   length of the tag in bytes (at most kMaxTagBytes)
//   u64   sequence: the time of the write in ns, strictly increasing in the writing process
//   u64   writer: 8 random bytes (never 0) drawn once per writing thread (again in a forked child)
//   tag   UTF-8, hps_et.<model>.<table>
//   u64   number of rows n
//   n x   [key: 8 bytes][value: value size bytes of float32]
//   u32   CRC-32 (zlib's, crc32.hpp) of every byte before it
// Version 1 (before the sequence) has no sequence or writer field; it is still read, its sequence
// is the time its name starts with (<20 digits>-...) and its writer is 0.
//
// A file is read from its header first (a 32-byte read tells a junk file; the size the header
// declares is compared with the file's before anything else is read), its rows in chunks of
// kUpdateChunkBytes into memory the caller's RowAllocator gives (Python's: NumPy arrays). A file is
// written under a hidden temporary name in its directory (stage_update), then renamed into place
// as <sequence, 20 digits>-<pid>-<counter, at least 6 digits>.hpsu (write_update; Python's
// write_update renames it with os.replace).
//
// Where this reader differs from updates.py's Python reader (files no writer makes):
// * a version-1 name's time is 20 ASCII digits (Python's \d takes any Unicode digit) and at most
//   2**64 - 1: a larger one is refused with its own message;
// * a file that shrinks while its header is read is incomplete ("it ended while it was read"),
//   where Python failed in struct.unpack.
//
// Example:
//   std::string path = sok::hps::write_update("updates", "foo", "t", keys, values, n, dim);
//   sok::hps::Update update = sok::hps::read_update(path);
//   update.tag;        // "hps_et.foo.t"
//   update.values[0];  // values: float [update.count, update.dim]
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "checkpoint_format.hpp"
#include "ps_config.hpp"

namespace sok::hps {

// updates.MAGIC: the first 4 bytes of every update file, "HCTR".
constexpr uint32_t kUpdateMagic = 0x52544348;
// updates.FORMAT_VERSION: the version write_update writes (1 is read too).
constexpr uint16_t kUpdateFormatVersion = 2;
// updates.SUFFIX: the suffix of an update file's name; other names in the directory are not updates.
constexpr char kUpdateSuffix[] = ".hpsu";
// updates.REJECTED: the folder of the update directory the files bad for every reader are moved to.
constexpr char kRejectedFolder[] = "rejected";
// The longest tag: len("hps_et..") + 2 names of kMaxNameLength.
constexpr uint32_t kMaxTagBytes = 8 + 2 * kMaxNameLength;
// The bytes of rows read at a time.
constexpr size_t kUpdateChunkBytes = size_t{8} << 20;
// The widest row a file holds: its value size (4 * dim) is a u32.
constexpr uint32_t kMaxUpdateDim = UINT32_MAX / 4;

// updates.UpdateFileError: an update file that cannot be applied; the message names the file and
// what is wrong.
class UpdateFileError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// updates.UpdateIncomplete: an update file shorter than its header says (truncated, or still being
// copied in).
class UpdateIncomplete : public UpdateFileError {
 public:
  using UpdateFileError::UpdateFileError;
};

// What a file's header says, checked.
struct UpdateHeader {
  std::string path;
  uint16_t version = 0;
  uint32_t dim = 0;
  std::string tag;  // hps_et.<model>.<table>
  uint64_t count = 0;
  uint64_t sequence = 0;  // version 1: the time its name starts with
  uint64_t writer = 0;    // 0 in version 1

  std::string model() const;  // the tag's <model>
};

// The memory of the rows of one update: keys (count,), values (count, dim), kept alive by `owner`.
struct UpdateRows {
  int64_t* keys = nullptr;
  float* values = nullptr;
  std::shared_ptr<void> owner;
};

// Gives the memory the rows of an update of `count` rows of `dim` are read into; may throw (no
// memory), which the reader passes on.
using RowAllocator = std::function<UpdateRows(uint64_t count, uint32_t dim)>;

// The default RowAllocator: two std::vectors.
UpdateRows allocate_rows(uint64_t count, uint32_t dim);

// The rows of one update file (updates.Update).
struct Update {
  std::string tag;  // hps_et.<model>.<table>
  uint64_t count = 0;
  uint32_t dim = 0;
  const int64_t* keys = nullptr;  // (count,)
  const float* values = nullptr;  // (count, dim)
  std::string path;               // the file it came from
  uint64_t sequence = 0;          // its place in the order of updates
  uint16_t version = kUpdateFormatVersion;
  uint32_t checksum = 0;        // the file's CRC-32
  uint64_t writer = 0;          // the id of the thread that wrote it (0: version 1)
  std::shared_ptr<void> rows;   // owns keys and values (UpdateRows::owner)
};

// An update file opened and its header checked; read() reads its rows. Never follows a symbolic
// link, never waits on a FIFO (both an UpdateFileError).
class UpdateFile {
 public:
  // Throws UpdateIncomplete, UpdateFileError (not a regular file, wrong magic or version, a bad tag,
  // data after the end the header gives, a version-1 file whose name holds no time), and OsError
  // (py_errors.hpp) where the file cannot be opened or read.
  explicit UpdateFile(const std::string& path);
  const UpdateHeader& header() const { return header_; }
  // Reads and checks the rows, once: the errors of the constructor, and UpdateFileError on a
  // checksum mismatch. What `allocate` throws is passed on.
  Update read(const RowAllocator& allocate = allocate_rows);

 private:
  void read_header();

  checkpoint::Fd fd_;
  uint64_t size_ = 0;
  UpdateHeader header_;
  uint32_t header_crc_ = 0;  // CRC-32 of the header's bytes
};

// updates.read_update: the checked update of the file at `path` (UpdateFile's errors).
Update read_update(const std::string& path, const RowAllocator& allocate = allocate_rows);

// The message of a file that is no regular file, of st_mode `mode` (no update is followed or waited on).
std::string not_regular_file(const std::string& path, unsigned mode);

// Throws std::invalid_argument where `name` (of a `what`: "model" or "table") is not a name of
// NAME_PATTERN, the name as repr() writes a str.
void check_update_name(const char* what, const std::string& name);
// That message, for a name whose repr() is `name_repr` (the Python binding's names of other types).
std::string update_name_error(const char* what, const std::string& name_repr);

// An update file written and synced under a hidden temporary name (".XXXXXX.tmp") in its directory;
// renaming `temporary` to `path` makes it visible.
struct StagedUpdate {
  std::string temporary;
  std::string path;
};

// The update of `count` rows (keys (count,), values (count, dim)) of table `table` of model `model`
// written under a temporary name in `directory` (made when missing); its sequence is the time of the
// write, later than any this process wrote before; its writer is this thread's id. Throws
// std::invalid_argument (a name not of NAME_PATTERN, dim 0 or above kMaxUpdateDim) and OsError
// (nothing is left behind).
StagedUpdate stage_update(const std::string& directory, const std::string& model, const std::string& table,
                          const int64_t* keys, const float* values, uint64_t count, uint64_t dim);

// updates.write_update: stage_update, then the rename into place; returns the file's path. Throws as
// stage_update does, and OsError where the rename fails (the temporary file removed).
std::string write_update(const std::string& directory, const std::string& model, const std::string& table,
                         const int64_t* keys, const float* values, uint64_t count, uint64_t dim);

// The sequence of the next update this process writes: the time in ns, or one more than the last
// sequence drawn when that is not older.
uint64_t next_update_sequence();
// This thread's writer id: 8 random bytes, never 0, drawn at its first write and again in a forked
// child.
uint64_t update_writer_id();

// os.makedirs(path, exist_ok=True). Throws OsError.
void make_directories(const std::string& path);

}  // namespace sok::hps
