"""The build spec as data: what to build (model reference, methods and their inputs, target options,
quantization scheme, validation gates), strict pydantic, loading neither torch, Prefect nor the targets.
"""
