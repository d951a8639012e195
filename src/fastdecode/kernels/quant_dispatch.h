// The tile shapes per instruction set and the layout switch, included after
// quant_kernel.h and quant_panel.h in each per-ISA translation unit. q4, q8, q4s and the K-quants
// run on their panels (quant_panel.h); the tiles below are the other layouts'.

// Tiles, measured on Zen 4 (benchmarks/real_sizes.md, benchmarks/batch_tiles.md; q4, q8, q4s and
// the K-quants ran on them until their panels, and the figures below that name them are from then). One
// activation row (batch-1 decode): one weight row at a time, so that each core reads one
// sequential stream from DRAM (4 rows side by side computed faster from cache but streamed
// slower, down to 9 GB/s a core for q6k/q8 at K = 2048). A decode batch (M <= kFewRows) whose
// quantized activations fit L1 (K <= kFewK): still one weight row at a time, streamed as at
// M = 1, against kFewCols activation rows, so each weight byte is read and unpacked once per
// call (4 x 4 tiles read 4 rows' streams side by side at ~5 GB/s a core; one row at a time
// was 1.3-2.8x faster at M = 8, K = 2048, and slower at K = 8192, where 8 activation rows
// overflow L1). On VNNI, up to 16 rows whose activations take <= 24 KB (16 at the 135M model's
// K = 576 and 1536, 12 at K = 2048) the same, in passes of kFewCols rows over each weight row
// from L1: 1.0-1.5x the 4 x 4 tile for M = 12 and 16 at K = 1536 (the 135M model's down) and for
// q8 (timed through torch, 2-thread), and 0.74-0.78x at M = 16, K = 2048 (32 KB), which stays
// on 4 x 4 (benchmarks/serve/README.md).
// More rows: 4 x 4 (on AVX2's 16 registers it spills, and was still no slower than 4 x 2 or
// 4 x 3, and faster for q6k). On VNNI also short rows (K <= kShortK) of the q5 layouts, q4nl and q4mx
// at any M > 1: there the one-row tiles ran 0.68-0.94x the 4 x 4's speed at M = 2..16 (K = 512
// to 768, one thread, weights from DRAM; 1.0-1.2x at K = 1024, 1.1-2.0x at K >= 1536), while
// AVX2's one-row tiles, and VNNI's for q8 and the K-quants, stayed ahead (benchmarks/batch_tiles.md,
// 2026-12-03).
static_assert(::fd::kTileRows == 4, "ops.cpp splits rows in tiles of 4");
constexpr int64_t kFewRows = 8, kFewK = 4096, kMoreRows = 16, kMoreBytes = 24576, kShortK = 768;
template <int L>
constexpr bool kShortRows4x4 = FD_VNNI && (L == kQ4NL || L == kQ4MX || L == kQ5 || L == kQ5S);
#ifndef FD_PAIRS
#define FD_PAIRS FD_VNNI
#endif
constexpr int kFewCols = FD_VNNI ? 8 : 4;  // VNNI's 32 registers hold 8 rows' sums; AVX2 spills past 4

// Where 512-bit registers run at full width (Args::wide, Zen 5), the 4 x 4 tiles take two groups
// a register (two_groups, in tiles of 4 activation rows) and then beat the one-row and pair
// tiles from M = 4 when a row has a pair of groups (K >= 512), weights streamed from DRAM too:
// 1.05-1.3x at M = 4..8, K = 2048, 1.4x at M = 16, K = 1536 (measured when q4, q8 and the
// K-quants took these tiles too, benchmarks/wide_tiles.md).
template <int L>
static void run_layout(const Args& a, int64_t n0, int64_t n1) {
  if (a.M == 1) rows<L, 1, 1>(a, n0, n1);
  else if (FD_VNNI && a.wide && a.nb >= 16 && a.M >= 4) rows<L, 4, 4>(a, n0, n1);
  else if (kShortRows4x4<L> && 32 * a.nb <= kShortK) rows<L, 4, 4>(a, n0, n1);
  else if ((a.M <= kFewRows && 32 * a.nb <= kFewK) || (FD_VNNI && a.M <= kMoreRows && a.M * 32 * a.nb <= kMoreBytes))
    rows<L, 1, kFewCols, FD_PAIRS>(a, n0, n1);
  else rows<L, 4, 4>(a, n0, n1);
}

static void dispatch(const Args& a, int64_t n0, int64_t n1) {
  switch (a.layout) {
    case kQ4: return panel_rows<kQ4>(a, n0, n1);
    case kQ8: return panel_rows<kQ8>(a, n0, n1);
    case kQ4K: return panel_rows<kQ4K>(a, n0, n1);
    case kQ5K: return panel_rows<kQ5K>(a, n0, n1);
    case kQ6K: return panel_rows<kQ6K>(a, n0, n1);
    case kQ5: return run_layout<kQ5>(a, n0, n1);
    case kQ5S: return run_layout<kQ5S>(a, n0, n1);
    case kQ4S: return panel_rows<kQ4S>(a, n0, n1);
    case kQ4NL: return run_layout<kQ4NL>(a, n0, n1);
    case kQ4XS: return run_layout<kQ4XS>(a, n0, n1);
    case kQ4MX: return run_layout<kQ4MX>(a, n0, n1);
  }
}
