// A C++ process applying online updates with no Python in it (tests/test_update_files_cpp.py builds
// it against sok_hps_serving_core's sources): it writes four updates with the C++ writer, one of
// a model its filter does not take, then applies the others in a DirectoryUpdateSource's own
// thread: the update of key 2 is refused (UpdateRejected), that of key 3 fails once (retried). The
// source logs to stderr (its default sink). It prints whether stop() saw the loop end, the keys
// applied, why each refused update was refused, and whether libpython is mapped into it.
//
// Usage: update_source_program DIRECTORY
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "update_source.hpp"

namespace hps = sok::hps;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIRECTORY\n", argv[0]);
    return 2;
  }
  const std::string directory = argv[1];
  for (int64_t key = 0; key < 4; ++key) {
    const float row[2] = {static_cast<float>(key), static_cast<float>(key)};
    hps::write_update(directory, key == 1 ? "other" : "m", "t", &key, row, 1, 2);
  }
  hps::UpdateSourceOptions options;
  options.poll_interval_s = 0.01;
  options.model_filters = {"m"};
  hps::DirectoryUpdateSource source(directory, options);
  std::mutex mutex;
  std::vector<int64_t> applied;
  int failures = 0;
  source.start([&](const hps::Update& update) {
    std::lock_guard<std::mutex> lock(mutex);
    if (update.keys[0] == 2) throw hps::UpdateRejected("rows of width 2, but the table's dim is 3");
    if (update.keys[0] == 3 && failures++ == 0) throw std::runtime_error("tier down");
    applied.push_back(update.keys[0]);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (applied.size() == 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("stopped %d\n", source.stop(5.0) ? 1 : 0);
  for (const int64_t key : applied) std::printf("applied %lld\n", static_cast<long long>(key));
  for (const auto& [name, why] : source.unapplied()) std::printf("unapplied %s\n", why.c_str());
  std::ifstream maps("/proc/self/maps");
  const std::string mapped((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  std::printf("libpython: %s\n", mapped.find("libpython") == std::string::npos ? "absent" : "mapped");
}
