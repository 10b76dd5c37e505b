from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MarkerType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MARKER_TYPE_UNSPECIFIED: _ClassVar[MarkerType]
    START: _ClassVar[MarkerType]
    KEEPALIVE: _ClassVar[MarkerType]
    END: _ClassVar[MarkerType]
    NACK: _ClassVar[MarkerType]
    REDELIVERED: _ClassVar[MarkerType]
    RELEASE: _ClassVar[MarkerType]
    DEAD_LETTERED: _ClassVar[MarkerType]
    BATCH: _ClassVar[MarkerType]
MARKER_TYPE_UNSPECIFIED: MarkerType
START: MarkerType
KEEPALIVE: MarkerType
END: MarkerType
NACK: MarkerType
REDELIVERED: MarkerType
RELEASE: MarkerType
DEAD_LETTERED: MarkerType
BATCH: MarkerType

class Header(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Marker(_message.Message):
    __slots__ = ("version", "type", "queue", "partition", "offset", "message_id", "attempt", "redeliver_after_ms", "key", "value", "headers", "reason", "max_attempts", "dead_letter_queue", "batch")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REDELIVER_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    version: int
    type: MarkerType
    queue: str
    partition: int
    offset: int
    message_id: str
    attempt: int
    redeliver_after_ms: int
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    reason: str
    max_attempts: int
    dead_letter_queue: str
    batch: _containers.RepeatedCompositeFieldContainer[Marker]
    def __init__(self, version: _Optional[int] = ..., type: _Optional[_Union[MarkerType, str]] = ..., queue: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., message_id: _Optional[str] = ..., attempt: _Optional[int] = ..., redeliver_after_ms: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., reason: _Optional[str] = ..., max_attempts: _Optional[int] = ..., dead_letter_queue: _Optional[str] = ..., batch: _Optional[_Iterable[_Union[Marker, _Mapping]]] = ...) -> None: ...
