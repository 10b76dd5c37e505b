"""The SQS-compatible subset, pure parts: parsing and checking AWS JSON 1.0 requests,
SQS error shapes, message attributes and their MD5s, and rendering messages. No I/O:
:mod:`kmq.proxy.sqs_api` does the talking to Kafka.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from kmq.errors import InvalidQueueError
from kmq.validation import RESERVED_HEADER_PREFIX, check_queue_id

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
MAX_BATCH = 10
MAX_RECEIVE = 10
MAX_WAIT_S = 20
MAX_VISIBILITY_S = 43_200
MAX_ATTRIBUTES = 10
TYPES_HEADER = "sqs:types"
"""kmq header holding each SQS message attribute's DataType (JSON). ``:`` never occurs in
an SQS attribute name, so it cannot collide with one."""
BODY_ENCODING_ATTRIBUTE = "kmq.body-encoding"
"""Added (``base64``) to a received message whose payload is not UTF-8 text."""

SUPPORTED = frozenset(
    {
        "CreateQueue",
        "GetQueueUrl",
        "ListQueues",
        "SendMessage",
        "SendMessageBatch",
        "ReceiveMessage",
        "DeleteMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
        "GetQueueAttributes",
    }
)
UNSUPPORTED = frozenset(
    {
        "AddPermission",
        "CancelMessageMoveTask",
        "DeleteQueue",
        "ListDeadLetterSourceQueues",
        "ListMessageMoveTasks",
        "ListQueueTags",
        "PurgeQueue",
        "RemovePermission",
        "SetQueueAttributes",
        "StartMessageMoveTask",
        "TagQueue",
        "UntagQueue",
    }
)

# SQS's legacy (query protocol) codes, sent in x-amzn-query-error: botocore maps modeled
# exceptions (client.exceptions.QueueDoesNotExist, ...) through them.
_LEGACY = {
    "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
    "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
    "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    "InvalidBatchEntryId": "AWS.SimpleQueueService.InvalidBatchEntryId",
    "BatchRequestTooLong": "AWS.SimpleQueueService.BatchRequestTooLong",
    "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
}


class SqsError(Exception):
    """An SQS error: ``code`` is the error shape's name (``__type``), ``status`` the HTTP
    status; ``sender`` says whose fault it is (x-amzn-query-error's second part)."""

    def __init__(self, code: str, message: str, status: int = 400, *, sender: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.sender = sender

    def render(self) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and body of the error response."""
        body = json.dumps({"__type": f"com.amazonaws.sqs#{self.code}", "message": self.message})
        legacy = _LEGACY.get(self.code, self.code)
        headers = {
            "content-type": CONTENT_TYPE,
            "x-amzn-query-error": f"{legacy};{'Sender' if self.sender else 'Receiver'}",
        }
        return self.status, headers, body.encode()


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def missing(name: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


def parse_action(target: str | None) -> str:
    """The action named by ``X-Amz-Target``."""
    if not target or not target.startswith(TARGET_PREFIX):
        raise SqsError(
            "InvalidAction",
            "kmq serve speaks the AWS JSON 1.0 protocol: POST / with "
            "X-Amz-Target: AmazonSQS.<Action>",
        )
    action = target[len(TARGET_PREFIX) :]
    if action in SUPPORTED:
        return action
    if action in UNSUPPORTED:
        raise SqsError("UnsupportedOperation", f"kmq serve does not support {action}.")
    raise SqsError("InvalidAction", f"The action {action} is not valid for this endpoint.")


def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise SqsError("SerializationException", "The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    return body


# -- fields -------------------------------------------------------------------------------


def string(body: Mapping[str, Any], name: str, *, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise missing(name)
        return None
    if not isinstance(value, str):
        raise invalid(f"Value for parameter {name} must be a string.")
    return value


def integer(
    body: Mapping[str, Any], name: str, low: int, high: int, default: int | None
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"Value for parameter {name} must be an integer.")
    if not low <= value <= high:
        raise invalid(
            f"Value {value} for parameter {name} is invalid. Must be between {low} and {high}."
        )
    return value


def string_list(body: Mapping[str, Any], name: str) -> list[str]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"Value for parameter {name} must be a list of strings.")
    return value


def queue_name(name: str | None) -> str:
    """A queue name as a kmq queue id (kmq's rule is wider than SQS's 80 characters of
    ``[A-Za-z0-9_-]``: any 1-200 UTF-8 bytes without whitespace or control characters)."""
    if not name:
        raise missing("QueueName")
    if name.endswith(".fifo"):
        raise invalid("kmq serve has no FIFO queues.")
    try:
        return check_queue_id(name)
    except InvalidQueueError as exc:
        raise invalid(f"Queue name is not valid: {exc}") from None


def queue_from_url(url: str | None) -> str:
    """The queue a QueueUrl (``scheme://host/ACCOUNT/QUEUE``) names; a bare name is taken
    as it is."""
    if not url:
        raise missing("QueueUrl")
    segment = url
    if "://" in url:
        parts = urlsplit(url).path.split("/")
        segment = unquote(parts[2]) if len(parts) == 3 and parts[0] == "" and parts[1] else ""
    try:
        return check_queue_id(segment)
    except InvalidQueueError:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None


def queue_url(base: str, account: str, queue: str) -> str:
    return f"{base.rstrip('/')}/{account}/{quote(queue, safe='')}"


# -- message attributes -------------------------------------------------------------------

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_TYPE_RE = re.compile(r"(String|Number|Binary)(\.[\x21-\x7e]{1,245})?")
_BODY_RE = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _check_attribute_name(name: str) -> None:
    lower = name.lower()
    if (
        not _NAME_RE.fullmatch(name)
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
        or lower.startswith(("aws.", "amazon."))
        or name.startswith(RESERVED_HEADER_PREFIX)
    ):
        raise invalid(f"Message attribute name '{name}' is invalid.")


def parse_attributes(value: object) -> tuple[dict[str, bytes], dict[str, str]]:
    """MessageAttributes -> (kmq headers, DataType per name)."""
    if value is None:
        return {}, {}
    if not isinstance(value, dict):
        raise invalid("MessageAttributes must be a map.")
    if len(value) > MAX_ATTRIBUTES:
        raise invalid(
            f"Number of message attributes [{len(value)}] exceeds the allowed maximum "
            f"[{MAX_ATTRIBUTES}]."
        )
    headers: dict[str, bytes] = {}
    types: dict[str, str] = {}
    for name, attr in value.items():
        _check_attribute_name(name)
        if not isinstance(attr, dict):
            raise invalid(f"Message attribute '{name}' must be a map.")
        data_type = attr.get("DataType")
        if not isinstance(data_type, str) or not _TYPE_RE.fullmatch(data_type):
            raise invalid(f"Message attribute '{name}' has an invalid DataType.")
        if attr.get("StringListValues") or attr.get("BinaryListValues"):
            raise invalid("StringListValues and BinaryListValues are not supported.")
        if data_type.startswith("Binary"):
            raw = attr.get("BinaryValue")
            if not isinstance(raw, str):
                raise invalid(f"Message attribute '{name}' of type Binary needs a BinaryValue.")
            try:
                data = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                raise invalid(f"Message attribute '{name}': BinaryValue is not base64.") from None
        else:
            text = attr.get("StringValue")
            if not isinstance(text, str):
                raise invalid(
                    f"Message attribute '{name}' of type {data_type} needs a StringValue."
                )
            if data_type.startswith("Number") and not _is_number(text):
                raise invalid(f"Message attribute '{name}': '{text}' is not a number.")
            data = text.encode()
        if not data:
            raise invalid(f"Message attribute '{name}' must have a non-empty value.")
        headers[name] = data
        types[name] = data_type
    return headers, types


def _is_number(text: str) -> bool:
    return re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", text) is not None


def _attribute_json(data_type: str, value: bytes) -> dict[str, str]:
    if data_type.startswith("Binary"):
        return {"DataType": data_type, "BinaryValue": base64.b64encode(value).decode()}
    return {"DataType": data_type, "StringValue": value.decode()}


def attributes_from_headers(headers: Mapping[str, bytes]) -> dict[str, dict[str, str]]:
    """A message's kmq headers as SQS message attributes: with the DataTypes an SQS
    sender gave, else String for UTF-8 values and Binary for the rest."""
    types: dict[str, str] = {}
    raw_types = headers.get(TYPES_HEADER)
    if raw_types:
        try:
            found = json.loads(raw_types)
            if isinstance(found, dict):
                types = {k: v for k, v in found.items() if isinstance(v, str)}
        except ValueError:
            types = {}
    out: dict[str, dict[str, str]] = {}
    for name, value in headers.items():
        if name == TYPES_HEADER:
            continue
        data_type = types.get(name)
        if data_type is None or not data_type.startswith("Binary"):
            try:
                value.decode()
            except UnicodeDecodeError:
                data_type = "Binary"
        out[name] = _attribute_json(data_type or "String", value)
    return out


def select_attributes(
    attributes: Mapping[str, dict[str, str]], wanted: Sequence[str]
) -> dict[str, dict[str, str]]:
    """The attributes MessageAttributeNames asks for (``All``, ``.*``, ``prefix.*``, names)."""
    if not wanted:
        return {}
    if "All" in wanted or ".*" in wanted:
        return dict(attributes)
    prefixes = tuple(w[:-1] for w in wanted if w.endswith(".*"))
    names = set(wanted)
    return {
        k: v for k, v in attributes.items() if k in names or (prefixes and k.startswith(prefixes))
    }


def md5_of_attributes(attributes: Mapping[str, Mapping[str, str]]) -> str:
    """SQS's MD5OfMessageAttributes."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        attr = attributes[name]
        data_type = attr["DataType"]
        if "BinaryValue" in attr:
            transport, value = b"\x02", base64.b64decode(attr["BinaryValue"])
        else:
            transport, value = b"\x01", attr["StringValue"].encode()
        for part in (name.encode(), data_type.encode()):
            digest.update(struct.pack(">I", len(part)) + part)
        digest.update(transport + struct.pack(">I", len(value)) + value)
    return digest.hexdigest()


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


# -- requests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendEntry:
    entry_id: str | None
    payload: bytes
    headers: dict[str, bytes]
    md5_body: str
    md5_attributes: str | None


def parse_send(entry: Mapping[str, Any], entry_id: str | None = None) -> SendEntry:
    """One SendMessage request, or one SendMessageBatch entry."""
    body = string(entry, "MessageBody")
    assert body is not None
    if not body:
        raise invalid("The request must contain a non-empty MessageBody.")
    if _BODY_RE.search(body):
        raise SqsError(
            "InvalidMessageContents", "The message contains characters outside the allowed set."
        )
    delay = integer(entry, "DelaySeconds", 0, 900, 0)
    if delay:
        raise invalid("kmq serve does not delay messages: DelaySeconds must be 0.")
    for fifo in ("MessageGroupId", "MessageDeduplicationId"):
        if entry.get(fifo) is not None:
            raise invalid(f"{fifo} is for FIFO queues, which kmq serve does not have.")
    attributes = entry.get("MessageAttributes")
    headers, types = parse_attributes(attributes)
    md5_attributes = None
    if headers:
        assert isinstance(attributes, dict)
        md5_attributes = md5_of_attributes(
            {name: _attribute_json(types[name], headers[name]) for name in headers}
        )
        headers[TYPES_HEADER] = json.dumps(types, separators=(",", ":")).encode()
    payload = body.encode()
    return SendEntry(entry_id, payload, headers, md5_hex(payload), md5_attributes)


_BATCH_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")


def batch_entries(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A batch request's ``Entries``: 1 to 10 maps with distinct, valid ``Id``s."""
    entries = body.get("Entries")
    if entries is None:
        raise missing("Entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid("Entries must be a list of maps.")
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for e in entries:
        entry_id = e.get("Id")
        if not isinstance(entry_id, str) or not _BATCH_ID_RE.fullmatch(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def failed_entry(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": error.sender,
        "Code": error.code,
        "Message": error.message,
    }


@dataclass(frozen=True)
class ReceiveParams:
    max_messages: int
    wait_s: int
    visibility_s: int
    system_attributes: frozenset[str] = field(default_factory=frozenset)
    attribute_names: tuple[str, ...] = ()


SYSTEM_ATTRIBUTES = ("ApproximateReceiveCount", "SentTimestamp")


def parse_receive(body: Mapping[str, Any], default_visibility_s: int) -> ReceiveParams:
    max_messages = integer(body, "MaxNumberOfMessages", 1, MAX_RECEIVE, 1)
    wait_s = integer(body, "WaitTimeSeconds", 0, MAX_WAIT_S, 0)
    visibility = integer(body, "VisibilityTimeout", 0, MAX_VISIBILITY_S, default_visibility_s)
    assert max_messages is not None and wait_s is not None and visibility is not None
    wanted = string_list(body, "AttributeNames") + string_list(body, "MessageSystemAttributeNames")
    system = frozenset(SYSTEM_ATTRIBUTES) if "All" in wanted else frozenset(wanted)
    names = tuple(string_list(body, "MessageAttributeNames"))
    return ReceiveParams(max_messages, wait_s, visibility, system, names)


def render_message(
    *,
    message_id: str,
    handle: str,
    payload: bytes,
    headers: Mapping[str, bytes],
    attempt: int,
    sent_ms: int,
    params: ReceiveParams,
) -> dict[str, Any]:
    """One message of a ReceiveMessage response."""
    attributes = select_attributes(attributes_from_headers(headers), params.attribute_names)
    try:
        body = payload.decode()
    except UnicodeDecodeError:
        body = base64.b64encode(payload).decode()
        attributes[BODY_ENCODING_ATTRIBUTE] = {"DataType": "String", "StringValue": "base64"}
    out: dict[str, Any] = {
        "MessageId": message_id,
        "ReceiptHandle": handle,
        "MD5OfBody": md5_hex(body.encode()),
        "Body": body,
    }
    system: dict[str, str] = {}
    if "ApproximateReceiveCount" in params.system_attributes:
        system["ApproximateReceiveCount"] = str(attempt)
    if "SentTimestamp" in params.system_attributes:
        system["SentTimestamp"] = str(sent_ms)
    if system:
        out["Attributes"] = system
    if attributes:
        out["MessageAttributes"] = attributes
        out["MD5OfMessageAttributes"] = md5_of_attributes(attributes)
    return out


# -- queue attributes -----------------------------------------------------------------------

QUEUE_ATTRIBUTES = (
    "ApproximateNumberOfMessages",
    "VisibilityTimeout",
    "MaximumMessageSize",
    "ReceiveMessageWaitTimeSeconds",
    "DelaySeconds",
    "QueueArn",
)
_KNOWN_QUEUE_ATTRIBUTES = frozenset(
    {
        *QUEUE_ATTRIBUTES,
        "All",
        "ApproximateNumberOfMessagesDelayed",
        "ApproximateNumberOfMessagesNotVisible",
        "CreatedTimestamp",
        "LastModifiedTimestamp",
        "MessageRetentionPeriod",
        "Policy",
        "RedrivePolicy",
        "RedriveAllowPolicy",
        "KmsMasterKeyId",
        "KmsDataKeyReusePeriodSeconds",
        "SqsManagedSseEnabled",
        "FifoQueue",
        "ContentBasedDeduplication",
        "DeduplicationScope",
        "FifoThroughputLimit",
    }
)


def wanted_queue_attributes(names: Sequence[str]) -> list[str]:
    """Which of ours GetQueueAttributes asks for; names SQS knows but kmq does not keep
    (CreatedTimestamp, Policy, ...) are left out of the answer, unknown ones refused."""
    for name in names:
        if name not in _KNOWN_QUEUE_ATTRIBUTES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    if "All" in names:
        return list(QUEUE_ATTRIBUTES)
    return [n for n in QUEUE_ATTRIBUTES if n in names]


def check_create_attributes(value: object, effective: Mapping[str, str]) -> None:
    """CreateQueue's Attributes: kmq stores none, so each must equal what the proxy does
    anyway (``effective``); anything else is refused rather than silently ignored."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise invalid("Attributes must be a map.")
    for name, given in value.items():
        if name not in _KNOWN_QUEUE_ATTRIBUTES or name == "All":
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        if name in effective and str(given) == effective[name]:
            continue
        if name == "FifoQueue" and str(given).lower() == "false":
            continue
        raise SqsError(
            "InvalidAttributeValue",
            f"kmq serve keeps no per-queue attributes: {name} can only be "
            + (f"{effective[name]} here." if name in effective else "left unset."),
        )
