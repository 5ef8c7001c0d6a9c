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
from pydantic_core import from_json

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
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"] and err["type"] == "value_error":
            lines.append(f"{path}: {msg}")  # a whole-model check: its message names the field and value
        else:
            lines.append(f"{path}: field {loc}: {msg} (value {shown})")
    more = len(e.errors()) - limit
    if more > 0:
        lines.append(f"{path}: ... and {more} more errors")
    return "\n".join(lines)


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of a user's file; a missing, unreadable, binary or mis-encoded file is an
    InputError naming it (`what` says which input it is: "trace", "cluster spec", ...)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found (cannot read it)") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a {what}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read {what} ({e.strerror})") from None
    if b"\0" in raw[:65536]:
        raise InputError(f"{path}: binary data (a NUL byte), expected a UTF-8 text {what}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                         f"save the {what} as UTF-8") from None


def parse_json(text: str, where: str, what: str | None = None) -> object:
    """JSON from `text`; malformed or absurdly nested JSON is an InputError at `where` (file[:line]),
    saying which input it should have been (`what`)."""
    kind = f"not a JSON {what}: " if what else ""
    try:
        # pydantic-core's parser: the same values as json's (floats bit for bit), in 60% of the time (150,000
        # jobs: 0.77 -> 0.46 s CPU); what it refuses (malformed JSON, but also lone surrogates or nesting past
        # 200 that json reads) goes to json, whose result or error is then the answer
        return from_json(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: {kind}not valid JSON (malformed JSON at line {e.lineno}, column "
                         f"{e.colno}: {e.msg})") from None
    except RecursionError:
        raise InputError(f"{where}: {kind}JSON nested too deeply to be a valid input") from None


def load_json(path: str | Path, what: str | None = None) -> object:
    return parse_json(read_text(path, what or "file"), str(path), what)


def load_model(path: str | Path, cls: type[M]) -> M:
    path = Path(path)
    data = load_json(path)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise InputError(format_validation_error(path, e)) from None


def write_model(obj: BaseModel, path: str | Path, compact: bool = False) -> None:
    """`obj` as JSON in `path`: indented one space a level, or on one line where `compact` (the same values,
    for a file that programs read and that is too big to read by eye)."""
    atomic_write(path, obj.model_dump_json(indent=None if compact else 1, exclude_none=False))


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


def check_output_file(path: str | Path, flag: str) -> Path:
    """Fail now, before any work, if `path` cannot become the output file: a directory, a missing
    parent directory (not created for a file: a mistyped path should not grow directories), or a
    place this process may not write. Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a directory; give a file name")
    parent = path.parent
    if not parent.exists():
        raise InputError(f"{flag} {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise InputError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: directory {parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{flag} {path}: file exists and is not writable")
    return path


def check_output_dir(path: str | Path, flag: str) -> Path:
    """Fail now, before any work, if `path` cannot be (or be created as) an output directory."""
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        what = "is a file" if probe == path else f"{probe} is a file"
        raise InputError(f"{flag} {path}: {what}; give a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: {probe} is not writable")
    return path
