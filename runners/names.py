"""Safe, distinct names for job ids wherever an id becomes part of a path or a
rendezvous id (torch uses the rendezvous id in file names).

Any id (slashes, dots, `.`/`..`, unicode, hundreds of characters) maps to a
readable prefix of its safe characters plus a hash of the whole id, so two ids
never share a directory (`a/b` and `a_b` differ in the hash) and no name can
climb out of the directory it is put in.
"""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
PREFIX_CHARS = 40


def safe_name(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    prefix = _UNSAFE.sub("_", text).strip("_")[:PREFIX_CHARS]
    return f"{prefix}-{digest}" if prefix else digest
