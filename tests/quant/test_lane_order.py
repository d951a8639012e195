"""The lane order of the packed layouts (quant/formats.py's docstring), on values whose
position is their value, so each test reads the stored bytes as the docstring says."""

import torch

from fastdecode.quant import formats


def _block_value(nb: int) -> torch.Tensor:
    """[1, 32 nb]: value v of block b is (b * 32 + v) mod 256, as int64."""
    return torch.arange(32 * nb)[None] % 256


def test_q8_bytes_are_by_sub_step_then_block():
    for nb in (8, 11):  # a full group, then a full and a partial one
        values = _block_value(nb)
        q = formats.pack_bytes(values.to(torch.uint8).view(torch.int8)).view(torch.uint8)[0].long()
        for b in range(nb):
            G, j = divmod(b, 8)
            g = min(8, nb - 8 * G)
            for v in range(32):
                i, t = divmod(v, 4)
                assert q[256 * G + 4 * g * i + 4 * j + t] == (32 * b + v) % 256


def test_nibbles_hold_sub_steps_c_and_c_plus_4():
    nb = 10
    values = torch.randint(0, 16, (1, 32 * nb), generator=torch.Generator().manual_seed(0))
    q = formats.pack_nibbles(values.to(torch.uint8))[0].long()
    for b in range(nb):
        G, j = divmod(b, 8)
        g = min(8, nb - 8 * G)
        for v in range(32):
            i, t = divmod(v, 4)
            byte = q[128 * G + 4 * g * (i % 4) + 4 * j + t]
            assert (byte >> 4 if i >= 4 else byte & 15) == values[0, 32 * b + v]


def test_fifth_bit_plane_and_top_bit_planes():
    nb = 16
    gen = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 2, (1, 32 * nb), generator=gen)
    top = torch.randint(0, 4, (1, 32 * nb), generator=gen)
    p5 = formats.pack_plane5(bits.to(torch.uint8))[0].long()
    p6 = formats.pack_plane6(top.to(torch.uint8))[0].long()
    for b in range(nb):
        G, j = divmod(b, 8)
        for v in range(32):
            i, t = divmod(v, 4)
            assert (p5[32 * G + 4 * j + t] >> i) & 1 == bits[0, 32 * b + v]
            assert (p6[64 * G + 32 * (i // 4) + 4 * j + t] >> (2 * (i % 4))) & 3 == top[0, 32 * b + v]
