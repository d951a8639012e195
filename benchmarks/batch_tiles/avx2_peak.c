// The int8 multiply-add peak of one AVX2 core (no VNNI), in inline assembly so that the compiler
// neither hoists the products nor spills:
//   maddubs: vpmaddubsw alone (32 multiply-adds each), 8 independent per iteration;
//   integer steps: what the q4 panel tiles run per 128 multiply-adds (quant_panel.h: four
//     vpmaddubsw, three vpaddw, one vpmaddwd, one vpaddd), twice per iteration, without the
//     nibble unpacking, the activation broadcasts, loads or the float steps.
// Both bound any AVX2 int8 matmul, ours or llama.cpp's. Run one copy per core to see both cores.
//
//   cc -O2 benchmarks/batch_tiles/avx2_peak.c -o /tmp/avx2_peak && /tmp/avx2_peak
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define MB(d) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #d "\n"

int main(void) {
  const long iters = 200000000;
  long n = iters;
  double t = now();
  __asm__ volatile(
      "vpcmpeqb %%ymm15, %%ymm15, %%ymm15\n vpabsb %%ymm15, %%ymm14\n"
      "1:\n" MB(1) MB(2) MB(3) MB(4) MB(5) MB(6) MB(7) MB(8) "dec %0\n jnz 1b\n"
      : "+r"(n)
      :
      : "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm14", "xmm15");
  double dt = now() - t;
  printf("maddubs: %.2f per ns, %.0f GMAC/s on one core\n", iters * 8 / dt / 1e9, iters * 8 * 32 / dt / 1e9);

  n = iters;
  t = now();
  __asm__ volatile(
      "vpxor %%ymm0, %%ymm0, %%ymm0\n vpxor %%ymm9, %%ymm9, %%ymm9\n"
      "vpcmpeqb %%ymm15, %%ymm15, %%ymm15\n vpabsb %%ymm15, %%ymm14\n vpabsw %%ymm15, %%ymm13\n"
      "1:\n" MB(1) MB(2) MB(3) MB(4)
      "vpaddw %%ymm1, %%ymm2, %%ymm1\n vpaddw %%ymm3, %%ymm4, %%ymm3\n vpaddw %%ymm1, %%ymm3, %%ymm1\n"
      "vpmaddwd %%ymm13, %%ymm1, %%ymm1\n vpaddd %%ymm1, %%ymm0, %%ymm0\n" MB(5) MB(6) MB(7) MB(8)
      "vpaddw %%ymm5, %%ymm6, %%ymm5\n vpaddw %%ymm7, %%ymm8, %%ymm7\n vpaddw %%ymm5, %%ymm7, %%ymm5\n"
      "vpmaddwd %%ymm13, %%ymm5, %%ymm5\n vpaddd %%ymm5, %%ymm9, %%ymm9\n"
      "dec %0\n jnz 1b\n"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm13", "xmm14", "xmm15");
  dt = now() - t;
  printf("integer steps: %.0f GMAC/s on one core\n", iters * 256 / dt / 1e9);
  return 0;
}
