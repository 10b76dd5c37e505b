"""``python -m kmq.proxy ...``: the same as ``kmq serve ...``."""

from kmq.cli.serve import serve

serve(prog_name="kmq serve")
