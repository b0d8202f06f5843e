"""Typed settings for the proxy: built-in defaults < TOML file < environment < flags.

Every setting has a dotted name (`upstream.url`) that is also its place in the TOML file
(`[upstream] url = ...`) and, upper-cased with `COMPACTION_PROXY_` in front, its
environment variable (`COMPACTION_PROXY_UPSTREAM_URL`). `REDIS_URL` is accepted as an
alias of `COMPACTION_PROXY_STORE_REDIS_URL` (the prefixed name wins). A wrong value or an
unknown key raises `ConfigError` naming the setting and where it came from.

The built-in defaults are the dataclass defaults below, so an installed proxy runs without
any file; `config/proxy.toml` documents the same values (a test keeps them equal).
`[[policy]]` tables are kept raw in `Settings.policies` for the policy parser; `[[price]]`
tables (optional prices per model, proxy/core/pricing.py) are parsed into `Settings.prices`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from proxy.core.policy import PolicyError, parse_policies
from proxy.core.pricing import PriceError, PriceTable, parse_price_table

ENV_PREFIX = "COMPACTION_PROXY_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
DEFAULT_CONFIG_PATH = Path("config/proxy.toml")
MIB = 1024 * 1024


class ConfigError(ValueError):
    """A setting is wrong; the message names it and its source."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    # Largest request body accepted (the API's own limit is 32 MB).
    max_body_bytes: int = 32 * MIB
    # Log lines: "human" (key=value) or "json" (one object per line).
    log_format: str = "human"
    # Seconds open requests (streams) may run on after SIGTERM before the proxy stops.
    drain_timeout: float = 30.0
    # Seconds a connection may take to send a request's headers, from its opening or the
    # end of its previous answer (an idle keep-alive connection is closed then too).
    header_timeout: float = 30.0
    # Seconds a request body may take, plus one per 64 KiB of it (a trickle is cut).
    body_timeout: float = 60.0
    # Open client connections at most (lowered at start to fit the open-file limit).
    max_connections: int = 2048
    # The event loop: "auto" (uvloop when installed, else asyncio's), "asyncio" or "uvloop".
    event_loop: str = "auto"
    # Memory for what was computed for each conversation line's last request, so the next
    # one parses, hashes and counts only what it adds (bodies counted 2.5x their bytes
    # for their parsed objects; least recently used line dropped first). 0: off.
    reuse_max_bytes: int = 256 * MIB
    # Bytes of a body past which the pure work on it (decoding, checking, counting,
    # planning) runs in a worker thread, so one huge request does not stall the others.
    off_loop_bytes: int = 256 * 1024


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    url: str = "https://api.anthropic.com"
    # Where OpenAI-format traffic goes (/v1/chat/completions and the other OpenAI paths;
    # see proxy/server/routing.py): OpenAI itself or any compatible server. Empty: with
    # auth.keys = "off", https://api.openai.com (callers send their own credential); with
    # "required", none (OpenAI-format requests are refused until it is set).
    openai_url: str = ""
    # Claude through Amazon Bedrock (the proxy's /bedrock routes; docs/bedrock-vertex.md):
    # bedrock-runtime's base URL; empty: https://bedrock-runtime.{region}.amazonaws.com
    # (and the control plane's reads at https://bedrock.{region}.amazonaws.com; when set,
    # those go to this same base).
    bedrock_url: str = ""
    # The AWS region requests are signed for (and, with bedrock_url empty, sent to);
    # empty: AWS_REGION, else AWS_DEFAULT_REGION.
    bedrock_region: str = ""
    # Claude through Google Vertex AI (the proxy's /vertex routes); empty: the location's
    # own endpoint (https://{location}-aiplatform.googleapis.com, aiplatform.googleapis.com
    # for `global`).
    vertex_url: str = ""
    # Seconds to open a new TCP/TLS connection to the upstream.
    connect_timeout: float = 10.0
    # Seconds a stream may stay silent before the proxy ends it (no total stream timeout).
    stream_idle_timeout: float = 300.0
    # Seconds to wait for bytes of a non-streaming answer (the SDK's own default is 600).
    response_timeout: float = 600.0
    # Connection pool: total open connections, and per upstream host (0 = no limit).
    pool_limit: int = 1024
    pool_limit_per_host: int = 0
    # Seconds an idle pooled connection is kept open.
    keepalive_timeout: float = 30.0
    # The longest event (its lines; one `data:` line in these APIs) of an upstream event
    # stream the proxy holds, and the largest whole answer it reads to parse (a summary,
    # a read_result round, an error it turns into an event): past either the answer is
    # refused (502, or an error event inside a stream). Memory per request stays within
    # a small multiple of them, whatever the upstream sends.
    max_line_bytes: int = 16 * 1024 * 1024
    max_answer_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoreSettings:
    # Empty: start an embedded redis-server under state_dir.
    redis_url: str = ""
    # Empty: $XDG_STATE_HOME/compaction-proxy or ~/.local/state/compaction-proxy.
    state_dir: str = ""
    key_prefix: str = "cp:"
    # Seconds for any single Redis call before the proxy degrades without it.
    op_timeout: float = 0.5
    # Seconds every stored key lives.
    ttl: int = 7 * 24 * 3600
    # The embedded Redis's memory limit (Redis's own syntax: "1gb", "512mb"; "0": none).
    # At the limit it evicts the least recently used keys that have a TTL (volatile-lru).
    max_memory: str = "1gb"
    # Checkpoints kept per conversation (per first message): one per line (a rewind, a
    # fork, sub-agents sharing a prefix); beyond it the least recently used goes.
    max_lines: int = 4


@dataclass(frozen=True, slots=True)
class AuthSettings:
    # "off": forward the caller's own credential (its hash is the tenant); "required":
    # only proxy-issued keys (`compaction-proxy keys create`) are let through.
    keys: str = "off"
    # Seconds a replica trusts its copy of a key record or a budget's limits.
    cache_seconds: float = 5.0
    # Name of the environment variable holding the admin key (the admin API and the
    # dashboard); empty: no admin API. The key itself is never in a file or in Redis.
    admin_key_env: str = ""
    # Environment variables a key made through the admin API may name as its upstream
    # credential, comma-separated, besides the providers' defaults (ANTHROPIC_API_KEY,
    # OPENAI_API_KEY). Never the admin key's, nor the proxy's own settings.
    upstream_envs: str = ""
    # Seconds into a Redis outage a key this replica knew valid keeps working, with
    # budgets.on_store_down = "open" (docs/fleet.md): a key revoked before the outage
    # still stops within cache_seconds (revocations reach the replicas as they are made).
    # 0: a key that cannot be checked again is refused after cache_seconds.
    outage_trust_seconds: float = 300.0


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    # While Redis is unreachable: "open" admits requests uncounted (up to
    # outage_allowance per key and replica), "closed" refuses them.
    on_store_down: str = "open"
    # Seconds a key, limit or reservation call to Redis may take before Redis counts as
    # unreachable (a stall shorter than this only delays requests).
    timeout: float = 2.0
    # Tokens (input + output reserved) one replica admits uncounted per key during one
    # outage with on_store_down = "open"; past it, that key's requests are refused (503).
    outage_allowance: int = 100_000


@dataclass(frozen=True, slots=True)
class ResponsesSettings:
    # Codex's compaction_trigger on /v1/responses: "pass-through" forwards it, "serve"
    # answers it with the proxy's own summary, "auto" forwards it until the upstream
    # refuses one (a server that is not OpenAI), then serves it.
    codex_compaction: str = "auto"
    # GET /v1/responses upgraded to a WebSocket (Codex's first choice): "relay" (one
    # upstream socket per client socket, every response.create compacted like a POST)
    # or "refuse" (426: Codex uses HTTP for the session).
    websocket: str = "relay"
    websocket_max_frame: int = 32 * 1024 * 1024  # bytes of one frame, either way
    websocket_heartbeat: float = 30.0  # seconds between pings on both sockets
    websocket_idle_timeout: float = 3600.0  # seconds a socket may go without a request


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    budgets: BudgetSettings = field(default_factory=BudgetSettings)
    responses: ResponsesSettings = field(default_factory=ResponsesSettings)
    # Raw `[[policy]]` tables, parsed into per-model policies elsewhere.
    policies: tuple[dict[str, Any], ...] = ()
    # `[[price]]` tables: what tokens cost per model (reports and stats; optional).
    prices: PriceTable = field(default_factory=PriceTable)
    # Where the settings came from, for messages: the file read ("" = none), and the
    # source of each setting not left at its default ("file X", "environment VAR", "flag
    # --port"). Not part of what the settings are, so equality ignores them.
    config_file: str = field(default="", compare=False)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def source_of(self, name: str) -> str:
        """Where the dotted setting's value came from ("default" when nothing set it)."""
        return self.sources.get(name, "default")

    def resolved_state_dir(self) -> Path:
        if self.store.state_dir:
            return Path(self.store.state_dir).expanduser()
        xdg = os.environ.get("XDG_STATE_HOME")
        base = Path(xdg) if xdg else Path.home() / ".local" / "state"
        return base / "compaction-proxy"


_SECTIONS: dict[str, type] = {
    "server": ServerSettings,
    "upstream": UpstreamSettings,
    "store": StoreSettings,
    "auth": AuthSettings,
    "budgets": BudgetSettings,
    "responses": ResponsesSettings,
}


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be greater than 0"


def _non_negative(value: float) -> str | None:
    return None if value >= 0 else "must be 0 or more"


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "must be a port number 0-65535 (0 = any free port)"


def _http_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.query or parts.fragment:
        return "must not have a query or fragment"
    return None


def _upstream_url(value: str) -> str | None:
    problem = _http_url(value)
    if problem:
        return problem
    path = urlsplit(value).path.rstrip("/")
    if path.endswith("/v1"):
        # Clients' paths already start with /v1: the request would go to .../v1/v1/...
        bare = value.rstrip("/").removesuffix("/v1")
        return (
            "must not end in /v1: the proxy appends the client's path, which starts with"
            f" /v1 (requests would go to /v1/v1/...); use {bare!r}"
        )
    return None


def _optional_upstream_url(value: str) -> str | None:
    return None if value == "" else _upstream_url(value)


def _aws_region(value: str) -> str | None:
    if value == "" or re.fullmatch(r"[a-z]{2,4}(-[a-z]+)+-\d{1,2}", value):
        return None
    return "must be empty (AWS_REGION, else AWS_DEFAULT_REGION) or an AWS region (us-east-1)"


def _redis_url(value: str) -> str | None:
    if value == "":
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "unix"):
        return "must be empty (embedded Redis) or a redis://, rediss:// or unix:// URL"
    try:
        parts.port  # noqa: B018 (raises on a malformed port)
    except ValueError as e:
        return f"has a bad port ({e})"
    return None


def _key_prefix(value: str) -> str | None:
    if any(c in value for c in "{}") or any(c.isspace() for c in value):
        return "must not contain braces or whitespace (braces would move the hash tag)"
    return None


def _memory_size(value: str) -> str | None:
    if re.fullmatch(r"\d+(b|kb|mb|gb|k|m|g)?", value.strip().lower()):
        return None
    return 'must be a size such as "1gb", "512mb" or "0" (no limit)'


def _log_format(value: str) -> str | None:
    return None if value in ("human", "json") else 'must be "human" or "json"'


def _one_of(*choices: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in choices else "must be " + " or ".join(f'"{c}"' for c in choices)

    return check


def _env_name(value: str) -> str | None:
    if value == "" or re.fullmatch(r"[A-Z_][A-Z0-9_]{0,127}", value):
        return None
    return "must be empty or an environment variable name (A-Z, 0-9, _)"


def _env_names(value: str) -> str | None:
    for name in value.split(","):
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]{0,127}", name.strip()):
            return "must be environment variable names (A-Z, 0-9, _), comma-separated"
    return None


def _optional_env_names(value: str) -> str | None:
    return None if not value.strip() else _env_names(value)


def _not_empty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "server.host": _not_empty,
    "server.port": _port,
    "server.max_body_bytes": _positive,
    "server.log_format": _log_format,
    "server.drain_timeout": _non_negative,
    "server.header_timeout": _positive,
    "server.body_timeout": _positive,
    "server.max_connections": _positive,
    "server.event_loop": _one_of("auto", "asyncio", "uvloop"),
    "server.reuse_max_bytes": _non_negative,
    "server.off_loop_bytes": _non_negative,
    "upstream.url": _upstream_url,
    "upstream.openai_url": _optional_upstream_url,
    "upstream.bedrock_url": _optional_upstream_url,
    "upstream.bedrock_region": _aws_region,
    "upstream.vertex_url": _optional_upstream_url,
    "upstream.connect_timeout": _positive,
    "upstream.stream_idle_timeout": _positive,
    "upstream.response_timeout": _positive,
    "upstream.pool_limit": _positive,
    "upstream.pool_limit_per_host": _non_negative,
    "upstream.keepalive_timeout": _non_negative,
    "upstream.max_line_bytes": _positive,
    "upstream.max_answer_bytes": _positive,
    "store.redis_url": _redis_url,
    "store.key_prefix": _key_prefix,
    "store.op_timeout": _positive,
    "store.ttl": _positive,
    "store.max_lines": _positive,
    "store.max_memory": _memory_size,
    "auth.keys": _one_of("off", "required"),
    "auth.cache_seconds": _non_negative,
    "auth.admin_key_env": _env_name,
    "auth.upstream_envs": _optional_env_names,
    "auth.outage_trust_seconds": _non_negative,
    "budgets.on_store_down": _one_of("open", "closed"),
    "budgets.timeout": _positive,
    "budgets.outage_allowance": _non_negative,
    "responses.codex_compaction": _one_of("auto", "pass-through", "serve"),
    "responses.websocket": _one_of("relay", "refuse"),
    "responses.websocket_max_frame": _positive,
    "responses.websocket_heartbeat": _positive,
    "responses.websocket_idle_timeout": _positive,
}

# Environment aliases: conventional names accepted besides COMPACTION_PROXY_*.
# ANTHROPIC_BASE_URL is deliberately not read: clients use it to point at this proxy.
_ENV_ALIASES = {"store.redis_url": "REDIS_URL"}


def _coerce(name: str, kind: type, value: Any, source: str) -> Any:
    """Convert a file or environment value to the field's type, or say why not. The
    environment gives text, so only there are numbers parsed from strings."""
    from_env = isinstance(value, str) and source.startswith("environment")
    ok = False
    try:
        if kind is str:
            ok = isinstance(value, str)
        elif isinstance(value, bool):
            ok = False  # TOML true is not a number
        elif kind is int:
            value = int(value.replace("_", "")) if from_env else value
            ok = isinstance(value, int)
        elif kind is float:
            value = float(value) if from_env else value
            ok = isinstance(value, (int, float))
            value = float(value) if ok else value
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r} ({source})")
    return value


def _field_types(section: type) -> dict[str, type]:
    kinds = {"int": int, "float": float, "str": str}
    return {f.name: kinds[str(f.type)] for f in dataclasses.fields(section)}


def _apply(
    values: dict[str, dict[str, Any]],
    sources: dict[str, str],
    section: str,
    key: str,
    value: Any,
    source: str,
) -> None:
    name = f"{section}.{key}"
    types = _field_types(_SECTIONS[section])
    if key not in types:
        known = ", ".join(sorted(types))
        raise ConfigError(
            f"{name}: unknown setting ({source}){_did_you_mean(key, types)};"
            f" known in [{section}]: {known}"
        )
    values[section][key] = _coerce(name, types[key], value, source)
    sources[name] = source


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]}?" if close else ""


# COMPACTION_PROXY_* variables read elsewhere than as a setting: the admin CLI's key
# (proxy/admin_client.py; the server names its own with auth.admin_key_env).
OTHER_VARIABLES = {"admin key of the CLI": ENV_PREFIX + "ADMIN_KEY"}


def environment_names() -> dict[str, str]:
    """Every COMPACTION_PROXY_* variable read, by the dotted setting it sets."""
    names = {"config file": CONFIG_ENV, **OTHER_VARIABLES}
    for section, cls in _SECTIONS.items():
        for key in _field_types(cls):
            name = f"{section}.{key}"
            names[name] = ENV_PREFIX + name.replace(".", "_").upper()
    return names


def misspelled_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each COMPACTION_PROXY_* variable that is no setting's (a typo would
    otherwise be ignored without a word), naming the closest real one."""
    known = environment_names().values()
    warnings = []
    for var in sorted(environ):
        if var.startswith(ENV_PREFIX) and var not in known:
            close = difflib.get_close_matches(var, list(known), n=1, cutoff=0.0)
            warnings.append(
                f"environment {var} is not a setting and is ignored; the closest is {close[0]}"
            )
    return warnings


def load_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML: {e}") from None


def default_config_path(environ: Mapping[str, str]) -> Path | None:
    """The file read when --config is not given: $COMPACTION_PROXY_CONFIG, then
    ./config/proxy.toml if it exists, else none (built-in defaults)."""
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV])
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


def load_settings(
    config_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    flags: Mapping[str, str] | None = None,
    warn: Callable[[str], object] | None = None,
) -> Settings:
    """Build validated settings. `overrides` maps dotted names to values (from flags;
    None values are ignored); `flags` names the flag of each (for messages). `warn` is
    told of COMPACTION_PROXY_* variables that are no setting's."""
    env = os.environ if environ is None else environ
    values: dict[str, dict[str, Any]] = {s: {} for s in _SECTIONS}
    sources: dict[str, str] = {}
    policies: tuple[dict[str, Any], ...] = ()
    prices = PriceTable()

    path = config_path if config_path is not None else default_config_path(env)
    if path is not None:
        source = f"file {path}"
        for top, content in load_file(path).items():
            if top == "policy":
                if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
                    raise ConfigError(f"policy: must be [[policy]] tables ({source})")
                policies = tuple(content)
            elif top == "price":
                if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
                    raise ConfigError(f"price: must be [[price]] tables ({source})")
                try:
                    prices = parse_price_table(content)
                except PriceError as e:
                    raise ConfigError(f"{e} ({source})") from None
            elif top in _SECTIONS:
                if not isinstance(content, dict):
                    raise ConfigError(f"{top}: must be a [{top}] table ({source})")
                for key, value in content.items():
                    _apply(values, sources, top, key, value, source)
            else:
                known = ", ".join([*sorted(_SECTIONS), "policy", "price"])
                raise ConfigError(f"{top}: unknown section ({source}); known: {known}")

    for section, cls in _SECTIONS.items():
        for key in _field_types(cls):
            name = f"{section}.{key}"
            var = ENV_PREFIX + name.replace(".", "_").upper()
            alias = _ENV_ALIASES.get(name)
            if var in env:
                _apply(values, sources, section, key, env[var], f"environment {var}")
            elif alias and alias in env:
                _apply(values, sources, section, key, env[alias], f"environment {alias}")

    for name, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = name.partition(".")
        if section not in _SECTIONS:
            raise ConfigError(f"{name}: unknown setting (flag)")
        flag = (flags or {}).get(name)
        _apply(values, sources, section, key, value, f"flag {flag}" if flag else "flag")

    for section in _SECTIONS:
        for key, value in values[section].items():
            name = f"{section}.{key}"
            check = _CHECKS.get(name)
            problem = check(value) if check else None
            if problem:
                raise ConfigError(f"{name}: {problem}, got {value!r} ({sources[name]})")

    try:
        parse_policies(policies)
    except PolicyError as e:
        raise ConfigError(f"{e} ({source if path is not None else 'built-in'})") from None

    if warn is not None:
        admin_key = values["auth"].get("admin_key_env", "")  # named by a setting: read
        for warning in misspelled_variables({k: v for k, v in env.items() if k != admin_key}):
            warn(warning)

    return Settings(
        server=ServerSettings(**values["server"]),
        upstream=UpstreamSettings(**values["upstream"]),
        store=StoreSettings(**values["store"]),
        auth=AuthSettings(**values["auth"]),
        budgets=BudgetSettings(**values["budgets"]),
        responses=ResponsesSettings(**values["responses"]),
        policies=policies,
        prices=prices,
        config_file=str(path) if path is not None else "",
        sources=dict(sources),
    )
