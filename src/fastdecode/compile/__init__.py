"""Compiling the model's step: the `Steps` the engine calls (steps.py), the strategies
that build them (strategies.py: none, decode in compiled.py, generate's chunked decode
loop in loop.py), exported AOTInductor packages (aot.py) and their export in a
background process (background.py)."""
