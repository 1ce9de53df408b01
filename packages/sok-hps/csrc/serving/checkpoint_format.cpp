// The files of a SOK checkpoint, as format.py reads them (checkpoint_format.hpp).
#include "checkpoint_format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "crc32.hpp"
#include "py_errors.hpp"
#include "py_path.hpp"
#include "py_text.hpp"

namespace sok::hps::checkpoint {
namespace {

uint32_t big_endian32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 | static_cast<uint32_t>(p[2]) << 8 |
         static_cast<uint32_t>(p[3]);
}

// format._read_exactly: fill `bytes` bytes at `out` from fd; CheckpointError when the file ends first.
void read_exactly(int fd, void* out, size_t bytes, const std::string& path) {
  auto* at = static_cast<char*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t count = ::read(fd, at + done, bytes - done);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw OsError(errno);
    if (count == 0) {
      throw CheckpointError("checkpoint file " + path + " is truncated: it ended " + std::to_string(bytes - done) +
                            " bytes early while being read");
    }
    done += static_cast<size_t>(count);
  }
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

std::string key_file(const std::string& table) { return table + kKeySuffix; }

std::string weight_file(const std::string& table) { return table + kWeightSuffix; }

const std::string& check_name(const std::string& name, const std::string& what, const std::string& where) {
  const char* rule = nullptr;
  if (name.empty()) {
    rule = "it is empty";
  } else if (name == "." || name == "..") {
    rule = "it is '.' or '..'";
  } else if (name.find('/') != std::string::npos) {
    rule = "it contains a path separator";
  } else if (name.find('\0') != std::string::npos) {
    rule = "it contains a NUL character";
  } else {
    return name;
  }
  throw CheckpointError((where.empty() ? "" : where + ": ") + what + " " + py_repr(name) + " is refused: " + rule +
                        "; table and file names of a checkpoint are plain names inside its directory (not empty, "
                        "not '.' or '..', no path separator, no NUL). The checkpoint is corrupt or was not written "
                        "by sok.dump");
}

Fd open_file(const std::string& path, int dir_fd) {
  const std::string name = dir_fd < 0 ? path : posixpath::basename(path);
  const std::string not_regular = "checkpoint file " + path +
                                  " is not a regular file (a symbolic link, a directory or a special file); sok reads "
                                  "only the files inside the checkpoint: put the file itself there";
  Fd fd(::openat(dir_fd < 0 ? AT_FDCWD : dir_fd, name.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw CheckpointError("checkpoint file " + path + " is missing");
    if (errno == ELOOP) throw CheckpointError(not_regular);
    throw OsError(errno, name);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw OsError(errno);
  if (S_ISDIR(st.st_mode)) throw OsError(EISDIR);  // as os.fdopen refuses it, before format.py checks
  if (!S_ISREG(st.st_mode)) throw CheckpointError(not_regular);
  return fd;
}

bool exists(const std::string& path, int dir_fd) {
  const std::string name = dir_fd < 0 ? path : posixpath::basename(path);
  struct stat st;
  if (::fstatat(dir_fd < 0 ? AT_FDCWD : dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw OsError(errno, name);
}

FileInfo read_header(const std::string& path, int dir_fd) {
  const Fd fd = open_file(path, dir_fd);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw OsError(errno);
  const int64_t size = st.st_size;
  if (size < kHeaderBytes) {
    throw CheckpointError("checkpoint file " + path + " is truncated: " + std::to_string(size) +
                          " bytes, shorter than the " + std::to_string(kHeaderBytes) + "-byte header");
  }
  unsigned char raw[kHeaderBytes];
  read_exactly(fd.get(), raw, sizeof(raw), path);
  const uint32_t file_type = big_endian32(raw + 256), dtype_index = big_endian32(raw + 292);
  constexpr uint32_t kDtypes = sizeof(kIndexDtype) / sizeof(kIndexDtype[0]);
  if ((file_type != kFileKey && file_type != kFileWeight && file_type != kFileState) || dtype_index >= kDtypes) {
    throw CheckpointError("checkpoint file " + path + " has a corrupt header (file type " + std::to_string(file_type) +
                          ", dtype index " + std::to_string(dtype_index) + ")");
  }
  FileInfo info{path, file_type, kIndexDtype[dtype_index], kIndexItemsize[dtype_index], 0, dir_fd};
  const int64_t payload = size - kHeaderBytes;
  if (payload % info.itemsize) {
    throw CheckpointError("checkpoint file " + path + " is truncated: " + std::to_string(payload) +
                          " payload bytes is not a whole number of " + info.dtype);
  }
  info.elements = payload / info.itemsize;
  return info;
}

std::tuple<FileInfo, FileInfo, int64_t> table_files(const std::string& path, const std::string& table, int dir_fd) {
  check_name(table, "table", path);
  FileInfo key_info = read_header(posixpath::join(path, key_file(table)), dir_fd);
  FileInfo weight_info = read_header(posixpath::join(path, weight_file(table)), dir_fd);
  if (key_info.file_type != kFileKey || weight_info.file_type != kFileWeight) {
    throw CheckpointError(key_info.path + " / " + weight_info.path + " have the wrong file types");
  }
  bool integer_keys = false;
  for (const char* dtype : kKeyFileDtypes) integer_keys = integer_keys || key_info.dtype == dtype;
  if (!integer_keys || weight_info.dtype != "float32") {
    throw CheckpointError(table + ": keys are " + key_info.dtype + " and weights " + weight_info.dtype +
                          "; expected integer keys (" +
                          joined(kKeyFileDtypes) +
                          ") and float32 weights");
  }
  const int64_t rows = key_info.elements;
  if ((rows == 0 && weight_info.elements != 0) || (rows && weight_info.elements % rows)) {
    throw CheckpointError(weight_info.path + " holds " + std::to_string(weight_info.elements) +
                          " floats, not a whole number of rows for the " + std::to_string(rows) + " keys of " +
                          key_info.path + ": the file is truncated or from another table");
  }
  return {std::move(key_info), std::move(weight_info), rows};
}

std::vector<int64_t> read_keys(const FileInfo& key_info, const std::optional<std::string>& expected_crc) {
  const Fd fd = open_file(key_info.path, key_info.dir_fd);
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  unsigned char header[kHeaderBytes];
  read_exactly(fd.get(), header, sizeof(header), key_info.path);
  uint32_t crc = update_crc32(header, sizeof(header));
  std::vector<int64_t> keys(static_cast<size_t>(key_info.elements));
  const size_t bytes = static_cast<size_t>(key_info.elements * key_info.itemsize);
  if (key_info.itemsize == 8) {  // int64, uint64: the bits as they are
    read_exactly(fd.get(), keys.data(), bytes, key_info.path);
    crc = update_crc32(keys.data(), bytes, crc);
  } else {  // int32 widened, uint32 zero-extended
    std::vector<uint32_t> narrow(keys.size());
    read_exactly(fd.get(), narrow.data(), bytes, key_info.path);
    crc = update_crc32(narrow.data(), bytes, crc);
    const bool is_signed = key_info.dtype == "int32";
    for (size_t i = 0; i < keys.size(); ++i) {
      keys[i] = is_signed ? static_cast<int64_t>(static_cast<int32_t>(narrow[i])) : static_cast<int64_t>(narrow[i]);
    }
  }
  const std::string value = crc32_hex(crc);
  if (expected_crc && value != *expected_crc) {
    throw CheckpointError(key_info.path + " does not match its checksum in the manifest (CRC-32 " + value +
                          ", expected " + *expected_crc + "): the file is corrupt");
  }
  return keys;
}

}  // namespace sok::hps::checkpoint
