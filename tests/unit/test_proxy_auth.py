"""Who may do what: bearer tokens, queue patterns, SQS access keys and SigV4 checks."""

from __future__ import annotations

import datetime
import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from kmq.proxy.auth import (
    AuthError,
    QueuePatterns,
    SignedRequest,
    TokenTable,
    parse_credentials,
    verify_sigv4,
)

TOKENS = """
# comment
all-queues-token-0123456789
limited-token-0123456789   emails  billing-*   # trailing comment
"""
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
KEYS = parse_credentials(f"AKIDEXAMPLE {SECRET}\nAKIDLIMITED limited-secret-0123456789 jobs")
BODY = b'{"QueueUrl": "http://127.0.0.1:8080/000000000000/emails"}'


def test_queue_patterns() -> None:
    p = QueuePatterns.parse("emails, billing-* ,x")
    assert p.patterns == ("emails", "billing-*", "x")
    assert p.allows("emails") and p.allows("billing-eu") and p.allows("billing-")
    assert not p.allows("emails2") and not p.allows("billing") and not p.allows("other")
    assert QueuePatterns().allows("anything") and QueuePatterns.parse("").unlimited


def test_tokens_authenticate_and_carry_their_queues() -> None:
    table = TokenTable.parse(TOKENS)
    assert table.authenticate("Bearer all-queues-token-0123456789").unlimited
    limited = table.authenticate("bearer   limited-token-0123456789 ")
    assert limited.allows("emails") and limited.allows("billing-x") and not limited.allows("jobs")
    semicolons = TokenTable.parse("first-token-0123456789;second-token-012345678 q")
    assert semicolons.authenticate("Bearer second-token-012345678").allows("q")


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "unauthenticated"),
        ("", "unauthenticated"),
        ("Basic dXNlcjpwYXNz", "unauthenticated"),
        ("Bearer ", "unauthenticated"),
        ("Bearer all-queues-token-012345678", "invalid_token"),
        ("Bearer all-queues-token-0123456789x", "invalid_token"),
    ],
)
def test_missing_or_unknown_tokens_are_401(header: str | None, code: str) -> None:
    with pytest.raises(AuthError) as info:
        TokenTable.parse(TOKENS).authenticate(header)
    assert (info.value.status, info.value.code) == (401, code)


@pytest.mark.parametrize("text", ["", "# only a comment", "short-token"])
def test_token_lists_that_would_let_anyone_in_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        TokenTable.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "AKID",
        "AKID short",
        "AK!D secret-long-enough-0123",
        "AK secret-long-enough-0123",
    ],
)
def test_bad_credential_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_credentials(text)


def test_secrets_stay_out_of_reprs() -> None:
    assert "wJalr" not in repr(KEYS["AKIDEXAMPLE"])


# -- SigV4 -------------------------------------------------------------------------------------


def signed(
    *,
    key_id: str = "AKIDEXAMPLE",
    secret: str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    body: bytes = BODY,
    region: str = "eu-west-1",
    service: str = "sqs",
    extra: dict[str, str] | None = None,
    at: datetime.datetime | None = None,
) -> SignedRequest:
    request = AWSRequest(
        method="POST",
        url="http://127.0.0.1:8080/",
        data=body,
        headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "AmazonSQS.GetQueueAttributes",
            **(extra or {}),
        },
    )
    signer = SigV4Auth(Credentials(key_id, secret), service, region)
    if at is None:
        signer.add_auth(request)
    else:
        from unittest import mock

        with mock.patch("botocore.auth.get_current_datetime", return_value=at):
            signer.add_auth(request)
    headers = (*request.prepare().headers.items(), ("Host", "127.0.0.1:8080"))
    return SignedRequest("POST", "/", "", headers, body)


def test_a_botocore_signature_verifies() -> None:
    assert verify_sigv4(signed(), KEYS).key_id == "AKIDEXAMPLE"
    limited = verify_sigv4(signed(key_id="AKIDLIMITED", secret="limited-secret-0123456789"), KEYS)
    assert limited.queues.allows("jobs") and not limited.queues.allows("emails")


def test_every_region_verifies_since_the_scope_is_signed() -> None:
    assert verify_sigv4(signed(region="ap-south-2"), KEYS).key_id == "AKIDEXAMPLE"


def _replace(req: SignedRequest, name: str, value: str) -> SignedRequest:
    headers = tuple((k, value if k.lower() == name else v) for k, v in req.headers)
    return SignedRequest(req.method, req.path, req.query, headers, req.body)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: SignedRequest(r.method, r.path, r.query, r.headers, r.body + b" "),
        lambda r: SignedRequest(r.method, "/other", r.query, r.headers, r.body),
        lambda r: SignedRequest(r.method, r.path, "a=1", r.headers, r.body),
        lambda r: SignedRequest("PUT", r.path, r.query, r.headers, r.body),
        lambda r: _replace(r, "x-amz-target", "AmazonSQS.PurgeQueue"),
        lambda r: _replace(r, "host", "evil.example:8080"),
    ],
)
def test_anything_changed_after_signing_fails(change: object) -> None:
    assert callable(change)
    with pytest.raises(AuthError) as info:
        verify_sigv4(change(signed()), KEYS)
    assert (info.value.status, info.value.code) == (403, "SignatureDoesNotMatch")


def test_a_wrong_secret_or_unknown_key_is_403() -> None:
    with pytest.raises(AuthError) as info:
        verify_sigv4(signed(secret="not-the-secret-0123456789"), KEYS)
    assert (info.value.status, info.value.code) == (403, "SignatureDoesNotMatch")
    with pytest.raises(AuthError) as info:
        verify_sigv4(signed(key_id="AKIDUNKNOWN"), KEYS)
    assert (info.value.status, info.value.code) == (403, "InvalidClientTokenId")


def test_a_stale_or_future_date_is_refused() -> None:
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    for skew in (datetime.timedelta(minutes=-16), datetime.timedelta(minutes=16)):
        with pytest.raises(AuthError) as info:
            verify_sigv4(signed(at=now + skew), KEYS)
        assert (info.value.status, info.value.code) == (403, "RequestExpired")
    assert verify_sigv4(signed(at=now - datetime.timedelta(minutes=14)), KEYS)
    old = signed(at=now - datetime.timedelta(minutes=2))
    with pytest.raises(AuthError):
        verify_sigv4(old, KEYS, max_skew_s=60)
    assert verify_sigv4(old, KEYS, time.time() - 120)


def test_missing_and_malformed_authorization() -> None:
    req = signed()
    kept = tuple((k, v) for k, v in req.headers if k.lower() != "authorization")
    bare = SignedRequest(req.method, req.path, req.query, kept, req.body)
    with pytest.raises(AuthError) as info:
        verify_sigv4(bare, KEYS)
    assert info.value.code == "MissingAuthenticationToken"
    for value in ("AWS4-HMAC-SHA256 nonsense", "AWS AKIDEXAMPLE:sig"):
        with pytest.raises(AuthError) as info:
            verify_sigv4(_replace(req, "authorization", value), KEYS)
        assert info.value.code == "IncompleteSignature"
    with pytest.raises(AuthError) as info:
        verify_sigv4(signed(service="sns"), KEYS)
    assert info.value.code == "IncompleteSignature"


def test_an_unsigned_payload_is_refused() -> None:
    req = signed(extra={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    with pytest.raises(AuthError) as info:
        verify_sigv4(req, KEYS)
    assert info.value.code == "SignatureDoesNotMatch"


def test_headers_botocore_would_skip_are_checked_when_a_client_signs_them() -> None:
    """Other SDKs sign User-Agent and the like: verify exactly the listed headers."""
    import hashlib
    import hmac

    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    headers = {
        "content-type": "application/x-amz-json-1.0",
        "host": "127.0.0.1:8080",
        "user-agent": "aws-sdk-java/2.0",
        "x-amz-date": amz_date,
        "x-amz-target": "AmazonSQS.GetQueueAttributes",
    }
    signed_names = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            *(f"{k}:{headers[k]}" for k in sorted(headers)),
            "",
            signed_names,
            hashlib.sha256(BODY).hexdigest(),
        ]
    )
    scope = f"{amz_date[:8]}/us-east-1/sqs/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY").encode()
    for part in (amz_date[:8], "us-east-1", "sqs", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    auth = (
        f"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{scope}, SignedHeaders={signed_names}, "
        f"Signature={signature}"
    )
    request = SignedRequest("POST", "/", "", (*headers.items(), ("authorization", auth)), BODY)
    assert verify_sigv4(request, KEYS).key_id == "AKIDEXAMPLE"
    with pytest.raises(AuthError):
        verify_sigv4(_replace(request, "user-agent", "tampered"), KEYS)
