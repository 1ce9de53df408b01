// The tables of sparse_files, as model_files.py reads them (model_files.hpp).
#include "model_files.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "checkpoint_directory.hpp"
#include "checkpoint_format.hpp"
#include "checkpoint_manifest.hpp"
#include "crc32.hpp"
#include "py_errors.hpp"
#include "py_path.hpp"
#include "py_text.hpp"

namespace sok::hps {
namespace {

namespace ckpt = checkpoint;

// A file's first `length` bytes, memory-mapped read-only (the mapping outlives the descriptor).
class Mapping {
 public:
  Mapping() = default;
  Mapping(int fd, size_t length) : length_(length) {
    base_ = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      throw OsError(errno);
    }
    ::madvise(base_, length, MADV_SEQUENTIAL);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base_ != nullptr) ::munmap(base_, length_);
  }
  const char* bytes() const { return static_cast<const char*>(base_); }

 private:
  void* base_ = nullptr;
  size_t length_ = 0;
};

// os.path.isfile: a regular file, symbolic links followed (a path holding NUL is none, as Python's).
bool is_file(const std::string& path) {
  struct stat st;
  return path.find('\0') == std::string::npos && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// os.path.getsize.
int64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw OsError(errno, path);
  return st.st_size;
}

// str() of a Python int that may pass int64.
std::string to_string(__int128 value) {
  if (value < 0) return "-" + to_string(-value);
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  } while (value > 0);
  return digits;
}

// Map the payload of the open file `fd` (`path`): `bytes` bytes after `offset`; the file must still
// hold them (it may have been truncated since its size was checked).
std::unique_ptr<Mapping> map_payload(int fd, int64_t offset, int64_t bytes, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw OsError(errno);
  if (st.st_size < offset + bytes) {
    throw ckpt::CheckpointError("checkpoint file " + path + " is truncated: it ended " +
                                std::to_string(offset + bytes - st.st_size) + " bytes early while being read");
  }
  return std::make_unique<Mapping>(fd, static_cast<size_t>(offset + bytes));
}

}  // namespace

struct TableSource::Data {
  std::string path;
  int64_t rows = 0;
  int64_t dim = 0;
  std::string format;
  std::vector<int64_t> keys;
  std::unique_ptr<Mapping> file;  // the file of the rows, mapped (none for a table without rows)
  const float* vectors = nullptr;  // (rows, dim), in `file`
  std::string header;              // the checkpoint weight file's header ("" for "hps")
  std::optional<std::string> crc32;  // the manifest's checksum of the weight file

  // model_files.TableSource._check_crc.
  void check_crc(uint32_t crc) const {
    if (crc32_hex(crc) != *crc32) {
      throw ModelFileError(path + ": the weight file does not match the checkpoint's checksum (" + crc32_hex(crc) +
                           " != " + *crc32 + "): the file is corrupt; dump the checkpoint again");
    }
  }
};

namespace {

// model_files._open_hps.
std::shared_ptr<TableSource::Data> open_hps(const std::string& path, int64_t dim) {
  const std::string key_path = posixpath::join(path, kKeyFile), vec_path = posixpath::join(path, kVectorFile);
  if (!is_file(vec_path)) {
    throw ModelFileError(vec_path + " is missing: a sparse-model directory holds " + py_repr(kKeyFile) + " and " +
                         py_repr(kVectorFile));
  }
  const int64_t key_bytes = file_size(key_path), vec_bytes = file_size(vec_path);
  for (const auto& [file, size, item] : {std::tuple{key_path, key_bytes, 8}, std::tuple{vec_path, vec_bytes, 4}}) {
    if (size == 0) throw ModelFileError(file + " is empty: a table needs at least one row");
    if (size % item) {
      throw ModelFileError(file + " has " + std::to_string(size) + " bytes, not a whole number of " +
                           std::to_string(item) + "-byte values: it is truncated");
    }
  }
  const int64_t rows = key_bytes / 8;
  const __int128 expected = static_cast<__int128>(rows) * dim * 4;
  if (vec_bytes != expected) {
    char found[32];
    std::snprintf(found, sizeof(found), "%g", static_cast<double>(vec_bytes) / static_cast<double>(rows * 4));
    throw ModelFileError(vec_path + " has " + std::to_string(vec_bytes) + " bytes; " + std::to_string(rows) +
                         " keys x dim " + std::to_string(dim) + " x 4 bytes would be " + to_string(expected) +
                         ". The file holds " + found +
                         " floats per key: set embedding_vecsize_per_table to the table's dim, or rewrite the files");
  }
  auto data = std::make_shared<TableSource::Data>();
  data->path = path;
  data->rows = rows;
  data->dim = dim;
  data->format = "hps";
  data->keys.resize(static_cast<size_t>(rows));
  const ckpt::Fd keys(::open(key_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (keys.get() < 0) throw OsError(errno, key_path);
  for (size_t done = 0; done < static_cast<size_t>(key_bytes);) {
    const ssize_t count = ::read(keys.get(), reinterpret_cast<char*>(data->keys.data()) + done, key_bytes - done);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw OsError(errno);
    if (count == 0) throw ModelFileError(key_path + " has " + std::to_string(done) + " bytes, not " +
                                         std::to_string(key_bytes) + ": it was truncated while being read");
    done += static_cast<size_t>(count);
  }
  const ckpt::Fd vectors(::open(vec_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (vectors.get() < 0) throw OsError(errno, vec_path);
  data->file = map_payload(vectors.get(), 0, vec_bytes, vec_path);
  data->vectors = reinterpret_cast<const float*>(data->file->bytes());
  return data;
}

// model_files._open_checkpoint: the table read through one handle of the checkpoint directory.
std::shared_ptr<TableSource::Data> open_checkpoint(const std::string& path, const std::string& directory,
                                                   const std::string& table, int64_t dim) {
  std::shared_ptr<TableSource::Data> data;
  const auto read = [&](const ckpt::OpenCheckpoint& checkpoint) {
    auto [key_info, weight_info, rows] = ckpt::table_files(checkpoint.path(), table, checkpoint.fd());
    const int64_t found = rows ? weight_info.elements / rows : dim;
    if (found != dim) {
      throw ModelFileError(weight_info.path + " holds rows of " + std::to_string(found) +
                           " floats, but the ps_config gives dim " + std::to_string(dim) +
                           ": set embedding_vecsize_per_table to the table's dim");
    }
    const ckpt::TableEntry* entry =
        ckpt::check_against_manifest(directory, table, checkpoint.manifest(), key_info, weight_info, dim);
    const auto crc_of = [&](const ckpt::FileInfo& info) -> std::optional<std::string> {
      const std::string* crc = entry ? entry->crc32_of(posixpath::basename(info.path)) : nullptr;
      return crc ? std::optional<std::string>(*crc) : std::nullopt;
    };
    auto out = std::make_shared<TableSource::Data>();
    out->path = path;
    out->rows = rows;
    out->dim = dim;
    out->format = "sok";
    if (rows) out->keys = ckpt::read_keys(key_info, crc_of(key_info));
    const ckpt::Fd weights = ckpt::open_file(weight_info.path, weight_info.dir_fd);
    out->header.resize(ckpt::kHeaderBytes);
    const ssize_t count = ::pread(weights.get(), out->header.data(), out->header.size(), 0);
    if (count < 0) throw OsError(errno);
    out->header.resize(static_cast<size_t>(count));
    if (rows) {
      out->file = map_payload(weights.get(), ckpt::kHeaderBytes, weight_info.elements * 4, weight_info.path);
      out->vectors = reinterpret_cast<const float*>(out->file->bytes() + ckpt::kHeaderBytes);
    }
    out->crc32 = crc_of(weight_info);
    data = std::move(out);
  };
  try {
    ckpt::read_consistently(directory, read);
  } catch (const ckpt::CheckpointError& error) {
    throw ModelFileError(path + ": " + error.what());
  }
  return data;
}

}  // namespace

const std::string& TableSource::path() const { return data_->path; }
int64_t TableSource::rows() const { return data_->rows; }
int64_t TableSource::dim() const { return data_->dim; }
const std::string& TableSource::format() const { return data_->format; }
const std::vector<int64_t>& TableSource::keys() const { return data_->keys; }

void TableSource::verify() const {
  const Data& d = *data_;
  if (!d.crc32) return;
  const uint32_t crc = update_crc32(d.header.data(), d.header.size());
  d.check_crc(update_crc32(d.vectors, static_cast<size_t>(d.rows * d.dim) * sizeof(float), crc));
}

TableChunks TableSource::chunks(int64_t chunk_rows) const {
  if (chunk_rows < 1) throw std::invalid_argument("chunk_rows must be >= 1, got " + std::to_string(chunk_rows));
  return TableChunks(data_, chunk_rows);
}

TableChunks::TableChunks(std::shared_ptr<const TableSource::Data> data, int64_t chunk_rows)
    : data_(std::move(data)), chunk_rows_(chunk_rows) {
  if (data_->crc32) crc_ = update_crc32(data_->header.data(), data_->header.size());
}

int64_t TableChunks::next_size() const { return done_ ? 0 : std::min(chunk_rows_, data_->rows - first_); }

int64_t TableChunks::next(int64_t* keys, float* rows) {
  const TableSource::Data& d = *data_;
  const int64_t n = next_size();
  if (n > 0) {
    const size_t bytes = static_cast<size_t>(n * d.dim) * sizeof(float);
    std::memcpy(keys, d.keys.data() + first_, static_cast<size_t>(n) * sizeof(int64_t));
    std::memcpy(rows, d.vectors + first_ * d.dim, bytes);
    if (d.crc32) crc_ = update_crc32(rows, bytes, crc_);
    first_ += n;
    return n;
  }
  if (!done_) {
    done_ = true;
    if (d.crc32) d.check_crc(crc_);
  }
  return 0;
}

TableSource open_table(const std::string& path, int64_t dim) {
  if (dim < 1) throw ModelFileError(path + ": dim must be >= 1, got " + std::to_string(dim));
  if (is_file(posixpath::join(path, kKeyFile))) return TableSource(open_hps(path, dim));
  const auto [directory, table] = posixpath::split(posixpath::normpath(path));
  if (is_file(posixpath::join(directory, ckpt::key_file(table)))) {
    return TableSource(open_checkpoint(path, directory, table, dim));
  }
  throw ModelFileError(path + ": no table there; expected a sparse-model directory with the files " +
                       py_repr(kKeyFile) + " and " + py_repr(kVectorFile) +
                       ", or <checkpoint dir>/<table> of a sok.dump checkpoint (files <table>-key and "
                       "<table>-weight); check sparse_files in the ps_config");
}

}  // namespace sok::hps
