"""A local OAuth2 token endpoint, and a service-account file whose `token_uri` names it,
so that google-auth's real token exchange runs in tests: the proxy's application default
credentials sign a JWT assertion with the file's private key, the endpoint checks it
against the public key (the signature, Google's audience, the scope) and answers with an
access token, which the Vertex stand-in accepts only while it lives.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import google.auth.exceptions
import google.auth.jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

TOKEN_PATH = "/oauth2/token"
PROJECT = "standin-project"
CLIENT_EMAIL = f"compaction-proxy@{PROJECT}.iam.gserviceaccount.com"
KEY_ID = "standin-key-1"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
# The audience google-auth's service-account assertions name, whatever the token_uri.
AUDIENCE = "https://oauth2.googleapis.com/token"
_JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"


@functools.cache
def _key() -> tuple[str, str]:
    """A test RSA key pair (private PEM, public PEM), made once per process."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private.decode(), public.decode()


def write_service_account(path: Path, token_uri: str) -> Path:
    """A service-account key file as Google issues them, its token_uri the local one."""
    info = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": KEY_ID,
        "private_key": _key()[0],
        "client_email": CLIENT_EMAIL,
        "client_id": "100000000000000000001",
        "token_uri": token_uri,
    }
    path.write_text(json.dumps(info))
    return path


@dataclass
class TokenEndpoint:
    """Issues access tokens for JWT assertions signed with the test key."""

    lifetime: int = 3600  # seconds an issued token lives
    issued: dict[str, float] = field(default_factory=dict)  # token -> expiry (monotonic)
    exchanges: int = 0

    def valid(self, token: str) -> bool:
        expiry = self.issued.get(token)
        return expiry is not None and time.monotonic() < expiry

    async def handle(self, request: web.Request) -> web.Response:
        form = await request.post()
        assertion = form.get("assertion")
        if form.get("grant_type") != _JWT_GRANT or not isinstance(assertion, str):
            return _refused("unsupported_grant_type", "Expected a JWT bearer assertion.")
        try:
            claims = google.auth.jwt.decode(  # type: ignore[no-untyped-call]
                assertion, certs={KEY_ID: _key()[1]}, audience=AUDIENCE, clock_skew_in_seconds=5
            )
        except (ValueError, google.auth.exceptions.GoogleAuthError) as e:
            return _refused("invalid_grant", f"Invalid JWT: {e}")
        if claims.get("iss") != CLIENT_EMAIL or CLOUD_PLATFORM not in str(claims.get("scope")):
            return _refused("invalid_scope", "Expected the cloud-platform scope.")
        token = "ya29.standin-" + secrets.token_urlsafe(24)
        self.issued[token] = time.monotonic() + self.lifetime
        self.exchanges += 1
        answer = {"access_token": token, "expires_in": self.lifetime, "token_type": "Bearer"}
        return web.json_response(answer)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post(TOKEN_PATH, self.handle)


def _refused(error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description}, status=400)
