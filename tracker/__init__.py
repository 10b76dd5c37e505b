"""kmq-tracker: watches the markers topic and redelivers messages whose lease expired."""

from tracker.config import TrackerConfig
from tracker.state import Due, PartitionState

__all__ = ["Due", "PartitionState", "TrackerConfig"]
