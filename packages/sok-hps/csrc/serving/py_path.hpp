// Python's os.path on POSIX (posixpath), as the C++ readers (model_files.hpp) build and name the
// paths their messages hold: join, split, basename, normpath, abspath.
//
// Example:
//   posixpath::join("ckpt", "emb_0-key")     // "ckpt/emb_0-key"
//   posixpath::split("ckpt/emb_0/")          // {"ckpt/emb_0", ""}
//   posixpath::normpath("./ckpt//a/../b")    // "ckpt/b"
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace sok::hps::posixpath {

std::string join(std::string_view a, std::string_view b);
std::pair<std::string, std::string> split(std::string_view path);
std::string basename(std::string_view path);
std::string normpath(std::string_view path);
// normpath(join(os.getcwd(), path)); OsError (py_errors.hpp) where the working directory is gone.
std::string abspath(std::string_view path);

}  // namespace sok::hps::posixpath
