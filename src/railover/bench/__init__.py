"""``railover bench``: benchmark suites measured side by side on a test bed.

:mod:`~railover.bench.cli` registers the command; each suite is a module (``healthy``,
``failover``, ``degraded``, ``failback``, ``false_failover``, ``scale``) with a ``run()``
that writes JSON, plots and a markdown table; :mod:`~railover.bench.common` holds what they
share (rank launch, result parsing, schedstat, percentiles).
"""
