// os.path's functions as posixpath.py writes them (py_path.hpp).
#include "py_path.hpp"

#include <unistd.h>

#include <cerrno>
#include <vector>

#include "py_errors.hpp"

namespace sok::hps::posixpath {

std::string join(std::string_view a, std::string_view b) {
  if (!b.empty() && b[0] == '/') return std::string(b);
  if (a.empty() || a.back() == '/') return std::string(a) + std::string(b);
  return std::string(a) + "/" + std::string(b);
}

std::pair<std::string, std::string> split(std::string_view path) {
  const size_t cut = path.rfind('/') + 1;  // npos + 1 == 0
  std::string head(path.substr(0, cut));
  if (head.find_first_not_of('/') != std::string::npos) head.erase(head.find_last_not_of('/') + 1);
  return {head, std::string(path.substr(cut))};
}

std::string basename(std::string_view path) { return std::string(path.substr(path.rfind('/') + 1)); }

std::string normpath(std::string_view path) {
  if (path.empty()) return ".";
  size_t slashes = 0;
  while (slashes < path.size() && path[slashes] == '/') ++slashes;
  const std::string root = slashes == 2 ? "//" : slashes > 0 ? "/" : "";
  std::vector<std::string_view> parts;
  for (size_t at = 0; at <= path.size();) {
    size_t end = path.find('/', at);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(at, end - at);
    at = end + 1;
    if (part.empty() || part == ".") continue;
    if (part != ".." || (root.empty() && (parts.empty() || parts.back() == ".."))) {
      parts.push_back(part);
    } else if (!parts.empty()) {
      parts.pop_back();
    }
  }
  std::string out = root;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += '/';
    out += parts[i];
  }
  return out.empty() ? "." : out;
}

std::string abspath(std::string_view path) {
  if (!path.empty() && path[0] == '/') return normpath(path);
  std::vector<char> cwd(4096);
  while (::getcwd(cwd.data(), cwd.size()) == nullptr) {
    if (errno != ERANGE) throw OsError(errno);
    cwd.resize(cwd.size() * 2);
  }
  return normpath(join(cwd.data(), path));
}

}  // namespace sok::hps::posixpath
