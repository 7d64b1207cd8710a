"""Decoder language models: exported for ExecuTorch's LLM runner, validated by what they generate."""
