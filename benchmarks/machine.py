"""Machine facts every benchmark prints in its header (shared by the scripts in this folder)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time

BACKEND_MODULES = ("sok_backend_det._core", "sok_backend_hkv._core")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages ("?" where the OS has none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def extension_builds() -> dict[str, str]:
    """Which build of each backend extension ran: a short hash and the file time (builds change
    under a benchmark that is rerun while the C++ is being worked on)."""
    builds = {}
    for module in BACKEND_MODULES:
        try:
            spec = importlib.util.find_spec(module)
        except ImportError:
            spec = None
        if spec is None or spec.origin is None:
            builds[module] = "not installed"
            continue
        with open(spec.origin, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(spec.origin)))
        builds[module] = f"sha256 {digest}, built {stamp}"
    return builds
