"""How config.yaml writes durations (`30s`, `15m`), sizes (`64KiB`) and JSON paths (`$.id`): parsed once, as pydantic
field types, so that nothing on the request path parses configuration again."""

import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from jsonpath_ng import JSONPath
from jsonpath_ng import parse as parse_jsonpath
from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_DURATION_SECONDS = 36500 * 86400.0  # a hundred years: still a datetime when added to or taken from now
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(b|kb|kib|mb|mib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2}


def parse_duration(value: Any) -> float:
    """`30s`, `15m`, `24h`, `2d`, `500ms`, or a number of seconds; returns seconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r} (use e.g. 30s, 15m, 24h)")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            seconds = float("inf") if value > 0 else float("-inf")
    else:
        m = _DURATION_RE.match(str(value))
        if not m:
            raise ValueError(f"invalid duration {value!r} (use e.g. 30s, 15m, 24h)")
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if seconds < 0:
        raise ValueError(f"invalid duration {value!r}: must not be negative")
    if not seconds <= MAX_DURATION_SECONDS:  # also NaN: clock arithmetic with it would fail at run time
        raise ValueError(f"invalid duration {value!r}: must be at most 36500d")
    return seconds


def parse_positive_duration(value: Any) -> float:
    """A duration that must be more than zero: a timeout of 0s would end every exchange before it began."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"invalid duration {value!r}: must be more than 0s")
    return seconds


def parse_size(value: Any) -> int:
    """`65536`, `64KiB`, `1MiB`; returns bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"invalid size {value!r} (use e.g. 65536, 64KiB, 1MiB)")
    return int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()]


def _compile_jsonpath(value: Any) -> "JsonPath":
    if isinstance(value, JsonPath):
        return value
    if not isinstance(value, str) or not value.startswith("$"):
        raise ValueError(f"invalid JSON path {value!r} (write it like $.id or $.items[0].id)")
    try:
        return JsonPath(value, parse_jsonpath(value))
    except Exception as e:  # noqa: BLE001 - jsonpath-ng raises bare Exceptions on syntax errors
        raise ValueError(f"invalid JSON path {value!r}: {e}") from None


@dataclass(frozen=True)
class JsonPath:
    """A compiled JSON path, kept with its source text."""

    text: str
    compiled: JSONPath = field(compare=False, repr=False)

    def find(self, document: Any) -> list[Any]:
        return [m.value for m in self.compiled.find(document)]

    def first(self, document: Any) -> Any:
        found = self.find(document)
        return found[0] if found else None


compile_jsonpath = _compile_jsonpath

Duration = Annotated[float, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[float, BeforeValidator(parse_positive_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
JsonPathField = Annotated[JsonPath, BeforeValidator(_compile_jsonpath), PlainSerializer(lambda p: p.text)]


@dataclass(frozen=True)
class AnswerField:
    """Where a value is in an answer: a JSON path into its body (`$.id`), or one of its headers (`header:ETag`)."""

    text: str
    path: JsonPath | None = field(default=None, compare=False, repr=False)

    @property
    def header(self) -> str | None:
        return self.text.split(":", 1)[1].strip() if self.path is None else None

    def first(self, document: Any) -> Any:
        """The value in a JSON document (None for a header)."""
        return self.path.first(document) if self.path is not None else None


def _compile_answer_field(value: Any) -> AnswerField:
    if isinstance(value, AnswerField):
        return value
    if isinstance(value, str) and value.lower().startswith("header:"):
        if not value.split(":", 1)[1].strip():
            raise ValueError(f"{value!r} names no header (write it like header:ETag)")
        return AnswerField(value)
    return AnswerField(value, _compile_jsonpath(value)) if isinstance(value, str) else AnswerField("", _compile_jsonpath(value))


AnswerFieldType = Annotated[AnswerField, BeforeValidator(_compile_answer_field), PlainSerializer(lambda f: f.text)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
