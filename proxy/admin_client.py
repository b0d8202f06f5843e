"""The admin API as the `keys` and `budgets` commands use it with `--url URL`.

The same operations as proxy/store/management.py, over HTTP: for fleets whose Redis is
private, the operator talks to any replica. The admin key comes from the environment
variable COMPACTION_PROXY_ADMIN_KEY (never a flag: flags show in `ps` and shell history).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import orjson

from proxy.core.management import KeyRequest, changes_body

ADMIN_KEY_ENV = "COMPACTION_PROXY_ADMIN_KEY"
TIMEOUT_SECONDS = 30


class AdminAPIError(Exception):
    """The admin API could not be reached or refused the call (the message says why)."""


class AdminClient:
    def __init__(self, url: str, admin_key: str) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {admin_key}"}
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls, url: str) -> AdminClient:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url {url!r}: an http:// or https:// URL of a proxy")
        key = os.environ.get(ADMIN_KEY_ENV, "").strip()
        if not key:
            raise ValueError(f"--url needs the admin key in ${ADMIN_KEY_ENV}")
        return cls(url, key)

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
            self._session = aiohttp.ClientSession(timeout=timeout)
        data = None if body is None else orjson.dumps(body)
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with self._session.request(
                method, self.url + path, data=data, headers=headers
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise AdminAPIError(f"cannot reach {self.url}: {type(e).__name__}: {e}") from None
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            answer = None
        if status < 300 and answer is not None:
            return answer
        error = answer.get("error") if isinstance(answer, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        message = message or f"HTTP {status}"
        if status == 400:
            raise ValueError(message)
        if status == 404 and path.startswith(("/admin/keys/", "/admin/budgets/")):
            raise LookupError(message)
        if status == 404:
            raise AdminAPIError(f"{self.url} has no admin API (is auth.admin_key_env set?)")
        raise AdminAPIError(f"{self.url} answered {status}: {message}")

    async def create_key(self, request: KeyRequest) -> dict[str, Any]:
        body = {k: v for k, v in asdict(request).items() if v not in ("", (), None)}
        if "scopes" in body:
            body["scopes"] = list(body["scopes"])
        if "policy" in body:
            body["policy"] = {k.removeprefix("policy:"): v for k, v in body["policy"]}
        created: dict[str, Any] = await self._call("POST", "/admin/keys", body)
        return created

    async def list_keys(self) -> list[dict[str, str]]:
        listed: list[dict[str, str]] = (await self._call("GET", "/admin/keys"))["keys"]
        return listed

    async def revoke_key(self, key_id: str) -> bool:
        try:
            await self._call("DELETE", f"/admin/keys/{quote(key_id, safe='')}")
        except LookupError:
            return False
        return True

    async def budget(self, kind: str, name: str) -> dict[str, Any]:
        report: dict[str, Any] = await self._call("GET", self._budget_path(kind, name))
        return report

    async def set_budget(
        self, kind: str, name: str, changes: dict[str, int | None]
    ) -> dict[str, Any]:
        path = self._budget_path(kind, name)
        report: dict[str, Any] = await self._call("PUT", path, changes_body(changes))
        return report

    @staticmethod
    def _budget_path(kind: str, name: str) -> str:
        return f"/admin/budgets/{quote(kind, safe='')}/{quote(name, safe='')}"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
