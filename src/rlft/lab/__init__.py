"""The lab: what rlft's own studies run on top of the library (layer 6 of docs/design.md's table).

The demo (:mod:`rlft.lab.demo` and its tracks), the study pipeline that the demo and ``scripts/`` share
(:mod:`rlft.lab.pipeline`), the test-look ledger (:mod:`rlft.lab.ledger`) and the commands that count their looks
(:mod:`rlft.lab.test_looks`), and the scripts' I/O rules (:mod:`rlft.lab.script_io`). The library below (``recipes/``
and down) never imports it.
"""
