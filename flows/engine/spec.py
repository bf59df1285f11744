"""The study spec, composed where the layers meet: one typed model, loaded from YAML, saved
with its hash into every release.

Each section is the model of the module that owns it, imported here: ``sources``
(:mod:`counterfactory.generation.sources`), ``design`` (:mod:`~counterfactory.generation.sampling`),
``prompts``, ``masks``, ``align`` (:mod:`~counterfactory.generation.prompts`, ``masks``, ``align``),
``gates`` (:mod:`counterfactory.validation.gate_stack`), and the bottom layer's own (``editor``,
``release``, ``run`` in :mod:`counterfactory.manifests.spec`; ``review``, ``trials``,
``robustness`` in their modules); each editor's options by its backend
(:data:`~counterfactory.generation.editors.registry.EDITORS`). The YAML loader is the bottom
layer's (:func:`~counterfactory.manifests.spec.read_spec_file`). Validation errors name the
field, the expected and the received value, and the file.

Adding a section is one line here: ``name: Model`` among the fields (and its ``canonical`` trim
when it must hash as before it existed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from counterfactory.generation.align import AlignConfig
from counterfactory.generation.editors import EDITORS
from counterfactory.generation.editors.base import hooks_of
from counterfactory.generation.masks import MaskOptions
from counterfactory.generation.prompts import PromptConfig
from counterfactory.generation.sampling import DesignConfig
from counterfactory.generation.sources import SourcesConfig
from counterfactory.manifests import spec as bottom
from counterfactory.manifests.derived import RobustnessConfig
from counterfactory.manifests.review import ReviewOptions
from counterfactory.manifests.safefiles import read_regular
from counterfactory.manifests.spec import (
    MAX_CALIBRATION_BYTES,
    MAX_CONCURRENCY,
    MAX_SEED,
    RayConfig,
    ReleaseConfig,
    RunConfig,
    SpecError,
    format_validation_error,
    missing_file,
    read_spec_file,
)
from counterfactory.manifests.trials import TRIALS_DIR, TrialError, TrialsConfig, load_biographies, needs_biographies
from counterfactory.validation.gate_stack import GatesConfig

__all__ = [
    "MAX_CALIBRATION_BYTES",
    "MAX_CONCURRENCY",
    "MAX_SEED",
    "EditorConfig",
    "NamedEditorConfig",
    "RayConfig",
    "ReleaseConfig",
    "RunConfig",
    "Spec",
    "SpecError",
    "load_spec",
]


class EditorConfig(bottom.EditorConfig):
    """``editor``: :class:`counterfactory.manifests.spec.EditorConfig` validated against the
    registered editor backends."""

    backends = EDITORS


class NamedEditorConfig(bottom.NamedEditorConfig):
    """One entry of ``editors``: :class:`counterfactory.manifests.spec.NamedEditorConfig`
    validated against the registered editor backends."""

    backends = EDITORS


class Spec(BaseModel):
    """A whole study design: the bottom layer's sections and the six the layers above own,
    each the model of the module that owns it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    sources: SourcesConfig
    design: DesignConfig
    # a section's defaults are its model validated from {} (as before the sections were imported here)
    prompts: PromptConfig = Field(default_factory=dict, validate_default=True)
    editor: EditorConfig = Field(default_factory=EditorConfig)
    #: several editors compared on one grid (each with its ``name``); instead of ``editor``
    editors: list[NamedEditorConfig] | None = None
    masks: MaskOptions = Field(default_factory=dict, validate_default=True)
    align: AlignConfig = Field(default_factory=dict, validate_default=True)
    gates: GatesConfig = Field(default_factory=dict, validate_default=True)
    release: ReleaseConfig
    review: ReviewOptions = Field(default_factory=ReviewOptions)
    #: the trial bank each release carries (``trials.jsonl``)
    trials: TrialsConfig = Field(default_factory=TrialsConfig)
    #: robustness variants each release carries as derived items (``derived.jsonl``)
    robustness: RobustnessConfig = Field(default_factory=RobustnessConfig)
    #: SQLAlchemy URL of the ledger; default ``sqlite:///<out>/ledger.sqlite``.
    ledger_url: str | None = None
    #: where the tasks execute (this machine's threads, or a Ray cluster) and how runs share
    #: machines (concurrency limits); not part of the study
    run: RunConfig = Field(default_factory=RunConfig)
    #: absolute path of the image store; default ``<out>/store``. Workers that share a
    #: ``ledger_url`` (a PostgreSQL ledger) share this too, or each would re-run the edits the
    #: others stored.
    store_dir: Path | None = None
    #: the spec file's text as the user wrote it (set by :func:`load_spec`)
    _written: str | None = PrivateAttr(default=None)
    #: the spec file it was loaded from (set by :func:`load_spec`)
    _path: Path | None = PrivateAttr(default=None)
    #: the label of the editor this spec is a view for (:meth:`editor_views`); None otherwise
    _editor_name: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _one_editor_field(cls, data: Any) -> Any:
        if isinstance(data, dict) and "editor" in data and data.get("editors") is not None:
            raise PydanticCustomError(
                "nested_invalid",
                "{message}",
                {
                    "field": "editors",
                    "message": "either `editor` (one editor) or `editors` (a list of named editors to compare), "
                    "not both: move the `editor` section into the `editors` list with a `name`",
                    "input": "both `editor` and `editors`",
                },
            )
        return data

    @field_validator("editors")
    @classmethod
    def _distinct_editors(cls, value: list[NamedEditorConfig] | None) -> list[NamedEditorConfig] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("at least one named editor (or leave `editors` out and use `editor`)")
        names: dict[str, int] = {}
        made: dict[str, int] = {}
        for i, entry in enumerate(value):
            if entry.name in names:
                raise ValueError(
                    f"a unique `name` per editor; editors[{i}] repeats {entry.name!r} of editors[{names[entry.name]}]"
                )
            names[entry.name] = i
            # what decides the attempts: two entries equal in it would make the same attempts
            same = json.dumps({k: v for k, v in entry.canonical().items() if k not in ("name", "max_attempts")},
                              sort_keys=True)  # fmt: skip
            if same in made:
                raise ValueError(
                    f"editors that make different attempts; editors[{i}] ({entry.name!r}) has the backend, options "
                    f"and seed of editors[{made[same]}] ({value[made[same]].name!r}): change an option or the seed"
                )
            made[same] = i
        return value

    @field_validator("store_dir")
    @classmethod
    def _absolute_store(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(
                f"an absolute path, received {str(value)!r}: every worker sharing the ledger must "
                "name the same folder, wherever it is started from"
            )
        return value

    @field_validator("ledger_url")
    @classmethod
    def _usable_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            make_url(value).get_dialect()
        except (ArgumentError, NoSuchModuleError, ValueError) as exc:
            raise ValueError(
                "an SQLAlchemy URL such as 'sqlite:////abs/path/ledger.sqlite' or "
                f"'postgresql+psycopg://user@host/db' ({exc})"
            ) from None
        from counterfactory.manifests.ledger import missing_driver

        missing = missing_driver(value)
        if missing is not None:
            raise ValueError(f"a ledger URL whose database driver is installed and usable; {missing}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Spec:
        if self.design.kind == "limb" and "cue" not in self.design.axes:
            raise ValueError("limb designs need a 'cue' axis (e.g. cue: [removed, kept])")
        if self.design.kind == "limb":
            missing = set(self.design.axes["cue"]) - set(self.prompts.limb)
            if missing:
                raise ValueError(f"prompts.limb has no template for cue values {sorted(missing)}")
        if self.design.templates_per_stratum is None and not all(
            callable(hooks_of(config.options()).plan_grid) for config in self.editor_configs()
        ):
            # an editor that plans the grid itself (an import: one cell per row of its table)
            # needs no draw from the strata; every other one does
            raise ValueError(
                "design.templates_per_stratum, how many source photos to draw from each stratum "
                "(only an import, whose grid is its table, may leave it out)"
            )
        # every condition's prompt rendered once: a missing template or an unknown field in
        # prompts.target_group stops the spec here instead of failing every cell mid-run
        self.prompts.check_renders(self.design)
        return self

    @property
    def editor_name(self) -> str | None:
        """The label of the editor this spec is a view for (:meth:`editor_views`), else None."""
        return self._editor_name

    def editor_views(self) -> list[Spec]:
        """One spec per editor the grid runs with: this spec itself when it has one ``editor``;
        with ``editors``, a copy per entry whose ``editor`` is that entry and whose
        :attr:`editor_name` is its label (what cell ids and the manifest carry). Every step of a
        run (plan, edit, judge, resume, publish's reading of the ledger) runs on a view as it
        runs on a one-editor spec; the release is the whole spec's."""
        if self.editors is None:
            return [self]
        views = []
        for entry in self.editors:
            view = self.model_copy(update={"editor": entry, "editors": None})
            view._editor_name = entry.name
            views.append(view)
        return views

    def bind_run_folder(self, out: str | Path) -> None:
        """Tell each editor backend whose options keep files of the run (the import backend's
        embedded dataset images) the run's folder ``out``, before they read anything."""
        for config in self.editor_configs():
            hooks_of(config.options()).bind_run_folder(Path(out))

    def editor_configs(self) -> list[EditorConfig]:
        """Every editor the spec runs with (``editors``, else ``[editor]``)."""
        return list(self.editors) if self.editors is not None else [self.editor]

    @property
    def source_path(self) -> Path | None:
        """The spec file this spec was loaded from, or None when built in code."""
        return self._path

    def as_written(self) -> tuple[str, str]:
        """``(text, sha256 of its bytes)``: the spec file as the user wrote it (what a release ships)."""
        text = self._written
        if text is None:
            text = self.to_yaml()
        return text, hashlib.sha256(text.encode("utf-8")).hexdigest()

    #: ``sources`` paths exactly as the spec file wrote them (``load_spec`` resolves the
    #: fields themselves against the file's folder); None for a spec built in code
    _written_sources: dict[str, str] | None = PrivateAttr(default=None)
    #: ``trials.biographies`` as written (the model holds it resolved against the spec's folder)
    _written_biographies: str | None = PrivateAttr(default=None)
    #: ``gates.calibration`` as written (relative to the spec's folder), for :meth:`canonical`
    _written_calibration: str | None = PrivateAttr(default=None)
    #: the sha256 of the pinned calibration's bytes as :func:`load_spec` read them
    _calibration_sha256: str | None = PrivateAttr(default=None)

    def calibration_sha256(self) -> str | None:
        """The sha256 of the pinned calibration (``gates.calibration``) as the spec was loaded
        with it (its thresholds were read then); None for the shipped one."""
        if self.gates.calibration is None:
            return None
        if self._calibration_sha256 is None:
            self._calibration_sha256 = hashlib.sha256(Path(self.gates.calibration).read_bytes()).hexdigest()
        return self._calibration_sha256

    def canonical(self) -> dict[str, Any]:
        """The study as its author wrote it: JSON-ready, defaults filled in, nothing about
        the machine it ran on and nothing the run does not use.

        Source paths and ``trials.biographies`` are as written (relative to the spec file, never
        resolved: a release's spec hash must not depend on where the study's folder lies); ``editor``
        (or each of ``editors``) holds the active backend's options only; ``gates`` and ``prompts`` the active kind's
        only; the limb-mask growth (``masks``) only for limb designs; ``ledger_url`` and
        ``store_dir`` (where the run kept its state, possibly with a password) and ``run`` (where
        it executed and how runs share machines) are left out. This is what
        :meth:`spec_hash` hashes and what :meth:`to_yaml` writes.
        (:meth:`as_written` is the file's own text, which a release ships.)
        """
        data = self.model_dump(mode="json")
        if self._written_sources is not None:
            data["sources"].update(self._written_sources)
        if self._written_biographies is not None:
            data["trials"]["biographies"] = self._written_biographies
        kind = self.design.kind
        if self.editors is None:  # one editor: as before `editors` existed
            data["editor"] = self.editor.canonical()
            data.pop("editors")
        else:
            data.pop("editor")
            data["editors"] = [entry.canonical() for entry in self.editors]
        data["gates"] = {"face_mask": data["gates"]["face_mask"], kind: data["gates"][kind]}
        if self.gates.calibration is not None:  # as written: the thresholds it gave are in the kind's gates
            data["gates"]["calibration"] = self._written_calibration or str(self.gates.calibration)
        other = "limb" if kind == "face" else "face"
        data["prompts"].pop(other, None)
        if kind == "face":
            data.pop("masks", None)
        else:  # how a face condition becomes words
            for unused in ("target_group", "gender_nouns"):
                data["prompts"].pop(unused, None)
        if not data["release"]["files"]:  # no plug-in release file: as before there were any
            data["release"].pop("files")
        if not data["trials"]["options"]:  # no protocol options: as before protocols could have any
            data["trials"].pop("options")
        if not data["trials"]["per_editor"]:  # a pooled bank: as before editors could be compared
            data["trials"].pop("per_editor")
        if data["review"].get("audit_near_threshold") is None:  # no uncertainty sampling: as before it existed
            data["review"].pop("audit_near_threshold", None)
            data["review"].pop("audit_near_threshold_rate", None)
        # the registration's correlation floor at its default: the spec as before it was a
        # setting (what the check does is the judging code's, versioned by its judge key)
        if data["align"]["min_correlation"] == type(self.align).model_fields["min_correlation"].default:
            data["align"].pop("min_correlation")
        # settings a gate added later, left unset (no calibration sets them): as before they
        # existed; each gate's thresholds model names them (``canonical_unset``)
        kind_gates = getattr(self.gates, kind)
        for gate, settings in data["gates"][kind].items():
            for key in getattr(type(getattr(kind_gates, gate, None)), "canonical_unset", ()):
                if isinstance(settings, dict) and key in settings and settings[key] is None:
                    settings.pop(key)
                # and inside a gate's per-path sets (locality's cohort / no_floor), which
                # carry the same thresholds
                for nested in settings.values() if isinstance(settings, dict) else ():
                    if isinstance(nested, dict) and key in nested and nested[key] is None:
                        nested.pop(key)
        data.pop("ledger_url", None)
        data.pop("run", None)
        data.pop("store_dir", None)
        return data

    def canonical_json(self) -> str:
        """:meth:`canonical` as compact JSON with sorted keys."""
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    def spec_hash(self) -> str:
        """sha256 of :meth:`canonical_json`: the same study hashes the same wherever it runs."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def to_yaml(self) -> str:
        """:meth:`canonical` as YAML; holds no machine path."""
        return yaml.safe_dump(self.canonical(), sort_keys=False, allow_unicode=True)


def _check_named_files(path: Path, spec: Spec, *, check_paths: bool) -> None:
    """Stop a spec at load when a file it names is missing, before anything is run or paid for.

    The trial prompt bank ships with the package and is always checked. The files of the
    study (the photo folder and metadata, the biographies, the prompt-template folder, files
    the editor's options name) are checked with ``check_paths``, and each message names the
    field, the path as resolved and the fix. The prompt templates themselves are checked by
    validation (:meth:`Spec._check_prompts`). The photos and limb masks each metadata record
    names are not checked here: one of them missing fails that source only, which the run
    records in the release's stats (the editor is never called for it). Model files (an editor's
    weights, a gate's ``weights``, ``insightface_pack``, ``libreface_weights``) belong to the
    machine that runs them, a Ray node perhaps, not to the study: the editor and gate stacks
    check them when they are built, before any work (a :class:`SetupError`).
    """
    bank = TRIALS_DIR / f"{spec.trials.prompts}.yaml"
    if not bank.is_file():
        known = ", ".join(sorted(p.stem for p in TRIALS_DIR.glob("trial_prompts_*.yaml")))
        raise missing_file(
            path,
            "trials.prompts",
            bank,
            f"the name of a trial prompt bank in {TRIALS_DIR} (without .yaml)",
            f"set trials.prompts to one of {known}, or leave it out for the default",
        )
    if not check_paths:
        return
    relative = f"relative paths are read from the spec file's folder {path.resolve().parent}"
    checks = [
        ("sources.photos", spec.sources.photos, "the folder holding the photos"),
        ("sources.metadata", spec.sources.metadata, "the sources' metadata file"),
    ]
    if spec.trials.biographies is not None:
        checks.append(("trials.biographies", spec.trials.biographies, "a biographies file"))
    for field_name, p, what in checks:
        if not p.exists():
            raise missing_file(path, field_name, p, what, f"correct the path ({relative})")
    if not spec.sources.photos.is_dir():
        raise SpecError(
            f"{path}: field `sources.photos`: expected the folder holding the photos; received "
            f"{str(spec.sources.photos)!r}, which is a file (name its folder instead)"
        )
    if not spec.sources.metadata.is_file():
        raise SpecError(
            f"{path}: field `sources.metadata`: expected a metadata file; received "
            f"{str(spec.sources.metadata)!r}, which is not a file"
        )
    if spec.trials.biographies is not None:
        try:
            load_biographies(spec.trials.biographies)
        except TrialError as exc:
            raise SpecError(f"{path}: field `trials.biographies`: {exc}") from None
    directory = spec.prompts.directory
    if directory is not None and not Path(directory).is_dir():
        # read as the templates are read (relative to the working folder), so named as resolved
        raise missing_file(
            path,
            "prompts.directory",
            Path(directory).resolve(),
            "a folder of prompt templates (<name>.txt)",
            "correct the path (a relative one is read from the working folder) or leave the field out",
        )
    for config in spec.editor_configs():
        for field_name, p in hooks_of(config.options()).named_files().items():
            # (a folder for an import backend's folder layout or Hugging Face dataset folder)
            if not Path(p).exists():
                raise missing_file(
                    path, field_name, Path(p), "an existing file or folder", f"correct the path ({relative})"
                )


def _pin_calibration(path: Path, data: dict[str, Any], base: Path) -> tuple[str | None, str | None]:
    """``(gates.calibration as written, sha256 of the bytes read)`` (None, None when unset),
    after resolving it in ``data``
    against the spec's folder and checking the file: a regular JSON file with thresholds for
    the design's kind, read as the gates will read it.

    Raises:
        SpecError: naming ``gates.calibration``, the path as resolved and the fix.
    """
    gates = data.get("gates")
    if not isinstance(gates, dict) or gates.get("calibration") is None:
        return None, None
    written = gates["calibration"]
    if not isinstance(written, str) or not written.strip():
        raise SpecError(f"{path}: field `gates.calibration`: expected the path of a calibration file; got {written!r}")
    resolved = (base / written).resolve()
    fix = (
        "write one with `counterfactory calibrate --from-review RUN_DIR --out DIR` and name DIR/calibration.json "
        f"(relative paths are read from the spec file's folder {base}), or leave the field out for the shipped one"
    )
    if not resolved.is_file():
        raise missing_file(path, "gates.calibration", resolved, "a calibration file", fix)
    try:
        raw = read_regular(resolved, MAX_CALIBRATION_BYTES, limit_field="a calibration file")
        loaded = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise SpecError(
            f"{path}: field `gates.calibration`: {str(resolved)!r} is not a calibration file: {exc}"
        ) from None
    suggested = loaded.get("suggested") if isinstance(loaded, dict) else None
    if not isinstance(suggested, dict):
        raise SpecError(f"{path}: field `gates.calibration`: {str(resolved)!r} has no `suggested` thresholds; {fix}")
    design = data.get("design")
    kind = design.get("kind", "face") if isinstance(design, dict) else "face"
    if not isinstance(suggested.get(kind), dict):
        raise SpecError(
            f"{path}: field `gates.calibration`: {str(resolved)!r} holds no thresholds for {kind} edits "
            f"(suggested.{kind}); calibrate from a run of a {kind} design"
        )
    data["gates"] = {**gates, "calibration": str(resolved)}
    return written, hashlib.sha256(raw).hexdigest()


def load_spec(path: str | Path, *, check_paths: bool = True) -> Spec:
    """Read, validate and resolve a spec file. Relative paths resolve against the file's folder.

    Every file the spec names is checked here (:func:`_check_named_files`), so a missing one
    stops the spec before any work. ``check_paths`` False validates a spec whose files live on
    another machine (only the bundled trial prompt bank is then checked).

    Raises:
        SpecError: with one message naming the file and every bad field, or the field whose
            file is missing, the path as resolved and the fix.
    """
    path = Path(path)
    text, data = read_spec_file(path)
    base = path.resolve().parent
    written_calibration, calibration_sha256 = _pin_calibration(path, data, base)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(path, exc)) from None
    written = {"photos": str(spec.sources.photos), "metadata": str(spec.sources.metadata)}
    sources = spec.sources.model_copy(
        update={
            "photos": (base / spec.sources.photos).resolve(),
            "metadata": (base / spec.sources.metadata).resolve(),
        }
    )
    update: dict[str, Any] = {"sources": sources}
    written_biographies = None if spec.trials.biographies is None else str(spec.trials.biographies)
    if spec.trials.biographies is not None:
        update["trials"] = spec.trials.model_copy(update={"biographies": (base / spec.trials.biographies).resolve()})
    spec = spec.model_copy(update=update)
    spec._written = text
    spec._path = path.resolve()
    # a backend whose options name files (the import backend's table) resolves them against the
    # spec's folder and checks them against the design (bind_spec on its options model)
    for view in spec.editor_views():
        hooks_of(view.editor.options()).bind_spec(view)
    if spec.trials.biographies is None and needs_biographies(spec.trials):
        needing = [p for p in spec.trials.protocols if needs_biographies(TrialsConfig(protocols=[p]))]
        raise SpecError(
            f"{path}: field `trials.biographies`: the {needing[0]} protocol needs a biographies file; "
            "set trials.biographies (see assets/trials/biographies_example_v1.yaml)"
        )
    spec._written_sources = written
    spec._written_biographies = written_biographies
    spec._written_calibration = written_calibration
    spec._calibration_sha256 = calibration_sha256
    _check_named_files(path, spec, check_paths=check_paths)
    return spec
