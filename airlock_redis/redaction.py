"""One place that hides credentials in text meant for people: logs, repr, errors, CLI output."""

from __future__ import annotations

import re

_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s]*)@")
# any query option whose name holds one of these words: password=, sentinel_password=, auth_token=, ...
_QUERY_SECRET_RE = re.compile(
    r"(?P<name>[?&][A-Za-z0-9_.\-]*(?:password|passwd|pass|pwd|token|secret)[A-Za-z0-9_.\-]*=)[^&#\s'\"]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """Hide ``scheme://user:pass@host`` credentials and secret-looking query options in any text."""
    text = _USERINFO_RE.sub(lambda m: f"{m.group('scheme')}***@", text)
    return _QUERY_SECRET_RE.sub(lambda m: f"{m.group('name')}***", text)
