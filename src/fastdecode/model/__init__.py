"""The model: its typed arguments and presets (args.py), the decoder (transformer.py)
and its key/value caches (kv_cache.py)."""
