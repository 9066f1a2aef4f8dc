"""One place that hides credentials in text meant for people: logs, repr, errors, CLI output."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s]*)@")
# any query option whose name holds one of these words: password=, sentinel_password=, auth_token=, ...
_QUERY_SECRET_RE = re.compile(
    r"(?P<name>[?&][A-Za-z0-9_.\-]*(?:password|passwd|pass|pwd|token|secret)[A-Za-z0-9_.\-]*=)[^&#\s'\"]*",
    re.IGNORECASE,
)


def without_password(url: str) -> str:
    """``url`` with its password (and any secret-looking query option) left out, the user kept:
    ``redis://app:pw@h:6379/0`` -> ``redis://app@h:6379/0``. A userinfo with no colon is a password
    alone (``redis://pw@h``), so it goes too."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}@{hosts}" if colon and user else hosts
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not _SECRET_NAME.search(k)]
    rest = f"?{urlencode(query, safe='/')}" if query else ""
    return f"{parts.scheme}://{netloc}{parts.path}{rest}"


_SECRET_NAME = re.compile(r"password|passwd|pass|pwd|token|secret", re.IGNORECASE)


def redact(text: str) -> str:
    """Hide ``scheme://user:pass@host`` credentials and secret-looking query options in any text."""
    text = _USERINFO_RE.sub(lambda m: f"{m.group('scheme')}***@", text)
    return _QUERY_SECRET_RE.sub(lambda m: f"{m.group('name')}***", text)
