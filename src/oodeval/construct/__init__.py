"""Building an OOD benchmark from label errors (Fi-ImageNet-1k paper, Sec. 3).

candidates -> evidence -> three-stage protocol (SQLite store + web app) -> exported manifests.
See ``docs/construct.md``.
"""

from .candidates import Candidate, Project, flag_counts, load_project, select_candidates, write_project
from .export import export, format_outcome, outcome_table
from .protocol import AuthError, ProtocolError, ProtocolStore
from .rules import Outcome, Verdict, agree, resolve_verdicts

__all__ = [
    "Candidate", "Project", "flag_counts", "load_project", "select_candidates", "write_project",
    "export", "format_outcome", "outcome_table",
    "AuthError", "ProtocolError", "ProtocolStore",
    "Outcome", "Verdict", "agree", "resolve_verdicts",
]
