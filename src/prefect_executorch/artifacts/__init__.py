"""Manifests, object stores, the bundle registry and Prefect report artifacts."""
