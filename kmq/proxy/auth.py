"""Who may do what: bearer tokens for the native API, SigV4 access keys for the SQS API,
and queue patterns limiting either. Pure: the caller passes the request's parts and the
time; nothing here touches Kafka or the network.

Token and access-key lists are text, one entry a line (or separated by ``;``), ``#``
starting a comment::

    TOKEN [QUEUE_PATTERN ...]                        # --tokens-file / KMQ_PROXY_TOKENS
    ACCESS_KEY_ID SECRET_ACCESS_KEY [QUEUE_PATTERN ...]   # --sqs-credentials-file

A queue pattern is a queue id, or a prefix ending in ``*``; an entry without patterns may
use every queue.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials

MIN_TOKEN_CHARS = 16
MAX_CLOCK_SKEW_S = 900.0
"""How far a SigV4 request's X-Amz-Date may be from the server clock (AWS's own 15 min)."""


class AuthError(Exception):
    """Refused: ``status`` 401 (no or unknown credentials) or 403 (known but not allowed,
    or a signature that does not match); ``code`` names the case for the API's errors."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class QueuePatterns:
    """Queue ids and ``prefix*`` patterns; empty means every queue."""

    patterns: tuple[str, ...] = ()

    @property
    def unlimited(self) -> bool:
        return not self.patterns

    def allows(self, queue: str) -> bool:
        if not self.patterns:
            return True
        for p in self.patterns:
            if p.endswith("*"):
                if queue.startswith(p[:-1]):
                    return True
            elif queue == p:
                return True
        return False

    @classmethod
    def parse(cls, text: str) -> QueuePatterns:
        """Comma- or whitespace-separated patterns."""
        return cls(tuple(p for p in re.split(r"[,\s]+", text.strip()) if p))


def _entries(text: str) -> Iterable[tuple[int, list[str]]]:
    for number, line in enumerate(re.split(r"[;\n]", text), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            yield number, line.split()


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


@dataclass(frozen=True)
class TokenTable:
    """Bearer tokens (kept as SHA-256 digests) and the queues each may use."""

    tokens: Mapping[bytes, QueuePatterns]

    @classmethod
    def parse(cls, text: str) -> TokenTable:
        tokens: dict[bytes, QueuePatterns] = {}
        for number, fields in _entries(text):
            token = fields[0]
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(
                    f"token list entry {number}: a token must be at least {MIN_TOKEN_CHARS} "
                    "characters long"
                )
            tokens[_digest(token)] = QueuePatterns(tuple(fields[1:]))
        if not tokens:
            raise ValueError("the token list holds no token")
        return cls(tokens)

    def authenticate(self, authorization: str | None) -> QueuePatterns:
        """The queues the request's bearer token may use; raises :class:`AuthError` (401)."""
        if not authorization:
            raise AuthError(401, "unauthenticated", "an Authorization: Bearer token is required")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError(401, "unauthenticated", "an Authorization: Bearer token is required")
        # A dict lookup of a digest: timing tells nothing about the tokens themselves.
        patterns = self.tokens.get(_digest(token.strip()))
        if patterns is None:
            raise AuthError(401, "invalid_token", "the bearer token is not valid")
        return patterns


@dataclass(frozen=True)
class AccessKey:
    key_id: str
    secret: str = field(default="", repr=False)
    queues: QueuePatterns = QueuePatterns()


def parse_credentials(text: str) -> dict[str, AccessKey]:
    """SQS access keys: ``ACCESS_KEY_ID SECRET_ACCESS_KEY [QUEUE_PATTERN ...]`` entries."""
    keys: dict[str, AccessKey] = {}
    for number, fields in _entries(text):
        if len(fields) < 2:
            raise ValueError(
                f"credentials entry {number}: expected ACCESS_KEY_ID SECRET_ACCESS_KEY "
                "[QUEUE_PATTERN ...]"
            )
        key_id, secret = fields[0], fields[1]
        if not re.fullmatch(r"[A-Za-z0-9]{4,128}", key_id):
            raise ValueError(f"credentials entry {number}: access key ids are 4-128 letters/digits")
        if len(secret) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"credentials entry {number}: a secret access key must be at least "
                f"{MIN_TOKEN_CHARS} characters long"
            )
        keys[key_id] = AccessKey(key_id, secret, QueuePatterns(tuple(fields[2:])))
    if not keys:
        raise ValueError("the credentials list holds no access key")
    return keys


# -- SigV4 ----------------------------------------------------------------------------------

_AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-fA-F]{64})\s*$"
)
_AMZ_DATE = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class SignedRequest:
    """What SigV4 covers of one HTTP request."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    """Every header as received (names in any case; repeated names kept)."""
    body: bytes


def _header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def verify_sigv4(
    request: SignedRequest,
    keys: Mapping[str, AccessKey],
    now: float | None = None,
    *,
    service: str = "sqs",
    max_skew_s: float = MAX_CLOCK_SKEW_S,
) -> AccessKey:
    """The access key that signed ``request``, or :class:`AuthError`. The expected
    signature is computed by botocore's ``SigV4Auth`` over the headers the client says it
    signed; the payload must be signed (``UNSIGNED-PAYLOAD`` is refused)."""
    authorization = _header(request.headers, "authorization")
    if not authorization:
        raise AuthError(
            403, "MissingAuthenticationToken", "Request is missing Authentication Token"
        )
    match = _AUTH_RE.match(authorization.strip())
    if match is None:
        raise AuthError(
            403, "IncompleteSignature", "the Authorization header is not an AWS4-HMAC-SHA256 one"
        )
    parts = match["credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or parts[3] != service:
        raise AuthError(403, "IncompleteSignature", "the credential scope is malformed")
    key_id, scope_date, region = parts[0], parts[1], parts[2]
    signed = match["signed"].lower().split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        raise AuthError(403, "IncompleteSignature", "host and x-amz-date must be signed")
    amz_date = _header(request.headers, "x-amz-date") or ""
    try:
        stamp = calendar.timegm(time.strptime(amz_date, _AMZ_DATE))
    except ValueError:
        raise AuthError(403, "IncompleteSignature", "X-Amz-Date is malformed") from None
    if amz_date[:8] != scope_date:
        raise AuthError(403, "SignatureDoesNotMatch", "the credential date is not X-Amz-Date's")
    current = time.time() if now is None else now
    if abs(current - stamp) > max_skew_s:
        raise AuthError(
            403,
            "RequestExpired",
            f"Signature expired: X-Amz-Date {amz_date} is more than {max_skew_s:g} s from "
            "the server's clock",
        )
    key = keys.get(key_id)
    if key is None:
        raise AuthError(
            403,
            "InvalidClientTokenId",
            "The security token included in the request is invalid",
        )
    if (_header(request.headers, "x-amz-content-sha256") or "").startswith(("UNSIGNED", "STREAM")):
        raise AuthError(403, "SignatureDoesNotMatch", "the payload must be signed")
    to_sign: list[tuple[str, str]] = []
    for name in signed:
        values = [v for k, v in request.headers if k.lower() == name]
        if not values:
            raise AuthError(403, "SignatureDoesNotMatch", f"signed header {name!r} is missing")
        to_sign.extend((name, v) for v in values)
    url = f"http://{_header(request.headers, 'host') or 'localhost'}{request.path}"
    if request.query:
        url += "?" + request.query
    aws_request = AWSRequest(method=request.method, url=url, data=request.body)
    for name, value in to_sign:
        aws_request.headers.add_header(name, value)
    aws_request.context["timestamp"] = amz_date
    signer = _ExactSigner(Credentials(key.key_id, key.secret), service, region, signed)
    canonical = signer.canonical_request(aws_request)
    expected = signer.signature(signer.string_to_sign(aws_request, canonical), aws_request)
    if not hmac.compare_digest(expected, match["signature"].lower()):
        raise AuthError(
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided",
        )
    return key


class _ExactSigner(SigV4Auth):
    """botocore's SigV4Auth, signing exactly the headers the client listed (botocore on
    its own leaves out some, such as User-Agent, that other SDKs may sign)."""

    def __init__(self, credentials: Credentials, service: str, region: str,
                 signed: list[str]) -> None:  # fmt: skip
        super().__init__(credentials, service, region)
        self._signed = frozenset(signed)

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        headers = HTTPHeaders()
        for name, value in request.headers.items():
            if name.lower() in self._signed:
                headers[name.lower()] = value
        return headers
