// Checks of sok::parallel_for and sok::WorkerPool (sok/kit/parallel.hpp), built and
// run by test_parallel_for.py: every part runs exactly once, nested and concurrent calls complete
// (falling back to threads of their own), and a worker's exception reaches the caller. Prints
// "ok" and exits 0, or prints what failed and exits 1.
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <thread>
#include <vector>

#include "sok/kit/parallel.hpp"

static int fail(const char* what) {
  std::printf("FAILED: %s\n", what);
  return 1;
}

int main() {
  for (int round = 0; round < 500; ++round) {
    const int64_t n = 10000 + round;
    std::vector<std::atomic<int>> seen(n);
    sok::parallel_for(n, 1, [&](int, int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) seen[i]++;
    });
    for (int64_t i = 0; i < n; ++i)
      if (seen[i] != 1) return fail("an index ran other than once");
  }

  std::atomic<int64_t> nested{0};
  sok::parallel_for(64, 1, [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sok::parallel_for(1000, 1, [&](int, int64_t b2, int64_t e2) { nested += e2 - b2; });
  });
  if (nested != 64 * 1000) return fail("nested parallel_for");

  bool thrown = false;
  try {
    sok::parallel_for(1000, 1, [&](int w, int64_t, int64_t) {
      if (w == sok::num_workers() - 1) throw std::runtime_error("worker error");
    });
  } catch (const std::runtime_error&) {
    thrown = true;
  }
  if (!thrown) return fail("a worker's exception did not reach the caller");

  std::atomic<int64_t> concurrent{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 200; ++r) sok::parallel_for(5000, 1, [&](int, int64_t b, int64_t e) { concurrent += e - b; });
    });
  }
  for (auto& t : callers) t.join();
  if (concurrent != int64_t{6} * 200 * 5000) return fail("concurrent callers");

  // The pool itself with more workers than this machine may have threads for.
  auto& pool = sok::WorkerPool::instance(7);
  for (int r = 0; r < 300; ++r) {
    const int workers = 1 + r % 8;
    std::vector<std::atomic<int>> ran(workers);
    const std::function<void(int)> job = [&](int w) { ran[w]++; };
    if (!pool.try_run(workers, job)) continue;  // the parallel_for pool of this process is another one
    for (int w = 0; w < workers; ++w)
      if (ran[w] != 1) return fail("a pool worker ran other than once");
  }
  std::printf("ok\n");
  return 0;
}
