"""Write unicode_tables.inc: the Unicode tables of py_text.cpp, as the running Python has them, and
its minor version (re's rules change between releases too: py_regex.cpp).

py_text.cpp writes Python's repr() of strs and strips them as str.strip() does; what repr() escapes
(str.isprintable()) and what strip() strips (str.isspace()) are tables of the Unicode version of
the Python's unicodedata, which a new Python brings (3.11: Unicode 14.0.0, 3.12: 15.0.0). So they
are not kept in the sources: CMakeLists.txt runs this script at build time with the Python the
package is built for (${Python_EXECUTABLE}) and the build directory's file is included. The file is
rewritten only when its text changes, so that a rerun does not rebuild py_text.cpp.

Usage::

    python gen_unicode_tables.py BUILD_DIR/unicode_tables.inc
"""

from __future__ import annotations

import platform
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

WIDTH = 120  # the C++ sources' line length
INDENT = "    "


def closed_ranges(member: Callable[[str], bool]) -> list[tuple[int, int]]:
    """The code points whose character is a member, as closed ranges ``(first, last)`` in ascending order."""
    ranges: list[list[int]] = []
    for cp in range(sys.maxunicode + 1):
        if member(chr(cp)):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp])
    return [(first, last) for first, last in ranges]


def array(name: str, ranges: list[tuple[int, int]]) -> list[str]:
    """The lines of ``constexpr Range name[] = {...};``, the items filled to WIDTH columns."""
    lines = [f"constexpr Range {name}[] = {{"]
    line = ""
    for first, last in ranges:
        item = f"{{0x{first:X}, 0x{last:X}}},"
        if line and len(INDENT) + len(line) + 1 + len(item) > WIDTH:
            lines.append(INDENT + line)
            line = ""
        line = f"{line} {item}" if line else item
    if line:
        lines.append(INDENT + line)
    return [*lines, "};"]


def tables() -> str:
    """The text of unicode_tables.inc."""
    return "\n".join(
        [
            "// Generated at build time by csrc/serving/gen_unicode_tables.py; do not edit: edit the script.",
            f"// From Python {platform.python_version()} ({sys.executable}), Unicode {unicodedata.unidata_version}.",
            "// The code points as closed ranges {first, last} in ascending order, for py_text.cpp.",
            "//",
            "// What str.isprintable() calls not printable (categories Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs but the",
            "// space): the characters repr() escapes.",
            *array("kNonPrintable", closed_ranges(lambda c: not c.isprintable())),
            "",
            "// What str.isspace() calls whitespace (category Zs, bidirectional class WS, B or S): what",
            "// str.strip() strips.",
            *array("kSpaces", closed_ranges(str.isspace)),
            "",
            "// The Python's minor version (3.x): what py_regex.cpp's checks follow where re changed.",
            f"constexpr int kPythonMinor = {sys.version_info.minor};",
            "",
        ]
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {Path(argv[0]).name} OUTPUT.inc", file=sys.stderr)
        return 2
    out = Path(argv[1])
    text = tables()
    if not out.exists() or out.read_text(encoding="utf-8") != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
