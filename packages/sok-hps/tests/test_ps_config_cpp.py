"""The C++ ps_config reader (csrc/serving/ps_config.hpp, through _serving) against config.py's.

For every config test_config.py loads (ps_config_cases), for the files no ps_config should be, and
for ~300 mutations of valid configs, the two readers give the same outcome: for a valid config
the same ``dataclasses.asdict`` value, types included (tuples, int against float); for an invalid
one a ConfigError with the same message; and the same warnings, in the same order. A config
the Python test passes as a mapping is given to C++ as JSON text (parse_ps_config) and, as every
config, as a file (read_ps_config, against load_config of the same file).

The readers' differences these cases reach (ps_config.hpp): an integer outside int64 and uint64 is
a parse error in C++ (json.hpp), where Python reads it; one above int64 is refused in a key of no
maximum, where Python takes it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import random
import re
import subprocess
import sys

import pytest
from hierarchical_parameter_server.config import MAX_CONFIG_BYTES, ConfigError, load_config
from ps_config_cases import (
    ALIAS_CASES,
    BAD_VALUES,
    CONFIGS,
    FLOAT_KEYS,
    HARD_MODEL_KEYS,
    HARD_TOP_LEVEL_KEYS,
    NON_FINITE,
    NON_FINITE_IDS,
    NON_FINITE_LITERALS,
    minimal,
    reference_section_4,
    with_alias,
    with_value,
    without,
)

_serving = pytest.importorskip("hierarchical_parameter_server._serving")

INT64 = range(-(2**63), 2**63)
UINT64 = range(2**64)
# The C++ reader's message for an integer above int64 in a key of no maximum.
ABOVE_INT64 = re.compile(r"expected an integer in \[\d+, 9223372036854775807\], got (\d+) \(int\)$")


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def python_outcome(source) -> tuple:
    """("ok", asdict, warnings) or ("error", message, warnings) of config.py's load_config."""
    logger = logging.getLogger("hierarchical_parameter_server.config")
    handler = _Warnings()
    logger.addHandler(handler)
    try:
        return ("ok", dataclasses.asdict(load_config(source)), handler.messages)
    except ConfigError as e:
        return ("error", str(e), handler.messages)
    finally:
        logger.removeHandler(handler)


def cpp_outcome(read, argument) -> tuple:
    """The outcome of the C++ reader, as python_outcome's."""
    warnings: list[str] = []
    try:
        return ("ok", read(argument, warn=warnings.append), warnings)
    except _serving.ConfigError as e:
        return ("error", str(e), warnings)


def typed(value):
    """``value`` with the type of every part spelled out, so that 1 != 1.0 and (1,) != [1]."""
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, repr(value))


def assert_same(cpp: tuple, python: tuple) -> None:
    assert typed(cpp) == typed(python)


def integers(value) -> list[int]:
    """The integers in a JSON value."""
    if isinstance(value, dict):
        return [i for v in value.values() for i in integers(v)]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in integers(v)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def check_mapping(raw, tmp_path) -> None:
    """The C++ reader of ``raw`` as JSON text and as a file against load_config of each."""
    text = json.dumps(raw)
    path = tmp_path / "ps.json"
    path.write_text(text)
    if any(i not in INT64 and i not in UINT64 for i in integers(raw)):  # json.hpp's difference
        with pytest.raises(_serving.JsonParseError, match="does not fit 64 bits"):
            _serving.parse_ps_config(text)
        with pytest.raises(_serving.ConfigError, match=r"ps\.json' cannot be parsed: integer .* does not fit 64 bits"):
            _serving.read_ps_config(str(path))
        return
    above_int64 = [i for i in integers(raw) if i not in INT64]
    for cpp, python in (
        (cpp_outcome(_serving.parse_ps_config, text), python_outcome(raw)),
        (cpp_outcome(_serving.read_ps_config, str(path)), python_outcome(path)),
    ):
        if above_int64 and typed(cpp) != typed(python):  # an int64 key of no maximum (ps_config.hpp)
            found = ABOVE_INT64.search(cpp[1]) if cpp[0] == "error" else None
            assert found and int(found[1]) in above_int64, (cpp, python)
        else:
            assert_same(cpp, python)


def check_file(path) -> None:
    assert_same(cpp_outcome(_serving.read_ps_config, str(path)), python_outcome(str(path)))


# -- every case of test_config.py ------------------------------------------------------------------


@pytest.mark.parametrize("raw", [minimal(), reference_section_4()], ids=["minimal", "reference-section-4"])
def test_valid_configs(raw, tmp_path):
    assert python_outcome(raw)[0] == "ok"
    check_mapping(raw, tmp_path)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_configs_of_test_config(name, tmp_path):
    check_mapping(CONFIGS[name], tmp_path)


@pytest.mark.parametrize(("section", "key", "alias", "canonical"), ALIAS_CASES)
def test_aliases(section, key, alias, canonical, tmp_path):
    check_mapping(with_alias(section, key, alias), tmp_path)


@pytest.mark.parametrize(("path", "value", "words"), BAD_VALUES)
def test_bad_values(path, value, words, tmp_path):
    raw = with_value(minimal(), path, value)
    assert python_outcome(raw)[0] == "error"
    check_mapping(raw, tmp_path)


@pytest.mark.parametrize("key", [f"models[0].{k}" for k in HARD_MODEL_KEYS] + HARD_TOP_LEVEL_KEYS)
def test_missing_hard_keys(key, tmp_path):
    check_mapping(without(minimal(), key), tmp_path)


@pytest.mark.parametrize("value", [*NON_FINITE, 1e39], ids=[*NON_FINITE_IDS, "beyond-float32"])
def test_default_values_beyond_float32(value, tmp_path):
    check_mapping(minimal(default_value_for_each_table=[0.5, value]), tmp_path)


@pytest.mark.parametrize("path", FLOAT_KEYS)
@pytest.mark.parametrize("value", NON_FINITE, ids=NON_FINITE_IDS)
def test_float_keys_refuse_non_finite_values(path, value, tmp_path):
    check_mapping(with_value(minimal(), path, value), tmp_path)


@pytest.mark.parametrize("literal", NON_FINITE_LITERALS)
def test_non_finite_literals_in_a_file(literal, tmp_path):
    path = tmp_path / f"{literal}.json"
    path.write_text(json.dumps(minimal()).replace("[1.5]", f"[{literal}]"))
    check_file(path)


# -- files that are not a ps_config ----------------------------------------------------------------

# name -> the file's bytes
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


@pytest.mark.parametrize("name", list(FILES))
def test_files_that_are_not_a_ps_config(name, tmp_path):
    path = tmp_path / f"{name}.json"
    path.write_bytes(FILES[name])
    outcome = python_outcome(str(path))
    assert outcome[0] == "error"
    check_file(path)


def test_a_missing_file_and_a_directory(tmp_path):
    check_file(tmp_path / "absent.json")
    check_file(tmp_path)
    check_file(tmp_path / "absent" / "ps.json")


def test_a_file_name_that_is_not_utf8(tmp_path):
    """The C++ reader given the name's bytes writes it as Python writes the str os.fsdecode makes of them."""
    for name in (b"ps\xff.json", b"ps\xe2\x82.json", b"ps\xc3\xa9\x80.json"):
        path = os.path.join(os.fsencode(tmp_path), name)
        assert_same(cpp_outcome(_serving.read_ps_config, path), python_outcome(os.fsdecode(path)))


def test_a_path_with_a_nul_byte():
    with pytest.raises(ValueError) as python:
        load_config("ps\0.json")
    with pytest.raises(_serving.ConfigError) as cpp:  # a ConfigError here (ps_config.hpp)
        _serving.read_ps_config("ps\0.json")
    assert str(cpp.value) == str(python.value)


def test_files_over_the_size_limit(tmp_path):
    path = tmp_path / "large.json"
    with open(path, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    check_file(path)
    check_file("/dev/zero")
    path.write_bytes(b" " * MAX_CONFIG_BYTES)  # at the limit: read, and blank
    check_file(path)


def test_a_fifo_without_a_writer(tmp_path):
    fifo = tmp_path / "ps.fifo"
    os.mkfifo(fifo)
    # In a child process: a C++ read that blocked would hold the GIL, so no thread here could time out.
    code = (
        "import sys; from hierarchical_parameter_server import _serving\n"
        "try:\n    _serving.read_ps_config(sys.argv[1])\nexcept _serving.ConfigError as e:\n    print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(fifo)], env=env, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("read_ps_config blocked on a FIFO without a writer")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == python_outcome(str(fifo))[1]


# -- what the messages are made of: Python's repr, difflib, re ------------------------------------


def test_every_code_point_is_written_as_repr_writes_it(tmp_path):
    # Each lone surrogate (\ud800 in the JSON) followed by an "x": json.loads would join a high and a low one.
    name = "".join(chr(c) + "x" if 0xD800 <= c <= 0xDFFF else chr(c) for c in range(0x110000))
    check_mapping(minimal(model=name), tmp_path)
    check_mapping(minimal(model=name + "'"), tmp_path)
    check_mapping(minimal(model="'\"\\"), tmp_path)


FLOATS = [0.0, -0.0, 0.1, 1e-4, 1e-5, 1.5e-7, 123456789.125, 1e15, 1e16, 1.2345678901234567e16, 1e22, 5e-324, -2.5e300]


@pytest.mark.parametrize("value", FLOATS, ids=[repr(f) for f in FLOATS])
def test_floats_are_written_as_repr_writes_them(value, tmp_path):
    check_mapping(minimal(max_batch_size=value), tmp_path)
    check_mapping(minimal(gpucache=[value, {"k": value}]), tmp_path)


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


@pytest.mark.parametrize("key", KEYS)
def test_unknown_keys_are_warned_with_the_same_nearest_key(key, tmp_path):
    raw = minimal(**{key: 1})
    raw[key] = 2
    raw["volatile_db"] = {key: 3, "type": "redis", "max_batch_size": 300000}
    raw["update_source"] = {key: 4, "max_batch_size": 1}
    check_mapping(raw, tmp_path)


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
    "(" * 600 + ")" * 600,
    "\\d\\D\\s\\S\\w\\W\\A\\Z\\b\\B",
    "é+",
    "(?P<é>a)",
]


@pytest.mark.filterwarnings("ignore:bad character in group name:DeprecationWarning")
@pytest.mark.parametrize("pattern", PATTERNS)
def test_update_filters_are_checked_as_re_compile_checks_them(pattern, tmp_path):
    raw = with_value(minimal(), "persistent_db.update_filters", [".+", pattern])
    try:
        expected = python_outcome(raw)
    except (OverflowError, ValueError, RecursionError) as e:  # config.py catches re.error only
        if pattern.startswith("(" * 600):
            return  # RecursionError: Python's and the C++ nesting limits differ (py_regex.hpp)
        with pytest.raises(_serving.ConfigError) as cpp:
            _serving.parse_ps_config(json.dumps(raw))
        assert str(cpp.value) == str(e)
        return
    assert_same(cpp_outcome(_serving.parse_ps_config, json.dumps(raw)), expected)


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


@pytest.mark.parametrize("margin", [1, 2**63 - 1, 2**63, 2**64 - 1])
def test_overflow_margin_takes_uint64(margin, tmp_path):
    raw = with_value(minimal(), "volatile_db.overflow_margin", margin)
    assert python_outcome(raw)[0] == "ok"
    check_mapping(raw, tmp_path)
    assert _serving.parse_ps_config(json.dumps(raw))["volatile_db"]["overflow_margin"] == margin


@pytest.mark.parametrize(
    "path", ["models[0].max_batch_size", "models[0].deployed_device_list", "models[0].refresh_interval"]
)
def test_integers_above_int64_in_keys_of_no_maximum(path, tmp_path):
    raw = with_value(minimal(), path, [2**63] if path.endswith("list") else 2**63)
    assert python_outcome(raw)[0] == "ok"  # config.py takes them
    with pytest.raises(_serving.ConfigError, match=ABOVE_INT64):
        _serving.parse_ps_config(json.dumps(raw))
    check_mapping(raw, tmp_path)


@pytest.mark.parametrize("address", ADDRESSES)
def test_addresses_are_checked_as_parse_address_checks_them(address, tmp_path):
    check_mapping(with_value(minimal(), "volatile_db.address", address), tmp_path)


# -- mutations ---------------------------------------------------------------------------------------

VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2,
    7,
    -(2**63),
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**31,
    0.0,
    -0.5,
    0.5,
    1.0,
    2.5,
    1e39,
    float("nan"),
    float("inf"),
    "",
    "x",
    "Redis",
    "ROCKSDB",
    "kafka",
    "Multi_Process_Hash_Map",
    "\u212aafka",
    "least_used",
    "static",
    "directory",
    "a.b",
    "[",
    "127.0.0.1:7000,h2:1",
    [],
    [0],
    [1, 2],
    ["a", "b"],
    [1.5, "x"],
    {},
    {"type": "redis"},
]


def _paths(node, prefix: str = "") -> list[str]:
    """The path of every key under ``node`` (``models[0].sparse_files``)."""
    out = []
    items = node.items() if isinstance(node, dict) else []
    for key, value in items:
        path = f"{prefix}.{key}" if prefix else key
        out.append(path)
        if isinstance(value, dict):
            out += _paths(value, path)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                out += _paths(v, f"{path}[{i}]")
    return out


def _full() -> dict:
    """A valid config with every section written out and every optional key given."""
    raw = reference_section_4()
    raw["volatile_db"] = {
        "type": "redis_cluster",
        "address": "10.0.0.1:7000,10.0.0.2",
        "num_partitions": 8,
        "num_node_connections": 4,
        "overflow_margin": 1000,
        "overflow_policy": "evict_oldest",
        "overflow_resolution_target": 0.5,
        "initial_cache_rate": 0.25,
        "update_filters": ["^foo$", "b.r"],
        "max_batch_size": 1000,
    }
    raw["persistent_db"] = {"type": "rocks_db", "path": "/tmp/r", "num_threads": 4, "update_filters": [".+"]}
    raw["update_source"] = {"type": "directory", "path": "/u", "poll_interval_ms": 50}
    raw["fuse_embedding_table"] = True
    raw["models"][0].update(embedding_cache_type="uvm", refresh_delay=1, refresh_interval=3, thread_pool_size=8)
    return raw


def _mutate(rng: random.Random, raw: dict) -> dict:
    raw = copy.deepcopy(raw)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        paths = _paths(raw)
        if not paths:
            break
        path = rng.choice(paths)
        *parents, last = path.split(".")
        node = raw
        for p in parents:
            name, index = p[:-1].split("[") if p.endswith("]") else (p, None)
            node = node[name] if index is None else node[name][int(index)]
        kind = rng.choice(["drop", "value", "value", "negate", "case", "typo", "item"])
        if kind == "drop":
            del node[last]
        elif kind == "value":
            node[last] = copy.deepcopy(rng.choice(VALUES))
        elif kind == "negate" and isinstance(node[last], (int, float)) and not isinstance(node[last], bool):
            node[last] = -node[last] - rng.choice([0, 1])
        elif kind == "case" and isinstance(node[last], str):
            node[last] = rng.choice([str.upper, str.title, lambda s: s + "_x", lambda s: s[:-1]])(node[last])
        elif kind == "typo":
            node[last[:-1] or "k"] = node.pop(last)
        elif isinstance(node[last], list) and node[last]:
            node[last][rng.randrange(len(node[last]))] = copy.deepcopy(rng.choice(VALUES))
        else:
            node[last] = copy.deepcopy(rng.choice(VALUES))
    return raw


def _mutations() -> list[dict]:
    rng = random.Random(20260529)
    bases = [minimal(), reference_section_4(), _full(), CONFIGS["empty-sections"]]
    return [_mutate(rng, rng.choice(bases)) for _ in range(300)]


MUTATIONS = _mutations()


def test_mutations_reach_both_outcomes():
    outcomes = [python_outcome(raw)[0] for raw in MUTATIONS]
    assert outcomes.count("ok") >= 30 and outcomes.count("error") >= 150


@pytest.mark.parametrize("index", range(len(MUTATIONS)))
def test_mutated_configs(index, tmp_path):
    check_mapping(MUTATIONS[index], tmp_path)
