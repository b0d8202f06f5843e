"""config/proxy.toml's settings and docs/configuration.md's table, generated from the
settings declared in proxy/config.py (each file keeps its hand-written prose around the
generated part, between two marker lines).

    python3 -m proxy.config_files --write   # rewrite what drifted (and the ConfigMap)
    python3 -m proxy.config_files           # exit 1 naming each file that drifted

tests/server/test_config.py fails when a file differs from what this renders.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

from proxy.config import DECLARED, Declared

ROOT = Path(__file__).resolve().parents[1]
TOML = ROOT / "config" / "proxy.toml"
DOCS = ROOT / "docs" / "configuration.md"
CONFIGMAP = ROOT / "deploy" / "kubernetes" / "configmap.py"
HOW = "python3 -m proxy.config_files --write"

TOML_START = f"# -- generated from proxy/config.py ({HOW}); edit there --"
TOML_END = "# -- end of the generated settings --"
DOCS_START = f"<!-- generated from proxy/config.py ({HOW}); edit there -->"
DOCS_END = "<!-- end of the generated table -->"


def toml_value(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for the plain text defaults are
    return repr(value)


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def shown_default(d: Declared) -> str:
    """The default as the docs' table shows it."""
    if d.unit == "s":
        return f"{d.default:g} s"
    if d.unit == "bytes" and d.default:
        return f"{d.default} ({_size(d.default)})"
    if d.kind is str:
        return f"`{d.default}`" if d.default else "empty"
    return str(d.default)


def render_toml() -> str:
    lines = [TOML_START]
    for section, settings in DECLARED.items():
        lines += ["", f"[{section}]"]
        for n, d in enumerate(settings.values()):
            if n:
                lines.append("")
            lines += textwrap.wrap(d.doc, 86, initial_indent="# ", subsequent_indent="# ")
            note = "  # seconds" if d.unit == "s" else ""
            note = f"  # {_size(d.default)}" if d.unit == "bytes" and d.default else note
            lines.append(f"{d.key} = {toml_value(d.default)}{note}")
    return "\n".join([*lines, "", TOML_END])


def render_docs() -> str:
    rows = [DOCS_START, "| setting | default | |", "|---|---|---|"]
    for settings in DECLARED.values():
        for d in settings.values():
            assert "|" not in d.doc, f"{d.name}: a '|' would split its row of the table"
            rows.append(f"| `{d.name}` | {shown_default(d)} | {d.doc} |")
    return "\n".join([*rows, DOCS_END])


def spliced(text: str, start: str, end: str, part: str) -> str:
    """`text` with what lies from the `start` line to the `end` line replaced by `part`."""
    head, found, rest = text.partition(start)
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise ValueError(f"the markers {start!r} and {end!r} are not both there")
    return head + part + tail


def _configmap(toml: str) -> str:
    render: Callable[[str], str] = runpy.run_path(str(CONFIGMAP))["render"]
    return render(toml)


def expected() -> dict[Path, str]:
    """Each generated file as it should read."""
    toml = spliced(TOML.read_text(), TOML_START, TOML_END, render_toml())
    return {
        TOML: toml,
        DOCS: spliced(DOCS.read_text(), DOCS_START, DOCS_END, render_docs()),
        CONFIGMAP.with_suffix(".yaml"): _configmap(toml),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m proxy.config_files")
    parser.add_argument("--write", action="store_true", help="rewrite the files that drifted")
    args = parser.parse_args(argv)
    drifted = {p: text for p, text in expected().items() if p.read_text() != text}
    for path, text in drifted.items():
        if args.write:
            path.write_text(text)
        print(f"{'rewrote' if args.write else 'drifted:'} {path.relative_to(ROOT)}")
    return 1 if drifted and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
