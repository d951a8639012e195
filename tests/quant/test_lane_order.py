"""The lane order and the panels of the packed layouts (quant/formats.py's docstring): each
test reads the stored bytes where the docstring says they are."""

import torch

from fastdecode.quant import formats


def test_panels_hold_16_rows_per_unit():
    """Panel p, block b, unit u, row i, byte j (a last panel of r < 16 rows stored short)."""
    n, nb = 37, 16  # two full panels and one of 5 rows
    gen = torch.Generator().manual_seed(2)
    for layout, units in (("q4", 4), ("q4s", 4), ("q8", 8), ("q4k", 4), ("q5k", 5), ("q6k", 4)):
        values = torch.randint(0, 16, (n, 32 * nb), generator=gen)
        if layout == "q8":
            values = values * 16 - 128 + torch.randint(0, 16, (n, 32 * nb), generator=gen)
        if layout in ("q5k", "q6k"):
            values = values + 16 * torch.randint(0, 2 if layout == "q5k" else 4, (n, 32 * nb), generator=gen)
        # each field stored [w][r] in its panel: q4k's and q5k's sc, mn per block, d, dmin per 8
        # blocks; q6k's sc per 16 values
        kq = {"sc": nb, "mn": nb, "d": nb // 8, "dmin": nb // 8}
        widths = {"q4k": kq, "q5k": kq, "q6k": {"sc": 2 * nb, "d": nb // 8}}.get(layout, {"scales": nb})
        fields = {name: torch.randint(0, 64, (n, w), generator=gen, dtype=torch.uint8) for name, w in widths.items()}
        t = formats.to_panels(layout, values, fields)
        q = t["qweight"].reshape(-1).view(torch.uint8).long()
        for row in range(n):
            p, i = divmod(row, 16)
            r = min(16, n - 16 * p)
            base = 16 * p * 4 * units * nb
            for name, w in widths.items():
                for c in range(w):
                    assert t[name].reshape(-1)[16 * p * w + r * c + i] == fields[name][row, c]
            for b in range(nb):
                for v in range(32):
                    u, j = divmod(v % 16, 4) if units != 8 else divmod(v, 4)
                    byte = q[base + 4 * units * r * b + 4 * r * u + 4 * i + j]
                    if units == 8:
                        assert byte == values[row, 32 * b + v] % 256
                        continue
                    assert (byte >> 4 if v >= 16 else byte & 15) == values[row, 32 * b + v] % 16
                    if layout == "q6k":  # the top two bits: unit h = v // 16, bits 2 s for v = 16 h + 4 s + j
                        top = t["qhigh"].reshape(-1)[16 * p * 8 * nb + 8 * r * b + 4 * r * (v // 16) + 4 * i + j]
                        assert (top >> (2 * u)) & 3 == values[row, 32 * b + v] // 16
                    if layout == "q5k":  # the fifth bit: unit 4, bit 4 h + s for v = 16 h + 4 s + j
                        top = q[base + 4 * units * r * b + 4 * r * 4 + 4 * i + j]
                        assert (top >> (4 * (v // 16) + u)) & 1 == values[row, 32 * b + v] // 16
        vals, back = formats.from_panels(layout, t)
        assert torch.equal(vals.long(), values) and all(torch.equal(back[k], f) for k, f in fields.items())
        rows = torch.tensor([[0, 15, 16], [33, 36, 7]])
        got, got_fields = formats.panel_rows(layout, t, rows)
        assert torch.equal(got.long(), values[rows])
        assert all(torch.equal(got_fields[k], f[rows]) for k, f in fields.items())


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


def test_fifth_bit_plane():
    nb = 16
    gen = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 2, (1, 32 * nb), generator=gen)
    p5 = formats.pack_plane5(bits.to(torch.uint8))[0].long()
    for b in range(nb):
        G, j = divmod(b, 8)
        for v in range(32):
            i, t = divmod(v, 4)
            assert (p5[32 * G + 4 * j + t] >> i) & 1 == bits[0, 32 * b + v]
