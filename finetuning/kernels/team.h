// A team of threads for our ops' parallel loops, in place of TensorFlow's `Shard`.
//
// Why: a served request is a chain of short ops (a 170-token SQuAD request's 384 -> 384
// product is ~0.25 ms on two cores), and `Shard` hands each op's parts to TensorFlow's
// intra-op pool, whose threads sleep between ops: each op then waits for a thread to be woken
// and the caller runs beside the pool's two threads on two cores. On a Zen 4 capped at AVX2 a
// chain of a layer's dense ops ran at ~150 GFLOP/s on two cores where the kernel on two
// threads of its own runs at ~195; with this team (and the serving session's inter-op pool at
// one thread, finetuning/frozen_session.py) whole SQuAD requests at batch 1 took 1.05-1.13x
// less time, fp32 to int8 (bench/README.md).
//
// The caller of an op and `helpers` threads claim units of its work from one atomic counter
// (a unit: a dense op's panel, an attention's (sequence, head), a layer norm's rows), so a
// helper that is late (descheduled, asleep) costs nothing but its share: the caller finishes
// the units it does not claim. Between ops a helper spins (yielding its core now and then to
// any other thread waiting for it) for kSpinMicroseconds, then sleeps until the next op.
// One op at a time holds the team; another op running at the same time (two inter-op threads)
// is served by `Shard` instead. Set BERT_TEAM=0 to use `Shard` for every op.
//
// The counter holds the op's generation in its high 32 bits and the next unit in its low
// 32, so a helper still holding an old op's generation cannot claim a unit of a new one
// (its compare-and-swap fails), and an op's fields are not rewritten while one of its
// units is unclaimed (the caller waits for all of them to be done).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <immintrin.h>
#include <mutex>
#include <string>
#include <thread>

namespace team {

constexpr int64_t kSpinMicroseconds = 300;  // a served request's gaps between our ops are less
// Work below this cost (the ops' cost units: about a flop) runs on the caller alone: a few
// microseconds, less than waking a helper.
constexpr int64_t kInlineCost = 400000;

class Team {
 public:
  explicit Team(int helpers) {
    for (int i = 0; i < helpers; ++i) std::thread([this] { Serve(); }).detach();
  }

  // Runs work(begin, end) over [0, total) in units of `grain`, on the caller and the
  // helpers; false (nothing run) where another op holds the team.
  bool Run(int64_t total, int64_t grain, const std::function<void(int64_t, int64_t)>& work) {
    if (busy_.exchange(true, std::memory_order_acquire)) return false;
    work_ = &work;
    total_ = total;
    grain_ = grain;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t generation = ++generations_ & 0xffffffffu;
    next_.store(generation << 32, std::memory_order_release);  // the op is published
    if (sleepers_.load(std::memory_order_acquire) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    Claim(generation);
    while (done_.load(std::memory_order_acquire) < total) _mm_pause();
    busy_.store(false, std::memory_order_release);
    return true;
  }

 private:
  // Claims and runs `generation`'s units until none is left (or a newer op is published).
  void Claim(uint64_t generation) {
    uint64_t seen = next_.load(std::memory_order_acquire);
    for (;;) {
      if ((seen >> 32) != generation) return;
      const int64_t begin = static_cast<int64_t>(seen & 0xffffffffu);
      if (begin >= total_) return;
      if (!next_.compare_exchange_weak(seen, seen + grain_, std::memory_order_acq_rel)) continue;
      const int64_t end = begin + grain_ < total_ ? begin + grain_ : total_;
      (*work_)(begin, end);
      done_.fetch_add(end - begin, std::memory_order_acq_rel);
      seen = next_.load(std::memory_order_acquire);
    }
  }

  uint64_t Published() const { return next_.load(std::memory_order_acquire) >> 32; }

  // A helper's life: wait for an op newer than the last it saw, claim its units.
  void Serve() {
    uint64_t last = Published();
    for (;;) {
      auto spun_since = std::chrono::steady_clock::now();
      for (int spins = 1; Published() == last; ++spins) {
        _mm_pause();
        if (spins % 256 != 0) continue;
        std::this_thread::yield();
        if (std::chrono::steady_clock::now() - spun_since <
            std::chrono::microseconds(kSpinMicroseconds))
          continue;
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1, std::memory_order_acq_rel);
        wake_.wait(lock, [&] { return Published() != last; });
        sleepers_.fetch_sub(1, std::memory_order_acq_rel);
        spun_since = std::chrono::steady_clock::now();
      }
      last = Published();
      Claim(last);
    }
  }

  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> next_{0};  // generation << 32 | next unit
  std::atomic<int64_t> done_{0};   // units done of the current op
  std::atomic<int> sleepers_{0};
  uint64_t generations_ = 0;
  const std::function<void(int64_t, int64_t)>* work_ = nullptr;
  int64_t total_ = 0, grain_ = 1;
  std::mutex mutex_;
  std::condition_variable wake_;
};

// The process's team of threads - 1 helpers (made at its first use, for the intra-op
// threads TensorFlow gives that op), or nullptr with BERT_TEAM=0 or one thread. Never freed:
// its helpers live as long as the process (a forked child has none, and its callers then do
// every unit themselves).
inline Team* Shared(int threads) {
  static Team* shared = [threads]() -> Team* {
    const char* switch_value = std::getenv("BERT_TEAM");
    if ((switch_value != nullptr && std::string(switch_value) == "0") || threads < 2)
      return nullptr;
    return new Team(threads - 1);
  }();
  return shared;
}

}  // namespace team
