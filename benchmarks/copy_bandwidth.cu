// What the host-GPU link does: copies between page-locked host memory and GPU memory, timed with
// CUDA events, for `benchmarks/hps_cpp.py --device gpu` (its PCIe floor: a lookup's rows' bytes over
// the host-to-GPU bandwidth measured here).
//
// One buffer of the largest size asked for on each side (cudaMallocHost, cudaMalloc), one stream
// of its own; per size and direction, --warmup untimed copies, then --iters copies each between two
// events recorded around one cudaMemcpyAsync and waited for; the median of their times. Bandwidth
// is bytes over that median, in GB/s (10^9 bytes a second).
//
// Build (hps_cpp.py does it; host code only, no kernels):
//   nvcc -O2 -std=c++17 benchmarks/copy_bandwidth.cu -o copy_bandwidth
//
// Usage:
//   copy_bandwidth [--device 0] [--iters 30] [--warmup 3] BYTES [BYTES ...]
//
// Output (stdout): one JSON line,
//   {"device": 0, "name": "NVIDIA H200", "iters": 30, "warmup": 3,
//    "sizes": [{"bytes": 14155776, "h2d_ms": ..., "d2h_ms": ..., "h2d_gbps": ..., "d2h_gbps": ...}, ...]}
// in the order the sizes were given.
// Exit status: 0; 1 when a CUDA call failed (which, with the error's name, on stderr; "no CUDA
// device" where none can be used); 2 for a bad command line (what is wrong on stderr).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// A failed CUDA call: where, which call, and the error's name and text; exit status 1.
#define COPY_CUDA(call) check((call), #call, __FILE__, __LINE__)

void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "copy_bandwidth: %s failed at %s:%d: %s: %s\n", call, file, line, cudaGetErrorName(status),
               cudaGetErrorString(status));
  std::exit(1);
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "copy_bandwidth: %s\nusage: copy_bandwidth [--device N >= 0] [--iters N >= 1] [--warmup N >= 0] "
               "BYTES [BYTES ...] (each >= 1)\n",
               why.c_str());
  std::exit(2);
}

// The integer of `text` for `what`, at least `least`; else usage() naming the value.
long long parse_count(const char* text, const char* what, long long least) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < least) {
    usage(std::string(what) + " must be an integer >= " + std::to_string(least) + ", got '" + text + "'");
  }
  return value;
}

// The median of `times` (milliseconds), which it reorders.
double median(std::vector<float>& times) {
  const size_t mid = times.size() / 2;
  std::nth_element(times.begin(), times.begin() + mid, times.end());
  if (times.size() % 2 == 1) return times[mid];
  const float upper = times[mid];
  return 0.5 * (upper + *std::max_element(times.begin(), times.begin() + mid));
}

// The median time (ms) of `iters` copies of `bytes` from src to dst in `stream`, after `warmup`.
double time_copies(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, int iters,
                   int warmup, cudaEvent_t start, cudaEvent_t stop) {
  for (int i = 0; i < warmup; ++i) COPY_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  COPY_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> times(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    COPY_CUDA(cudaEventRecord(start, stream));
    COPY_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream));
    COPY_CUDA(cudaEventRecord(stop, stream));
    COPY_CUDA(cudaEventSynchronize(stop));
    COPY_CUDA(cudaEventElapsedTime(&times[i], start, stop));
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0, iters = 30, warmup = 3;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" || arg == "--iters" || arg == "--warmup") {
      if (i + 1 >= argc) usage(arg + " needs a value");
      const long long least = arg == "--iters" ? 1 : 0;
      const long long value = parse_count(argv[++i], arg.c_str(), least);
      if (value > 1000000) usage(arg + " must be at most 1000000, got " + std::to_string(value));
      (arg == "--device" ? device : arg == "--iters" ? iters : warmup) = static_cast<int>(value);
    } else if (!arg.empty() && arg[0] == '-') {
      usage("unknown option '" + arg + "'");
    } else {
      sizes.push_back(static_cast<size_t>(parse_count(argv[i], "BYTES", 1)));
    }
  }
  if (sizes.empty()) usage("no sizes given");

  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    std::fprintf(stderr, "copy_bandwidth: no CUDA device (cudaGetDeviceCount: %s: %s, %d devices)\n",
                 cudaGetErrorName(counted), cudaGetErrorString(counted), count);
    return 1;
  }
  if (device >= count) usage("--device " + std::to_string(device) + " is not one of the " + std::to_string(count) +
                             " devices (0 .. " + std::to_string(count - 1) + ")");
  COPY_CUDA(cudaSetDevice(device));
  cudaDeviceProp props{};
  COPY_CUDA(cudaGetDeviceProperties(&props, device));

  const size_t largest = *std::max_element(sizes.begin(), sizes.end());
  void* host = nullptr;
  void* gpu = nullptr;
  COPY_CUDA(cudaMallocHost(&host, largest));
  COPY_CUDA(cudaMalloc(&gpu, largest));
  std::memset(host, 1, largest);
  COPY_CUDA(cudaMemset(gpu, 0, largest));
  cudaStream_t stream = nullptr;
  COPY_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start = nullptr, stop = nullptr;
  COPY_CUDA(cudaEventCreate(&start));
  COPY_CUDA(cudaEventCreate(&stop));

  std::string name;  // as a JSON string's contents
  for (const char* c = props.name; *c != '\0'; ++c) {
    if (*c == '"' || *c == '\\') name += '\\';
    if (static_cast<unsigned char>(*c) >= 0x20) name += *c;
  }
  std::string out = "{\"device\": " + std::to_string(device) + ", \"name\": \"" + name +
                    "\", \"iters\": " + std::to_string(iters) + ", \"warmup\": " + std::to_string(warmup) +
                    ", \"sizes\": [";
  for (size_t s = 0; s < sizes.size(); ++s) {
    const size_t bytes = sizes[s];
    const double h2d = time_copies(gpu, host, bytes, cudaMemcpyHostToDevice, stream, iters, warmup, start, stop);
    const double d2h = time_copies(host, gpu, bytes, cudaMemcpyDeviceToHost, stream, iters, warmup, start, stop);
    if (h2d <= 0 || d2h <= 0) {
      std::fprintf(stderr, "copy_bandwidth: copies of %zu bytes timed %g ms (to the GPU) and %g ms (from it): below "
                   "the events' resolution; ask for more bytes\n", bytes, h2d, d2h);
      return 1;
    }
    char entry[256];
    std::snprintf(entry, sizeof(entry),
                  "%s{\"bytes\": %zu, \"h2d_ms\": %.6f, \"d2h_ms\": %.6f, \"h2d_gbps\": %.4f, \"d2h_gbps\": %.4f}",
                  s == 0 ? "" : ", ", bytes, h2d, d2h, bytes / (h2d * 1e6), bytes / (d2h * 1e6));
    out += entry;
  }
  out += "]}";
  std::printf("%s\n", out.c_str());

  COPY_CUDA(cudaEventDestroy(start));
  COPY_CUDA(cudaEventDestroy(stop));
  COPY_CUDA(cudaStreamDestroy(stream));
  COPY_CUDA(cudaFree(gpu));
  COPY_CUDA(cudaFreeHost(host));
  return 0;
}
