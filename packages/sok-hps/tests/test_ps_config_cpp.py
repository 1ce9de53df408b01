"""load_config through the C++ reader (csrc/serving/ps_config.cpp): what test_config.py does not pin.

The reader's messages are made of Python's: repr of every value, difflib's nearest key, re's
verdict on a regular expression, parse_address's on an address; each is held to Python's here.
The defaults of the C++ structs are held to the dataclasses', the names it takes to NAME_PATTERN.
The files that are not a ps_config, the integers of 64 bits and more, and the mappings JSON cannot
say have their messages pinned.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import logging
import os
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hierarchical_parameter_server import _serving
from hierarchical_parameter_server.config import (
    MAX_CONFIG_BYTES,
    NAME_PATTERN,
    OVERFLOW_POLICIES,
    ConfigError,
    ModelConfig,
    PersistentDBConfig,
    PSConfig,
    UpdateSourceConfig,
    VolatileDBConfig,
    load_config,
    parse_address,
)

sys.path.insert(0, str(Path(__file__).parent))  # the helper modules beside the tests (importlib mode)

from ps_config_cases import minimal, reference_section_4, with_value  # noqa: E402

# The message of an integer above int64's maximum in a key of no upper bound (ps_config.hpp).
ABOVE_INT64 = re.compile(r"expected an integer in \[\d+, 9223372036854775807\], got (\d+) \(int\)$")


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def outcome(source) -> tuple:
    """("ok", asdict, warnings) or ("error", message, warnings) of load_config(source)."""
    logger = logging.getLogger("hierarchical_parameter_server.config")
    handler = _Warnings()
    logger.addHandler(handler)
    try:
        return ("ok", dataclasses.asdict(load_config(source)), handler.messages)
    except ConfigError as e:
        return ("error", str(e), handler.messages)
    finally:
        logger.removeHandler(handler)


def both(raw, tmp_path) -> tuple:
    """The outcome of ``raw`` as a mapping, which must be that of ``raw`` written to a file."""
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(raw))
    result = outcome(raw)
    assert outcome(path) == result
    return result


def error(raw, tmp_path) -> str:
    result = both(raw, tmp_path)
    assert result[0] == "error", result
    return result[1]


# -- the C++ structs against the dataclasses --------------------------------------------------------


def test_the_readers_defaults_are_the_dataclasses():
    cfg = load_config(minimal())
    assert cfg.volatile_db == VolatileDBConfig()
    assert cfg.persistent_db == PersistentDBConfig()
    assert cfg.update_source == UpdateSourceConfig()
    assert cfg.fuse_embedding_table == PSConfig.__dataclass_fields__["fuse_embedding_table"].default
    model = cfg.model("m")
    for f in dataclasses.fields(ModelConfig):
        if f.default is not dataclasses.MISSING:
            assert getattr(model, f.name) == f.default, f.name


def test_the_reader_returns_the_dataclasses_fields_in_order():
    raw = _serving.parse_ps_config(json.dumps(minimal()))
    assert list(raw) == [f.name for f in dataclasses.fields(PSConfig)]
    for key, cls in (
        ("volatile_db", VolatileDBConfig),
        ("persistent_db", PersistentDBConfig),
        ("update_source", UpdateSourceConfig),
    ):
        assert list(raw[key]) == [f.name for f in dataclasses.fields(cls)]
    assert list(raw["models"][0]) == [f.name for f in dataclasses.fields(ModelConfig)]


def test_errors_are_config_errors_of_config_py():
    with pytest.raises(ConfigError) as e:
        load_config({"supportlonglong": "yes", "models": []})
    assert type(e.value) is ConfigError and e.value.__cause__ is None
    assert str(e.value) == "supportlonglong: expected true or false, got 'yes' (str)"


@pytest.mark.parametrize(
    "name",
    ["m", "a-b_C9", "x" * 120, "x" * 121, "", "a.b", "a b", "é", "a/b", "\u212a", "m\n", "٣"],
)
def test_names_are_those_of_name_pattern(name, tmp_path):
    for raw in (minimal(model=name), minimal(embedding_table_names=["t", name])):
        result = both(raw, tmp_path)
        assert (result[0] == "ok") == bool(NAME_PATTERN.fullmatch(name)), result


@pytest.mark.parametrize(
    ("policy", "alias"), [(name, a) for name, aliases in OVERFLOW_POLICIES.items() for a in (name, *aliases)]
)
def test_overflow_policies_are_the_readers(policy, alias):
    cfg = load_config(with_value(minimal(), "volatile_db.overflow_policy", alias.upper()))
    assert cfg.volatile_db.overflow_policy == policy


# -- files that are not a ps_config ----------------------------------------------------------------

FILES = {
    "binary": bytes(range(256)) * 4,
    "truncated-utf8": b'{"a": "\xe2\x82',
    "overlong-utf8": b'{"a": "\xc0\xaf"}',
    "surrogate-utf8": b'{"a": "\xed\xa0\x80"}',
    "beyond-unicode": b'{"a": "\xf4\x90\x80\x80"}',
    "lone-continuation-after-text": '{"ä": 1} '.encode() + b"\x80",
    "bad-continuation": b'["\xe2\x28\xa1"]',
    "empty": b"",
    "blank": b" \n",
    "unicode-blank": "\u3000\x1c\n".encode(),
    "bad-json": b"{",
    "trailing-comma": b"[1,]",
    "missing-colon": b'{"a" 1}',
    "extra-data": b"{} {}",
    "bom": b'\xef\xbb\xbf{"supportlonglong": true}',
    "control-character": b'{"a": "\x01"}',
    "bad-escape": b'{"a": "\\q"}',
    "bad-unicode-escape": b'{"a": "\\u12"}',
    "unterminated-string": '{"ä": "x'.encode(),
    "array": b"[1, 2]",
    "string": b'"ps"',
    "null": b"null",
    "number": b"1.5",
    "nan": b"NaN",
    "boolean": b"true",
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "too-many-digits": b'{"supportlonglong": true, "models": ' + b"1" * 5000 + b"}",
    "too-many-negative-digits": b'{"models": -' + b"1" * 4301 + b"}",
}


def not_utf8(byte: str, offset: int) -> str:
    return f"is not UTF-8 text (byte {byte} at offset {offset}); is it a binary file? Pass the path of a JSON ps_config"


def holds(kind: str) -> str:
    return f'holds {kind}; a ps_config is a JSON object {{"supportlonglong": ..., "models": [...]}}'


def too_many_digits(digits: int) -> str:
    return (
        f"cannot be parsed: Exceeds the limit (4300 digits) for integer string conversion: value has {digits} digits; "
        "use sys.set_int_max_str_digits() to increase the limit"
    )


EMPTY = "is empty; write the ps_config's JSON object into it"
# name -> load_config's message after "ps_config file '<path>' "
FILE_ERRORS = {
    "binary": not_utf8("0x80", 128),
    "truncated-utf8": not_utf8("0xe2", 7),
    "overlong-utf8": not_utf8("0xc0", 7),
    "surrogate-utf8": not_utf8("0xed", 7),
    "beyond-unicode": not_utf8("0xf4", 7),
    "lone-continuation-after-text": not_utf8("0x80", 10),
    "bad-continuation": not_utf8("0xe2", 2),
    "empty": EMPTY,
    "blank": EMPTY,
    "unicode-blank": EMPTY,
    "bad-json": "is not valid JSON: " + "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    "trailing-comma": "is not valid JSON: " + "Expecting value: line 1 column 4 (char 3)",
    "missing-colon": "is not valid JSON: " + "Expecting ':' delimiter: line 1 column 6 (char 5)",
    "extra-data": "is not valid JSON: " + "Extra data: line 1 column 4 (char 3)",
    "bom": "is not valid JSON: " + "Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0)",
    "control-character": "is not valid JSON: " + "Invalid control character at: line 1 column 8 (char 7)",
    "bad-escape": "is not valid JSON: " + "Invalid \\escape: line 1 column 8 (char 7)",
    "bad-unicode-escape": "is not valid JSON: " + "Invalid \\uXXXX escape: line 1 column 9 (char 8)",
    "unterminated-string": "is not valid JSON: " + "Unterminated string starting at: line 1 column 7 (char 6)",
    "array": holds("an array"),
    "string": holds("a string"),
    "null": holds("null"),
    "number": holds("a number"),
    "nan": holds("a number"),
    "boolean": holds("a boolean"),
    "deep": "nests arrays or objects too deeply to parse; a ps_config nests 4 levels deep",
    "too-many-digits": too_many_digits(5000),
    "too-many-negative-digits": too_many_digits(4301),
}


@pytest.mark.parametrize("name", list(FILES))
def test_files_that_are_not_a_ps_config(name, tmp_path):
    path = tmp_path / f"{name}.json"
    path.write_bytes(FILES[name])
    assert outcome(path) == ("error", f"ps_config file {str(path)!r} {FILE_ERRORS[name]}", [])


def test_a_missing_file_and_a_directory(tmp_path):
    for path, why in (
        (tmp_path / "absent.json", "No such file or directory"),
        (tmp_path, "Is a directory"),
        (tmp_path / "absent" / "ps.json", "No such file or directory"),
    ):
        message = f"ps_config file {str(path)!r} cannot be read ({why}); pass the path of a JSON file"
        assert outcome(path) == ("error", message, [])


def test_a_file_name_that_is_not_utf8_is_named_as_os_fsdecode_reads_it(tmp_path):
    for name in (b"ps\xff.json", b"ps\xe2\x82.json", b"ps\xc3\xa9\x80.json"):
        path = os.path.join(os.fsencode(tmp_path), name)
        message = (
            f"ps_config file {os.fsdecode(path)!r} cannot be read (No such file or directory); pass the path of a "
            "JSON file"
        )
        assert outcome(path) == outcome(os.fsdecode(path)) == ("error", message, [])


def test_a_path_with_a_nul_byte():
    assert outcome("ps\0.json") == ("error", "embedded null byte", [])


def test_files_over_the_size_limit(tmp_path):
    path = tmp_path / "large.json"
    with open(path, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    for too_large in (str(path), "/dev/zero"):
        message = (
            f"ps_config file {too_large!r} is larger than {MAX_CONFIG_BYTES} bytes; a ps_config is a small JSON "
            "file, pass its path"
        )
        assert outcome(too_large) == ("error", message, [])
    path.write_bytes(b" " * MAX_CONFIG_BYTES)  # at the limit: read, and blank
    assert outcome(path)[1] == f"ps_config file {str(path)!r} {EMPTY}"


# -- integers of 64 bits and more -----------------------------------------------------------------


@pytest.mark.parametrize("margin", [1, 2**63 - 1, 2**63, 2**64 - 1])
def test_overflow_margin_takes_uint64(margin, tmp_path):
    result = both(with_value(minimal(), "volatile_db.overflow_margin", margin), tmp_path)
    assert result[1]["volatile_db"]["overflow_margin"] == margin


@pytest.mark.parametrize("value", [2**63, 2**64, 10**30, 10**400])
@pytest.mark.parametrize(
    "path", ["models[0].max_batch_size", "models[0].deployed_device_list", "models[0].refresh_interval"]
)
def test_integers_above_int64_are_refused_in_keys_of_no_maximum(path, value, tmp_path):
    message = error(with_value(minimal(), path, [value] if path.endswith("list") else value), tmp_path)
    found = ABOVE_INT64.search(message)
    assert message.startswith(path) and found and int(found[1]) == value, message


@pytest.mark.parametrize("value", [-(2**63) - 1, -(10**30), -(10**400)])
def test_integers_below_int64_are_below_every_minimum(value, tmp_path):
    assert error(with_value(minimal(), "models[0].max_batch_size", value), tmp_path) == (
        f"models[0].max_batch_size: expected an integer >= 1, got {value} (int)"
    )
    assert error(with_value(minimal(), "models[0].deployed_device_list", [value]), tmp_path) == (
        f"models[0].deployed_device_list[0]: expected an integer >= 0, got {value} (int)"
    )


@pytest.mark.parametrize("value", [2**64, 10**30, -(10**30), 10**308, 10**309])
def test_integers_beyond_64_bits_are_numbers_as_float_reads_them(value, tmp_path):
    try:
        number = float(value)
    except OverflowError:
        number = None
    result = both(with_value(minimal(), "models[0].hit_rate_threshold", value), tmp_path)
    if number is None or number < 0:
        assert result[1] == f"models[0].hit_rate_threshold: expected a finite number >= 0.0, got {value} (int)"
    else:
        assert result[1]["models"][0]["hit_rate_threshold"] == number


# -- what the messages are made of: Python's repr, difflib, re, parse_address ---------------------


def test_every_code_point_is_written_as_repr_writes_it(tmp_path):
    # Each lone surrogate followed by an "x": json.loads would join a high and a low one.
    name = "".join(chr(c) + "x" if 0xD800 <= c <= 0xDFFF else chr(c) for c in range(0x110000))
    for model in (name, name + "'", "'\"\\"):
        assert error(minimal(model=model), tmp_path) == (
            "models[0].model: expected a name of 1 to 120 letters, digits, '_' or '-' (it becomes part of the table "
            f"tag hps_et.<model>.<table>), got {model!r} (str)"
        )


FLOATS = [0.0, -0.0, 0.1, 1e-4, 1e-5, 1.5e-7, 123456789.125, 1e15, 1e16, 1.2345678901234567e16, 1e22, 5e-324, -2.5e300]


@pytest.mark.parametrize("value", FLOATS, ids=[repr(f) for f in FLOATS])
def test_floats_are_written_as_repr_writes_them(value, tmp_path):
    assert error(minimal(max_batch_size=value), tmp_path) == (
        f"models[0].max_batch_size: expected an integer >= 1, got {value!r} (float)"
    )
    listed = [value, {"k": value}]
    assert error(minimal(gpucache=listed), tmp_path) == (
        f"models[0].gpucache: expected true or false, got {listed!r} (list)"
    )


KEYS = [
    "gpucacheper",
    "gpucach",
    "GPUCACHEPER",
    "max_batch",
    "maxnum_des_features",
    "refresh",
    "x",
    "fuse_embedding_tables",
    "embedding_cache",
    "use_hctr",
    "ä" * 3,
    "g" * 250 + "pucacheper",  # long enough for difflib's autojunk
    "gpucacheper" * 20,
    "ps_config",
]


def unknown_key_warning(where: str, key: str, known: list[str]) -> str:
    """The warning of an unknown key, with difflib's nearest known key."""
    near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(sorted(known))}"
    return (
        f"ps_config: unknown key {where}.{key} is ignored{hint}"
        if where
        else (f"ps_config: unknown key {key} is ignored{hint}")
    )


def fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("key", KEYS)
def test_unknown_keys_are_warned_with_difflibs_nearest_key(key, tmp_path):
    raw = minimal(**{key: 1})
    raw[key] = 2
    raw["volatile_db"] = {key: 3, "type": "redis", "max_batch_size": 300000}
    raw["update_source"] = {key: 4, "max_batch_size": 1}
    warnings = []
    if key not in fields(ModelConfig):
        warnings.append(unknown_key_warning("models[0]", key, fields(ModelConfig)))
    if key not in fields(VolatileDBConfig):
        warnings.append(unknown_key_warning("volatile_db", key, fields(VolatileDBConfig)))
    warnings.append("ps_config: volatile_db.max_batch_size 300000 is above 262143, which Redis pipelines handle badly")
    if key not in fields(UpdateSourceConfig):
        warnings.append(unknown_key_warning("update_source", key, fields(UpdateSourceConfig)))
    warnings.append("ps_config: update_source.max_batch_size is ignored (Kafka is not supported)")
    if key not in fields(PSConfig):
        warnings.append(unknown_key_warning("", key, fields(PSConfig)))
    result = both(raw, tmp_path)
    assert result[2] == warnings, result


PATTERNS = [
    ".+",
    "^hps_.+$",
    "(",
    ")",
    "a)",
    "[",
    "[a",
    "[]",
    "[]a]",
    "[^]",
    "[z-a]",
    "[a-\\d]",
    "[\\d-z]",
    "[a-]",
    "[\\n-a]",
    "[\\x41-\\x40]",
    "*",
    "a**",
    "a{2,1}",
    "a{,3}",
    "a{3",
    "a{}",
    "{1}",
    "^*",
    "\\b+",
    "a{4294967295}",
    "a{4294967294}",
    "a{" + "1" * 4301 + "}",
    "\\",
    "a\\",
    "\\q",
    "\\8",
    "\\1",
    "(a)\\1",
    "(a)\\2",
    "(a\\1)",
    "\\x4",
    "\\x4g",
    "\\u12",
    "\\U0011ffff",
    "\\U0010ffff",
    "\\777",
    "\\0777",
    "[\\777]",
    "\\N",
    "\\N{",
    "\\N{}",
    "\\N{x}",
    "\\N{EM DASH}+",
    "[\\N{EM DASH}-\\N{EM DASH}]",
    "(?",
    "(?P",
    "(?Px)",
    "(?P<",
    "(?P<>a)",
    "(?P<1a>a)",
    "(?P<a>a)(?P<a>b)",
    "(?P<a>a)(?P=a)",
    "(?P<a>a(?P=a))",
    "(?P=b)",
    "(?P<a",
    "(?#comment",
    "(?#comment)a",
    "(?<x)",
    "(?<=a+)b",
    "(?<=a|bc)d",
    "(?<=ab|cd)e",
    "(?<!a{2})b",
    "(?<=(?<=a+)b)c",
    "(?<=a{4294967294}a{4294967294})b",
    "(a)(?<=\\1)",
    "(?<=(a)\\1)",
    "(?(1)a|b)",
    "(a)(?(1)a|b)",
    "(a)(?(1)a|b|c)",
    "(?(0)a)",
    "(?(-1)a)",
    "(?(a)a)",
    "(?(1a)a)",
    "(?( 1 )a)",
    "(?(1_0)a)",
    "(?(99999999999)a)",
    "(?(1)a",
    "(?<=(?(1)a))",
    "(?i)a",
    "a(?i)",
    "(?x) a (",
    "(?x)a b # c\n(",
    "a\n(",
    "a\nb\nc[",
    "(?i",
    "(?iz)",
    "(?i-",
    "(?i-:a)",
    "(?i-i:a)",
    "(?-a:b)",
    "(?L)a",
    "(?au)a",
    "(?a)(?u)a",
    "(?t:a)",
    "(?-t:a)",
    "(?>a+)+",
    "(?:a*)*",
    "(?=a)*",
    "(a|b)+c",
    "a|*",
    "((((a))))",
    "\\d\\D\\s\\S\\w\\W\\A\\Z\\b\\B",
    "é+",
    "(?P<é>a)",
]


@pytest.mark.filterwarnings("ignore:bad character in group name:DeprecationWarning")
@pytest.mark.parametrize("pattern", PATTERNS)
def test_update_filters_are_checked_as_re_compile_checks_them(pattern, tmp_path):
    try:
        re.compile(pattern)
        expected = None
    except (re.error, OverflowError, ValueError) as e:
        expected = f"persistent_db.update_filters[1]: {pattern!r} is not a valid regular expression ({e})"
    result = both(with_value(minimal(), "persistent_db.update_filters", [".+", pattern]), tmp_path)
    if expected is None:
        assert result[0] == "ok" and result[1]["persistent_db"]["update_filters"] == (".+", pattern)
    else:
        assert result[1] == expected


ADDRESSES = [
    "h",
    "h:1",
    "h:65535",
    "h:65536",
    "h:0",
    "h:007000",
    ":7000",
    "h:",
    " h:1 ",
    "a,b",
    "a,,b",
    "\u3000h:1\x85",
]


@pytest.mark.parametrize("address", [*ADDRESSES, "h:７０００", "h:²"])
def test_addresses_are_checked_as_parse_address_checks_them(address, tmp_path):
    try:
        expected = ("ok", tuple(parse_address(a) for a in address.split(",")))
    except ConfigError as e:
        expected = ("error", str(e))
    result = both(with_value(minimal(), "volatile_db.address", address), tmp_path)
    if result[0] == "ok":
        result = ("ok", load_config(with_value(minimal(), "volatile_db.address", address)).volatile_db.addresses)
    assert result[:2] == expected


def test_every_code_point_is_whitespace_as_str_isspace_says(tmp_path):
    # parse_address strips its entry: every whitespace character around one goes, every other
    # character (before a port, in an entry of its own) stays and is the host.
    chars = [chr(c) for c in range(0x110000) if c != ord(",")]
    spaces = "".join(c for c in chars if c.isspace())
    kept = [c for c in chars if not c.isspace()]
    for address, hosts in ((f"{spaces}h:1{spaces}", ["h"]), (",".join(c + ":1" for c in kept), kept)):
        assert both(with_value(minimal(), "volatile_db.address", address), tmp_path)[0] == "ok"
        addresses = load_config(with_value(minimal(), "volatile_db.address", address)).volatile_db.addresses
        assert addresses == tuple((host, 1) for host in hosts)


# -- mappings: what JSON can say ------------------------------------------------------------------


def test_tuples_and_other_mappings_are_arrays_and_objects(tmp_path):
    raw = reference_section_4()
    as_tuples = dict(
        raw, models=tuple(types.MappingProxyType(dict(m, sparse_files=tuple(m["sparse_files"]))) for m in raw["models"])
    )
    assert outcome(types.MappingProxyType(as_tuples)) == both(raw, tmp_path)


def test_subclasses_of_int_and_float_are_their_values():
    class Size(enum.IntEnum):
        LARGE = 1024

    model = load_config(minimal(max_batch_size=Size.LARGE, gpucacheper=np.float64(0.5))).model("m")
    assert type(model.max_batch_size) is int and model.max_batch_size == 1024
    assert type(model.gpucacheper) is float and model.gpucacheper == 0.5


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (np.int64(3), "np.int64(3) (int64)"),
        (np.float32(0.5), "np.float32(0.5) (float32)"),
        (b"x", "b'x' (bytes)"),
        ({1, 2}, "{1, 2} (set)"),
    ],
)
def test_values_json_cannot_write_are_refused(value, shown):
    with pytest.raises(ConfigError) as e:
        load_config(minimal(max_batch_size=value))
    assert str(e.value) == (
        f"models[0].max_batch_size: {shown} is not a JSON value; give a dict, list, str, int, float, bool or None "
        "(e.g. int(x) or float(x) of a numpy scalar)"
    )


@pytest.mark.parametrize(("key", "shown"), [(1, "1 (int)"), (None, "None (NoneType)"), ((1, 2), "(1, 2) (tuple)")])
def test_keys_that_are_not_strings_are_refused(key, shown):
    raw = minimal()
    raw["models"][0][key] = 1
    with pytest.raises(ConfigError) as e:
        load_config(raw)
    assert str(e.value) == f"models[0]: key {shown} is not a string; a JSON object's keys are strings"
    with pytest.raises(ConfigError, match=rf"^ps_config: key {re.escape(shown)} is not a string"):
        load_config({key: 1, **minimal()})


@pytest.mark.parametrize("depth", [600, 100_000])
def test_mappings_nested_too_deeply_are_refused(depth):
    nested: list = []
    for _ in range(depth):
        nested = [nested]
    with pytest.raises(ConfigError, match="^ps_config nests arrays or objects too deeply to read"):
        load_config(minimal(comment=nested))
