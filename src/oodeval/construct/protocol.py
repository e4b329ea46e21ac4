"""The annotation store: SQLite in WAL mode, append-only verdict rows (rules in :mod:`.rules`).

Tables: ``images`` (the candidate pool), ``annotators`` (name, role ``stage1``/``stage3``, SHA-256 of
the access token), ``verdicts`` (image, annotator, stage 1 or 3, verdict, proposed OOD label,
fine-grained flag, ID class, note, UTC time). Triggers forbid UPDATE and DELETE on ``verdicts``: a
changed mind is a new row, and the latest row per (image, annotator, stage) counts.
A Stage-1 verdict can be revised until both Stage-1 verdicts of the image are in; a Stage-3
verdict until all three are in. Each submission runs in one ``BEGIN IMMEDIATE`` transaction
(check state, insert), so concurrent submissions from threads or processes are serialised and
none is lost. Exactly two Stage-1 annotators and one Stage-3 (third) annotator per project.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from .._io import atomic_path
from .candidates import Candidate
from .rules import Outcome, Verdict, check_verdict, resolve

__all__ = ["ProtocolStore", "ProtocolError", "AuthError", "Annotator", "VerdictRow"]

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
  verdict TEXT NOT NULL CHECK(verdict IN ('ood', 'id', 'ambiguous')),
  ood_label TEXT, fine_grained INTEGER NOT NULL CHECK(fine_grained IN (0, 1)),
  id_class INTEGER, note TEXT, created TEXT NOT NULL);
CREATE INDEX verdicts_by_image ON verdicts(image, stage, id);
CREATE TRIGGER verdicts_no_update BEFORE UPDATE ON verdicts
  BEGIN SELECT RAISE(ABORT, 'verdict rows are append-only'); END;
CREATE TRIGGER verdicts_no_delete BEFORE DELETE ON verdicts
  BEGIN SELECT RAISE(ABORT, 'verdict rows are append-only'); END;
"""


class ProtocolError(ValueError):
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
    created: str

    def as_verdict(self) -> Verdict:
        return Verdict(self.annotator, self.verdict, self.ood_label, self.fine_grained, self.id_class, self.stage)

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


def _reached_stage3(o: Outcome) -> bool:
    """The image went to Stage 3: disputed now, or decided there."""
    return o.status == "stage3" or (o.status == "final" and o.stage == 3)


class ProtocolStore:
    """``ProtocolStore(path)`` opens an existing store; ``ProtocolStore.create`` makes one.

    Every method opens its own short-lived connection, so one store object may be shared by
    the threads of the web server.
    """

    def __init__(self, path: str | Path, timeout: float = 60.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        if not self.path.is_file():
            raise FileNotFoundError(f"no protocol store at {self.path}; run `oodeval construct init` first")
        try:
            with self._connect() as con:
                meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"{self.path} is not an oodeval protocol store: {exc}") from None
        if meta.get("format") != "oodeval.construct.protocol/1":
            raise ValueError(f"{self.path} is not an oodeval protocol store (format {meta.get('format')!r})")
        self.n_classes = int(meta["n_classes"]) if meta.get("n_classes") else None

    # -- set-up ---------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | Path,
        candidates: list[Candidate],
        stage1: tuple[str, str] | list[str],
        stage3: str,
        n_classes: int | None = None,
    ) -> tuple[ProtocolStore, dict[str, str]]:
        """Create the store with its images and annotators; return it and name -> fresh token.

        Tokens are shown only here (the store keeps their SHA-256).
        """
        path = Path(path)
        names = [*stage1, stage3]
        if len(stage1) != 2:
            raise ValueError(f"the protocol needs exactly two Stage-1 annotators, got {len(stage1)}")
        if len(set(names)) != 3 or any(not n or not n.strip() for n in names):
            raise ValueError(f"the three annotator names must be distinct and non-empty, got {names}")
        if not candidates:
            raise ValueError("no candidate images to annotate")
        ids = [c.image for c in candidates]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{len(ids) - len(set(ids))} duplicate image id(s) among the candidates")
        if path.exists():
            raise FileExistsError(f"protocol store {path} already exists; it holds verdicts and is never overwritten")
        tokens = {n: _new_token() for n in names}
        with atomic_path(path) as tmp:
            con = sqlite3.connect(tmp)
            try:
                con.executescript(SCHEMA)
                con.execute("INSERT INTO meta VALUES ('format', 'oodeval.construct.protocol/1')")
                con.execute("INSERT INTO meta VALUES ('n_classes', ?)", (str(n_classes) if n_classes else "",))
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

    def annotator(self, name: str) -> Annotator:
        for a in self.annotators():
            if a.name == name:
                return a
        raise AuthError(f"unknown annotator {name!r}")

    # -- images ---------------------------------------------------------------------------------
    def images(self) -> list[Candidate]:
        """The pool in its original order."""
        with self._connect() as con:
            rows = con.execute("SELECT image, path, original_label, original_name, flag FROM images ORDER BY position").fetchall()
        return [Candidate(*r) for r in rows]

    def image(self, image: str) -> Candidate:
        with self._connect() as con:
            row = con.execute("SELECT image, path, original_label, original_name, flag FROM images WHERE image = ?", (image,)).fetchone()
        if row is None:
            raise ProtocolError(f"unknown image id {image!r}")
        return Candidate(*row)

    # -- verdicts -------------------------------------------------------------------------------
    @staticmethod
    def _rows(con: sqlite3.Connection, image: str | None = None) -> list[VerdictRow]:
        sql = "SELECT id, image, annotator, stage, verdict, ood_label, fine_grained, id_class, note, created FROM verdicts"
        rows = con.execute(sql + (" WHERE image = ? ORDER BY id" if image else " ORDER BY id"), (image,) if image else ()).fetchall()
        return [VerdictRow(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8], r[9]) for r in rows]

    def rows(self, image: str | None = None) -> list[VerdictRow]:
        """Every stored row (of one image), oldest first: the full audit trail."""
        with self._connect() as con:
            return self._rows(con, image)

    @staticmethod
    def _latest(rows: list[VerdictRow], order: list[str]) -> tuple[list[VerdictRow], list[VerdictRow]]:
        """The latest row per annotator for Stage 1 and Stage 3, in annotator order."""
        latest: dict[tuple[int, str], VerdictRow] = {}
        for r in rows:
            latest[(r.stage, r.annotator)] = r
        s1 = [latest[(1, n)] for n in order if (1, n) in latest]
        s3 = [latest[(3, n)] for n in order if (3, n) in latest]
        return s1, s3

    def _outcome(self, rows: list[VerdictRow], order: list[str]) -> Outcome:
        s1, s3 = self._latest(rows, order)
        return resolve([r.as_verdict() for r in s1], [r.as_verdict() for r in s3])

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
    ) -> int:
        """Append one verdict row after checking it against the protocol; return its row id.

        Raises ProtocolError (nothing stored) for an unknown image or annotator, a stage the
        annotator has no part in, a closed stage, or fields that do not fit the verdict.
        """
        try:
            check_verdict(verdict, ood_label, bool(fine_grained), id_class, self.n_classes)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        if stage not in (1, 3):
            raise ProtocolError(f"stage must be 1 or 3 (Stage 2 is the automatic comparison), got {stage!r}")
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                people = con.execute("SELECT name, role FROM annotators ORDER BY position").fetchall()
                order = [name for name, _ in people]
                if annotator not in order:
                    raise AuthError(f"unknown annotator {annotator!r}")
                if stage == 1 and dict(people)[annotator] != "stage1":
                    raise ProtocolError(f"{annotator} is the Stage-3 annotator and gives no Stage-1 verdicts")
                if con.execute("SELECT 1 FROM images WHERE image = ?", (image,)).fetchone() is None:
                    raise ProtocolError(f"unknown image id {image!r}")
                state = self._outcome(self._rows(con, image), order)
                if stage == 1 and state.status != "stage1":
                    raise ProtocolError(f"Stage 1 of image {image!r} is closed: both Stage-1 verdicts are in")
                if stage == 3 and state.status != "stage3":
                    why = "it is still in Stage 1" if state.status == "stage1" else "it is already decided"
                    raise ProtocolError(f"image {image!r} takes no Stage-3 verdict: {why}")
                created = datetime.now(timezone.utc).isoformat(timespec="microseconds")
                cur = con.execute(
                    "INSERT INTO verdicts(image, annotator, stage, verdict, ood_label, fine_grained, id_class, note, created)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (image, annotator, stage, verdict, (ood_label or "").strip() or None, int(bool(fine_grained)), id_class, note, created),
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return int(cur.lastrowid)

    # -- derived state ----------------------------------------------------------------------------
    def outcomes(self) -> dict[str, Outcome]:
        """image -> Outcome for the whole pool, in pool order."""
        order = [a.name for a in self.annotators()]
        by_image: dict[str, list[VerdictRow]] = defaultdict(list)
        for r in self.rows():
            by_image[r.image].append(r)
        return {c.image: self._outcome(by_image.get(c.image, []), order) for c in self.images()}

    def outcome(self, image: str) -> Outcome:
        self.image(image)
        return self._outcome(self.rows(image), [a.name for a in self.annotators()])

    def view(self, annotator: str, image: str) -> dict:
        """What ``annotator`` may see of ``image``.

        Stage-1 annotators see only their own Stage-1 verdict while the image is undecided or
        decided at Stage 2; once it is in Stage 3 everyone sees both Stage-1 verdicts and the
        Stage-3 verdicts so far (the joint review).
        """
        who = self.annotator(annotator)
        cand = self.image(image)
        rows = self.rows(image)
        order = [a.name for a in self.annotators()]
        s1, s3 = self._latest(rows, order)
        state = self._outcome(rows, order)
        reached3 = _reached_stage3(state)
        mine = next((r.as_dict() for r in s1 if r.annotator == who.name), None)
        view = {
            "image": cand.image,
            "original_label": cand.original_label,
            "original_name": cand.original_name,
            "flag": cand.flag,
            "my_stage1": mine,
            "in_stage3": reached3,
        }
        if reached3:
            view["stage1"] = [r.as_dict() for r in s1]
            view["stage3"] = [r.as_dict() for r in s3]
            view["outcome"] = asdict(state)
        return view

    def queue(self, annotator: str, stage: int) -> list[dict]:
        """The annotator's queue: ``[{image, done}]`` in pool order.

        Stage 1: every image for a Stage-1 annotator (``done`` = own verdict given; nothing about the
        other annotator). Stage 3: the images that reached Stage 3, for all three annotators.
        """
        who = self.annotator(annotator)
        outcomes = self.outcomes()
        mine = {(r.image, r.stage) for r in self.rows() if r.annotator == who.name}
        if stage == 1:
            if who.role != "stage1":
                return []
            return [{"image": img, "done": (img, 1) in mine} for img in outcomes]
        if stage == 3:
            return [
                {"image": img, "done": (img, 3) in mine or o.status == "final"}
                for img, o in outcomes.items()
                if _reached_stage3(o)
            ]
        raise ProtocolError(f"stage must be 1 or 3, got {stage!r}")

    def progress(self) -> list[dict]:
        """Per annotator: Stage-1 verdicts given / pool size, Stage-3 verdicts given / disputed images."""
        outcomes = self.outcomes()
        disputed = {img for img, o in outcomes.items() if _reached_stage3(o)}
        done: dict[tuple[str, int], set] = defaultdict(set)
        for r in self.rows():
            done[(r.annotator, r.stage)].add(r.image)
        return [
            {
                "annotator": a.name,
                "role": a.role,
                "stage1_done": len(done[(a.name, 1)]),
                "stage1_total": len(outcomes) if a.role == "stage1" else 0,
                "stage3_done": len(done[(a.name, 3)] & disputed),
                "stage3_total": len(disputed),
            }
            for a in self.annotators()
        ]

    def summary(self) -> dict[str, int]:
        """Counts of images per state: stage1, stage3, ood, id, ambiguous."""
        counts = dict.fromkeys(("stage1", "stage3", "ood", "id", "ambiguous"), 0)
        for o in self.outcomes().values():
            counts[o.verdict if o.status == "final" else o.status] += 1
        return counts
