"""Versioned prompt templates and how a cell's condition fills them.

Templates live in ``assets/prompts/<name>.txt``; a spec names them. FOCUS uses one prompt for
every face edit with ``{TARGET_GROUP}`` the only variable; limb cells pick a template by their
cue state (``removed`` or the ``kept`` control).
"""

from __future__ import annotations

import functools
import hashlib
import re
import stat
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from counterfactory.assets import PROMPTS_DIR
from counterfactory.generation.regions import DEFAULT_REGION, template_region
from counterfactory.generation.sampling import DesignConfig, conditions
from counterfactory.manifests.errors import SetupError

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class PromptConfig(BaseModel):
    """``prompts`` in the spec."""

    model_config = ConfigDict(extra="forbid")

    #: face cells: one template for every condition.
    face: str = "face_only_v1"
    #: limb cells: a template per value of the ``cue`` axis.
    limb: dict[str, str] = Field(default_factory=lambda: {"removed": "limb_removed_v1", "kept": "limb_kept_v1"})
    #: how a face condition becomes ``{TARGET_GROUP}``; fields are the design's axes plus
    #: ``gender_noun`` (man / woman) and ``article`` (a / an).
    target_group: str = "{article} {race} {gender_noun}"
    gender_nouns: dict[str, str] = Field(
        default_factory=lambda: {"male": "man", "female": "woman", "man": "man", "woman": "woman"}
    )
    negative: str | None = None
    #: extra folder searched before the bundled ``assets/prompts``.
    directory: Path | None = None

    def check_renders(self, design: DesignConfig) -> None:
        """Render every condition of ``design`` once, so a missing template or an unknown field
        in ``target_group`` stops the spec when it loads instead of failing every cell mid-run.

        The spec (the engine's ``Spec``) calls this on its own sections, so
        the spec module never imports this package.

        Raises:
            ValueError: naming the template or field at fault (pydantic reports it as the
                spec's validation error).
        """
        # each template the design names, at its field (prompts.face, prompts.limb.<cue>), with
        # the files looked for
        if design.kind == "face":
            named = {"prompts.face": self.face}
        else:
            named = {f"prompts.limb.{cue}": self.limb[cue] for cue in design.axes["cue"]}
        for field_name, name in named.items():
            try:
                load_template(name, self.directory)
            except SetupError as exc:  # no such file
                folders = [d for d in (self.directory, PROMPTS_DIR) if d is not None]
                tried = ", ".join(str((Path(d) / f"{name}.txt").resolve()) for d in folders)
                raise PydanticCustomError(
                    "nested_invalid",
                    "{message}",
                    {
                        "field": field_name,
                        "message": f"the name of a prompt template, but {exc} (looked for {tried}); name a "
                        f"bundled template, or put {name}.txt in prompts.directory",
                        "input": name,
                    },
                ) from None
            except ValueError as exc:  # a name that cannot be a file's
                raise PydanticCustomError(
                    "nested_invalid",
                    "{message}",
                    {"field": field_name, "message": f"the name of a prompt template: {exc}", "input": name},
                ) from None
        for condition in conditions(design):
            try:
                render_prompt(self, kind=design.kind, condition=condition, source_meta={})
            except SetupError as exc:  # a missing template
                raise ValueError(f"prompts: {exc}") from None
            except KeyError as exc:
                raise ValueError(
                    f"prompts.target_group {self.target_group!r} uses {{{exc.args[0]}}}, which is "
                    f"not one of the fields it can use: the design's axes {sorted(design.axes)}, "
                    "gender_noun and article (rename the axis, e.g. to 'race', or change target_group)"
                ) from None
            except (ValueError, IndexError) as exc:
                raise ValueError(f"prompts: {exc}") from None


@dataclass(frozen=True)
class RenderedPrompt:
    """A filled template. ``region`` is the edit region the template names
    (:func:`~counterfactory.generation.regions.template_region`): what the mask builder draws
    and the gates measure body skin outside. It is not part of the lineage: the template's
    sha256 already names it for the template's own text, and the region decides measurement,
    not the editor's output."""

    template: str
    template_sha256: str
    text: str
    region: str = DEFAULT_REGION

    def lineage(self) -> dict[str, str]:
        return {"template": self.template, "template_sha256": self.template_sha256, "text": self.text}


def load_template(name: str, directory: Path | None = None) -> tuple[str, str]:
    """``(text, sha256)`` of the template called ``name``."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"prompt template name {name!r} may hold only letters, digits, '_', '-', '.'")
    for folder in [d for d in (directory, PROMPTS_DIR) if d is not None]:
        path = Path(folder) / f"{name}.txt"
        try:
            st = path.stat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            return _template_file(str(path), st.st_mtime_ns, st.st_size)
    known = sorted(p.stem for p in PROMPTS_DIR.glob("*.txt"))
    raise SetupError(
        f"prompt template {name!r} not found in {directory or PROMPTS_DIR}; bundled templates: {', '.join(known)}"
    )


@functools.lru_cache(maxsize=64)
def _template_file(path: str, mtime_ns: int, size: int) -> tuple[str, str]:
    """``(text, sha256)`` of a template file, read once per version of it (every cell renders its
    template: a 10,000-cell re-run read the same few files 10,000 times)."""
    raw = Path(path).read_bytes()
    return raw.decode("utf-8").strip(), hashlib.sha256(raw).hexdigest()


def template_variables(text: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(text) if field}


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def render_prompt(
    config: PromptConfig,
    *,
    kind: str,
    condition: Mapping[str, str],
    source_meta: Mapping[str, object] | None = None,
) -> RenderedPrompt:
    """Fill the template for one cell.

    Face cells: ``{TARGET_GROUP}`` from ``config.target_group`` (e.g. "a Black woman").
    Limb cells: the template for ``condition["cue"]``; ``{LIMB_REGION}`` from the source's
    metadata ``limb_region`` (top level or under ``extra``; default "arm and hand").
    """
    meta = dict(source_meta or {})
    if kind == "face":
        name = config.face
        values = dict(condition)
        gender = values.get("gender", "")
        values["gender_noun"] = config.gender_nouns.get(gender, gender)
        without_article = config.target_group.format(**values, article="").strip()
        values["article"] = _article(without_article)
        group = " ".join(config.target_group.format(**values).split())
        variables = {"TARGET_GROUP": group}
    else:
        cue = condition.get("cue")
        if cue not in config.limb:
            raise ValueError(f"no limb prompt for cue {cue!r}; prompts.limb has {sorted(config.limb)}")
        name = config.limb[cue]
        extra = meta.get("extra") if isinstance(meta.get("extra"), dict) else {}
        region = meta.get("limb_region") or extra.get("limb_region") or "arm and hand"
        variables = {"LIMB_REGION": str(region)}
    text, sha = load_template(name, config.directory)
    missing = template_variables(text) - set(variables)
    if missing:
        raise ValueError(f"prompt template {name!r} needs {sorted(missing)}, which {kind} cells do not provide")
    edit_region = template_region(name, config.directory) if kind == "face" else DEFAULT_REGION
    return RenderedPrompt(template=name, template_sha256=sha, text=text.format(**variables), region=edit_region)


def face_region(config: PromptConfig) -> str:
    """The edit region of a face design's prompt (``config.face``), by name."""
    return template_region(config.face, config.directory)
