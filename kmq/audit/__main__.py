"""``python -m kmq.audit`` or ``spark-submit .../kmq/audit/__main__.py``: ``kmq audit``."""

from kmq.cli.audit import audit

if __name__ == "__main__":
    audit(prog_name="kmq audit")
