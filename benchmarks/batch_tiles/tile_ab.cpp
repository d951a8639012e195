// Two builds of the packed matmul kernels in one process, one thread: the tiles of quant_kernel.h
// and the dispatch of quant_dispatch.h at a baseline revision (A, headers under QK_A) and in the
// working tree (B, QK_B), called in alternation on the same weights and activations. Built and
// run by tile_ab.sh, which also checks that both give the same bits.
//
//   tile_ab M N K [LAYOUT [ROUNDS]]      LAYOUT: kernels.h's Layout (0 q4, 1 q8, 2 q4k, ...)
//
// AB_AVX2=1 at build time compiles both for AVX2 instead of AVX-512 VNNI. NO_WIDE (environment)
// turns the 512-bit paths off (QuantArgs::wide, on by default here, as ops.cpp has it on Zen 5).
//
// COPIES (environment) rotates that many copies of the weights, so that with enough of them each
// call streams its weights from DRAM, as a model's decode step does. Prints the minimum and the
// lower quartile of each build's CPU time per call (THREADS > 1: wall time, the rows split as
// ops.cpp splits them), and B's speed relative to A's.
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include "kernels.h"

#include "isa_begin.h"
namespace A {
#include QK_A_KERNEL
#include QK_A_DISPATCH
}
namespace B {
#include QK_B_KERNEL
#include QK_B_DISPATCH
}
#pragma GCC pop_options

#include "harness.h"

// As ops.cpp's launch: chunks of whole 4-row tiles.
template <class F>
static void run(F f, const fd::QuantArgs& a) {
  split((a.N + 3) / 4, 16, [&](int64_t t0, int64_t t1) { f(a, 4 * t0, std::min(a.N, 4 * t1)); });
}

int main(int argc, char** argv) {
  int64_t M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]);
  threads = getenv("THREADS") ? atoi(getenv("THREADS")) : 1;
  int layout = argc > 4 ? atoi(argv[4]) : fd::kQ4;
  int rounds = argc > 5 ? atoi(argv[5]) : 200;
  std::mt19937 g(1);
  int64_t nb = K / 32, G = (nb + 7) / 8;
  std::vector<float> x(M * K);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(g);
  std::vector<int8_t> xq(M * G * 256); std::vector<float> xd(M * G * 8), xs(M * G * 8); std::vector<int32_t> xsums(M * G * 16);
  A::quantize_rows(x.data(), M, K, xq.data(), xd.data(), xs.data(), xsums.data());
  // Row strides as quant/formats.py packs them: q8 one byte a value, the others a nibble; q6k's
  // high bits and 8-bit scales twice the q5 layouts'.
  const bool q6k = layout == fd::kQ6K;
  const int64_t qs = layout == fd::kQ8 ? K : K / 2, qhs = q6k ? K / 4 : K / 8, scs = q6k ? 2 * nb : nb;
  std::vector<uint8_t> q(N * qs), qh(N * qhs);
  for (auto& v : q) v = g();
  for (auto& v : qh) v = g();
  std::vector<uint16_t> sc(N * scs), mn(N * nb), d(N * nb / 8), dm(N * nb / 8);
  for (auto& v : sc) v = 0x2000 + (g() & 0xff);
  for (auto& v : mn) v = 0xa000 + (g() & 0xff);
  for (auto& v : d) v = 0x2000 + (g() & 0xff);
  for (auto& v : dm) v = 0x2000 + (g() & 0xff);
  std::vector<float> ya(M * N), yb(M * N);
  const int copies = getenv("COPIES") ? atoi(getenv("COPIES")) : 1;
  std::vector<std::vector<uint8_t>> qc(copies, q), qhc(copies, qh);
  std::vector<std::vector<uint16_t>> scc(copies, sc), mnc(copies, mn), dc(copies, d), dmc(copies, dm);
  fd::QuantArgs a{};
  a.layout = (fd::Layout)layout; a.qs = qs; a.qhs = qhs; a.scs = scs; a.nb = nb;
  a.xq = xq.data(); a.xd = xd.data(); a.xs = xs.data(); a.xsums = xsums.data(); a.M = M; a.N = N;
  a.wide = !getenv("NO_WIDE");  // the 512-bit paths, as on Zen 5 (ops.cpp's wide())
  auto weights = [&](int k) {  // copy k of the weights
    a.q = qc[k].data(); a.qh = qhc[k].data(); a.sc = (const uint8_t*)scc[k].data(); a.mn = (const uint8_t*)mnc[k].data();
    a.d = dc[k].data(); a.dmin = dmc[k].data();
  };
  std::vector<double> ta, tb;
  for (int r = 0; r < rounds; ++r) {
    weights(r % copies);
    a.y = ya.data(); double t0 = now(); run(A::dispatch, a); ta.push_back(now() - t0);
    weights((r + copies / 2) % copies);
    a.y = yb.data(); t0 = now(); run(B::dispatch, a); tb.push_back(now() - t0);
  }
  bool same = std::memcmp(ya.data(), yb.data(), ya.size() * 4) == 0;
  std::sort(ta.begin(), ta.end()); std::sort(tb.begin(), tb.end());
  double mac = double(M) * N * K;
  printf("M=%ld N=%ld K=%ld L=%d  A min %.1f q1 %.1f us (%.1f GMAC/s)  B min %.1f q1 %.1f us (%.1f GMAC/s)  B/A speed %.3f  same=%d\n",
         M, N, K, layout, ta[0] * 1e6, ta[rounds / 4] * 1e6, mac / ta[rounds / 4] / 1e9, tb[0] * 1e6, tb[rounds / 4] * 1e6,
         mac / tb[rounds / 4] / 1e9, ta[rounds / 4] / tb[rounds / 4], same);
}
