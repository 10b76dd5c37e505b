"""The SQS subset's pure parts: actions, error shapes, request checks, attributes, MD5s."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from typing import Any

import pytest

from kmq.proxy import sqs
from kmq.proxy.sqs import SqsError


def test_actions_come_from_the_target_header() -> None:
    assert sqs.parse_action("AmazonSQS.ReceiveMessage") == "ReceiveMessage"
    with pytest.raises(SqsError) as info:
        sqs.parse_action("AmazonSQS.PurgeQueue")
    assert info.value.code == "UnsupportedOperation"
    for bad in (None, "", "AmazonSNS.Publish", "AmazonSQS.Frobnicate"):
        with pytest.raises(SqsError) as info:
            sqs.parse_action(bad)
        assert info.value.code == "InvalidAction" and info.value.status == 400


def test_errors_have_sqs_shapes_and_the_query_error_header() -> None:
    status, headers, body = SqsError("QueueDoesNotExist", "gone").render()
    assert status == 400
    assert json.loads(body) == {"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "gone"}
    assert headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    assert headers["content-type"] == "application/x-amz-json-1.0"
    status, headers, _ = SqsError("InternalError", "x", 500, sender=False).render()
    assert (status, headers["x-amzn-query-error"]) == (500, "InternalError;Receiver")
    _, headers, _ = SqsError("ReceiptHandleIsInvalid", "x").render()
    assert headers["x-amzn-query-error"] == "ReceiptHandleIsInvalid;Sender"


@pytest.mark.parametrize("raw", [b"{", b"[1]", b'"s"', b"\xff"])
def test_bodies_must_be_json_objects(raw: bytes) -> None:
    with pytest.raises(SqsError) as info:
        sqs.parse_body(raw)
    assert info.value.code == "SerializationException"


def test_an_empty_body_is_an_empty_request() -> None:
    assert sqs.parse_body(b"") == {}


def test_queue_urls_round_trip_any_queue_id() -> None:
    for queue in ("emails", "a/b:c", "üñí"):
        url = sqs.queue_url("http://h:1", "000000000000", queue)
        assert sqs.queue_from_url(url) == queue
    assert sqs.queue_from_url("emails") == "emails"
    for bad in ("http://h:1/000000000000/", "http://h:1/0/has%20space"):
        with pytest.raises(SqsError) as info:
            sqs.queue_from_url(bad)
        assert info.value.code == "QueueDoesNotExist"
    with pytest.raises(SqsError) as info:
        sqs.queue_from_url(None)
    assert info.value.code == "MissingParameter"


def test_queue_names() -> None:
    assert sqs.queue_name("jobs-1") == "jobs-1"
    for bad, code in (
        ("jobs.fifo", "InvalidParameterValue"),
        ("a b", "InvalidParameterValue"),
        (None, "MissingParameter"),
        ("x" * 201, "InvalidParameterValue"),
    ):
        with pytest.raises(SqsError) as info:
            sqs.queue_name(bad)
        assert info.value.code == code


def test_numbers_are_checked() -> None:
    body = {"MaxNumberOfMessages": 11, "WaitTimeSeconds": 20}
    assert sqs.integer(body, "WaitTimeSeconds", 0, 20, 0) == 20
    assert sqs.integer({}, "WaitTimeSeconds", 0, 20, 7) == 7
    for value in (11, 0, "5", True, 1.5):
        with pytest.raises(SqsError) as info:
            sqs.integer({"MaxNumberOfMessages": value}, "MaxNumberOfMessages", 1, 10, 1)
        assert info.value.code == "InvalidParameterValue"


def test_receive_parameters() -> None:
    p = sqs.parse_receive({}, 30)
    assert (p.max_messages, p.wait_s, p.visibility_s) == (1, 0, 30)
    assert p.system_attributes == frozenset() and p.attribute_names == ()
    p = sqs.parse_receive(
        {
            "MaxNumberOfMessages": 10,
            "WaitTimeSeconds": 20,
            "VisibilityTimeout": 0,
            "AttributeNames": ["All"],
            "MessageAttributeNames": ["a.*"],
        },
        30,
    )
    assert (p.max_messages, p.wait_s, p.visibility_s) == (10, 20, 0)
    assert p.system_attributes == frozenset(sqs.SYSTEM_ATTRIBUTES)
    p = sqs.parse_receive({"MessageSystemAttributeNames": ["ApproximateReceiveCount"]}, 30)
    assert p.system_attributes == {"ApproximateReceiveCount"}
    for bad in (
        {"MaxNumberOfMessages": 11},
        {"WaitTimeSeconds": 21},
        {"VisibilityTimeout": 43_201},
        {"MessageAttributeNames": "All"},
    ):
        with pytest.raises(SqsError):
            sqs.parse_receive(bad, 30)


def _expected_md5(name: str, data_type: str, transport: int, value: bytes) -> str:
    parts = b""
    for part in (name.encode(), data_type.encode()):
        parts += struct.pack(">I", len(part)) + part
    parts += bytes([transport]) + struct.pack(">I", len(value)) + value
    return hashlib.md5(parts).hexdigest()


def test_message_attribute_md5_follows_the_sqs_algorithm() -> None:
    one = {"n": {"DataType": "Number", "StringValue": "5"}}
    assert sqs.md5_of_attributes(one) == _expected_md5("n", "Number", 1, b"5")
    binary = {"b": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\x00\x01").decode()}}
    assert sqs.md5_of_attributes(binary) == _expected_md5("b", "Binary", 2, b"\x00\x01")
    both = {**binary, **one}
    assert sqs.md5_of_attributes(both) == sqs.md5_of_attributes(dict(reversed(both.items())))


def test_send_keeps_attributes_as_headers_with_their_types() -> None:
    entry = sqs.parse_send(
        {
            "MessageBody": "héllo",
            "MessageAttributes": {
                "n": {"DataType": "Number.int", "StringValue": "-1.5e3"},
                "s": {"DataType": "String", "StringValue": "v"},
                "b": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\xff").decode()},
            },
        }
    )
    assert entry.payload == "héllo".encode()
    assert entry.md5_body == hashlib.md5("héllo".encode()).hexdigest()
    assert entry.headers["n"] == b"-1.5e3" and entry.headers["b"] == b"\xff"
    types = json.loads(entry.headers[sqs.TYPES_HEADER])
    assert types == {"n": "Number.int", "s": "String", "b": "Binary"}
    back = sqs.attributes_from_headers(entry.headers)
    assert back["n"] == {"DataType": "Number.int", "StringValue": "-1.5e3"}
    assert back["b"]["DataType"] == "Binary" and sqs.TYPES_HEADER not in back
    assert sqs.md5_of_attributes(back) == entry.md5_attributes


@pytest.mark.parametrize(
    ("entry", "code"),
    [
        ({}, "MissingParameter"),
        ({"MessageBody": ""}, "InvalidParameterValue"),
        ({"MessageBody": 5}, "InvalidParameterValue"),
        ({"MessageBody": "a\x00b"}, "InvalidMessageContents"),
        ({"MessageBody": "x", "DelaySeconds": 5}, "InvalidParameterValue"),
        ({"MessageBody": "x", "MessageGroupId": "g"}, "InvalidParameterValue"),
        (
            {
                "MessageBody": "x",
                "MessageAttributes": {"AWS.x": {"DataType": "String", "StringValue": "v"}},
            },
            "InvalidParameterValue",
        ),
        (
            {
                "MessageBody": "x",
                "MessageAttributes": {"kmq.id": {"DataType": "String", "StringValue": "v"}},
            },
            "InvalidParameterValue",
        ),
        (
            {
                "MessageBody": "x",
                "MessageAttributes": {"a": {"DataType": "Text", "StringValue": "v"}},
            },
            "InvalidParameterValue",
        ),
        (
            {
                "MessageBody": "x",
                "MessageAttributes": {"a": {"DataType": "Number", "StringValue": "five"}},
            },
            "InvalidParameterValue",
        ),
        (
            {
                "MessageBody": "x",
                "MessageAttributes": {"a": {"DataType": "Binary", "BinaryValue": "**"}},
            },
            "InvalidParameterValue",
        ),
        (
            {
                "MessageBody": "x",
                "MessageAttributes": {
                    f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)
                },
            },
            "InvalidParameterValue",
        ),
    ],
)
def test_bad_send_entries(entry: dict[str, Any], code: str) -> None:
    with pytest.raises(SqsError) as info:
        sqs.parse_send(entry)
    assert info.value.code == code


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "MissingParameter"),
        ({"Entries": []}, "EmptyBatchRequest"),
        ({"Entries": [{"Id": str(i)} for i in range(11)]}, "TooManyEntriesInBatchRequest"),
        ({"Entries": [{"Id": "a"}, {"Id": "a"}]}, "BatchEntryIdsNotDistinct"),
        ({"Entries": [{"Id": "no spaces"}]}, "InvalidBatchEntryId"),
        ({"Entries": [{}]}, "InvalidBatchEntryId"),
        ({"Entries": "x"}, "InvalidParameterValue"),
    ],
)
def test_batch_entries_are_checked(body: dict[str, Any], code: str) -> None:
    with pytest.raises(SqsError) as info:
        sqs.batch_entries(body)
    assert info.value.code == code


def test_attribute_selection() -> None:
    attrs = {k: {"DataType": "String", "StringValue": "v"} for k in ("a.x", "a.y", "b")}
    assert sqs.select_attributes(attrs, []) == {}
    assert set(sqs.select_attributes(attrs, ["All"])) == {"a.x", "a.y", "b"}
    assert set(sqs.select_attributes(attrs, [".*"])) == {"a.x", "a.y", "b"}
    assert set(sqs.select_attributes(attrs, ["a.*"])) == {"a.x", "a.y"}
    assert set(sqs.select_attributes(attrs, ["b", "c"])) == {"b"}


def test_rendered_messages() -> None:
    params = sqs.parse_receive({"AttributeNames": ["All"], "MessageAttributeNames": ["All"]}, 30)
    out = sqs.render_message(
        message_id="m",
        handle="h",
        payload=b"text",
        headers={"k": b"v"},
        attempt=3,
        sent_ms=123,
        params=params,
    )
    assert out["Body"] == "text" and out["MD5OfBody"] == hashlib.md5(b"text").hexdigest()
    assert out["Attributes"] == {"ApproximateReceiveCount": "3", "SentTimestamp": "123"}
    assert out["MessageAttributes"] == {"k": {"DataType": "String", "StringValue": "v"}}
    assert out["MD5OfMessageAttributes"] == sqs.md5_of_attributes(out["MessageAttributes"])
    plain = sqs.render_message(
        message_id="m",
        handle="h",
        payload=b"text",
        headers={"k": b"v"},
        attempt=1,
        sent_ms=1,
        params=sqs.parse_receive({}, 30),
    )
    assert set(plain) == {"MessageId", "ReceiptHandle", "MD5OfBody", "Body"}


def test_a_payload_that_is_not_text_is_sent_as_base64_and_says_so() -> None:
    params = sqs.parse_receive({}, 30)
    out = sqs.render_message(
        message_id="m",
        handle="h",
        payload=b"\xff\x00",
        headers={},
        attempt=1,
        sent_ms=1,
        params=params,
    )
    assert base64.b64decode(out["Body"]) == b"\xff\x00"
    assert out["MessageAttributes"][sqs.BODY_ENCODING_ATTRIBUTE]["StringValue"] == "base64"


def test_queue_attributes() -> None:
    assert sqs.wanted_queue_attributes(["All"]) == list(sqs.QUEUE_ATTRIBUTES)
    assert sqs.wanted_queue_attributes(["Policy", "VisibilityTimeout"]) == ["VisibilityTimeout"]
    with pytest.raises(SqsError) as info:
        sqs.wanted_queue_attributes(["Nonsense"])
    assert info.value.code == "InvalidAttributeName"


def test_create_queue_attributes_must_be_what_the_proxy_does_anyway() -> None:
    effective = {"VisibilityTimeout": "30", "DelaySeconds": "0"}
    sqs.check_create_attributes(None, effective)
    sqs.check_create_attributes({"VisibilityTimeout": "30", "FifoQueue": "false"}, effective)
    for attrs, code in (
        ({"VisibilityTimeout": "60"}, "InvalidAttributeValue"),
        ({"FifoQueue": "true"}, "InvalidAttributeValue"),
        ({"RedrivePolicy": "{}"}, "InvalidAttributeValue"),
        ({"Nonsense": "1"}, "InvalidAttributeName"),
    ):
        with pytest.raises(SqsError) as info:
            sqs.check_create_attributes(attrs, effective)
        assert info.value.code == code
