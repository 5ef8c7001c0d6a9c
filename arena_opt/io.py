"""Reading and writing the JSON formats, with errors that name file, field and value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    # write-then-rename: an interrupted write never leaves a truncated file behind
    tmp.write_text(obj.model_dump_json(indent=1, exclude_none=False))
    tmp.replace(path)
