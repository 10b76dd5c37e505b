"""``kmq serve``, SQS-compatible API, driven by unmodified boto3 through ``endpoint_url``."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from mypy_boto3_sqs import SQSClient

from tests.functional.conftest import Broker, RunningTracker, Topics
from tests.functional.helpers import Children, read_records
from tests.functional.test_proxy_helpers import (
    KEY_ID,
    KEY_SECRET,
    LIMITED_KEY_ID,
    LIMITED_KEY_SECRET,
    Replica,
    make_topics,
    running_tracker,
    service,
    start_replica,
)


def sqs_client(
    replica: Replica, key_id: str = KEY_ID, secret: str = KEY_SECRET, **config: Any
) -> SQSClient:
    return boto3.client(
        "sqs",
        endpoint_url=replica.url,
        region_name="eu-central-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=Config(**config) if config else None,
    )


def qname() -> str:
    return f"sqs-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def stopics(broker: Broker) -> Topics:
    return make_topics(broker, 4)


@pytest.fixture(scope="module")
def stracker(broker: Broker, stopics: Topics) -> Iterator[RunningTracker]:
    yield from running_tracker(broker, stopics)


@pytest.fixture(scope="module")
def replica(
    broker: Broker,
    stopics: Topics,
    stracker: RunningTracker,
    kids: Children,
    tmp_path_factory: pytest.TempPathFactory,
) -> Replica:
    directory = tmp_path_factory.mktemp("sqs")
    return start_replica(
        kids, broker, stopics, directory, "proxy-sqs", "--queues", "sqs-*,limited-*"
    )


@pytest.fixture
def sqs(replica: Replica) -> SQSClient:
    return sqs_client(replica)


def receive_all(sqs: SQSClient, url: str, count: int, **params: Any) -> list[Any]:
    got: list[Any] = []
    while len(got) < count:
        r = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=min(10, count - len(got)),
            WaitTimeSeconds=10,
            **params,
        )
        if not r.get("Messages"):
            break
        got.extend(r["Messages"])
    return got


def test_queues_are_created_found_and_listed(sqs: SQSClient, replica: Replica) -> None:
    name = qname()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{replica.url}/000000000000/{name}"
    assert (
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "2"})["QueueUrl"] == url
    )
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix="sqs-")["QueueUrls"]
    assert sqs.list_queues(QueueNamePrefix="nothing-").get("QueueUrls", []) == []
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName="not-served-here")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=f"{replica.url}/000000000000/elsewhere", MessageBody="x")
    refused: list[Any] = [{"VisibilityTimeout": "60"}, {"FifoQueue": "true"}]
    for attributes in refused:
        with pytest.raises(sqs.exceptions.InvalidAttributeValue):
            sqs.create_queue(QueueName=qname(), Attributes=attributes)
    with pytest.raises(ClientError) as info:
        sqs.create_queue(QueueName="sqs-x.fifo")
    assert info.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_send_receive_and_delete_with_attributes(sqs: SQSClient) -> None:
    url = sqs.create_queue(QueueName=qname())["QueueUrl"]
    attributes: Any = {
        "s": {"DataType": "String", "StringValue": "välue"},
        "n": {"DataType": "Number", "StringValue": "42"},
        "b": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody="first ✓", MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == hashlib.md5("first ✓".encode()).hexdigest()
    entries: list[Any] = [{"Id": f"e{i}", "MessageBody": f"batch {i}"} for i in range(3)]
    entries.append({"Id": "late", "MessageBody": "x", "DelaySeconds": 5})
    batch = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert sorted(e["Id"] for e in batch["Successful"]) == ["e0", "e1", "e2"]
    assert [(e["Id"], e["Code"]) for e in batch["Failed"]] == [("late", "InvalidParameterValue")]
    got = receive_all(
        sqs, url, 4, MessageAttributeNames=["All"], AttributeNames=["All"], VisibilityTimeout=60
    )
    by_body = {m["Body"]: m for m in got}
    assert set(by_body) == {"first ✓", "batch 0", "batch 1", "batch 2"}
    first = by_body["first ✓"]
    assert first["MessageId"] == sent["MessageId"]
    assert first["MessageAttributes"] == attributes
    assert first["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert all(m["Attributes"]["ApproximateReceiveCount"] == "1" for m in got)
    assert all(m["MD5OfBody"] == hashlib.md5(m["Body"].encode()).hexdigest() for m in got)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    rest = [m for m in got if m is not first]
    handles: list[Any] = [
        {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(rest)
    ]
    handles.append({"Id": "junk", "ReceiptHandle": "not-a-handle"})
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=handles)
    assert len(deleted["Successful"]) == 3
    assert [(e["Id"], e["Code"]) for e in deleted["Failed"]] == [("junk", "ReceiptHandleIsInvalid")]
    # Visible again at once, had a delete not counted; a deleted message stays deleted.
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": f"c{i}", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(got)
        ],
    )
    assert len(changed["Successful"]) == 4 and not changed.get("Failed")
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2).get("Messages", []) == []


def test_a_batch_entry_too_large_fails_alone(sqs: SQSClient) -> None:
    url = sqs.create_queue(QueueName=qname())["QueueUrl"]
    entries: list[Any] = [
        {"Id": "first", "MessageBody": "first"},
        {"Id": "big", "MessageBody": "x" * 1_100_000},  # over max_message_bytes
        {"Id": "last", "MessageBody": "last"},
    ]
    batch = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert sorted(e["Id"] for e in batch["Successful"]) == ["first", "last"]
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in batch["Failed"]] == [
        ("big", "InvalidParameterValue", True)
    ]
    got = receive_all(sqs, url, 3, VisibilityTimeout=30)
    ids = {e["Id"]: e["MessageId"] for e in batch["Successful"]}
    assert sorted((m["MessageId"], m["Body"]) for m in got) == sorted(
        [(ids["first"], "first"), (ids["last"], "last")]
    )
    for m in got:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_receive_count_visibility_and_a_stale_handle(sqs: SQSClient) -> None:
    url = sqs.create_queue(QueueName=qname())["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="again and again")
    names: Any = ["ApproximateReceiveCount"]
    (first,) = receive_all(sqs, url, 1, VisibilityTimeout=1, AttributeNames=names)
    (second,) = receive_all(sqs, url, 1, VisibilityTimeout=60, AttributeNames=names)
    assert second["MessageId"] == first["MessageId"]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in (first, second)] == ["1", "2"]
    # kmq's choice: an authentic, unexpired handle deletes without error even when its
    # delivery was redelivered meanwhile; the redelivered copy is not touched.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=0
    )
    (third,) = receive_all(sqs, url, 1, VisibilityTimeout=60, AttributeNames=names)
    assert third["MessageId"] == first["MessageId"]
    assert third["Attributes"]["ApproximateReceiveCount"] == "2", "a release is not a receive"
    # A new visibility timeout counts from now: cut from 60 s to 1 s, it runs out.
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=third["ReceiptHandle"], VisibilityTimeout=1
    )
    (fourth,) = receive_all(sqs, url, 1, VisibilityTimeout=60, AttributeNames=names)
    assert fourth["MessageId"] == first["MessageId"]
    assert fourth["Attributes"]["ApproximateReceiveCount"] == "3"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=fourth["ReceiptHandle"])


def test_a_long_poll_waits_and_bad_parameters_are_sqs_errors(sqs: SQSClient) -> None:
    import time

    url = sqs.create_queue(QueueName=qname())["QueueUrl"]
    started = time.monotonic()
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []) == []
    assert time.monotonic() - started >= 0.95
    calls: list[tuple[Callable[[], object], str]] = [
        (
            lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11),
            "InvalidParameterValue",
        ),
        (lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=21), "InvalidParameterValue"),
        (lambda: sqs.purge_queue(QueueUrl=url), "AWS.SimpleQueueService.UnsupportedOperation"),
        (lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="x"), "ReceiptHandleIsInvalid"),
        (
            lambda: sqs.send_message_batch(QueueUrl=url, Entries=[]),
            "AWS.SimpleQueueService.EmptyBatchRequest",
        ),
        (
            lambda: sqs.send_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(11)]
            ),
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        ),
        (
            lambda: sqs.send_message_batch(
                QueueUrl=url,
                Entries=[{"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}],
            ),
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        ),
    ]
    for call, error in calls:
        with pytest.raises(ClientError) as info:
            call()
        assert info.value.response["Error"]["Code"] == error
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(sqs.exceptions.UnsupportedOperation):
        sqs.delete_queue(QueueUrl=url)


def test_wrong_missing_stale_or_out_of_scope_credentials_change_nothing(
    replica: Replica, broker: Broker, stopics: Topics
) -> None:
    url = f"{replica.url}/000000000000/{qname()}"
    body = f"must not be written {uuid.uuid4()}"
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    stale = mock.patch(
        "botocore.auth.get_current_datetime", return_value=now - datetime.timedelta(hours=1)
    )
    cases: list[tuple[SQSClient, Any, str]] = [
        (sqs_client(replica, secret="not-the-secret-access-key"), None, "SignatureDoesNotMatch"),
        (sqs_client(replica, key_id="AKIDNOBODY"), None, "InvalidClientTokenId"),
        (sqs_client(replica, signature_version=UNSIGNED), None, "MissingAuthenticationToken"),
        (sqs_client(replica), stale, "RequestExpired"),
        (sqs_client(replica, LIMITED_KEY_ID, LIMITED_KEY_SECRET), None, "AccessDenied"),
    ]
    for client, patch, code in cases:
        with patch or contextlib.nullcontext():
            for action in ("send", "receive"):
                with pytest.raises(ClientError) as info:
                    if action == "send":
                        client.send_message(QueueUrl=url, MessageBody=body)
                    else:
                        client.receive_message(QueueUrl=url, WaitTimeSeconds=1)
                assert info.value.response["Error"]["Code"] == code
                assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    limited = sqs_client(replica, LIMITED_KEY_ID, LIMITED_KEY_SECRET)
    own = limited.create_queue(QueueName=f"limited-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    limited.send_message(QueueUrl=own, MessageBody="allowed")
    assert not [
        r for r in read_records(broker.bootstrap_servers, stopics.queue) if r.value == body.encode()
    ]


def test_binary_payloads_from_the_sdk_arrive_base64_and_say_so(
    sqs: SQSClient, broker: Broker, stopics: Topics
) -> None:
    import base64

    name = qname()
    svc = service(broker, stopics)
    try:
        svc.queue(name).producer().send(b"\xff\xfe\x00", headers={"origin": b"sdk"})
    finally:
        svc.close()
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    (m,) = receive_all(sqs, url, 1, MessageAttributeNames=["origin"])
    assert base64.b64decode(m["Body"]) == b"\xff\xfe\x00"
    assert m["MessageAttributes"]["kmq.body-encoding"]["StringValue"] == "base64"
    assert m["MessageAttributes"]["origin"] == {"DataType": "String", "StringValue": "sdk"}
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_approximate_number_of_messages_is_the_queue_groups_lag(
    broker: Broker, topics: Topics, children: Children, tmp_path: Path
) -> None:
    """Its own topics: no other queue shares the partitions, so the count is exact."""
    replica = start_replica(
        children, broker, topics, tmp_path, "proxy-counts", "--counts-cache-s", "0"
    )
    sqs = sqs_client(replica)
    url = sqs.create_queue(QueueName="counted")["QueueUrl"]

    def count() -> int:
        attrs = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )
        return int(attrs["Attributes"]["ApproximateNumberOfMessages"])

    assert count() == 0
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(3)]
    )
    assert count() == 3
    got = receive_all(sqs, url, 3)
    assert len(got) == 3
    assert count() == 0, "taken messages are no longer waiting"
    everything = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert everything["VisibilityTimeout"] == "2" and everything["QueueArn"].endswith(":counted")
