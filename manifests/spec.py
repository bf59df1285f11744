"""The spec's bottom layer: the YAML loader and this layer's own sections.

The study spec is one typed model (:class:`counterfactory.flows.engine.spec.Spec`), composed in
the engine where the layers meet: its upper sections (``sources``, ``design``, ``prompts``,
``masks``, ``align``, ``gates``) are the models of the modules that own them, imported there.
This module holds what the bottom layer owns of it: the file read as bounded YAML
(:func:`read_spec_file`), the ``editor`` section (validated against the editor registry the
engine names, :attr:`EditorConfig.backends`), ``release``, ``run``, the shared message format
(:func:`format_validation_error`) and :class:`SpecError`; ``review``, ``trials`` and
``robustness`` are the models of their own modules in this layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.registry import Registry
from counterfactory.manifests.release_folder import RELEASE_NAME, RELEASE_VERSION
from counterfactory.manifests.yamlsafe import (
    MAX_YAML_BYTES,
    YamlDuplicateKeyError,
    YamlLimitError,
    brief,
    safe_load_limited,
)

#: the largest seed an attempt may use (signed 32-bit)
MAX_SEED = 2**31 - 1
# matched whole (fullmatch): ``$`` alone lets a trailing newline through
_SEMVER = RELEASE_VERSION
_SLUG = RELEASE_NAME


class SpecError(CounterfactoryError, ValueError):
    """A spec that cannot run; the message names the file and the field."""


class EditorConfig(BaseModel):
    """``editor``: the backend by name, its options, and the retry budget.

    Options of any registered backend may sit beside ``backend`` under the backend's name
    (``qwen: {steps: 40}``); each is validated against the options model its backend registered
    in :attr:`backends` (the editor registry, which lives with the editors: the engine's spec
    sets it on its subclass; here it is None and the options stay as written), so a new backend
    needs no change here. Switching ``backend`` is the only change needed to move a study between
    editors.
    """

    model_config = ConfigDict(extra="allow")
    #: the editor backends' registry the backend and its options are validated against
    backends: ClassVar[Registry | None] = None

    backend: str = "classical"
    #: a rejected cell is tried again with the next seed, up to this many attempts.
    max_attempts: int = Field(3, ge=1, le=1000)
    #: attempt ``n`` uses ``seed + n - 1``; every one must fit a signed 32-bit integer (the
    #: ledger's column on PostgreSQL, and the seed fields of remote APIs).
    seed: int = Field(0, ge=0, le=MAX_SEED)

    @model_validator(mode="after")
    def _last_seed_fits(self) -> EditorConfig:
        last = self.seed + self.max_attempts - 1
        if last > MAX_SEED:
            raise ValueError(
                f"seed + max_attempts - 1 at most {MAX_SEED} (the last attempt's seed); got {last}: lower editor.seed"
            )
        return self

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        editors = cls.backends
        if editors is not None and value not in editors:
            raise ValueError(f"one of the registered editor backends: {', '.join(editors.names())}")
        return value

    @model_validator(mode="after")
    def _backend_options(self) -> EditorConfig:
        editors = type(self).backends
        if editors is None:  # no registry named: the options as written
            return self
        extra = self.__pydantic_extra__ if self.__pydantic_extra__ is not None else {}
        for name, value in list(extra.items()):
            if name not in editors:
                # reported at editor.<name>, like any unknown field (see format_validation_error)
                raise PydanticCustomError(
                    "nested_extra_forbidden",
                    "not a known field or registered editor backend (valid backends: {valid}); check its spelling",
                    {"field": name, "valid": ", ".join(editors.names()), "input": value},
                )
            options = editors.get(name).options
            if not isinstance(value, options):
                try:
                    extra[name] = options.model_validate(value or {})
                except ValidationError as exc:
                    first = exc.errors()[0]
                    raise PydanticCustomError(
                        "nested_invalid",
                        "{message}",
                        {
                            "field": ".".join([name, *(str(p) for p in first["loc"])]),
                            "message": first["msg"],
                            "input": first.get("input"),
                        },
                    ) from None
        if self.backend not in extra:
            extra[self.backend] = editors.get(self.backend).options()
        return self

    def options(self) -> BaseModel:
        """The active backend's options model."""
        return getattr(self, self.backend)

    def canonical(self) -> dict[str, Any]:
        """JSON-ready: the backend, the retry budget, the seed and the active backend's options only
        (less what the options model's ``canonical_trim`` drops: settings added later, at their
        defaults, so a spec hashes as before they existed)."""
        data = self.model_dump(mode="json")
        options = data[self.backend]
        trim = getattr(self.options(), "canonical_trim", None)
        return {
            "backend": self.backend,
            "max_attempts": data["max_attempts"],
            "seed": data["seed"],
            self.backend: trim(options) if callable(trim) else options,
        }


class NamedEditorConfig(EditorConfig):
    """One entry of ``editors``: an :class:`EditorConfig` and the short label that names it in
    cell ids, the manifest (``editor_name``), ``stats.json`` (``editors``) and the report."""

    name: str = Field(min_length=1, max_length=40)

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not _SLUG.fullmatch(value):
            raise ValueError("a short label of letters, digits, '_', '-', '.' (such as 'classical-seed5')")
        return value

    def canonical(self) -> dict[str, Any]:
        return {"name": self.name, **super().canonical()}


class ReleaseConfig(BaseModel):
    """``release``: the name and semantic version the run publishes."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str = "0.1.0"
    description: str = ""
    licence: str = "see sources"
    #: optional release files a plug-in registered, by file name, each with its options
    #: (:mod:`counterfactory.manifests.release_files`); left out of the canonical spec when empty
    files: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("files")
    @classmethod
    def _registered_files(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from counterfactory.manifests.release_files import RELEASE_FILES, check_name

        for name, options in value.items():
            check_name(name)
            if name not in RELEASE_FILES:
                raise ValueError(f"{name!r} is not a registered release file; registered: {RELEASE_FILES.names()}")
            RELEASE_FILES.get(name).options.model_validate(options)
        return value

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not _SLUG.fullmatch(value):
            raise ValueError("a release name holds letters, digits, '_', '-', '.'")
        return value

    @field_validator("version")
    @classmethod
    def _semver(cls, value: str) -> str:
        if not _SEMVER.fullmatch(value):
            raise ValueError("a semantic version such as 1.0.0")
        return value


class RayConfig(BaseModel):
    """``run.ray``: run the flow's tasks on a Ray cluster (``counterfactory run --ray`` overrides).

    Attributes:
        address: ``local`` starts a Ray instance on this machine for the run; ``auto`` joins
            the one ``RAY_ADDRESS`` or ``ray start`` on this machine names; ``HOST:PORT`` is a
            head node's GCS address; ``ray://HOST:PORT`` goes through Ray Client.
        num_gpus: GPUs each editing task asks for; default 1 for a backend that runs on CUDA
            (``qwen`` with a ``cuda`` device), 0 otherwise (``classical``, ``fal``).
        num_cpus: CPUs each alignment-and-gates task asks for.
        connect_timeout_s: how long a head node has to answer before the run stops, unpaid.
    """

    model_config = ConfigDict(extra="forbid")

    address: str = Field("local", min_length=1)
    num_gpus: float | None = Field(None, ge=0, le=1024)
    num_cpus: float = Field(1.0, gt=0, le=65_536)
    connect_timeout_s: float = Field(5.0, gt=0, le=600)


#: the largest ``run.gpu_slots`` / ``run.fal_max_concurrency`` (a Prefect limit holds a small integer)
MAX_CONCURRENCY = 100_000


class RunConfig(BaseModel):
    """``run``: where the run executes and how runs share machines. Never part of the spec's
    hash: moving a study between machines or clusters changes no output.

    Each limit is a Prefect global concurrency limit, shared by every run against the same
    Prefect server (parallel templates, other specs, scheduled runs): a run sets the server's
    limit to the spec's value when it starts (:mod:`counterfactory.flows.limits`). ``None``
    sets no limit.

    Attributes:
        ray: run the tasks on a Ray cluster (:class:`RayConfig`); None: this machine's threads.
        gpu_slots: editor batches on the GPU at once (backends that run on one: ``qwen``),
            Prefect limit ``counterfactory-gpu``; one slot per batch.
        fal_max_concurrency: fal requests in flight at once, the account's concurrency,
            Prefect limit ``counterfactory-fal``; one slot per request.
    """

    model_config = ConfigDict(extra="forbid")

    ray: RayConfig | None = None
    gpu_slots: int | None = None
    fal_max_concurrency: int | None = None

    @field_validator("gpu_slots", "fal_max_concurrency")
    @classmethod
    def _at_least_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(
                f"a concurrency limit of at least 1 (a limit of {value} lets no edit start, so the run would "
                "wait for ever); set 1 or more, or remove the field for no limit"
            )
        if value is not None and value > MAX_CONCURRENCY:
            raise ValueError(
                f"a concurrency limit of at most {MAX_CONCURRENCY:,} (got {value:,}); set the number of GPUs or fal "
                "slots you have, or remove the field for no limit"
            )
        return value


def _field_with_nul(data: Any, where: str = "") -> str | None:
    """The dotted field of the first string (key or value) in ``data`` holding a NUL byte, or None."""
    stack: list[tuple[Any, str]] = [(data, where)]
    seen: set[int] = set()
    while stack:
        value, at = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return at or "(top level)"
        elif isinstance(value, (dict, list)) and id(value) not in seen:
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                name = f"{at}.{key}" if at else str(key)
                if isinstance(key, str) and "\x00" in key:
                    return name
                stack.append((child, name))
    return None


def _describe(value: Any) -> str:
    return brief(value, 80)


def format_validation_error(path: Path | str, error: ValidationError) -> str:
    """One readable message: the file, then each field with expected and received values."""
    lines = [f"{path}: the spec is not valid ({error.error_count()} problem(s)); nothing was run"]
    for item in error.errors():
        parts = [str(p) for p in item["loc"]]
        if item["type"].startswith("nested_"):  # a plug-in's section, validated by its own model
            parts.append(item["ctx"]["field"])
            item = {**item, "input": item["ctx"].get("input")}
        loc = ".".join(parts) or "(top level)"
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "nested_extra_forbidden":
            lines.append(f"  - field `{loc}`: {msg}; received {_describe(item['input'])}")
        elif item["type"] == "missing":
            lines.append(f"  - field `{loc}`: required, but missing")
        elif item["type"] == "extra_forbidden":
            lines.append(
                f"  - field `{loc}`: not a known field (received {_describe(item['input'])}); check its spelling"
            )
        else:
            lines.append(f"  - field `{loc}`: expected {msg[0].lower() + msg[1:]}; received {_describe(item['input'])}")
    return "\n".join(lines)


def missing_file(path: Path, field_name: str, resolved: Path, what: str, fix: str) -> SpecError:
    """The error for a file the spec names that is not there: the field, the path as resolved, the fix."""
    return SpecError(f"{path}: field `{field_name}`: expected {what}; {str(resolved)!r} does not exist; {fix}")


#: the largest calibration file a spec may pin (the shipped one is about 1 MB)
MAX_CALIBRATION_BYTES = 64 * 1024 * 1024


def read_spec_file(path: Path) -> tuple[str, dict[str, Any]]:
    """``(the file's text, its fields)``: a spec file read as bounded, UTF-8, duplicate-free YAML
    holding a mapping with no NUL byte anywhere (what :func:`counterfactory.flows.engine.spec.load_spec`
    then validates).

    Raises:
        SpecError: naming the file and what is wrong with it.
    """
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise SpecError(
            f"{path}: {path.stat().st_size:,} bytes, over the limit of {MAX_YAML_BYTES:,} for a spec; "
            "is this the right file?"
        )
    try:
        text = path.read_text(encoding="utf-8")
        data = safe_load_limited(text)
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{path}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start : exc.start + 1]!r}); "
            "save the spec as UTF-8"
        ) from None
    except YamlLimitError as exc:
        raise SpecError(f"{path}: refused: {exc}") from None
    except YamlDuplicateKeyError as exc:
        raise SpecError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of spec fields at the top level, got {type(data).__name__}")
    nul = _field_with_nul(data)
    if nul is not None:
        raise SpecError(
            f"{path}: field `{nul}`: a NUL byte in its value (no path or name holds one); remove it, nothing was run"
        )
    return text, data
