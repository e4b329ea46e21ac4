"""The annotation store: SQLite in WAL mode, append-only verdict rows (rules in :mod:`.rules`).

Tables: ``images`` (the candidate pool), ``annotators`` (name, role ``stage1``/``stage3``, SHA-256 of
the access token), ``verdicts`` (image, annotator, stage 1 or 3, verdict, proposed OOD label,
fine-grained flag, ID class, note, the client's submission id, UTC time, the label's WordNet sense),
``reopenings`` (a coordinator's reopening of a decided image: the rows up to ``after_row`` stop
counting; reason, who, time, the export it made stale) and ``exports`` (each export: folder, time,
the last row and reopening it included). Triggers forbid UPDATE, DELETE and ``INSERT OR REPLACE``
onto an existing row of these three: a changed mind is a new row, and the latest row per (image,
annotator, stage) counts; a ``withdrawn`` row (undo) means "no verdict".
A Stage-1 verdict can be revised until both Stage-1 verdicts of the image are in, and withdrawn
(undo) until the other one is in: an agreement (Stage 2) is final and only :meth:`ProtocolStore.reopen`
(``oodeval construct reopen``, confirmed and logged) undoes it; a Stage-3 verdict can be revised or
withdrawn until all three are in. Each annotator keeps at most ``MAX_ROWS`` rows per (image, stage)
and notes of at most ``MAX_NOTE`` characters. Each submission carries a submission id: a replay returns the stored row and adds
nothing; and the id of the row it revises (``base``): a submission made on an outdated view is
refused, so an old request never undoes a newer revision. Each submission runs in one
``BEGIN IMMEDIATE`` transaction (check state, insert), so concurrent submissions from threads or
processes are serialised and none is lost. Outcomes are kept per image and updated from the rows
added since the last look (rows are append-only). The store file is readable by its owner only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import sqlite3
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from threading import Lock

from .._io import atomic_path
from ..errors import InputError
from ..zeroshot.wordnet import DEFAULT_WORDNET, noun_sense
from .candidates import Candidate, Project, evidence_sha256, pool_sha256
from .rules import Outcome, SenseLemmas, Verdict, check_text, check_verdict, differences, resolve_verdicts

__all__ = ["ProtocolStore", "ProtocolError", "AuthError", "Annotator", "VerdictRow", "open_store", "wordnet_senses", "MAX_ROWS", "MAX_NOTE"]

log = logging.getLogger(__name__)
MAX_ROWS = 20  # rows per (annotator, image, stage): revisions and undos together
MAX_NOTE = 1000  # characters of a note

SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE images(
  image TEXT PRIMARY KEY, position INTEGER UNIQUE NOT NULL, path TEXT NOT NULL,
  original_label INTEGER NOT NULL, original_name TEXT NOT NULL, flag TEXT NOT NULL);
CREATE TABLE annotators(
  name TEXT PRIMARY KEY, position INTEGER UNIQUE NOT NULL,
  role TEXT NOT NULL CHECK(role IN ('stage1', 'stage3')), token_sha256 TEXT UNIQUE NOT NULL);
CREATE TABLE verdicts(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  image TEXT NOT NULL REFERENCES images(image),
  annotator TEXT NOT NULL REFERENCES annotators(name),
  stage INTEGER NOT NULL CHECK(stage IN (1, 3)),
  verdict TEXT NOT NULL CHECK(verdict IN ('ood', 'id', 'ambiguous', 'withdrawn')),
  ood_label TEXT, fine_grained INTEGER NOT NULL CHECK(fine_grained IN (0, 1)),
  id_class INTEGER, note TEXT, submission TEXT UNIQUE NOT NULL, created TEXT NOT NULL, ood_sense TEXT);
CREATE INDEX verdicts_by_image ON verdicts(image, stage, id);
CREATE TABLE reopenings(
  id INTEGER PRIMARY KEY AUTOINCREMENT, image TEXT NOT NULL REFERENCES images(image), after_row INTEGER NOT NULL,
  reason TEXT NOT NULL, by TEXT NOT NULL, created TEXT NOT NULL, stale_export TEXT);
CREATE TABLE exports(
  id INTEGER PRIMARY KEY AUTOINCREMENT, folder TEXT NOT NULL, created TEXT NOT NULL,
  last_row INTEGER NOT NULL, last_reopening INTEGER NOT NULL);
CREATE TRIGGER verdicts_no_update BEFORE UPDATE ON verdicts
  BEGIN SELECT RAISE(ABORT, 'verdict rows are append-only'); END;
CREATE TRIGGER verdicts_no_delete BEFORE DELETE ON verdicts
  BEGIN SELECT RAISE(ABORT, 'verdict rows are append-only'); END;
CREATE TRIGGER verdicts_no_replace BEFORE INSERT ON verdicts
  WHEN EXISTS (SELECT 1 FROM verdicts WHERE id = NEW.id OR submission = NEW.submission)
  BEGIN SELECT RAISE(ABORT, 'verdict rows are append-only'); END;
""" + "".join(f"""CREATE TRIGGER {t}_no_update BEFORE UPDATE ON {t} BEGIN SELECT RAISE(ABORT, '{t} rows are append-only'); END;
CREATE TRIGGER {t}_no_delete BEFORE DELETE ON {t} BEGIN SELECT RAISE(ABORT, '{t} rows are append-only'); END;
CREATE TRIGGER {t}_no_replace BEFORE INSERT ON {t} WHEN EXISTS (SELECT 1 FROM {t} WHERE id = NEW.id)
  BEGIN SELECT RAISE(ABORT, '{t} rows are append-only'); END;
""" for t in ("reopenings", "exports"))
FORMAT = "oodeval.construct.protocol/3"  # /2 matched OOD labels across all WordNet senses; its outcomes are not /3's
ANY_BASE = object()  # submit(base=ANY_BASE): no check of the revised row (the CLI, scripts)


class ProtocolError(InputError):
    """A submission or query the protocol refuses (unknown image, closed stage, bad fields)."""


class AuthError(ProtocolError):
    """An unknown access token or annotator."""


@dataclass(frozen=True)
class Annotator:
    name: str
    role: str
    position: int


@dataclass(frozen=True)
class VerdictRow:
    """One stored row."""

    id: int
    image: str
    annotator: str
    stage: int
    verdict: str
    ood_label: str | None
    fine_grained: bool
    id_class: int | None
    note: str | None
    submission: str
    created: str
    ood_sense: str | None = None

    def as_verdict(self) -> Verdict:
        return Verdict(self.annotator, self.verdict, self.ood_label, self.fine_grained, self.id_class, self.stage, self.ood_sense)

    def as_dict(self) -> dict:
        return asdict(self)


def _hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_token() -> str:
    """A fresh URL-safe access token that never starts with ``-`` (argparse would read it as an option)."""
    while True:
        token = secrets.token_urlsafe(24)
        if not token.startswith("-"):
            return token


def _sense_lemmas(wnid: str) -> tuple[str, ...] | None:
    sense = noun_sense(wnid)
    return None if sense is None else sense.lemmas


def wordnet_senses() -> SenseLemmas | None:
    """wnid -> lemmas of that WordNet noun synset (Debian ``wordnet-base``) when installed, else None (free labels only)."""
    if not all((DEFAULT_WORDNET / f).is_file() for f in ("data.noun", "index.noun")):
        return None
    return _sense_lemmas


def _reached_stage3(o: Outcome) -> bool:
    """The image went to Stage 3: disputed now, or decided there."""
    return o.status == "stage3" or (o.status == "final" and o.stage == 3)


_COLUMNS = "id, image, annotator, stage, verdict, ood_label, fine_grained, id_class, note, submission, created, ood_sense"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _row(r: tuple) -> VerdictRow:
    return VerdictRow(*r[:6], bool(r[6]), *r[7:])


class ProtocolStore:
    """``ProtocolStore(path)`` opens an existing store; ``ProtocolStore.create`` makes one.

    Every method opens its own short-lived connection, so one store object may be shared by
    the threads of the web server. OOD labels may carry a WordNet noun sense when the store was
    created with WordNet (``senses`` in its meta table); the ID class names (``class_names``) refuse
    labels naming an ID class.
    """

    def __init__(self, path: str | Path, timeout: float = 60.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        if not self.path.is_file():
            raise FileNotFoundError(f"no protocol store at {self.path}; run `oodeval construct init` first")
        try:
            with self._connect() as con:
                meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.OperationalError as exc:  # full disk, no permission, I/O error: the store itself may be fine
            raise InputError(f"protocol store {self.path} cannot be opened ({exc}); free disk space or fix the folder's "
                             "permissions, then retry (nothing was recorded)") from None
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{self.path} is not an oodeval protocol store: {exc}") from None
        if meta.get("format") != FORMAT:
            old = " (made by an earlier oodeval that matched OOD labels across all WordNet senses; finish it with that version)"
            raise InputError(f"{self.path} is not an oodeval protocol store of format {FORMAT} (format {meta.get('format')!r})"
                             + (old if meta.get("format") == "oodeval.construct.protocol/2" else ""))
        self.n_classes = int(meta["n_classes"])
        self.pool_sha256 = meta["pool_sha256"]
        self.class_names: list[str] | None = json.loads(meta["class_names"]) if meta.get("class_names") else None
        self.senses: SenseLemmas | None = None
        if meta["senses"] == "wordnet":
            self.senses = wordnet_senses()
            if self.senses is None:
                raise InputError(f"{self.path} takes WordNet senses of OOD labels, but WordNet (Debian wordnet-base) is not installed")
        with self._connect() as con:
            people = con.execute("SELECT name, role, position FROM annotators ORDER BY position").fetchall()
            self._order = [p[0] for p in people]
            self._images = [Candidate(*r) for r in con.execute("SELECT image, path, original_label, original_name, flag FROM images ORDER BY position")]
        self._lock = Lock()
        self._seen = 0  # the largest row id folded into the caches below
        self._reopen_seen = 0  # the largest reopening id folded in
        self._after: dict[str, int] = {}  # image -> rows up to this id no longer count (reopened)
        self._by_image: dict[str, list[VerdictRow]] = {c.image: [] for c in self._images}
        self._outcomes: dict[str, Outcome] = {c.image: Outcome("stage1") for c in self._images}

    # -- set-up ---------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | Path,
        candidates: list[Candidate],
        stage1: tuple[str, str] | list[str],
        stage3: str,
        n_classes: int,
        senses: bool | None = None,
        class_names: list[str] | None = None,
    ) -> tuple[ProtocolStore, dict[str, str]]:
        """Create the store with its images and annotators; return it and name -> fresh token.

        n_classes: the ID class count (ID verdicts are checked against it). senses: OOD labels may
        name a WordNet noun sense (default: when WordNet is installed). class_names: the ID class
        names (an OOD label naming one is refused; None: not checked). Tokens are shown only here
        (the store keeps their SHA-256).
        """
        path = Path(path)
        names = [*stage1, stage3]
        if len(stage1) != 2:
            raise InputError(f"the protocol needs exactly two Stage-1 annotators, got {len(stage1)}")
        check_text(**{f"annotator name {n!a}": n for n in names}, **{f"class name {i}": c for i, c in enumerate(class_names or [])})
        if len(set(names)) != 3 or any(not n or not n.strip() for n in names):
            raise InputError(f"the three annotator names must be distinct and non-empty, got {names}")
        if not candidates:
            raise InputError("no candidate images to annotate")
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
            raise InputError(f"n_classes must be a positive integer, got {n_classes!r}")
        if senses is None:
            senses = wordnet_senses() is not None
        if class_names is not None and len(class_names) != n_classes:
            raise InputError(f"{len(class_names)} class names for {n_classes} ID classes")
        ids = [c.image for c in candidates]
        if len(set(ids)) != len(ids):
            raise InputError(f"{len(ids) - len(set(ids))} duplicate image id(s) among the candidates")
        if path.exists():
            raise FileExistsError(f"protocol store {path} already exists; it holds verdicts and is never overwritten")
        tokens = {n: _new_token() for n in names}
        with atomic_path(path, private=True) as tmp:
            con = sqlite3.connect(tmp)
            try:
                os.chmod(tmp, 0o600)  # SQLite gives the -wal and -shm files the same mode
                con.executescript(SCHEMA)
                con.executemany("INSERT INTO meta VALUES (?, ?)", [
                    ("format", FORMAT), ("n_classes", str(n_classes)), ("pool_sha256", pool_sha256(candidates)),
                    ("senses", "wordnet" if senses else "none"),
                ] + ([("class_names", json.dumps(list(class_names)))] if class_names is not None else []))
                con.executemany(
                    "INSERT INTO images VALUES (?, ?, ?, ?, ?, ?)",
                    [(c.image, i, c.path, c.original_label, c.original_name, c.flag) for i, c in enumerate(candidates)],
                )
                con.executemany(
                    "INSERT INTO annotators VALUES (?, ?, ?, ?)",
                    [(n, i, "stage1" if i < 2 else "stage3", _hash_token(tokens[n])) for i, n in enumerate(names)],
                )
                con.commit()
                con.execute("PRAGMA journal_mode=WAL")
            finally:
                con.close()
        return cls(path), tokens

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        con = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            con.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA foreign_keys=ON")
            yield con
        finally:
            con.close()

    # -- who ------------------------------------------------------------------------------------
    def annotators(self) -> list[Annotator]:
        """All annotators, Stage-1 pair first, the third last."""
        with self._connect() as con:
            rows = con.execute("SELECT name, role, position FROM annotators ORDER BY position").fetchall()
        return [Annotator(*r) for r in rows]

    def authenticate(self, token: str | None) -> Annotator:
        """The annotator owning ``token``; AuthError otherwise."""
        if not token:
            raise AuthError("no access token given")
        with self._connect() as con:
            row = con.execute("SELECT name, role, position FROM annotators WHERE token_sha256 = ?", (_hash_token(token),)).fetchone()
        if row is None:
            raise AuthError("unknown access token")
        return Annotator(*row)

    def token_sha256(self, name: str) -> str | None:
        """The SHA-256 of ``name``'s current access token (a session made with an older one is void)."""
        with self._connect() as con:
            row = con.execute("SELECT token_sha256 FROM annotators WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    def annotator(self, name: str) -> Annotator:
        for a in self.annotators():
            if a.name == name:
                return a
        raise AuthError(f"unknown annotator {name!r}")

    def reissue(self, name: str) -> str:
        """A new access token for ``name``; the old one stops working at once. Returns the token."""
        self.annotator(name)
        token = _new_token()
        with self._connect() as con:
            con.execute("UPDATE annotators SET token_sha256 = ? WHERE name = ?", (_hash_token(token), name))
        return token

    # -- images ---------------------------------------------------------------------------------
    def images(self) -> list[Candidate]:
        """The pool in its original order."""
        return list(self._images)

    def image(self, image: str) -> Candidate:
        for c in self._images:
            if c.image == image:
                return c
        raise ProtocolError(f"unknown image id {image!r}")

    # -- verdicts -------------------------------------------------------------------------------
    @staticmethod
    def _rows(con: sqlite3.Connection, image: str | None = None, after: int = 0) -> list[VerdictRow]:
        sql = f"SELECT {_COLUMNS} FROM verdicts WHERE id > ?"
        if image is not None:
            return [_row(r) for r in con.execute(sql + " AND image = ? ORDER BY id", (after, image))]
        return [_row(r) for r in con.execute(sql + " ORDER BY id", (after,))]

    def rows(self, image: str | None = None) -> list[VerdictRow]:
        """Every stored row (of one image), oldest first: the full audit trail."""
        with self._connect() as con:
            return self._rows(con, image)

    def _latest(self, rows: list[VerdictRow]) -> tuple[list[VerdictRow], list[VerdictRow]]:
        """The latest non-withdrawn row per annotator for Stage 1 and Stage 3, in annotator order."""
        latest: dict[tuple[int, str], VerdictRow] = {}
        for r in rows:
            latest[(r.stage, r.annotator)] = r
        s1 = [latest[(1, n)] for n in self._order if (1, n) in latest and latest[(1, n)].verdict != "withdrawn"]
        s3 = [latest[(3, n)] for n in self._order if (3, n) in latest and latest[(3, n)].verdict != "withdrawn"]
        return s1, s3

    def _outcome(self, rows: list[VerdictRow]) -> Outcome:
        s1, s3 = self._latest(rows)
        return resolve_verdicts([r.as_verdict() for r in s1], [r.as_verdict() for r in s3])

    def _current(self, image: str, rows: list[VerdictRow]) -> list[VerdictRow]:
        """The rows that count: those after the image's latest reopening."""
        after = self._after.get(image, 0)
        return [r for r in rows if r.id > after] if after else rows

    def submit(
        self,
        annotator: str,
        image: str,
        stage: int,
        verdict: str,
        ood_label: str | None = None,
        fine_grained: bool = False,
        id_class: int | None = None,
        note: str | None = None,
        submission: str | None = None,
        base: int | None | object = ANY_BASE,
        ood_sense: str | None = None,
    ) -> int:
        """Append one verdict row (``withdrawn``: undo) after checking it against the protocol; return its row id.

        submission: the client's id of this submission (default: a fresh one); a replay of a stored
        submission returns its row and stores nothing. base: the id of the annotator's latest row for
        (image, stage) that the submission revises (None: there was none); refused when it is no
        longer the latest. ood_sense: the WordNet noun synset the OOD label means (None: a free label).
        Raises ProtocolError (nothing stored) for an unknown image or annotator, a stage the annotator
        has no part in, a closed stage, an outdated base, fields that do not fit the verdict, a note
        over ``MAX_NOTE`` characters, or more than ``MAX_ROWS`` rows for one (image, stage).
        """
        try:
            check_text(image=image, verdict=verdict, ood_label=ood_label, note=note, submission=submission, ood_sense=ood_sense)
        except InputError as exc:
            raise ProtocolError(str(exc)) from None
        if verdict != "withdrawn":
            try:
                check_verdict(verdict, ood_label, bool(fine_grained), id_class, self.n_classes, ood_sense or None,
                              self.class_names, self.senses)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
        elif ood_label or fine_grained or id_class is not None or ood_sense:
            raise ProtocolError("a 'withdrawn' row (undo) takes no OOD label, sense, fine-grained flag or ID class")
        if note is not None and len(note) > MAX_NOTE:
            raise ProtocolError(f"a note has at most {MAX_NOTE} characters, got {len(note)}")
        if stage not in (1, 3):
            raise ProtocolError(f"stage must be 1 or 3 (Stage 2 is the automatic comparison), got {stage!r}")
        submission = submission or secrets.token_hex(16)
        row_values = (image, annotator, stage, verdict, (ood_label or "").strip() or None, int(bool(fine_grained)), id_class, note,
                      ood_sense or None)
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                replay = con.execute(f"SELECT {_COLUMNS} FROM verdicts WHERE submission = ?", (submission,)).fetchone()
                if replay is not None:
                    old = _row(replay)
                    if (old.image, old.annotator, old.stage, old.verdict, old.ood_label, int(old.fine_grained), old.id_class, old.note,
                            old.ood_sense) != row_values:
                        raise ProtocolError(f"submission id {submission!r} was already used for another verdict")
                    con.execute("ROLLBACK")
                    return old.id
                self._check(con, annotator, image, stage, verdict, base)
                cur = con.execute(
                    "INSERT INTO verdicts(image, annotator, stage, verdict, ood_label, fine_grained, id_class, note, ood_sense, "
                    "submission, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*row_values, submission, _now()),
                )
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        return int(cur.lastrowid)

    def _check(self, con: sqlite3.Connection, annotator: str, image: str, stage: int, verdict: str, base: int | None | object) -> None:
        """Raise ProtocolError unless ``annotator`` may add this row now (inside the submit transaction)."""
        if annotator not in self._order:
            raise AuthError(f"unknown annotator {annotator!r}")
        if stage == 1 and self._order.index(annotator) == 2:
            raise ProtocolError(f"{annotator} is the Stage-3 annotator and gives no Stage-1 verdicts")
        if image not in self._by_image:
            raise ProtocolError(f"unknown image id {image!r}")
        after = con.execute("SELECT coalesce(max(after_row), 0) FROM reopenings WHERE image = ?", (image,)).fetchone()[0]
        rows = self._rows(con, image, after=after)
        mine = [r for r in rows if r.annotator == annotator and r.stage == stage]
        latest = mine[-1].id if mine else None
        if base is not ANY_BASE and base != latest:
            raise ProtocolError(f"your verdict on {image!r} changed since this page loaded (now row {latest}); reload and try again")
        if len(mine) >= MAX_ROWS:
            raise ProtocolError(f"{annotator} has made {len(mine)} Stage-{stage} submissions on {image!r}, the most one may; "
                                "ask the coordinator")
        state = self._outcome(rows)
        if verdict == "withdrawn":
            if not mine or mine[-1].verdict == "withdrawn":
                raise ProtocolError(f"{annotator} has no Stage-{stage} verdict on {image!r} to undo")
            if stage == 1 and (_reached_stage3(state) or any(r.stage == 3 for r in rows)):
                raise ProtocolError(f"image {image!r} is in Stage 3: its Stage-1 verdicts can no longer be undone")
            if stage == 1 and state.status == "final":
                raise ProtocolError(f"image {image!r} was decided at Stage 2 (the two verdicts agree): agreement is final; "
                                    "only the coordinator can reopen it (oodeval construct reopen)")
            if stage == 3 and state.status == "final":
                raise ProtocolError(f"image {image!r} is already decided: its Stage-3 verdicts can no longer be undone")
        elif stage == 1 and state.status != "stage1":
            raise ProtocolError(f"Stage 1 of image {image!r} is closed: both Stage-1 verdicts are in (undo yours to change it)")
        elif stage == 3 and state.status != "stage3":
            why = "it is still in Stage 1" if state.status == "stage1" else "it is already decided"
            raise ProtocolError(f"image {image!r} takes no Stage-3 verdict: {why}")

    # -- derived state ----------------------------------------------------------------------------
    def _refresh(self) -> tuple[dict[str, list[VerdictRow]], dict[str, Outcome]]:
        """Fold the rows added since the last call into the per-image rows and outcomes."""
        with self._lock:
            with self._connect() as con:
                con.execute("BEGIN")  # one snapshot of both tables
                new = self._rows(con, after=self._seen)
                reopened = con.execute("SELECT id, image, after_row FROM reopenings WHERE id > ? ORDER BY id", (self._reopen_seen,)).fetchall()
                con.execute("COMMIT")
            for r in new:
                self._by_image[r.image].append(r)
            for _, image, after in reopened:
                self._after[image] = after
            for image in {r.image for r in new} | {r[1] for r in reopened}:
                self._outcomes[image] = self._outcome(self._current(image, self._by_image[image]))
            if new:
                self._seen = new[-1].id
            if reopened:
                self._reopen_seen = reopened[-1][0]
            return {k: list(v) for k, v in self._by_image.items()}, dict(self._outcomes)

    def outcomes(self) -> dict[str, Outcome]:
        """image -> Outcome for the whole pool, in pool order."""
        return self._refresh()[1]

    def outcome(self, image: str) -> Outcome:
        self.image(image)
        return self.outcomes()[image]

    def view(self, annotator: str, image: str) -> dict:
        """What ``annotator`` may see of ``image``.

        Stage-1 annotators see only their own Stage-1 verdict and the image's state (``stage1``,
        ``stage3`` or ``final``; a Stage-2 decision only once both verdicts are in); once it is in
        Stage 3 everyone sees both Stage-1 verdicts, the Stage-3 verdicts so far and the fields on
        which they differ (the joint review).
        """
        who = self.annotator(annotator)
        cand = self.image(image)
        by_image, outcomes = self._refresh()
        rows, state = self._current(image, by_image[image]), outcomes[image]
        s1, s3 = self._latest(rows)
        reached3 = _reached_stage3(state)
        mine1 = [r for r in rows if r.annotator == who.name and r.stage == 1]
        mine3 = [r for r in rows if r.annotator == who.name and r.stage == 3]
        view = {
            "image": cand.image,
            "original_label": cand.original_label,
            "original_name": cand.original_name,
            "flag": cand.flag,
            "status": state.status,
            "my_stage1": next((r.as_dict() for r in s1 if r.annotator == who.name), None),
            "my_last_row": {1: mine1[-1].id if mine1 else None, 3: mine3[-1].id if mine3 else None},
            "in_stage3": reached3,
        }
        if state.status == "final" and state.stage == 2 and view["my_stage1"] is not None:
            view["outcome"] = asdict(state)
        if reached3:
            view["stage1"] = [r.as_dict() for r in s1]
            view["stage3"] = [r.as_dict() for r in s3]
            view["differences"] = differences([r.as_verdict() for r in s1])
            view["outcome"] = asdict(state)
        return view

    def queue(self, annotator: str, stage: int) -> list[dict]:
        """The annotator's queue: ``[{image, done, status}]`` in pool order.

        Stage 1: every image for a Stage-1 annotator (``done`` = own verdict given; ``status`` the
        image's state). Stage 3: the images that reached Stage 3, for all three annotators.
        """
        who = self.annotator(annotator)
        by_image, outcomes = self._refresh()
        if stage not in (1, 3):
            raise ProtocolError(f"stage must be 1 or 3, got {stage!r}")
        if stage == 1 and who.role != "stage1":
            return []
        out = []
        for img, o in outcomes.items():
            s1, s3 = self._latest(self._current(img, by_image[img]))
            if stage == 1:
                out.append({"image": img, "done": any(r.annotator == who.name for r in s1), "status": o.status})
            elif _reached_stage3(o):
                out.append({"image": img, "done": any(r.annotator == who.name for r in s3) or o.status == "final", "status": o.status})
        return out

    def progress(self) -> list[dict]:
        """Per annotator: Stage-1 verdicts given / pool size, Stage-3 verdicts given / disputed images, Stage-3 images waiting."""
        by_image, outcomes = self._refresh()
        disputed = {img for img, o in outcomes.items() if _reached_stage3(o)}
        done: dict[tuple[str, int], set] = defaultdict(set)
        for img, rows in by_image.items():
            s1, s3 = self._latest(self._current(img, rows))
            for r in s1 + s3:
                done[(r.annotator, r.stage)].add(img)
        waiting = {img for img, o in outcomes.items() if o.status == "stage3"}
        return [
            {
                "annotator": a.name,
                "role": a.role,
                "stage1_done": len(done[(a.name, 1)]),
                "stage1_total": len(outcomes) if a.role == "stage1" else 0,
                "stage3_done": len(done[(a.name, 3)] & disputed),
                "stage3_total": len(disputed),
                "stage3_waiting": len(waiting - done[(a.name, 3)]),
            }
            for a in self.annotators()
        ]

    # -- coordinator: reopening and exports ----------------------------------------------------------
    def reopen(self, image: str, reason: str, by: str) -> dict:
        """Reopen a decided image (the coordinator's confirmed action): its rows so far stop counting and
        it starts again in Stage 1. Logged in ``reopenings`` (never removed) and as a warning.

        Returns ``{"reopening": id, "stale_export": folder or None, "export_created": time or None}``:
        the latest export that included the image's decision, now stale. ProtocolError for an
        image that is not decided or an empty reason.
        """
        if not reason or not reason.strip():
            raise ProtocolError("reopening a decided image needs a reason (it is logged)")
        try:
            check_text(image=image, reason=reason, by=by)
        except InputError as exc:
            raise ProtocolError(str(exc)) from None
        self.image(image)
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                after = con.execute("SELECT coalesce(max(after_row), 0) FROM reopenings WHERE image = ?", (image,)).fetchone()[0]
                rows = self._rows(con, image, after=after)
                state = self._outcome(rows)
                if state.status != "final":
                    raise ProtocolError(f"image {image!r} is not decided (it is in {state.status}); there is nothing to reopen")
                last = rows[-1].id
                export = con.execute("SELECT folder, created FROM exports WHERE last_row >= ? ORDER BY id DESC LIMIT 1", (last,)).fetchone()
                cur = con.execute("INSERT INTO reopenings(image, after_row, reason, by, created, stale_export) VALUES (?, ?, ?, ?, ?, ?)",
                                  (image, last, reason.strip(), by, _now(), export[0] if export else None))
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        log.warning("%s reopened %s (was %s at stage %s): %s", by, image, state.verdict, state.stage, reason.strip())
        return {"reopening": int(cur.lastrowid), "stale_export": export[0] if export else None, "export_created": export[1] if export else None}

    def reopenings(self) -> list[dict]:
        """Every reopening, oldest first (the coordinator's audit trail)."""
        with self._connect() as con:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute("SELECT * FROM reopenings ORDER BY id")]

    def record_export(self, folder: str | Path) -> None:
        """Note an export of the outcomes as of the last :meth:`outcomes` call (for :meth:`stale_export`)."""
        with self._connect() as con:
            con.execute("INSERT INTO exports(folder, created, last_row, last_reopening) VALUES (?, ?, ?, ?)",
                        (str(folder), _now(), self._seen, self._reopen_seen))

    def stale_export(self) -> dict | None:
        """The latest export when an image it included was reopened since: ``{folder, created, reopened}``; else None."""
        with self._connect() as con:
            export = con.execute("SELECT folder, created, last_row, last_reopening FROM exports ORDER BY id DESC LIMIT 1").fetchone()
            if export is None:
                return None
            images = [r[0] for r in con.execute("SELECT DISTINCT image FROM reopenings WHERE id > ? AND after_row <= ?", export[2:][::-1])]
        return {"folder": export[0], "created": export[1], "reopened": images} if images else None

    def summary(self) -> dict[str, int]:
        """Counts of images per state: stage1, stage3, ood, id, ambiguous."""
        counts = dict.fromkeys(("stage1", "stage3", "ood", "id", "ambiguous"), 0)
        for o in self.outcomes().values():
            counts[o.verdict if o.status == "final" else o.status] += 1
        return counts


def open_store(project: Project, check_evidence: bool = False) -> ProtocolStore:
    """The project's store, after checking it was made for this pool (and, if asked, this evidence)."""
    store = ProtocolStore(project.db_path)
    if store.pool_sha256 != pool_sha256(project.candidates):
        raise InputError(f"{project.db_path} was made for another candidate pool than {project.folder / 'candidates.csv'}; "
                         "the pool changed after `construct init`")
    pinned = project.pinned.get("evidence")
    if check_evidence and pinned is not None and evidence_sha256(project.evidence_dir) != pinned:
        raise InputError(f"the evidence in {project.evidence_dir} changed after `construct init`")
    return store
