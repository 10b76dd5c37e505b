"""``kmq audit``: what the queue and markers topics say happened to every message.

``kmq.audit.transforms`` holds the logic (pure DataFrame functions), ``kmq.audit.job`` the
I/O, ``kmq.audit.summary`` and ``kmq.audit.report`` the outputs. Needs ``kmq[spark]``.
"""
