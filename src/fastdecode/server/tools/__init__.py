"""Tool calling for /v1/chat/completions: which functions a request offers (spec), how the
checkpoint's family writes calls (formats), the prompt (prompt), the grammar that holds the
reply to the format (grammar), and reading the calls back, streamed or whole (parse, stream)."""
