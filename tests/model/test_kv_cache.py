import torch

from fastdecode.model.kv_cache import DynamicKVCache, KVCache, cache_bytes


def test_update_writes_each_row_at_its_slot_and_positions():
    cache = KVCache(3, 2, 8, 4, torch.float32)
    k = torch.arange(2 * 2 * 2 * 4, dtype=torch.float32).view(2, 2, 2, 4)  # [B, T, Hkv, D]
    rows, pos = torch.tensor([2, 0]), torch.tensor([[5, 6], [0, 1]])
    k_all, v_all = cache.update(rows, pos, k, -k)
    assert k_all.shape == (3, 2, 8, 4)  # [slots, Hkv, S, D] views of the storage
    assert torch.equal(k_all[2, :, 5], k[0, 0]) and torch.equal(k_all[2, :, 6], k[0, 1])
    assert torch.equal(k_all[0, :, 0], k[1, 0]) and torch.equal(v_all[0, :, 1], -k[1, 1])
    written = torch.zeros(3, 8, dtype=torch.bool)
    written[2, 5] = written[2, 6] = written[0, 0] = written[0, 1] = True
    assert torch.equal(k_all.abs().sum(dim=(1, 3)) > 0, written)  # nothing else touched


def test_dynamic_cache_grows_to_the_largest_position():
    cache = DynamicKVCache(2, 1, 4, torch.float32)
    k = torch.ones(1, 3, 1, 4)
    cache.update(torch.tensor([1]), torch.tensor([[0, 1, 2]]), k, k)
    assert cache.seq_len == 3
    k_all, _ = cache.update(torch.tensor([0]), torch.tensor([[5]]), k[:, :1] * 2, k[:, :1])
    assert cache.seq_len == 6 and k_all[0, 0, 5, 0] == 2 and k_all[1, 0, 2, 0] == 1


def test_cache_bytes():
    assert cache_bytes(30, 8, 3, 2048, 64, torch.float32) == 2 * 30 * 8 * 3 * 2048 * 64 * 4
    assert cache_bytes(1, 1, 1, 1, 1, torch.bfloat16) == 4


def test_cache_bytes_of_each_kv_dtype():
    assert cache_bytes(30, 8, 3, 2048, 64, torch.float16) == 2 * 30 * 8 * 3 * 2048 * 64 * 2
    assert cache_bytes(30, 8, 3, 2048, 64, "q8_0") == 2 * 30 * 8 * 3 * 2048 * 68


def test_a_float16_cache_stores_what_to_float16_gives():
    cache = KVCache(2, 2, 8, 4, torch.float16)
    k = torch.randn(1, 3, 2, 4)
    k_all, v_all = cache.update(torch.tensor([1]), torch.tensor([[0, 1, 2]]), k, 2 * k)
    assert k_all.dtype == torch.float16
    assert torch.equal(k_all[1, :, :3], k[0].transpose(0, 1).to(torch.float16))
    assert torch.equal(v_all[1, :, :3], (2 * k[0]).transpose(0, 1).to(torch.float16))
