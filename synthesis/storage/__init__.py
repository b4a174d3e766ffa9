"""Storage backends behind one `Storage` interface; `build_storage` picks one from config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from synthesis.storage.base import Storage

BACKENDS = ("local", "s3")

__all__ = ["BACKENDS", "Storage", "build_storage"]


def _opt(config: Mapping[str, Any], name: str) -> Any:
    # Settings usually come from environment variables, where "unset" often
    # arrives as an empty string; treat that like a missing key.
    value = config.get(name)
    return None if value == "" else value


def _req(config: Mapping[str, Any], name: str) -> Any:
    value = _opt(config, name)
    if value is None:
        raise ValueError(f"storage backend {config.get('backend')!r} needs {name!r}")
    return value


def build_storage(config: Mapping[str, Any]) -> Storage:
    """Build the configured backend. Imports are deferred so `local` never loads boto3."""
    backend = config.get("backend")
    # Read raw, not via _opt: an empty prefix is a deliberate (if unusual) choice.
    prefix = config.get("bucket_prefix")
    bucket_prefix = "chorus-" if prefix is None else str(prefix)
    if backend == "local":
        from synthesis.storage.local import LocalStorage

        return LocalStorage(
            Path(_req(config, "local_root")),
            secret=str(_req(config, "secret")),
            base_url=str(_req(config, "base_url")),
            bucket_prefix=bucket_prefix,
        )
    if backend == "s3":
        from synthesis.storage.s3 import S3Storage

        # Optional client tuning; numbers may arrive as strings from the environment.
        tuning: dict[str, Any] = {}
        for name, cast in (
            ("connect_timeout", float),
            ("read_timeout", float),
            ("max_attempts", int),
        ):
            if _opt(config, name) is not None:
                tuning[name] = cast(_opt(config, name))
        return S3Storage(
            endpoint_url=_opt(config, "endpoint_url"),
            region=str(_opt(config, "region") or "us-east-1"),
            access_key=_opt(config, "access_key"),
            secret_key=_opt(config, "secret_key"),
            addressing_style=str(_opt(config, "addressing_style") or "path"),
            public_endpoint_url=_opt(config, "public_endpoint_url"),
            bucket_prefix=bucket_prefix,
            **tuning,
        )
    raise ValueError(f"unknown storage backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
