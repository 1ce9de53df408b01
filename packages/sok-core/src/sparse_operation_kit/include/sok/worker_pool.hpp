// Worker threads for sok::parallel_for (sok/backend.hpp): started on first use and parked on a
// condition variable between jobs, instead of threads created and joined on every bulk call.
#pragma once

#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

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

}  // namespace sok
