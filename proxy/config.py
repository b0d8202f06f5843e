"""Typed settings for the proxy: built-in defaults < TOML file < environment < flags.

Every setting has a dotted name (`upstream.url`) that is also its place in the TOML file
(`[upstream] url = ...`) and, upper-cased with `COMPACTION_PROXY_` in front, its
environment variable (`COMPACTION_PROXY_UPSTREAM_URL`). `REDIS_URL` is accepted as an
alias of `COMPACTION_PROXY_STORE_REDIS_URL` (the prefixed name wins). A wrong value or an
unknown key raises `ConfigError` naming the setting and where it came from.

Each setting is declared once, below: its type (the annotation), its default, its doc and
its check, in one `setting(...)` line of its section's dataclass. config/proxy.toml and
the table in docs/configuration.md are generated from these declarations
(proxy/config_files.py; a test fails when they drift).

How to add a setting:
  1. Add a field to its section, e.g. in UpstreamSettings:
         bedrock_url: str = setting("", "Where Bedrock traffic goes.", _optional_http_url)
     (types: str, int, float; `unit="s"` or `"bytes"` for how the docs show the default;
     a new check is a function of the value returning the problem or None).
  2. Run `python3 -m proxy.config_files --write` (rewrites config/proxy.toml, the table
     in docs/configuration.md and deploy/kubernetes/configmap.yaml).
A new section is a new frozen dataclass, a field of `Settings` and a line in `SECTIONS`.

`[[policy]]` tables are parsed once, here (`Settings.model_policies`: yours, then the
built-in one); `[[price]]` tables (optional prices per model, proxy/core/pricing.py) into
`Settings.prices`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from proxy.core.policy import DEFAULT_POLICIES, Policy, PolicyError, parse_policies
from proxy.core.pricing import PriceError, PriceTable, parse_price_table

ENV_PREFIX = "COMPACTION_PROXY_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
DEFAULT_CONFIG_PATH = Path("config/proxy.toml")
MIB = 1024 * 1024

T = TypeVar("T")
# A setting's check: the problem with a value ("must be ..."), or None when it is fine.
Check = Callable[[Any], "str | None"]


class ConfigError(ValueError):
    """A setting is wrong; the message names it and its source."""


# -- checks ---------------------------------------------------------------------------


def _any(value: object) -> str | None:
    return None


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


def _optional_http_url(value: str) -> str | None:
    return None if value == "" else _http_url(value)


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


def _one_of(*choices: str) -> Check:
    def check(value: str) -> str | None:
        return None if value in choices else "must be " + " or ".join(f'"{c}"' for c in choices)

    return check


_ENV_NAME = r"[A-Z_][A-Z0-9_]{0,127}"


def _env_name(value: str) -> str | None:
    if value == "" or re.fullmatch(_ENV_NAME, value):
        return None
    return "must be empty or an environment variable name (A-Z, 0-9, _)"


def _optional_env_names(value: str) -> str | None:
    if not value.strip() or all(re.fullmatch(_ENV_NAME, n.strip()) for n in value.split(",")):
        return None
    return "must be environment variable names (A-Z, 0-9, _), comma-separated"


def _not_empty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


# -- the settings ---------------------------------------------------------------------


def setting(default: T, doc: str, check: Check = _any, *, unit: str = "") -> T:
    """A setting's default, doc (a sentence or two, Markdown; it becomes its comment in
    config/proxy.toml and its row in docs/configuration.md) and check. `unit` ("s",
    "bytes") says how the docs show the default."""
    metadata = {"doc": doc, "check": check, "unit": unit}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = setting("127.0.0.1", "Address to listen on.", _not_empty)
    port: int = setting(8080, "Port to listen on (0: any free port).", _port)
    max_body_bytes: int = setting(
        32 * MIB,
        "Largest request body accepted (the API's own limit); a larger one gets 413"
        " `request_too_large`.",
        _positive,
        unit="bytes",
    )
    log_format: str = setting(
        "human",
        'Request log lines: `"human"` (`key=value`) or `"json"` (one object per line).',
        _one_of("human", "json"),
    )
    drain_timeout: float = setting(
        30.0,
        "After SIGTERM, how long open requests (streams) may run on before the proxy stops"
        " (readiness fails at once).",
        _non_negative,
        unit="s",
    )
    header_timeout: float = setting(
        30.0,
        "Time to send a request's headers, from connecting or the end of the previous answer"
        " (an idle keep-alive connection is closed then too).",
        _positive,
        unit="s",
    )
    body_timeout: float = setting(
        60.0,
        "Time to send a request body, plus 1 s per 64 KiB of it (a trickle is cut: 408).",
        _positive,
        unit="s",
    )
    max_connections: int = setting(
        2048,
        "Open client connections at most (lowered at start to fit the open-file limit).",
        _positive,
    )
    event_loop: str = setting(
        "auto",
        'The event loop: `"auto"` (uvloop when installed, else asyncio\'s, as on Windows),'
        ' `"asyncio"` or `"uvloop"`; bench/RESULTS.md has both.',
        _one_of("auto", "asyncio", "uvloop"),
    )
    reuse_max_bytes: int = setting(
        256 * MIB,
        "Memory for what was computed for each conversation line's last request (its bytes,"
        " parsed messages, digests, count keys), so the next one parses, hashes and counts"
        " only what it adds; bodies count 2.5x their bytes for their parsed objects, the"
        " least recently used line goes first; 0: off. Metrics `compaction_proxy_reuse_*`.",
        _non_negative,
        unit="bytes",
    )
    off_loop_bytes: int = setting(
        256 * 1024,
        "Bodies larger than this are decoded, checked, counted and planned in a worker"
        " thread, so one huge request does not stall the others.",
        _non_negative,
        unit="bytes",
    )


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    url: str = setting(
        "https://api.anthropic.com",
        "Where Anthropic-format traffic goes, the only place it comes from (`--upstream`;"
        " no trailing `/v1`).",
        _upstream_url,
    )
    openai_url: str = setting(
        "",
        "Where OpenAI-format traffic (`/v1/chat/completions`, ...; proxy/server/routing.py)"
        " goes: OpenAI or any compatible server (`--openai-upstream`; no trailing `/v1`)."
        ' Empty: `https://api.openai.com` with `auth.keys = "off"` (callers send their own'
        ' credential), none with `"required"` (those requests get 403).',
        _optional_upstream_url,
    )
    bedrock_url: str = setting(
        "",
        "Claude through Amazon Bedrock, the proxy's `/bedrock` routes"
        " ([Bedrock and Vertex AI](bedrock-vertex.md)): bedrock-runtime's base. Empty:"
        " `https://bedrock-runtime.{region}.amazonaws.com`, and the control plane's reads at"
        " `https://bedrock.{region}.amazonaws.com`; when set, both go to this base. Set (or"
        " `bedrock_region` set), a missing AWS credential stops start-up.",
        _optional_upstream_url,
    )
    bedrock_region: str = setting(
        "",
        "The AWS region Bedrock requests are signed for (and sent to when `bedrock_url` is"
        " empty). Empty: `AWS_REGION`, else `AWS_DEFAULT_REGION`.",
        _aws_region,
    )
    vertex_url: str = setting(
        "",
        "Claude through Google Vertex AI, the proxy's `/vertex` routes: Vertex AI's base."
        " Empty: the endpoint of the location the path names"
        " (`https://{location}-aiplatform.googleapis.com`, `https://aiplatform.googleapis.com`"
        " for `global`). Set, missing Google credentials stop start-up.",
        _optional_upstream_url,
    )
    gemini_url: str = setting(
        "",
        "Where Gemini API traffic (`/v1beta/...`, `/v1/models/{model}:generateContent`, ...;"
        " proxy/server/routing.py) goes (`--gemini-upstream`). Empty:"
        " `https://generativelanguage.googleapis.com`.",
        _optional_upstream_url,
    )
    connect_timeout: float = setting(
        10.0, "Time to open a new TCP/TLS connection to the upstream.", _positive, unit="s"
    )
    stream_idle_timeout: float = setting(
        300.0,
        "Silence allowed inside a stream before the proxy ends it (no total stream timeout).",
        _positive,
        unit="s",
    )
    response_timeout: float = setting(
        600.0,
        "Silence allowed before or inside a non-streaming answer (the SDK's own default).",
        _positive,
        unit="s",
    )
    pool_limit: int = setting(1024, "Open upstream connections, in total.", _positive)
    pool_limit_per_host: int = setting(
        0,
        "Open upstream connections per upstream host (0: only the total applies).",
        _non_negative,
    )
    keepalive_timeout: float = setting(
        30.0, "How long an idle pooled connection is kept open.", _non_negative, unit="s"
    )
    max_line_bytes: int = setting(
        16 * MIB,
        "The longest event of an upstream event stream the proxy holds; past it an error"
        " event ends the stream. Memory per request stays within a small multiple of this"
        " and `max_answer_bytes`, whatever the upstream sends.",
        _positive,
        unit="bytes",
    )
    max_answer_bytes: int = setting(
        16 * MIB,
        "The largest whole answer the proxy reads to parse (a summary, a read_result round,"
        " an error it turns into an event); past it, 502.",
        _positive,
        unit="bytes",
    )


@dataclass(frozen=True, slots=True)
class StoreSettings:
    redis_url: str = setting(
        "",
        "The Redis to use (`redis://`, `rediss://`, `unix://`; also `REDIS_URL`); empty:"
        " an embedded `redis-server` on a unix socket under `state_dir`.",
        _redis_url,
    )
    state_dir: str = setting(
        "",
        "The embedded Redis's data; empty: `$XDG_STATE_HOME/compaction-proxy` or"
        " `~/.local/state/compaction-proxy`.",
    )
    key_prefix: str = setting(
        "cp:",
        "Before every Redis key (keys then carry a `{tenant:conversation}` hash tag).",
        _key_prefix,
    )
    op_timeout: float = setting(
        0.5,
        "Time for any single Redis call before the proxy goes on without it (Redis's time:"
        " when the proxy's own event loop comes to an answer late, that lateness is not"
        " counted).",
        _positive,
        unit="s",
    )
    ttl: int = setting(
        7 * 24 * 3600,
        "Lifetime of every stored key, renewed while a conversation names it (refs at most"
        " every 10 minutes, or a quarter of the TTL when shorter).",
        _positive,
        unit="s",
    )
    max_memory: str = setting(
        "1gb",
        'The embedded Redis\'s memory limit, in Redis\'s own syntax (`"512mb"`; `"0"`:'
        " none); at the limit it evicts the least recently used keys that have a TTL"
        ' (volatile-lru). See "Sizing Redis".',
        _memory_size,
    )
    max_lines: int = setting(
        4,
        "Checkpoints kept per conversation and first message: one per line (a rewind, a"
        " fork, sub-agents sharing a prefix); beyond it the least recently used goes"
        " (docs/lines.md).",
        _positive,
    )


@dataclass(frozen=True, slots=True)
class AuthSettings:
    keys: str = setting(
        "off",
        '`"off"`: forward the caller\'s own credential (its hash is the tenant);'
        ' `"required"`: only proxy-issued keys (`compaction-proxy keys create`) are let'
        ' through (see "Keys, budgets and a fleet").',
        _one_of("off", "required"),
    )
    cache_seconds: float = setting(
        5.0,
        "How long a replica trusts its copy of a key record or a budget's limits.",
        _non_negative,
        unit="s",
    )
    admin_key_env: str = setting(
        "",
        "The environment variable holding the admin key, for the admin API and `/dashboard`"
        " (the key itself is never in a file or in Redis); empty: both answer 404.",
        _env_name,
    )
    upstream_envs: str = setting(
        "",
        "Environment variables a key made through the admin API may name as its upstream"
        " credential, comma-separated, besides `ANTHROPIC_API_KEY` and `OPENAI_API_KEY`"
        " (never the admin key's, nor the proxy's own settings).",
        _optional_env_names,
    )
    outage_trust_seconds: float = setting(
        300.0,
        'With `budgets.on_store_down = "open"`, how long into a Redis outage a key this'
        " replica knew valid keeps working (a key revoked before the outage still stops"
        " within `cache_seconds`); 0: a key that cannot be checked again is refused after"
        " `cache_seconds`.",
        _non_negative,
        unit="s",
    )


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    on_store_down: str = setting(
        "open",
        'While Redis is unreachable: `"open"` admits requests uncounted (up to'
        ' `outage_allowance` per key and replica), `"closed"` refuses them (503).',
        _one_of("open", "closed"),
    )
    timeout: float = setting(
        2.0,
        "Time a key, limit or reservation call to Redis may take before Redis counts as"
        " unreachable (a shorter stall only delays requests).",
        _positive,
        unit="s",
    )
    outage_allowance: int = setting(
        100_000,
        "Tokens (input + output reserved) one replica admits uncounted per key during one"
        ' outage with `on_store_down = "open"`; past it, that key\'s requests get 503.',
        _non_negative,
    )


@dataclass(frozen=True, slots=True)
class ResponsesSettings:
    codex_compaction: str = setting(
        "auto",
        'Codex\'s `compaction_trigger` on `/v1/responses`: `"pass-through"` forwards it,'
        ' `"serve"` answers it with the proxy\'s own summary, `"auto"` forwards it until'
        " the upstream refuses one (a server that is not OpenAI), then serves it.",
        _one_of("auto", "pass-through", "serve"),
    )
    websocket: str = setting(
        "relay",
        '`GET /v1/responses` upgraded to a WebSocket (Codex\'s first choice): `"relay"`'
        " (one upstream socket per client socket, every `response.create` compacted like a"
        ' POST) or `"refuse"` (426: Codex uses HTTP for the session).',
        _one_of("relay", "refuse"),
    )
    websocket_max_frame: int = setting(
        32 * MIB,
        "Bytes of one WebSocket frame, client or upstream (a bigger one closes that socket, 1009).",
        _positive,
        unit="bytes",
    )
    websocket_heartbeat: float = setting(
        30.0, "Time between pings on both sockets.", _positive, unit="s"
    )
    websocket_idle_timeout: float = setting(
        3600.0,
        "How long a socket may go without a `response.create` before it is closed.",
        _positive,
        unit="s",
    )


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    budgets: BudgetSettings = field(default_factory=BudgetSettings)
    responses: ResponsesSettings = field(default_factory=ResponsesSettings)
    # `[[policy]]` tables as written; parsed (and so checked) once, into model_policies.
    policies: tuple[Mapping[str, Any], ...] = ()
    # `[[price]]` tables: what tokens cost per model (reports and stats; optional).
    prices: PriceTable = field(default_factory=PriceTable)
    # Where the settings came from, for messages: the file read ("" = none), and the
    # source of each setting not left at its default ("file X", "environment VAR", "flag
    # --port"). Not part of what the settings are, so equality ignores them.
    config_file: str = field(default="", compare=False)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    # What every model's policy is chosen from: the parsed `policies`, then the built-in
    # one (the first whose glob fits the model wins). Raises PolicyError when one is wrong.
    model_policies: tuple[Policy, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        parsed = (*parse_policies(self.policies), *DEFAULT_POLICIES)
        object.__setattr__(self, "model_policies", parsed)

    def source_of(self, name: str) -> str:
        """Where the dotted setting's value came from ("default" when nothing set it)."""
        return self.sources.get(name, "default")

    def resolved_state_dir(self) -> Path:
        if self.store.state_dir:
            return Path(self.store.state_dir).expanduser()
        xdg = os.environ.get("XDG_STATE_HOME")
        base = Path(xdg) if xdg else Path.home() / ".local" / "state"
        return base / "compaction-proxy"


# The [section] tables, in the order the file and the docs list them.
SECTIONS: dict[str, type] = {
    "server": ServerSettings,
    "upstream": UpstreamSettings,
    "store": StoreSettings,
    "auth": AuthSettings,
    "budgets": BudgetSettings,
    "responses": ResponsesSettings,
}


@dataclass(frozen=True, slots=True)
class Declared:
    """One setting as declared: what the loader checks and the generated files show."""

    section: str
    key: str
    kind: type  # str, int or float
    default: Any
    doc: str
    check: Check
    unit: str

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def variable(self) -> str:
        return ENV_PREFIX + self.name.replace(".", "_").upper()


def _declared_in(section: str, cls: type) -> dict[str, Declared]:
    kinds = typing.get_type_hints(cls)
    return {
        f.name: Declared(
            section,
            f.name,
            kinds[f.name],
            f.default,
            f.metadata["doc"],
            f.metadata["check"],
            f.metadata["unit"],
        )
        for f in dataclasses.fields(cls)
    }


# Every setting, by section then key.
DECLARED: dict[str, dict[str, Declared]] = {s: _declared_in(s, c) for s, c in SECTIONS.items()}


def declared() -> Iterable[Declared]:
    """Every setting, in declaration order."""
    for settings in DECLARED.values():
        yield from settings.values()


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


def _apply(
    values: dict[str, dict[str, Any]],
    sources: dict[str, str],
    section: str,
    key: str,
    value: Any,
    source: str,
) -> None:
    name = f"{section}.{key}"
    known = DECLARED[section]
    if key not in known:
        raise ConfigError(
            f"{name}: unknown setting ({source}){_did_you_mean(key, known)};"
            f" known in [{section}]: {', '.join(sorted(known))}"
        )
    values[section][key] = _coerce(name, known[key].kind, value, source)
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
    names.update((d.name, d.variable) for d in declared())
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


def _tables(content: object, top: str, source: str) -> list[dict[str, Any]]:
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise ConfigError(f"{top}: must be [[{top}]] tables ({source})")
    return content


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
    values: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    sources: dict[str, str] = {}
    policies: tuple[dict[str, Any], ...] = ()
    prices = PriceTable()

    path = config_path if config_path is not None else default_config_path(env)
    source = f"file {path}" if path is not None else "built-in"
    for top, content in (load_file(path) if path is not None else {}).items():
        if top == "policy":
            policies = tuple(_tables(content, top, source))
        elif top == "price":
            try:
                prices = parse_price_table(_tables(content, top, source))
            except PriceError as e:
                raise ConfigError(f"{e} ({source})") from None
        elif top in SECTIONS:
            if not isinstance(content, dict):
                raise ConfigError(f"{top}: must be a [{top}] table ({source})")
            for key, value in content.items():
                _apply(values, sources, top, key, value, source)
        else:
            known = ", ".join([*sorted(SECTIONS), "policy", "price"])
            raise ConfigError(f"{top}: unknown section ({source}); known: {known}")

    for d in declared():
        alias = _ENV_ALIASES.get(d.name)
        if d.variable in env:
            _apply(values, sources, d.section, d.key, env[d.variable], f"environment {d.variable}")
        elif alias and alias in env:
            _apply(values, sources, d.section, d.key, env[alias], f"environment {alias}")

    for name, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = name.partition(".")
        if section not in SECTIONS:
            raise ConfigError(f"{name}: unknown setting (flag)")
        flag = (flags or {}).get(name)
        _apply(values, sources, section, key, value, f"flag {flag}" if flag else "flag")

    for d in declared():  # the value each ends with: a later source may mend an earlier one
        value = values[d.section].get(d.key, d.default)
        problem = d.check(value)
        if problem:
            raise ConfigError(f"{d.name}: {problem}, got {value!r} ({sources[d.name]})")

    if warn is not None:
        admin_key = values["auth"].get("admin_key_env", "")  # named by a setting: read
        for warning in misspelled_variables({k: v for k, v in env.items() if k != admin_key}):
            warn(warning)

    sections: dict[str, Any] = {name: cls(**values[name]) for name, cls in SECTIONS.items()}
    try:
        return Settings(
            **sections,
            policies=policies,
            prices=prices,
            config_file=str(path) if path is not None else "",
            sources=dict(sources),
        )
    except PolicyError as e:
        raise ConfigError(f"{e} ({source})") from None
