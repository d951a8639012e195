// The attention kernel before and after the tiled rewrite, in one process: bitwise
// comparison and timing, without torch. Built by benchmarks/attention/run.py, which
// compiles the baseline's kernel (the row-per-task one, from git) under the
// namespace `base` and the working tree's attention.cpp; or, with BASE_TILED, the
// tiled kernel at a later revision (attention.cpp there) against the working tree's.
//
//   harness check                      bitwise old == new over a grid of shapes
//   harness bench KV T L B H HKV D W THREADS ROUNDS LAYERS
//
// The working tree's kernel runs its wide (AVX-512) path wherever the CPU has AVX-512 F/BW/VL
// (fastdecode itself uses it by default only on CPUs with full-width 512-bit FMAs), unless NARROW
// is set in the environment.
//
// bench times both kernels in alternation, ROUNDS rounds of 3 calls each, and prints
// the lower quartile of each (a call's own CPU time at THREADS=1, wall time beyond:
// the cores are shared), and the minimum. LAYERS separate caches are used in turn, as a model's
// layers are, so that K/V come from L3 or memory rather than a warm L2.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#define fd base
#include "base_kernels.h"
#undef fd
#include "kernels.h"

namespace {

struct Case {
  int64_t B, T, H, Hkv, D, window, S, slots;
  int kv;
  int64_t start;  // first position of each row's chunk (-1: random)
};

struct Data {
  std::vector<float> q, y0, y1;
  std::vector<uint8_t> k, v;
  std::vector<int64_t> pos, rows;
  int64_t ks[3], L;
};

uint16_t f2h(float f) { return _cvtss_sh(f, 0); }
uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

Data make(const Case& c, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  Data d;
  d.q.resize(c.B * c.T * c.H * c.D);
  for (auto& x : d.q) x = n(g);
  const int64_t row = c.kv == 3 ? c.D / 32 * 34 : c.D, esz = c.kv == 0 ? 4 : c.kv == 3 ? 1 : 2;
  d.ks[2] = row;
  d.ks[1] = c.S * row;
  d.ks[0] = c.Hkv * c.S * row;
  const int64_t N = c.slots * c.Hkv * c.S;
  d.k.resize(N * row * esz);
  d.v.resize(N * row * esz);
  for (auto* buf : {&d.k, &d.v}) {
    for (int64_t r = 0; r < N; ++r) {
      uint8_t* p = buf->data() + r * row * esz;
      if (c.kv == 3) {
        for (int64_t b = 0; b < c.D / 32; ++b) {
          const uint16_t h = f2h(std::abs(n(g)) * 0.02f);
          std::memcpy(p + b * 34, &h, 2);
          for (int i = 0; i < 32; ++i) p[b * 34 + 2 + i] = static_cast<uint8_t>(static_cast<int8_t>(g() % 255 - 127));
        }
      } else {
        for (int64_t i = 0; i < c.D; ++i) {
          const float x = 2 * n(g);
          if (c.kv == 0) {
            std::memcpy(p + i * 4, &x, 4);
          } else {
            const uint16_t h = c.kv == 1 ? f2h(x) : f2bf(x);
            std::memcpy(p + i * 2, &h, 2);
          }
        }
      }
    }
  }
  d.pos.resize(c.B * c.T);
  d.rows.resize(c.B);
  std::vector<int64_t> perm(c.slots);
  for (int64_t i = 0; i < c.slots; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), g);
  d.L = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    d.rows[b] = perm[b % c.slots];
    const int64_t s0 = c.start >= 0 ? c.start : static_cast<int64_t>(g() % (c.S - c.T + 1));
    for (int64_t t = 0; t < c.T; ++t) d.pos[b * c.T + t] = s0 + t, d.L = std::max(d.L, s0 + t + 1);
  }
  if (c.window > 0) d.L = std::min(d.L, c.window);
  d.y0.assign(c.B * c.T * c.H * c.D, -1.f);
  d.y1.assign(c.B * c.T * c.H * c.D, -2.f);
  return d;
}

// The wide (AVX-512) path where the CPU has it, unless NARROW is set in the environment.
bool wide() {
  return !std::getenv("NARROW") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

// A tiled kernel (the working tree's, or with BASE_TILED the baseline's attention.cpp at a later
// revision) as ops.cpp runs it: one task per thread, each taking tiles from a shared counter.
template <class Args, class Kv, class Tiles>
void run_tiled(const Case& c, Data& d, float* y, int threads, Tiles (*tiles)(const Args&, int),
               void (*run)(const Args&, const Tiles&, std::atomic<int64_t>&)) {
  Args a{d.q.data(), d.k.data(), d.v.data(), d.pos.data(), d.rows.data(), y,
         c.B, c.T, c.H, c.Hkv, c.D, c.window, {c.T * c.H * c.D, c.H * c.D, c.D, 1},
         {d.ks[0], d.ks[1], d.ks[2]}, 1.f / std::sqrt(static_cast<float>(c.D)), static_cast<Kv>(c.kv), d.L};
  if constexpr (requires { a.wide; }) a.wide = wide();
  const Tiles p = tiles(a, threads);
  std::atomic<int64_t> next{0};
  const int nt = static_cast<int>(std::min<int64_t>(threads, p.count));
  if (nt <= 1) return run(a, p, next);
#pragma omp parallel num_threads(nt)
  run(a, p, next);
}

#ifdef BASE_TILED
void run_base(const Case& c, Data& d, int threads) {
  run_tiled<base::AttentionArgs, base::KvFormat>(c, d, d.y0.data(), threads, base::attention_tiles,
                                                 base::attention_run);
}
#else
// As ops.cpp ran it: at::parallel_for over the B T H rows, in equal contiguous chunks.
void run_base(const Case& c, Data& d, int threads) {
  const base::AttentionArgs a{d.q.data(), d.k.data(), d.v.data(), d.pos.data(), d.rows.data(), d.y0.data(),
                              c.T, c.H, c.Hkv, c.D, c.window, {c.T * c.H * c.D, c.H * c.D, c.D, 1},
                              {d.ks[0], d.ks[1], d.ks[2]}, 1.f / std::sqrt(static_cast<float>(c.D)),
                              static_cast<base::KvFormat>(c.kv)};
  const int64_t N = c.B * c.T * c.H, L = d.L;
  const int nt = static_cast<int>(std::min<int64_t>(threads, N));
#pragma omp parallel num_threads(nt)
  {
    const int64_t chunk = (N + nt - 1) / nt, r0 = omp_get_thread_num() * chunk, r1 = std::min(N, r0 + chunk);
    if (r0 < r1) base::attention_rows(a, r0, r1, L);
  }
}
#endif

void run_new(const Case& c, Data& d, int threads) {
  run_tiled<fd::AttentionArgs, fd::KvFormat>(c, d, d.y1.data(), threads, fd::attention_tiles, fd::attention_run);
}

double ms(clockid_t clk, const timespec& a, const timespec& b) {
  return (b.tv_sec - a.tv_sec) * 1e3 + 1e-6 * (b.tv_nsec - a.tv_nsec);
}

const char* kKvNames[] = {"f32", "f16", "bf16", "q8_0"};

int check() {
  std::vector<Case> cases;
  for (int kv = 0; kv < 4; ++kv) {
    for (auto [H, Hkv] : {std::pair{9, 3}, {32, 8}, {4, 4}, {8, 1}, {6, 2}, {10, 2}, {14, 2}})
      for (int64_t D : {16, 32, 64, 80, 96, 128, 256})
        for (int64_t T : {1, 3, 8, 18, 33})
          for (int64_t B : {1, 3})
            for (int64_t w : {0, 1, 7, 40}) cases.push_back({B, T, H, Hkv, D, w, 300, 4, kv, -1});
    cases.push_back({1, 18, 9, 3, 64, 0, 1600, 1, kv, 1551});
    cases.push_back({2, 64, 32, 8, 64, 0, 3000, 2, kv, -1});
    cases.push_back({1, 40, 8, 4, 256, 512, 2000, 1, kv, -1});
    cases.push_back({4, 1, 9, 3, 64, 0, 5000, 4, kv, -1});
  }
  int bad = 0, n = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (c.kv == 3 && c.D % 32) continue;
    Data d = make(c, 1000 + static_cast<uint32_t>(i));
    run_base(c, d, 1);
    for (int th : {1, 2, 3}) {
      std::fill(d.y1.begin(), d.y1.end(), -2.f);
      run_new(c, d, th);
      ++n;
      if (std::memcmp(d.y0.data(), d.y1.data(), d.y0.size() * 4) != 0) {
        size_t j = 0;
        while (std::memcmp(&d.y0[j], &d.y1[j], 4) == 0) ++j;
        if (bad++ < 10)
          std::printf("differs: kv=%s B=%ld T=%ld H=%ld/%ld D=%ld window=%ld threads=%d at %zu: %g vs %g\n",
                      kKvNames[c.kv], c.B, c.T, c.H, c.Hkv, c.D, c.window, th, j, d.y0[j], d.y1[j]);
      }
    }
  }
  std::printf("%d of %d runs differ\n", bad, n);
  return bad != 0;
}

int bench(char** argv) {
  const int kv = std::atoi(argv[0]);
  const int64_t T = std::atol(argv[1]), L = std::atol(argv[2]), B = std::atol(argv[3]), H = std::atol(argv[4]),
                Hkv = std::atol(argv[5]), D = std::atol(argv[6]), w = std::atol(argv[7]);
  const int threads = std::atoi(argv[8]), rounds = std::atoi(argv[9]), layers = std::atoi(argv[10]);
  const Case c{B, T, H, Hkv, D, w, L, B, kv, L - T};
  std::vector<Data> data;
  for (int l = 0; l < layers; ++l) data.push_back(make(c, 1 + l));
  run_base(c, data[0], threads);
  run_new(c, data[0], threads);
  const bool same = std::memcmp(data[0].y0.data(), data[0].y1.data(), data[0].y0.size() * 4) == 0;
  const clockid_t clk = threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
  std::vector<double> tb, tn;
  int l = 0;
  for (int r = 0; r < rounds; ++r) {
    using Run = void (*)(const Case&, Data&, int);
    for (auto [f, out] : {std::pair<Run, std::vector<double>*>{run_base, &tb}, {run_new, &tn}}) {
      for (int i = 0; i < 3; ++i) {
        timespec t0, t1;
        clock_gettime(clk, &t0);
        f(c, data[l], threads);
        clock_gettime(clk, &t1);
        out->push_back(ms(clk, t0, t1));
        l = (l + 1) % layers;
      }
    }
  }
  std::sort(tb.begin(), tb.end());
  std::sort(tn.begin(), tn.end());
  // The lower quartile; at 2+ threads the minimum too (a call whose threads all kept their cores).
  const double a = tb[tb.size() / 4], b = tn[tn.size() / 4];
  double macs = 0;
  for (int64_t t = 0; t < T; ++t) {
    int64_t n = L - T + t + 1;
    if (w > 0) n = std::min(n, w);
    macs += 2.0 * n * D * H * B;
  }
  std::printf("{\"kv\": \"%s\", \"T\": %ld, \"L\": %ld, \"B\": %ld, \"H\": %ld, \"Hkv\": %ld, \"D\": %ld, "
              "\"window\": %ld, \"threads\": %d, \"layers\": %d, \"base_ms\": %.4f, \"new_ms\": %.4f, "
              "\"base_min_ms\": %.4f, \"new_min_ms\": %.4f, \"base_gmacs\": %.1f, \"new_gmacs\": %.1f, \"speedup\": %.2f, "
              "\"speedup_min\": %.2f, \"same\": %s}\n",
              kKvNames[kv], T, L, B, H, Hkv, D, w, threads, layers, a, b, tb[0], tn[0], macs / a / 1e6, macs / b / 1e6,
              a / b, tb[0] / tn[0], same ? "true" : "false");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "check") return check();
  if (mode == "bench" && argc == 13) return bench(argv + 2);
  std::fprintf(stderr, "usage: harness check | harness bench KV T L B H HKV D W THREADS ROUNDS LAYERS\n");
  return 2;
}
