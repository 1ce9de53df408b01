"""Type stub of sok-hps's binding of the C++ server's readers (csrc/serving/module.cpp)."""

from collections.abc import Callable
from typing import Any

__all__ = ["ConfigError", "JsonParseError", "parse_json", "parse_ps_config", "read_ps_config"]

class JsonParseError(ValueError):
    """A text that is not JSON; the message is json.JSONDecodeError's."""

class ConfigError(ValueError):
    """A ps_config the C++ reader refuses; the message is hierarchical_parameter_server.config's."""

def parse_json(text: str) -> Any:
    """The value of the JSON text, as json.loads makes it."""

def read_ps_config(path: str, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """dataclasses.asdict(config.load_config(path)), by csrc/serving/ps_config.hpp; warn(message) for
    each warning config.py logs."""

def parse_ps_config(json_text: str, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """dataclasses.asdict(config.load_config(json.loads(json_text))), by csrc/serving/ps_config.hpp;
    JsonParseError where the text is not JSON."""
