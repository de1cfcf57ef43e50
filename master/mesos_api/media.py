"""Content-Type and Accept, as Mesos reads them: JSON or protobuf bodies, and the
encoding of the events a subscription is answered with."""

from __future__ import annotations

JSON = "application/json"
PROTOBUF = "application/x-protobuf"
MEDIA = (JSON, PROTOBUF)

MAX_ACCEPT_RANGES = 64  # media ranges read from one Accept header


def content_type(header: str | None) -> str | None:
    """The body's encoding (JSON or PROTOBUF) from its Content-Type; None if another.
    Parameters (`; charset=utf-8`) are ignored."""
    if header is None:
        return None
    media = header.split(";", 1)[0].strip().lower()
    return media if media in MEDIA else None


def _quality(params: list[str]) -> float:
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def accepts(header: str | None, media: str) -> bool:
    """Whether an Accept header lets the response be `media` (no header: anything),
    with its best matching range's quality above 0 (RFC 7231, as Mesos reads it)."""
    if header is None:
        return True
    best: tuple[int, float] | None = None  # (specificity, quality) of the best match
    kind = media.partition("/")[0]
    for part in header.split(",")[:MAX_ACCEPT_RANGES]:
        pieces = part.split(";")
        candidate = pieces[0].strip().lower()
        c_kind, _, c_sub = candidate.partition("/")
        if candidate == media:
            specificity = 2
        elif c_kind == kind and c_sub == "*":
            specificity = 1
        elif candidate == "*/*":
            specificity = 0
        else:
            continue
        if best is None or specificity > best[0]:
            best = (specificity, _quality(pieces[1:]))
    return best is not None and best[1] > 0


def response_media(accept: str | None) -> str | None:
    """What a subscription's events are encoded as: JSON if acceptable, else protobuf,
    as Mesos prefers; None if neither (406)."""
    for media in (JSON, PROTOBUF):
        if accepts(accept, media):
            return media
    return None
