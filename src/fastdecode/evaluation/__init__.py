"""Evaluating a loaded model: perplexity over windows of a text (perplexity.py)."""
