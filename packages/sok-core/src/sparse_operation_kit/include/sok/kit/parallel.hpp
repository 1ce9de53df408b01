// Parallel bulk loops of the CPU tables: sok::parallel_for and parallel_workers over the threads
// of a WorkerPool, started on first use and parked on a condition variable between jobs, instead
// of threads created and joined on every bulk call.
#ifndef SOK_KIT_PARALLEL_HPP_
#define SOK_KIT_PARALLEL_HPP_

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sok {

class WorkerPool {
 public:
  // The pool of this process (one per extension module) with `threads` workers besides the
  // caller, made on first use. A child made by fork gets a new pool: the parent's threads do not
  // exist there. Pools are never destroyed: parked threads end with the process.
  static WorkerPool& instance(int threads) {
    static std::mutex made;
    static WorkerPool* pool = nullptr;
    std::lock_guard<std::mutex> lock(made);
    if (pool == nullptr || pool->pid_ != getpid()) pool = new WorkerPool(threads);
    return *pool;
  }

  // Runs job(w) for w = 0 .. workers - 1 (at most threads + 1): 0 on the calling thread, the
  // others on the pool's threads, and returns when all are done. job must not throw. Returns false,
  // having run nothing, while the pool serves another caller or when the caller is one of its
  // threads (a parallel_for inside a parallel_for): the caller then needs threads of its own.
  bool try_run(int workers, const std::function<void(int)>& job) {
    if (in_pool() || workers - 1 > threads_) return false;
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      active_ = workers - 1;
      pending_ = workers - 1;
      ++generation_;
    }
    wake_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    return true;
  }

 private:
  explicit WorkerPool(int threads) : threads_(threads), pid_(getpid()) {
    for (int w = 1; w <= threads; ++w) std::thread([this, w] { loop(w); }).detach();
  }

  static bool& in_pool() {
    thread_local bool in = false;
    return in;
  }

  // Worker w (1 .. threads): runs each job whose active workers include it. A new job starts only
  // after every worker of the previous one is done (try_run waits for them while holding busy_),
  // so a worker that wakes late still runs the job it is part of.
  void loop(int w) {
    in_pool() = true;
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (w > active_) continue;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      (*job)(w);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  const int threads_;
  const pid_t pid_;
  std::mutex busy_;   // held by the caller whose job runs
  std::mutex mutex_;  // guards the fields below
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* job_ = nullptr;
  int active_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
};

// Threads used by bulk operations: the hardware threads, at most 16.
inline int num_workers() {
  static const int n = static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  return n;
}

// Runs fn(worker, begin, end) over [0, n) split in contiguous parts, in parallel when n is at
// least `min_parallel`: on the threads of the WorkerPool, or on threads made for this call while the
// pool is busy (another caller, or a parallel_for inside a parallel_for). Exceptions in workers are
// rethrown in the caller.
template <class Fn>
void parallel_for(int64_t n, int64_t min_parallel, Fn&& fn) {
  const int workers = num_workers();
  if (n < min_parallel || workers == 1) {
    fn(0, int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errors(workers);
  const int64_t chunk = (n + workers - 1) / workers;
  const std::function<void(int)> job = [&](int w) {
    try {
      fn(w, std::min(n, w * chunk), std::min(n, (w + 1) * chunk));
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  if (!WorkerPool::instance(workers - 1).try_run(workers, job)) {
    std::vector<std::thread> threads;
    for (int w = 1; w < workers; ++w) threads.emplace_back(job, w);
    job(0);
    for (auto& t : threads) t.join();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Runs fn(worker, workers) on every worker (for loops partitioned by owner, e.g. row % workers).
template <class Fn>
void parallel_workers(int64_t n, int64_t min_parallel, Fn&& fn) {
  int workers = (n < min_parallel) ? 1 : num_workers();
  parallel_for(workers, 2, [&](int, int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) fn(static_cast<int>(w), workers);
  });
}

}  // namespace sok

#endif  // SOK_KIT_PARALLEL_HPP_
