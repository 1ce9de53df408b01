// One configuration of HierarchicalKV's own benchmark per process, for
// `benchmarks/storage_gpu.py --hkv`.
//
// HKV's benchmark/merlin_hashtable_benchmark.cc.cu has no command line: its
// main() runs a fixed list of configurations. This driver compiles that file
// into itself with its main() renamed out of the way and calls its test_main()
// once, with the configuration given here, so that the method (fill, top-ups,
// warm-up, the 60/40 batch, best of two host-timed calls, LRU) is HKV's own.
// Nothing of HKV is copied here; the build includes it from an HKV source tree.
//
// Build (benchmarks/build_hkv.sh does it, and names the binary by its inputs):
//   nvcc -O3 -DNDEBUG -std=c++17 -gencode arch=compute_90,code=sm_90 \
//        -I <hkv>/include -I <hkv>/benchmark benchmarks/hkv_driver.cu
//
// Usage:
//   hkv_driver --dim 64 --capacity 16777216 --hbm-gb 2 --keys-per-op 1048576
//              --lambdas 0.5,0.75,1.0 --apis insert_or_assign,find,export_batch
//
// Output (stdout, unbuffered so that a run cut short keeps its finished rows):
//   "# " lines describing the GPU and the configuration, then a markdown header
//   "| λ | <api> | <api> | ...|" and its rule, then test_main's rows, one per λ:
//   "| 0.50 |<blanks>1.808 |<blanks>3.652 |...|" in the APIs' order, each
//   figure 1 Mi keys / seconds / 2^30 (HKV's "Billion-KV/second"). test_main
//   prints "free HBM is not enough, ignore current benchmark!" instead of rows
//   when less than --hbm-gb GiB of device memory is free.
// Exit status: 0 when test_main returned, 1 when it threw (the message on
// stderr), 2 for a bad command line (what is wrong on stderr).

// HKV's headers and the standard headers its benchmark includes come first,
// so that the renaming of main below reaches only the benchmark's own text.
#include <assert.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "benchmark_util.cuh"
#include "merlin_hashtable.cuh"

#define main hkv_benchmark_main
#include "merlin_hashtable_benchmark.cc.cu"
#undef main

#ifndef SOK_HKV_SOURCE
#define SOK_HKV_SOURCE "unlabelled build (no -DSOK_HKV_SOURCE)"
#endif

namespace {

// HKV's API_Select values by the names its benchmark prints (find* is find_ptr).
const std::vector<std::pair<std::string, benchmark::API_Select>> kApis = {
    {"find", benchmark::API_Select::find},
    {"insert_or_assign", benchmark::API_Select::insert_or_assign},
    {"find_or_insert", benchmark::API_Select::find_or_insert},
    {"assign", benchmark::API_Select::assign},
    {"insert_and_evict", benchmark::API_Select::insert_and_evict},
    {"find_ptr", benchmark::API_Select::find_ptr},
    {"find_or_insert_ptr", benchmark::API_Select::find_or_insert_ptr},
    {"export_batch", benchmark::API_Select::export_batch},
    {"export_batch_if", benchmark::API_Select::export_batch_if},
    {"contains", benchmark::API_Select::contains},
};

struct Options {
  size_t dim = 0;
  size_t capacity = 0;
  size_t hbm_gb = 0;
  size_t keys_per_op = 0;
  std::vector<float> lambdas;
  std::vector<std::string> api_names;
  std::vector<benchmark::API_Select> apis;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "hkv_driver: " << message << "\n"
            << "usage: hkv_driver --dim N --capacity SLOTS --hbm-gb GB "
               "--keys-per-op N --lambdas L,L,... --apis API,API,...\n"
            << "APIs:";
  for (const auto& api : kApis) std::cerr << " " << api.first;
  std::cerr << std::endl;
  std::exit(2);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    parts.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return parts;
}

size_t parse_size(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || *end != '\0') {
    usage_error(flag + " " + text + ": not a whole number >= 0");
  }
  return static_cast<size_t>(value);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--dim") {
      options.dim = parse_size(flag, value);
    } else if (flag == "--capacity") {
      options.capacity = parse_size(flag, value);
    } else if (flag == "--hbm-gb") {
      options.hbm_gb = parse_size(flag, value);
    } else if (flag == "--keys-per-op") {
      options.keys_per_op = parse_size(flag, value);
    } else if (flag == "--lambdas") {
      for (const std::string& part : split(value)) {
        char* end = nullptr;
        const float lambda = std::strtof(part.c_str(), &end);
        if (part.empty() || *end != '\0' || !(lambda > 0.0f && lambda <= 1.0f)) {
          usage_error("--lambdas " + value + ": each must be in (0, 1]");
        }
        options.lambdas.push_back(lambda);
      }
    } else if (flag == "--apis") {
      for (const std::string& part : split(value)) {
        const auto found =
            std::find_if(kApis.begin(), kApis.end(),
                         [&part](const auto& api) { return api.first == part; });
        if (found == kApis.end()) usage_error("--apis: unknown API " + part);
        options.api_names.push_back(part);
        options.apis.push_back(found->second);
      }
    } else {
      usage_error("unknown option " + flag);
    }
  }
  if (options.dim == 0 || options.capacity == 0 || options.keys_per_op == 0 ||
      options.lambdas.empty() || options.apis.empty()) {
    usage_error(
        "--dim, --capacity, --keys-per-op (all > 0), --hbm-gb, --lambdas and "
        "--apis are all needed");
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  std::cout << std::unitbuf;
  try {
    cudaDeviceProp props;
    CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
    const double row_gib = static_cast<double>(options.capacity) *
                           options.dim * sizeof(float) / (1 << 30);
    std::cout << "# HKV: " << SOK_HKV_SOURCE << "\n"
              << "# GPU: " << props.name << " (sm " << props.major << "."
              << props.minor << ")\n"
              << "# dim " << options.dim << ", capacity " << options.capacity
              << " slots, rows " << std::fixed << std::setprecision(3)
              << row_gib << " GiB, HBM for values " << options.hbm_gb
              << " GiB, " << options.keys_per_op << " keys per op, LRU\n"
              << "| λ |";
    for (const std::string& name : options.api_names) {
      std::cout << " " << name << " |";
    }
    std::cout << "\n|---:|";
    for (size_t i = 0; i < options.apis.size(); i++) std::cout << "---:|";
    std::cout << "\n";
    std::vector<benchmark::API_Select> apis = options.apis;
    test_main(apis, options.dim, options.capacity, options.keys_per_op,
              options.hbm_gb, 1.0f, false, options.lambdas);
    CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& error) {
    std::cerr << "hkv_driver: " << error.what() << std::endl;
    return 1;
  }
  return 0;
}
