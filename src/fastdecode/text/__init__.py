"""Text: the tokenizer interface, the byte tokenizer and streaming detokenization
(tokenizer.py), and sandboxed Jinja chat templates (chat_template.py)."""
