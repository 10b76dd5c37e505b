"""``kmq serve``: kmq queues for any language over HTTP.

A native JSON API (:mod:`kmq.proxy.native`) and an SQS-compatible subset
(:mod:`kmq.proxy.sqs_api`) on one ASGI app (:mod:`kmq.proxy.app`), backed by kmq's public
API (:mod:`kmq.proxy.backend`). Receipt handles are self-contained and signed
(:mod:`kmq.proxy.handles`), so replicas are stateless and any of them settles any message.
Needs the ``proxy`` extra: ``pip install 'kmq[proxy]'``.
"""
