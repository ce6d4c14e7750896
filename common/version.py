"""Installed package versions, read from package metadata (nothing is imported)."""

from __future__ import annotations

from importlib import metadata


def package_version(name: str = "bertflow") -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
