"""The `fastdecode` command: the entry point and generate/chat (main.py), settings from
YAML and key=value arguments (keys.py), the chat loop (repl.py), `fastdecode export`
(export.py), `fastdecode perplexity` (perplexity.py) and progress bars (progress.py)."""
