// A fixed set of worker threads that run one parallel loop at a time; owned by its user.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fd::kernels {

class ThreadPool {
 public:
  // threads counts the calling thread, which works too; threads <= 1 runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) once for every i in [0, n), items handed out in order to whichever thread is
  // free; returns when all calls are done and rethrows the first exception a call threw.
  // Not reentrant: one run() at a time.
  void run(size_t n, const std::function<void(size_t)>& fn);

 private:
  void work();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  // Workers poll generation_, busy_ and stop_ for a while before sleeping on the condition
  // variables, which are signalled under mu_ (thread_pool.cc).
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<uint64_t> generation_{0};  // runs started
  std::atomic<int> busy_{0};             // workers still inside the current run
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

}  // namespace fd::kernels
