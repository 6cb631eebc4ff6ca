"""proto3 JSON values: durations as "1.5s", uint64 as decimal strings."""

from __future__ import annotations

import base64
from typing import Any, Dict, Union


def duration(seconds: float) -> str:
    """A google.protobuf.Duration in proto3 JSON: "10s", "0.250s"."""
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


def seconds(value: Any, default: float = 0.0) -> float:
    """The seconds of a proto3 JSON duration ("10s"), or default when unset."""
    if not value:
        return default
    return float(str(value).rstrip("s"))


def u64(msg: Dict[str, Any], field: str) -> int:
    """A uint64 field of an answer: a decimal string, absent when 0."""
    return int(msg.get(field) or 0)


def b64(value: Union[bytes, str]) -> str:
    """A bytes field: value (str is encoded as UTF-8) in standard base64."""
    if isinstance(value, str):
        value = value.encode()
    return base64.b64encode(value).decode()


def unb64(value: Any) -> bytes:
    """The bytes of a bytes field of an answer."""
    return base64.b64decode(value) if value else b""
