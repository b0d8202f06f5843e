"""Scenario mode: the stand-in plays a model through a whole task, for agents that cannot
send an `x-stand-in` header (the real Codex CLI).

A scenario is asked, for each request, for the script of its answer: a dict with the keys
an `x-stand-in` header takes (`text`, `tool`, ...), laid over the stand-in's default script
and under the request's own header. For compaction and summary requests it may add a note
to the summary the stand-in writes, so that what it needs to go on survives a compaction.

`ShellChunks` is a coding task: "print a log in chunks with the shell, then report". Turn
after turn it calls Codex's `exec_command` with the next chunk; after `calls` chunks it
answers the final sentence. Its progress is read from the request itself: every command
carries a `SCENARIO-STEP=<n>` marker (in the arguments, and echoed into the output), and
the summaries it notes carry the last one, so it resumes right after a compaction of any
kind (Codex's, or the proxy's dropping old turns with a note).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.testing.prompt import Prompt, texts
from proxy.testing.reply import Call

STEP = re.compile(r"SCENARIO-STEP=(\d+)")
DONE_TEXT = "SCENARIO-DONE: all chunks printed"


class Scenario(Protocol):
    @property
    def name(self) -> str: ...

    def script(self, prompt: Prompt) -> dict[str, Any]:
        """`x-stand-in` keys for the answer to this request."""
        ...

    def summary_note(self, prompt: Prompt) -> str:
        """A line the stand-in adds to a summary of this request's history ("" for none)."""
        ...


def steps_done(prompt: Prompt) -> int:
    """The highest step marker anywhere in the request: texts, results, calls' inputs."""
    best = 0
    for entry in prompt.entries:
        said = [*texts(entry)]
        for part in entry.parts:
            if isinstance(part, Call):
                given = part.input
                said.append(given if isinstance(given, str) else orjson.dumps(given).decode())
        for text in said:
            for match in STEP.finditer(text):
                best = max(best, int(match.group(1)))
    return best


@dataclass(frozen=True)
class ShellChunks:
    """Print `file` in `calls` chunks of `lines` lines with exec_command, then report."""

    calls: int = 16
    file: str = "big.log"
    lines: int = 120
    name: str = "shell-chunks"

    def command(self, step: int) -> str:
        first = (step - 1) * self.lines + 1
        last = step * self.lines
        return f"echo SCENARIO-STEP={step}; sed -n '{first},{last}p' {self.file}"

    def script(self, prompt: Prompt) -> dict[str, Any]:
        done = steps_done(prompt)
        if done >= self.calls:
            return {"text": f"{DONE_TEXT} ({done} of {self.calls})."}
        step = done + 1
        arguments = {"cmd": self.command(step), "yield_time_ms": 10000}
        return {
            "text": f"Printing chunk {step} of {self.calls}.",
            "tool": {"name": "exec_command", "input": arguments},
        }

    def summary_note(self, prompt: Prompt) -> str:
        done = steps_done(prompt)
        return (
            f"Task: print {self.file} in chunks of {self.lines} lines with exec_command;"
            f" SCENARIO-STEP={done} of {self.calls} done, go on with the next chunk."
        )


def big_log(lines: int) -> str:
    """The file ShellChunks prints: a deterministic log of `lines` lines."""
    rows = []
    for i in range(1, lines + 1):
        status = (200, 404, 500)[i * 7 % 3]
        rows.append(
            f"2025-03-01T10:{i // 60 % 60:02d}:{i % 60:02d}Z INFO worker-{i % 8} req=r{i:06d}"
            f" path=/api/v1/items/{i * 7919 % 99991} status={status}"
            f" latency={i * 37 % 900}ms bytes={i * 104729 % 99000} user=u{i * 31 % 300}"
        )
    return "\n".join(rows) + "\n"
