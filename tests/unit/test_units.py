"""How config.yaml writes durations, sizes and JSON paths (units.py): what each parses to, the bounds, and the
one-line error for what it refuses; and the pydantic field types that parse them once, at load."""

import math

import pytest
from pydantic import ValidationError

from proxy_addon.units import (
    MAX_DURATION_SECONDS,
    Duration,
    JsonPath,
    JsonPathField,
    PositiveDuration,
    Size,
    StrictModel,
    compile_jsonpath,
    parse_duration,
    parse_positive_duration,
    parse_size,
)


@pytest.mark.parametrize("text, seconds", [
    ("30s", 30.0), ("15m", 900.0), ("24h", 86400.0), ("2d", 172800.0), ("500ms", 0.5), ("1.5h", 5400.0),
    (" 10s ", 10.0), ("0s", 0.0), (5, 5.0), (2.5, 2.5), (0, 0.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "abc", "10", "10 sec", "s", "-5s", "1w", "1.2.3s", -1, True, None, [30]])
def test_parse_duration_refuses(bad):
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(bad)


@pytest.mark.parametrize("text, size", [
    (65536, 65536), ("65536", 65536), ("64KiB", 65536), ("64kib", 65536), ("1MiB", 1048576), ("1kb", 1000),
    ("2MB", 2_000_000), ("10 b", 10), ("0", 0),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "-1", -1, "1GB", "abc", "1.5MiB", "KiB", True, None])
def test_parse_size_refuses(bad):
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(bad)


@pytest.mark.parametrize("value", [MAX_DURATION_SECONDS, "36500d", f"{36500 * 24}h"])
def test_a_hundred_years_is_the_longest_duration(value):
    assert parse_duration(value) == MAX_DURATION_SECONDS


@pytest.mark.parametrize("value", ["36501d", MAX_DURATION_SECONDS + 1, math.inf, math.nan, 10**400, -(10**400)])
def test_a_duration_past_a_hundred_years_or_not_a_number_is_refused(value):
    """Added to or taken from now, it would no longer be a datetime: refused at load, not at run time."""
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(value)


def test_a_positive_duration_refuses_zero_and_takes_the_least_above_it():
    for zero in ("0s", "0ms", 0, 0.0):
        with pytest.raises(ValueError, match="more than 0s"):
            parse_positive_duration(zero)
    assert parse_positive_duration("1ms") == 0.001 and parse_positive_duration(0.01) == 0.01


def test_the_fields_parse_at_load_and_name_what_is_wrong():
    class Settings(StrictModel):
        timeout: PositiveDuration = 30.0
        window: Duration = 0.0
        cap: Size = 0
        path: JsonPathField | None = None

    got = Settings.model_validate({"timeout": "2m", "window": "0s", "cap": "2KiB", "path": "$.data.id"})
    assert (got.timeout, got.window, got.cap, got.path.text) == (120.0, 0.0, 2048, "$.data.id")
    assert got.model_dump()["path"] == "$.data.id"  # written back as it was given
    with pytest.raises(ValidationError, match="invalid duration"):
        Settings.model_validate({"timeout": "0s"})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Settings.model_validate({"timeot": "1s"})


def test_a_json_path_finds_every_match_and_first_is_none_when_there_is_none():
    items = compile_jsonpath("$.items[*].id")
    document = {"items": [{"id": 1}, {"id": 2}, {"name": "x"}]}
    assert items.find(document) == [1, 2] and items.first(document) == 1
    assert items.find({"items": []}) == [] and items.first({}) is None
    assert compile_jsonpath("$.id").first({"id": None}) is None


def test_a_compiled_path_is_kept_as_is_and_compares_by_its_text():
    path = compile_jsonpath("$.id")
    assert compile_jsonpath(path) is path
    assert path == compile_jsonpath("$.id") and path != compile_jsonpath("$.ID")
    assert isinstance(path, JsonPath)


@pytest.mark.parametrize("bad", ["id", ".id", "", None, 5, "$.items[", "$.a..[?"])
def test_an_invalid_json_path_is_refused_with_its_text(bad):
    with pytest.raises(ValueError, match="invalid JSON path"):
        compile_jsonpath(bad)
