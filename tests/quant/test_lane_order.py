"""The lane order and the panels of the packed layouts (quant/formats.py's docstring): each
test reads the stored bytes where the docstring says they are."""

import torch

from fastdecode.quant import formats


def test_panels_hold_16_rows_per_unit():
    """Panel p, block b, unit u, row i, byte j (a last panel of r < 16 rows stored short)."""
    n, nb = 37, 3  # two full panels and one of 5 rows
    gen = torch.Generator().manual_seed(2)
    for layout, units in (("q4", 4), ("q4s", 4), ("q8", 8)):
        values = torch.randint(0, 16, (n, 32 * nb), generator=gen)
        if layout == "q8":
            values = values * 16 - 128 + torch.randint(0, 16, (n, 32 * nb), generator=gen)
        scales = torch.randn(n, nb).half()
        t = formats.to_panels(layout, values, {"scales": scales})
        q = t["qweight"].reshape(-1).view(torch.uint8).long()
        s = t["scales"].reshape(-1)
        for row in range(n):
            p, i = divmod(row, 16)
            r = min(16, n - 16 * p)
            base = 16 * p * 4 * units * nb
            for b in range(nb):
                assert s[16 * p * nb + r * b + i] == scales[row, b]
                for v in range(32):
                    u, j = divmod(v % 16, 4) if units == 4 else divmod(v, 4)
                    byte = q[base + 4 * units * r * b + 4 * r * u + 4 * i + j]
                    if units == 4:
                        assert (byte >> 4 if v >= 16 else byte & 15) == values[row, 32 * b + v]
                    else:
                        assert byte == values[row, 32 * b + v] % 256
        vals, fields = formats.from_panels(layout, t)
        assert torch.equal(vals.long(), values) and torch.equal(fields["scales"], scales)
        rows = torch.tensor([[0, 15, 16], [33, 36, 7]])
        got, got_fields = formats.panel_rows(layout, t, rows)
        assert torch.equal(got.long(), values[rows]) and torch.equal(got_fields["scales"], scales[rows])


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
