"""The attention kernel's contract: a query row's output is the same, bit for bit,
whatever else is in the call. The kernel groups rows into tiles (a kv head's query
heads over a few tokens) that share their K/V loads; the grouping follows B, T and
the thread count, so each row is computed here alone (B = T = 1) and compared with the
same row inside prefill chunks, decode batches and other thread counts."""

import pytest
import torch

from fastdecode import kernels
from fastdecode.model.kv_cache import KVCache, Q8_0

pytestmark = pytest.mark.skipif(not kernels.load_kernels(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason}")

KV = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "q8_0": Q8_0}
# (B, T, H, Hkv, D, window): SmolLM2 (9/3), Llama 3.2 1B (32/8), MHA, MQA, 5 and 7 heads
# per kv head (groups of 3 + 2, 3 + 2 + 2), head_dim 64 and others, sliding windows.
SHAPES = [
    (1, 18, 9, 3, 64, 0),
    (2, 9, 32, 8, 64, 0),
    (3, 5, 4, 4, 32, 0),
    (2, 7, 8, 1, 128, 0),
    (2, 6, 10, 2, 64, 5),
    (1, 11, 14, 2, 256, 9),
    (4, 1, 9, 3, 64, 0),
]


def cache(kv, slots, S, Hkv, D, seed):
    g = torch.Generator().manual_seed(seed)
    c = KVCache(slots, Hkv, S, D, KV[kv])
    k = 2 * torch.randn(slots, S, Hkv, D, generator=g)
    v = torch.randn(slots, S, Hkv, D, generator=g)
    return c.update(torch.arange(slots), torch.arange(S).expand(slots, S), k, v)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}kv{}D{}w{}".format(*s))
@pytest.mark.parametrize("kv", list(KV))
def test_each_row_is_the_same_alone(kv, shape):
    B, T, H, Hkv, D, window = shape
    S, slots = 80, B + 1
    k_all, v_all = cache(kv, slots, S, Hkv, D, seed=1)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, T, H, D, generator=g)
    ends = torch.randint(T - 1, S, (B,), generator=g)  # ragged: each row's last position
    pos = torch.stack([torch.arange(int(e) - T + 1, int(e) + 1) for e in ends])
    rows = torch.randperm(slots, generator=g)[:B]
    scale = D ** -0.5
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in sorted({1, 2, 3, threads}):
            torch.set_num_threads(n)
            outs.append(torch.ops.fastdecode.attention(q, k_all, v_all, pos, rows, window, scale))
        torch.set_num_threads(1)
        alone = torch.empty_like(outs[0])
        for b in range(B):
            for t in range(T):
                alone[b, t] = torch.ops.fastdecode.attention(q[b:b + 1, t:t + 1], k_all, v_all, pos[b:b + 1, t:t + 1],
                                                             rows[b:b + 1], window, scale)[0, 0]
    finally:
        torch.set_num_threads(threads)
    for y in outs:
        assert torch.equal(y, alone)
    # A chunk split in two (as chunked prefill does) gives the same rows too.
    if T > 1:
        h = T // 2
        first = torch.ops.fastdecode.attention(q[:, :h], k_all, v_all, pos[:, :h], rows, window, scale)
        rest = torch.ops.fastdecode.attention(q[:, h:], k_all, v_all, pos[:, h:], rows, window, scale)
        assert torch.equal(torch.cat([first, rest], dim=1), alone)


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("window", [0, 7])
def test_a_chunk_as_rows_of_one_token_gives_its_bits(kv, window):
    """A mixed step's rows of one token ([N, 1]): decode rows of several slots, and prompt chunks
    as consecutive rows of their slot at consecutive positions (which the op computes as one row
    of their tokens), in any order: each row equals the same token computed alone, and a chunk
    equals it as one [1, T] row."""
    H, Hkv, D, S = 9, 3, 64, 96
    k_all, v_all = cache(kv, 6, S, Hkv, D, seed=7)
    g = torch.Generator().manual_seed(8)
    # (slot, first position, tokens): decode rows, a chunk, a decode row, a chunk of one, a chunk
    parts = [(0, 50, 1), (3, 70, 1), (1, 0, 12), (4, 33, 1), (2, 40, 1), (5, 20, 9)]
    rows = torch.tensor([s for s, _, n in parts for _ in range(n)])
    pos = torch.tensor([p + i for _, p, n in parts for i in range(n)])[:, None]
    q = torch.randn(len(rows), 1, H, D, generator=g)
    y = torch.ops.fastdecode.attention(q, k_all, v_all, pos, rows, window, 0.125)
    for i in range(len(rows)):
        alone = torch.ops.fastdecode.attention(q[i:i + 1], k_all, v_all, pos[i:i + 1], rows[i:i + 1], window, 0.125)
        assert torch.equal(y[i], alone[0]), i
    first = 2  # the 12-token chunk, as the row of 12 tokens it is
    chunk = torch.ops.fastdecode.attention(q[first:first + 12].view(1, 12, H, D), k_all, v_all,
                                           pos[first:first + 12].view(1, 12), rows[first:first + 1], window, 0.125)
    assert torch.equal(y[first:first + 12].view(1, 12, H, D), chunk)


def test_padding_rows_do_not_change_the_others():
    """A batch with extra rows (another slot, repeated positions) leaves the first row's result alone."""
    k_all, v_all = cache("float16", 3, 64, 3, 64, seed=3)
    q = torch.randn(1, 8, 9, 64, generator=torch.Generator().manual_seed(4))
    pos = torch.arange(30, 38)[None]
    alone = torch.ops.fastdecode.attention(q, k_all, v_all, pos, torch.tensor([1]), 0, 0.125)
    pad_q = torch.cat([q, torch.randn(2, 8, 9, 64)])
    pad_pos = torch.cat([pos, torch.zeros(1, 8, dtype=torch.long), torch.full((1, 8), 63)])
    batched = torch.ops.fastdecode.attention(pad_q, k_all, v_all, pad_pos, torch.tensor([1, 0, 2]), 0, 0.125)
    assert torch.equal(batched[:1], alone)


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("D", [64, 96])
def test_a_head_is_the_same_in_any_group(kv, D):
    """Heads sharing a kv head are reduced in groups (3 at a time, then 2, then 1),
    in different lanes of one reduction: the same query as any head of any group
    size gives the bits it gives as the only head."""
    k_all, v_all = cache(kv, 1, 50, 1, D, seed=5)
    g = torch.Generator().manual_seed(6)
    q1 = torch.randn(1, 6, 1, D, generator=g)
    pos, rows = torch.arange(40, 46)[None], torch.tensor([0])
    one = torch.ops.fastdecode.attention(q1, k_all, v_all, pos, rows, 0, 0.3)
    for n_rep in (2, 3, 4, 5, 7, 8):
        y = torch.ops.fastdecode.attention(q1.expand(1, 6, n_rep, D).contiguous(), k_all, v_all, pos, rows, 0, 0.3)
        for h in range(n_rep):
            assert torch.equal(y[:, :, h:h + 1], one), (n_rep, h)


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("shape", SHAPES + [(1, 18, 9, 3, 40, 0), (1, 33, 4, 2, 24, 0), (2, 12, 8, 4, 256, 40)],
                         ids=lambda s: "B{}T{}H{}kv{}D{}w{}".format(*s))
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_every_instruction_set_gives_the_same_bits(kv, shape, softcap):
    """The attention's AVX-512 path (p v and the softmax 16 lanes at a time, and a prefill tile's
    scores from K transposed, 16 keys a register), which runs by default only where 512-bit
    FMAs run at full width, forced on and off, against the AVX2 path: the same bits. Long
    caches (keys in several blocks and a last partial vector of 16), head dims with a half
    vector left over (40, 24), windows, Gemma 2's capped scores."""
    B, T, H, Hkv, D, window = shape
    if kv == "q8_0" and D % 32:
        pytest.skip("q8_0 needs head_dim in blocks of 32")
    if "avx512-vnni" not in kernels.available_isas():
        pytest.skip("no AVX-512 VNNI here: the attention has one path")
    S, slots = 700, B + 1
    k_all, v_all = cache(kv, slots, S, Hkv, D, seed=7)
    g = torch.Generator().manual_seed(8)
    q = torch.randn(B, T, H, D, generator=g)
    ends = torch.randint(S - 200, S, (B,), generator=g)
    pos = torch.stack([torch.arange(int(e) - T + 1, int(e) + 1) for e in ends])
    rows = torch.randperm(slots, generator=g)[:B]
    outs = {}
    try:
        for isa, wide in (("avx2", None), ("avx512-vnni", False), ("avx512-vnni", True)):
            kernels.set_isa(isa)
            assert kernels.set_wide(wide) == bool(wide)
            outs[isa, wide] = torch.ops.fastdecode.attention(q, k_all, v_all, pos, rows, window, D ** -0.5, softcap)
    finally:
        kernels.set_isa(None)
        kernels.set_wide(None)
    narrow = outs["avx2", None]
    assert torch.isfinite(narrow).all()
    for key, y in outs.items():
        assert torch.equal(y, narrow), key


# (B, H, Hkv, D, window): decode steps over caches long enough (>= 256 KB of K a row) that a call
# with fewer tiles (B x Hkv) than threads splits each tile's keys, rows and dims over the threads
# (kernels.h, attention_split): Gemma 3 270M's one kv head, with and without its window, a head
# dim with a half vector of 8 left over, a ragged batch of 2, and SmolLM2's three kv heads on 4.
SPLIT = [(1, 4, 1, 256, 0), (1, 4, 1, 256, 600), (1, 8, 1, 72, 0), (2, 6, 1, 128, 0), (1, 9, 3, 64, 0)]


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("shape", SPLIT, ids=lambda s: "B{}H{}kv{}D{}w{}".format(*s))
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_a_split_decode_step_gives_each_rows_bits(kv, shape, softcap):
    """On 2, 3 and 4 threads, and on every instruction set path, a split step's rows are the bits
    each row gives alone on one thread (where nothing splits)."""
    B, H, Hkv, D, window = shape
    if kv == "q8_0" and D % 32:
        pytest.skip("q8_0 needs head_dim in blocks of 32")
    S, slots = 4200, B + 1
    k_all, v_all = cache(kv, slots, S, Hkv, D, seed=9)
    g = torch.Generator().manual_seed(10)
    q = torch.randn(B, 1, H, D, generator=g)
    pos = torch.randint(S - 300, S, (B, 1), generator=g)
    rows = torch.randperm(slots, generator=g)[:B]
    paths = [("avx2", None)]
    if "avx512-vnni" in kernels.available_isas():
        paths += [("avx512-vnni", False), ("avx512-vnni", True)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([torch.ops.fastdecode.attention(q[b:b + 1], k_all, v_all, pos[b:b + 1], rows[b:b + 1],
                                                          window, D ** -0.5, softcap) for b in range(B)])
        for isa, wide in paths:
            kernels.set_isa(isa)
            kernels.set_wide(wide)
            for n in (2, 3, 4):
                torch.set_num_threads(n)
                y = torch.ops.fastdecode.attention(q, k_all, v_all, pos, rows, window, D ** -0.5, softcap)
                assert torch.equal(y, alone), (isa, wide, n)
    finally:
        torch.set_num_threads(threads)
        kernels.set_isa(None)
        kernels.set_wide(None)


def test_the_wide_path_needs_avx512():
    if not kernels.available_isas():
        pytest.skip("no native instruction set")
    try:
        kernels.set_isa("avx2")
        assert kernels.set_wide(True) is False
    finally:
        kernels.set_isa(None)
        kernels.set_wide(None)


@pytest.mark.parametrize("kv", ["float32", "q8_0"])
def test_sinks_give_each_row_its_bits_on_every_path(kv):
    """With sinks (gpt-oss), a decode step split over 2 threads and a prefill tile of 7 tokens give each
    row the bits it has alone on one thread, on every instruction set path."""
    H, Hkv, D, S = 8, 1, 64, 4200  # one kv head's 4200 keys of 256 B: the decode step splits
    k_all, v_all = cache(kv, 2, S, Hkv, D, seed=11)
    g = torch.Generator().manual_seed(12)
    q = torch.randn(1, 7, H, D, generator=g)
    pos = torch.arange(S - 7, S)[None]
    rows, sinks = torch.tensor([1]), torch.randn(H, generator=g) * 3
    paths = [("avx2", None)]
    if "avx512-vnni" in kernels.available_isas():
        paths += [("avx512-vnni", False), ("avx512-vnni", True)]
    threads = torch.get_num_threads()

    def attend(t0, t1):
        return torch.ops.fastdecode.attention_sinks(q[:, t0:t1], k_all, v_all, pos[:, t0:t1], rows, 0, D ** -0.5,
                                                    0.0, sinks)
    try:
        torch.set_num_threads(1)
        alone = torch.cat([attend(t, t + 1) for t in range(7)], dim=1)
        for isa, wide in paths:
            kernels.set_isa(isa)
            kernels.set_wide(wide)
            torch.set_num_threads(2)
            assert torch.equal(attend(6, 7), alone[:, 6:]), (isa, wide)
            assert torch.equal(attend(0, 7), alone), (isa, wide)
    finally:
        torch.set_num_threads(threads)
        kernels.set_isa(None)
        kernels.set_wide(None)
