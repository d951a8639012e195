"""The Python API: `load()` and `LLM` (llm.py), and the synchronous facade that
`LLM.generate`/`stream`/`chat` use (generate.py)."""
