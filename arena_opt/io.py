"""Reading and writing the JSON formats, with errors that name file, field and value, and the one
atomic writer (`atomic_write`, `atomic_path`) every result file goes through."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator, TypeVar

from pydantic import BaseModel, ValidationError

from arena_opt.errors import InputError

M = TypeVar("M", bound=BaseModel)


def format_validation_error(path: str | Path, e: ValidationError, limit: int = 5) -> str:
    lines = []
    for err in e.errors()[:limit]:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        value = err.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"{path}: field {loc}: {err['msg']} (value {shown})")
    more = len(e.errors()) - limit
    if more > 0:
        lines.append(f"{path}: ... and {more} more errors")
    return "\n".join(lines)


def load_model(path: str | Path, cls: type[M]) -> M:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise InputError(format_validation_error(path, e)) from None


def write_model(obj: BaseModel, path: str | Path) -> None:
    atomic_write(path, obj.model_dump_json(indent=1, exclude_none=False))


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary name in `path`'s directory for a writer that wants a file name (savefig);
    on success the file is fsynced and renamed onto `path`, on any failure it is removed and
    `path` keeps its previous content."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # same directory: rename is atomic only within one file system; the suffix keeps format sniffing
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Write a result file so that readers see the old content or the new, never a part: a
    temporary file in the same directory, fsync, rename; removed on failure (a full disk, a signal)."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())


def write_json(path: str | Path, data: object, indent: int | None = 1, **kw) -> None:
    atomic_write(path, json.dumps(data, indent=indent, **kw) + "\n")


def _fsync_dir(d: Path) -> None:
    # makes the rename itself durable; some file systems refuse fsync on a directory
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
