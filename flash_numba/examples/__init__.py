"""Examples that use flash_numba inside a model: ``gpt`` trains a small character-level GPT."""
