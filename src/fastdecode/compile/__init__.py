"""Compiling the model's step: the strategies (strategies.py), the `generate` strategy's
chunked decode loop (loop.py), exported AOTInductor packages (aot.py) and their export
in a background process (background.py)."""
