"""Library versions compared the PEP 440 way (``2.15.0.dev20261007+cu132`` sorts before ``2.15.0``)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def parse_version(version: str | None) -> Version | None:
    """The version, or None for a missing or unparseable one (``unknown``)."""
    if not version:
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None


def minor_version(version: str | None) -> tuple[int, int] | None:
    """``2.14.0+cu130`` -> (2, 14); None when there is no such part."""
    parsed = parse_version(version)
    return (parsed.release[0], parsed.release[1]) if parsed and len(parsed.release) >= 2 else None


def older_than(version: str | None, minimum: str) -> bool:
    """Whether a known ``version`` sorts before ``minimum`` (an unknown one is not held against it)."""
    parsed = parse_version(version)
    return parsed is not None and parsed < Version(minimum)
