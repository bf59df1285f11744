"""The scoring side: ``ask`` a model every trial of a release, ``score`` its answers as the papers do.

``metrics`` (each paper's metrics), ``stats`` (scipy / statsmodels intervals and tests),
``score`` (answers checked against the release, parsed, scored, written), ``report`` (tables,
plots, ``report.html``), ``answers`` (the answers ledger), ``ask`` and ``backends`` (the models).
"""
