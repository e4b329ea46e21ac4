"""Sub-commands of the ``oodeval`` CLI, one module each (see :mod:`oodeval.cli`)."""
