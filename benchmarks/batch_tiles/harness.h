// Timing and threading shared by tile_ab.cpp and panel_proto.cpp.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ctime>

static int threads = 1;  // THREADS (environment)

// CPU time of this thread on one thread; wall time on several.
static double now() {
  timespec t;
  clock_gettime(threads > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// f(u0, u1) over [0, units) on `threads` threads, each taking chunks (at least min_chunk, about
// 4 a thread) from a shared counter, as ops.cpp's launch does.
template <class F>
static void split(int64_t units, int64_t min_chunk, F f) {
  if (threads == 1) return f(0, units);
  const int64_t chunk = std::max<int64_t>(min_chunk, units / (threads * 4));
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(threads)
  for (int64_t t0; (t0 = next.fetch_add(chunk)) < units;) f(t0, std::min(units, t0 + chunk));
}
