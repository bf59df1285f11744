"""The run folder (``--out``): its layout, written in one place, and what opens it.

::

    OUT/
      ledger.sqlite                  the ledger (unless the spec's ``ledger_url`` names a database)
      store/                         images by sha256 (unless the spec's ``store_dir`` names a shared one)
      releases/<name>/<version>/     sealed releases
      run_spec.json                  the spec file that ran here last (``publish OUT``, ``review serve OUT``)
      .run.lock                      one run at a time (:mod:`counterfactory.manifests.runlock`)
      schedule.jsonl                 what each scheduled run did (:mod:`counterfactory.flows.schedule`)
      .ray-run                       a Ray run's marker, read by every node (:mod:`counterfactory.flows.ray`)

:class:`RunFolder` is the one place these names are spelled: the engine, the scheduler, Ray,
the command line and the review site ask it for the ledger's URL, the store, the lock and the
recorded spec. :class:`Workspace` is a run folder opened for one spec (ledger and store open).
Plain functions, no Prefect.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from counterfactory.flows.engine.spec import Spec, load_spec
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.runlock import RunFolderError, RunFolderLock
from counterfactory.manifests.store import ImageStore, atomic_write

#: the ledger's file, unless the spec's ``ledger_url`` names another database
LEDGER_FILE = "ledger.sqlite"
#: the image store's folder, unless the spec's ``store_dir`` names a shared one
STORE_DIR = "store"
#: sealed releases, ``releases/<name>/<version>/``
RELEASES_DIR = "releases"
#: which spec file ran here last, and its sha256 then
RECORDED_SPEC_FILE = "run_spec.json"
#: one line per scheduled run
SCHEDULE_LOG = "schedule.jsonl"
#: written by a Ray run's driver; a worker that cannot read it does not share the folder
RAY_MARKER = ".ray-run"


class RunSpecNotFoundError(CounterfactoryError, FileNotFoundError):
    """A run folder that records no spec and has no release to take one from: pass ``--spec``."""


class RunFolder:
    """One run folder: where each of its parts is, and the ledger, store and lock of a run there.

    ``out`` is the folder as given (messages name it so); ``path`` is it resolved.
    """

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.path = self.out.resolve()

    def __repr__(self) -> str:
        return f"RunFolder({str(self.out)!r})"

    @property
    def ledger_file(self) -> Path:
        """The SQLite ledger a spec without ``ledger_url`` keeps here."""
        return self.path / LEDGER_FILE

    @property
    def releases(self) -> Path:
        return self.path / RELEASES_DIR

    @property
    def recorded_spec_file(self) -> Path:
        return self.path / RECORDED_SPEC_FILE

    @property
    def schedule_log(self) -> Path:
        return self.path / SCHEDULE_LOG

    @property
    def ray_marker(self) -> Path:
        return self.path / RAY_MARKER

    def ledger_url(self, spec: Spec) -> str:
        """The ledger's SQLAlchemy URL: the spec's ``ledger_url``, else this folder's SQLite file."""
        return spec.ledger_url or f"sqlite:///{self.ledger_file}"

    def has_own_ledger(self, spec: Spec) -> bool:
        """Whether ``spec``'s ledger is this folder's file and it exists (a run was made here)."""
        return spec.ledger_url is None and self.ledger_file.is_file()

    def store_dir(self, spec: Spec) -> Path:
        """The image store's folder: the spec's ``store_dir`` (shared by workers on one ledger),
        else ``<out>/store``."""
        return spec.store_dir if spec.store_dir is not None else self.path / STORE_DIR

    def lock(self) -> RunFolderLock:
        """The folder's run lock (:class:`~counterfactory.manifests.runlock.RunFolderLock`), not yet held."""
        return RunFolderLock(self.out)

    def open(self, spec: Spec) -> Workspace:
        """The folder opened for ``spec``: created if needed, its ledger and store open."""
        self.path.mkdir(parents=True, exist_ok=True)
        return Workspace(out=self.path, ledger=Ledger(self.ledger_url(spec)), store=ImageStore(self.store_dir(spec)))

    def record_spec(self, spec_path: str | Path) -> None:
        """Record which spec file ran here, so ``publish OUT`` and ``review serve OUT`` find it."""
        path = Path(spec_path).resolve()
        data = {"spec_path": str(path), "spec_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        atomic_write(self.recorded_spec_file, (json.dumps(data, indent=2) + "\n").encode())

    def recorded_spec(self) -> tuple[Path, str]:
        """``(spec path, sha256 of its bytes at run time)`` of the last run here.

        Raises:
            RunFolderError: no run was recorded here.
        """
        try:
            data = json.loads(self.recorded_spec_file.read_text(encoding="utf-8"))
            return Path(data["spec_path"]), data["spec_sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            raise RunFolderError(
                f"{self.out}: no run recorded here ({RECORDED_SPEC_FILE} missing or unreadable); run "
                f"`counterfactory run SPEC --out {self.out}` first, or name the spec with --spec"
            ) from None

    def spec_of_run(self, spec_path: Path | None = None) -> Spec:
        """The spec this folder's runs were made with, parsed: ``spec_path`` if given, else the
        spec file its last run recorded, else the spec.yaml of its newest release.

        Raises:
            RunSpecNotFoundError: neither is there; the message says to pass ``--spec``.
        """
        if spec_path is not None:
            return load_spec(spec_path)
        try:
            # the spec file `counterfactory run` recorded: a release's spec.yaml is the text as
            # written, whose relative paths only mean something beside the original file
            recorded, _ = self.recorded_spec()
            if recorded.is_file():
                return load_spec(recorded)
        except RunFolderError:
            pass
        found = sorted(self.releases.glob("*/*/spec.yaml"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise RunSpecNotFoundError(
                f"{self.out}: no release with a spec.yaml under {self.out / RELEASES_DIR}; pass the run's spec with --spec"
            )
        return load_spec(found[-1])


@dataclass
class Workspace:
    """A run folder opened for one spec: its ledger and image store (:meth:`RunFolder.open`)."""

    out: Path
    ledger: Ledger
    store: ImageStore
    #: the run using it (its claims on attempts); None outside a run
    run_id: str | None = None

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.out)

    @property
    def releases(self) -> Path:
        return self.folder.releases


def open_workspace(spec: Spec, out: str | Path) -> Workspace:
    """``RunFolder(out).open(spec)``."""
    return RunFolder(out).open(spec)


def count_missing_outputs(ws: Workspace) -> int:
    """Finished attempts whose output image is gone from the store (each will run once more)."""
    # one column of the finished attempts, not every row whole (a re-run asks this first)
    return sum(1 for sha in ws.ledger.finished_outputs() if sha and not ws.store.has(sha))
