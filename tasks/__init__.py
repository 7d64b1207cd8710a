"""Prefect tasks: thin wrappers over the library functions, one pipeline stage each."""
