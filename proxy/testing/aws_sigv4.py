"""SigV4 checked as AWS checks it, for the Bedrock stand-in: the signature a request
carries is recomputed with botocore from what arrived (method, the raw path and query,
the headers it names as signed, the body's bytes) and known test credentials, so a
request signed over anything but exactly what was sent fails, as it would at AWS.

`TEST_CREDENTIALS` are what tests give the proxy (AWS_ACCESS_KEY_ID/..._SECRET_...
/AWS_SESSION_TOKEN); the stand-in accepts those and no others.
"""

from __future__ import annotations

import datetime
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from multidict import CIMultiDict

SIGV4_TIME = "%Y%m%dT%H%M%SZ"
MAX_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class TestCredentials:
    access_key: str
    secret_key: str
    token: str | None = None


TEST_CREDENTIALS = TestCredentials(
    "AKIASTANDINTEST00001", "standin/secret/key/not/a/real/one/0000", "standin-session-token"
)
TEST_BEDROCK_KEY = "bedrock-api-key-standin-0001"  # what AWS_BEARER_TOKEN_BEDROCK holds

_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, ?SignedHeaders=(?P<signed>[a-z0-9;-]+), ?"
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why AWS would refuse the request: its error type and message (403)."""

    error: str
    message: str


def check_request(
    method: str,
    url: str,
    sent: Mapping[str, str],
    body: bytes,
    *,
    region: str,
    now: datetime.datetime,
    credentials: TestCredentials = TEST_CREDENTIALS,
    bearer: str | None = TEST_BEDROCK_KEY,
    service: str = "bedrock",
) -> Refusal | None:
    """None if the request is authorised; `url` is scheme, Host and the raw path+query."""
    headers = CIMultiDict(sent)
    authorization = headers.get("Authorization", "")
    if authorization.startswith("Bearer "):
        given = authorization.removeprefix("Bearer ")
        if bearer is not None and hmac.compare_digest(given, bearer):
            return None
        return Refusal("UnrecognizedClientException", "Invalid API Key format or API key.")
    if not authorization:
        return Refusal("MissingAuthenticationTokenException", "Missing Authentication Token")
    parts = _AUTH.match(authorization)
    if parts is None:
        return Refusal("IncompleteSignatureException", "Authorization header is malformed.")
    if parts["key"] != credentials.access_key:
        return Refusal(
            "UnrecognizedClientException", "The security token included in the request is invalid."
        )
    stamp = headers.get("X-Amz-Date", "")
    try:
        signed_at = datetime.datetime.strptime(stamp, SIGV4_TIME).replace(tzinfo=datetime.UTC)
    except ValueError:
        return Refusal("IncompleteSignatureException", "X-Amz-Date is missing or malformed.")
    if abs(now - signed_at) > MAX_SKEW:
        return Refusal("InvalidSignatureException", f"Signature expired: {stamp} is now too old.")
    if (parts["date"], parts["region"], parts["service"]) != (stamp[:8], region, service):
        return Refusal(
            "InvalidSignatureException",
            f"Credential should be scoped to a valid region and service: {region}/{service}.",
        )
    signed = parts["signed"].split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        return Refusal("InvalidSignatureException", "host and x-amz-date must be signed.")
    token = headers.get("X-Amz-Security-Token")
    if token != credentials.token or (token is not None and "x-amz-security-token" not in signed):
        return Refusal(
            "UnrecognizedClientException", "The security token included in the request is invalid."
        )
    request = AWSRequest(method=method, url=url, data=body)
    for name in signed:
        value = headers.get(name)
        if value is None:
            return Refusal("InvalidSignatureException", f"Signed header {name} is missing.")
        request.headers[name] = value
    request.context["timestamp"] = stamp
    frozen = ReadOnlyCredentials(credentials.access_key, credentials.secret_key, credentials.token)
    signer = SigV4Auth(frozen, service, region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, parts["signature"]):
        return Refusal(
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
        )
    return None
