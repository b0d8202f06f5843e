#!/usr/bin/env python3
"""CI smoke step: what a new user runs, run the way they run it.

1. The README's set-up command, read from README.md (the first ```sh block under
   "## Set-up", so the two cannot drift), runs as written in a copy of the checkout
   without its .venv, with its own HOME and XDG_STATE_HOME and none of our environment
   (the port comes from COMPACTION_PROXY_SERVER_PORT, a free one, as the README allows).
   `GET /healthz` must answer 200 within a minute of `serve` starting, /readyz must find
   the embedded Redis, SIGTERM must end it with status 0, and no process (redis-server
   included) may be left.
2. The Dockerfile's install step (its `pip install` line, on only what its COPY lines
   copy) in a fresh venv, with no extras: every command of the CLI runs there (serve,
   stand-in, demo, keys, budgets, audit, plan, replay), and again nothing is left running.

Standard library only (it runs before any venv exists). Prints what it does and how long
each part took; exits 1 with the reason on the first failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEALTHZ_WITHIN = 60.0  # seconds from `serve` starting to /healthz answering 200
INSTALL_WITHIN = 900.0  # seconds for a venv and pip install (a cold cache is slow)
STOP_WITHIN = 40.0  # seconds from SIGTERM to the exit (drain_timeout is 30)


class SmokeFailure(Exception):
    pass


def setup_command(readme: str) -> str:
    """The first ```sh block of the README's "## Set-up" section, as one command."""
    section = readme.split("\n## Set-up\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    if block is None:
        raise SmokeFailure('README.md: no ```sh block under "## Set-up"')
    command = block.group(1).strip()
    if "compaction-proxy serve" not in command:
        raise SmokeFailure(f"README.md: the set-up command does not start serve: {command}")
    return command


def docker_install(dockerfile: str) -> tuple[str, list[str]]:
    """The Dockerfile's pip install command and the paths its COPY lines copy."""
    found = re.search(r"^RUN (pip install [^&\n]*?)\s*(?:&&|$)", dockerfile, re.M)
    if found is None:
        raise SmokeFailure("Dockerfile: no `RUN pip install ...` line")
    copied = []
    for line in re.findall(r"^COPY (.+)$", dockerfile, re.M):
        copied += [p for p in line.split()[:-1] if not p.startswith("--")]
    return found.group(1), copied


def say(message: str) -> None:
    print(f"readme-smoke: {message}", flush=True)


def checkout_files() -> list[str]:
    """What a fresh clone of this submission holds: tracked files and new unignored ones."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def copy_tree(names: list[str], dest: Path) -> None:
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)


def user_env(home: Path, port: int) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
    env = {k: v for k, v in os.environ.items() if k in keep}
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        XDG_STATE_HOME=str(home / "state"),
        TMPDIR=str(home / "tmp"),  # the demo's temporary state too, so leftovers are seen
        COMPACTION_PROXY_SERVER_PORT=str(port),
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def processes_under(root: Path) -> dict[int, str]:
    """Running processes whose command line mentions `root` (pid -> command line)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if str(root) in cmdline:
            found[int(proc.name)] = cmdline
    return found


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def wait_for_serve(shell: subprocess.Popen[bytes], root: Path, log: Path) -> int:
    """The pid of `compaction-proxy serve` once the install is done and it has started."""
    deadline = time.monotonic() + INSTALL_WITHIN
    while time.monotonic() < deadline:
        if shell.poll() is not None:
            raise SmokeFailure(
                f"the command ended ({shell.returncode}) before serve ran:\n" + tail(log)
            )
        for pid, cmdline in processes_under(root).items():
            if "compaction-proxy serve" in cmdline:
                return pid
        time.sleep(0.2)
    raise SmokeFailure(f"no serve after {INSTALL_WITHIN:.0f} s:\n" + tail(log))


def tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:])


def wait_healthy(url: str, serve_pid: int, log: Path) -> float:
    started = time.monotonic()
    while time.monotonic() - started < HEALTHZ_WITHIN:
        status, _ = get(f"{url}/healthz")
        if status == 200:
            return time.monotonic() - started
        if not Path(f"/proc/{serve_pid}").exists():
            raise SmokeFailure("serve exited before /healthz answered:\n" + tail(log))
        time.sleep(0.25)
    raise SmokeFailure(f"/healthz did not answer 200 within {HEALTHZ_WITHIN:.0f} s:\n" + tail(log))


def check_ready(url: str, state: Path, log: Path) -> None:
    status, body = get(f"{url}/readyz")
    ready = json.loads(body or b"{}")
    if status != 200 or ready.get("store") != "ok":
        raise SmokeFailure(
            f"/readyz {status} {ready}: the embedded Redis is not serving\n" + tail(log)
        )
    if not any("redis-server" in c for c in processes_under(state).values()):
        raise SmokeFailure(f"no redis-server runs over {state}")


def stop(pid: int, waiter: subprocess.Popen[bytes], root: Path, log: Path) -> None:
    """SIGTERM to serve; it (and the shell running it) must exit 0 and leave nothing."""
    os.kill(pid, signal.SIGTERM)
    try:
        code = waiter.wait(timeout=STOP_WITHIN)
    except subprocess.TimeoutExpired:
        raise SmokeFailure(
            f"still running {STOP_WITHIN:.0f} s after SIGTERM:\n" + tail(log)
        ) from None
    if code != 0:
        raise SmokeFailure(f"exit status {code} after SIGTERM:\n" + tail(log))
    no_leftovers(root)


def no_leftovers(root: Path) -> None:
    deadline = time.monotonic() + 5  # a child being reaped right now
    while (left := processes_under(root)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        raise SmokeFailure(f"processes left running: {sorted(left.values())}")


def readme_setup(work: Path) -> None:
    command = setup_command((ROOT / "README.md").read_text())
    clone, home = work / "clone", work / "home"
    copy_tree(checkout_files(), clone)
    port = free_port()
    log = work / "readme.log"
    say(f"README set-up command, as written: {command}")
    began = time.monotonic()
    with log.open("wb") as out:
        shell = subprocess.Popen(
            ["bash", "-c", command],
            cwd=clone,
            env=user_env(home, port),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        pid = wait_for_serve(shell, work, log)
        installed = time.monotonic() - began
        healthy = wait_healthy(f"http://127.0.0.1:{port}", pid, log)
        say(f"installed in {installed:.0f} s; /healthz 200 {healthy:.1f} s after serve started")
        check_ready(f"http://127.0.0.1:{port}", home / "state", log)
        stop(pid, shell, work, log)
        say("SIGTERM: exit 0, no process left (redis-server included)")
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise SmokeFailure(f"{' '.join(args)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return done.stdout


def _within(name: str, copied: str) -> bool:
    return name == copied or name.startswith(copied.rstrip("/") + "/")


def docker_install_and_commands(work: Path) -> None:
    """The image's install step in a fresh venv, then every command, with no extras."""
    install, copied = docker_install((ROOT / "Dockerfile").read_text())
    app, home = work / "app", work / "home2"
    names = [n for n in checkout_files() if any(_within(n, c) for c in copied)]
    copy_tree(names, app)
    port = free_port()
    env = user_env(home, port)
    say(f"Dockerfile install step in a fresh venv, copying {' '.join(copied)}: {install}")
    began = time.monotonic()
    run([sys.executable, "-m", "venv", ".venv"], app, env)
    run(["bash", "-c", f".venv/bin/{install}"], app, env, timeout=INSTALL_WITHIN)
    say(f"installed in {time.monotonic() - began:.0f} s")
    cli = str(app / ".venv" / "bin" / "compaction-proxy")
    fixture = ROOT / "tests" / "fixtures" / "agent-requests" / "claude-code-turn7.json"
    trace = work / "trace.jsonl"
    trace.write_text(fixture.read_text().replace("\n", " ") + "\n")
    run([cli, "plan", str(fixture)], app, env)
    run([cli, "audit", str(fixture)], app, env)
    run([cli, "replay", str(trace), "--out", str(work / "replay.html")], app, env)
    run([cli, "keys", "list"], app, env)  # no serve: the embedded Redis started for it
    run([cli, "budgets", "show", "--team", "smoke"], app, env)
    demo = run([cli, "demo", "--turns", "14", "--out", str(work / "demo.html")], app, env)
    strategies = re.findall(r"^turn +\d+/\d+  (\S+)", demo, re.M)
    if set(strategies) <= {"untouched"} or not (work / "demo.html").exists():
        raise SmokeFailure(f"demo showed no compaction or wrote no report:\n{demo}")
    log = work / "serve.log"
    with log.open("wb") as out:
        standin = subprocess.Popen([cli, "stand-in", "--port", "0"], cwd=app, env=env, stdout=out)
        serve = subprocess.Popen([cli, "serve"], cwd=app, env=env, stderr=out, stdout=out)
    try:
        healthy = wait_healthy(f"http://127.0.0.1:{port}", serve.pid, log)
        check_ready(f"http://127.0.0.1:{port}", home / "state", log)
        run([cli, "keys", "list"], app, env)  # serve runs it: the command uses that one
        os.kill(standin.pid, signal.SIGTERM)
        if standin.wait(timeout=STOP_WITHIN) != 0:
            raise SmokeFailure("stand-in: exit status not 0 after SIGTERM")
        stop(serve.pid, serve, work, log)
        say(f"every command ran; serve healthy in {healthy:.1f} s, stopped cleanly, nothing left")
    finally:
        for child in (standin, serve):
            if child.poll() is None:
                child.kill()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="cp-readme-smoke-") as tmp:
        work = Path(tmp)
        try:
            readme_setup(work)
            docker_install_and_commands(work)
        except SmokeFailure as e:
            print(f"readme-smoke: FAILED: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
