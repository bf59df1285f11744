"""The study design and the grid: which sources become templates, and which cells each gets.

A :class:`DesignConfig` says what varies (its ``axes``: race x gender for face studies, a cue
state for limb studies), how sources are stratified (by metadata fields such as occupation),
how many templates each stratum contributes, and which conditions each template receives.
:func:`expand_grid` turns the sources and the design into a :class:`Grid`: the chosen
:class:`Template` s and one :class:`Cell` per template x condition.

The grid is a pure function of (the set of sources, the design): inputs are sorted by id
before anything is drawn, so input order never matters and the same seed always gives the same
grid. Each stratum draws its templates from its own generator, seeded by
``SeedSequence([design.seed, stable_key(stratum)])``, and each template draws its conditions from
``SeedSequence([design.seed, stable_key(stratum), stable_key(template id)])``; conditions are
balanced within a stratum. A source that appears or disappears (a photo newly failing its face
check) therefore changes only its own stratum's templates and cells, never another stratum's
(which would re-buy their edits).

Sizes: FOCUS (Dehdashtian et al., 2025) uses 6 occupations x 8 photos x 10 race-gender groups
= 480 cells; InclusiveCFImageBias uses one template per photo with cue ``removed``/``kept``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from counterfactory.generation.sources import FailedSource

#: The axis whose values are compared with a template's ``presented_gender``.
GENDER_AXIS = "gender"
#: Record fields a design may stratify on; anything else goes through ``extra.<key>``.
STRATUM_FIELDS = ("occupation", "context", "presented_gender", "licence")

_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class DesignConfig(BaseModel):
    """One study design.

    Attributes:
        kind: ``"face"`` (whole-face demographic edits) or ``"limb"`` (inpainting in a mask).
        axes: ordered axes of the condition grid, e.g.
            ``{"race": ["White", "Black", "East Asian", "South Asian", "Latino"],
            "gender": ["male", "female"]}`` or ``{"cue": ["removed", "kept"]}``. Names are
            identifiers; values are non-empty, unique per axis (case-insensitively), and
            contain neither ``|`` nor ``=`` (they appear in cell ids).
        strata: record fields to stratify on (``occupation``, ``context``,
            ``presented_gender``, ``licence``, or ``extra.<key>``); ``[]`` is one stratum.
            A missing value is its own stratum (``None``).
        templates_per_stratum: templates drawn from each stratum (>= 1).
        seed: seeds every stratum's and template's generator (>= 0), see the module docstring.
        conditions_per_template: how many conditions each template gets; ``None`` gives each
            template every condition the ``gender_balance`` rule allows.
        gender_balance: which conditions a template may get, comparing the template's
            ``presented_gender`` with each condition's ``gender`` value (case-insensitive):

            - ``"any"``: every condition is allowed.
            - ``"match"``: only conditions whose gender equals the template's.
            - ``"mismatch"``: only conditions whose gender differs from the template's.
            - ``"balanced"``: each template gets ``n`` matched and ``n`` mismatched conditions,
              ``n = conditions_per_template / 2`` (which must then be even), or, when that is
              ``None``, ``n = min(#matched, #mismatched)`` (with two genders fully crossed:
              every condition).

            Every mode other than ``"any"`` needs a ``gender`` axis and skips sources whose
            ``presented_gender`` is unknown (and, for ``"match"``/``"balanced"``, sources
            whose gender is none of the axis values); skipped sources are listed in
            :attr:`Grid.excluded`, never dropped silently.
        on_short_stratum: a stratum with fewer eligible sources than
            ``templates_per_stratum``: ``"take_all"`` takes them all and records a shortfall;
            ``"error"`` raises.

    When ``conditions_per_template`` picks a subset, conditions are spread evenly over each
    stratum: each template (in grid order) takes the allowed conditions its stratum used least
    often so far, ties broken by the template's own seeded generator.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["face", "limb"]
    axes: dict[str, list[str]]
    strata: list[str] = Field(default_factory=lambda: ["occupation", "presented_gender"])
    #: required unless the editor plans the grid itself (an import: the grid is the table);
    #: checked when the spec loads (``Spec._consistent``) and again by :func:`expand_grid`
    templates_per_stratum: int | None = Field(None, ge=1, le=1_000_000)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    conditions_per_template: int | None = Field(None, ge=1, le=1_000_000)
    gender_balance: Literal["any", "match", "mismatch", "balanced"] = "any"
    on_short_stratum: Literal["error", "take_all"] = "take_all"

    @field_validator("axes")
    @classmethod
    def _axes(cls, axes: dict[str, list[str]]) -> dict[str, list[str]]:
        if not axes:
            raise ValueError("at least one axis, e.g. {'cue': ['removed', 'kept']}")
        for name, values in axes.items():
            if not _AXIS_NAME.fullmatch(name):
                raise ValueError(f"axis names that are identifiers (letters, digits, '_'), got {name!r}")
            if not values:
                raise ValueError(f"axis {name!r} to have at least one value")
            seen: dict[str, str] = {}
            for value in values:
                if not value.strip() or value != value.strip() or "|" in value or "=" in value:
                    raise ValueError(
                        f"axis {name!r} values to be non-empty, without surrounding spaces, '|' or '=', got {value!r}"
                    )
                if value.casefold() in seen:
                    raise ValueError(f"axis {name!r} values to be unique, got {seen[value.casefold()]!r} and {value!r}")
                seen[value.casefold()] = value
        return axes

    @field_validator("strata")
    @classmethod
    def _strata(cls, strata: list[str]) -> list[str]:
        for name in strata:
            if name not in STRATUM_FIELDS and not (name.startswith("extra.") and len(name) > len("extra.")):
                raise ValueError(f"strata among {', '.join(STRATUM_FIELDS)} or 'extra.<key>', got {name!r}")
        if len(set(strata)) != len(strata):
            raise ValueError(f"each stratum field once, got {strata}")
        return strata

    @model_validator(mode="after")
    def _feasible(self) -> DesignConfig:
        n_conditions = math.prod(len(v) for v in self.axes.values())
        cpt = self.conditions_per_template
        if cpt is not None and cpt > n_conditions:
            raise ValueError(f"conditions_per_template <= the {n_conditions} conditions of the axes, got {cpt}")
        if self.gender_balance == "any":
            return self
        if GENDER_AXIS not in self.axes:
            raise ValueError(
                f"a {GENDER_AXIS!r} axis when gender_balance is {self.gender_balance!r} (axes are {list(self.axes)})"
            )
        per_gender = n_conditions // len(self.axes[GENDER_AXIS])
        other_gender = n_conditions - per_gender
        if self.gender_balance == "match":
            limit = per_gender
        elif self.gender_balance == "mismatch":
            limit = other_gender
        else:
            limit = 2 * min(per_gender, other_gender)
            if cpt is not None and cpt % 2:
                raise ValueError(f"an even conditions_per_template with gender_balance 'balanced', got {cpt}")
        if limit == 0:
            raise ValueError(f"a gender axis with more than one value for gender_balance {self.gender_balance!r}")
        if cpt is not None and cpt > limit:
            raise ValueError(
                f"conditions_per_template <= {limit} (what gender_balance {self.gender_balance!r} "
                f"allows per template), got {cpt}"
            )
        return self


@dataclass(frozen=True)
class Template:
    """A source chosen for the design.

    Attributes:
        source_id: the source's id.
        stratum: the stratum's field values, e.g.
            ``{"occupation": "nurse", "presented_gender": "female"}``.
        index: 0-based position among its stratum's templates (ordered by source id).
    """

    source_id: str
    stratum: Mapping[str, str | None] = field(hash=False)
    index: int


@dataclass(frozen=True)
class Cell:
    """One template x condition.

    Attributes:
        source_id: the template's source id.
        condition: axis -> value in axis order, e.g. ``{"race": "Black", "gender": "female"}``.
        cell_id: stable id, ``"<source_id>|race=Black|gender=female"`` (see :func:`cell_id`).
        gender_match: whether the condition's gender equals the template's presented gender;
            ``None`` when there is no gender axis or the presented gender is unknown.
        editor: the label of the editor that fills it when the spec compares ``editors``
            (its id then ends ``|editor=<label>``, :func:`for_editor`); None with one editor.
    """

    source_id: str
    condition: Mapping[str, str] = field(hash=False)
    cell_id: str
    gender_match: bool | None
    editor: str | None = None


@dataclass(frozen=True)
class StratumSummary:
    """How one stratum was sampled.

    Attributes:
        stratum: field -> value for this stratum.
        available: eligible sources in it.
        requested: ``templates_per_stratum``.
        source_ids: the sources taken, sorted.
    """

    stratum: Mapping[str, str | None] = field(hash=False)
    available: int
    requested: int
    source_ids: tuple[str, ...]

    @property
    def missing(self) -> int:
        """How many templates short of ``requested`` this stratum is (0 when full)."""
        return max(self.requested - len(self.source_ids), 0)


@dataclass(frozen=True)
class Exclusion:
    """A source the grid could not use, and why."""

    source_id: str
    reason: str


@dataclass(frozen=True, eq=False)
class Grid:
    """The expanded design.

    Attributes:
        design: the design it was expanded from.
        templates: in grid order (strata sorted by their values, then source id).
        cells: in grid order (templates, then conditions in axis order); ids are unique.
        strata: one summary per stratum, in grid order.
        excluded: sources that could not take part (failed to load, gender unknown, ...).
    """

    design: DesignConfig
    templates: tuple[Template, ...]
    cells: tuple[Cell, ...]
    strata: tuple[StratumSummary, ...]
    excluded: tuple[Exclusion, ...] = ()

    @property
    def shortfalls(self) -> tuple[StratumSummary, ...]:
        """Strata that had fewer eligible sources than ``templates_per_stratum``."""
        return tuple(s for s in self.strata if s.missing)

    def cells_of(self, source_id: str) -> tuple[Cell, ...]:
        """The cells of one template, in condition order."""
        return tuple(c for c in self.cells if c.source_id == source_id)


def conditions(design: DesignConfig) -> list[dict[str, str]]:
    """The cross product of the design's axes, first axis outermost.

    Example: ``{"race": ["A", "B"], "gender": ["m", "f"]}`` gives
    ``[{race: A, gender: m}, {race: A, gender: f}, {race: B, gender: m}, {race: B, gender: f}]``.
    """
    names = list(design.axes)
    return [dict(zip(names, values)) for values in product(*design.axes.values())]


def cell_id(source_id: str, condition: Mapping[str, str]) -> str:
    """``"<source_id>|axis=value|..."`` with axes in the condition's order."""
    return "|".join([source_id, *(f"{k}={v}" for k, v in condition.items())])


def _record(item: Any) -> Any:
    return getattr(item, "record", None) or item


def _field_value(record: Any, name: str) -> str | None:
    if name.startswith("extra."):
        extra = getattr(record, "extra", None) or {}
        value = extra.get(name[len("extra.") :])
    else:
        if not hasattr(record, name):
            raise ValueError(f"source {record.id!r} has no metadata field {name!r} to stratify on")
        value = getattr(record, name)
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _gender(record: Any) -> str | None:
    value = getattr(record, "presented_gender", None)
    if not isinstance(value, str):
        return None
    return value.strip().casefold() or None


def _stratum_order(key: tuple[str | None, ...]) -> tuple:
    return tuple((v is not None, v or "") for v in key)


def stable_key(value: Any) -> int:
    """A 128-bit integer from the JSON of ``value``: the same on every machine and Python run
    (unlike ``hash``), for seeding ``numpy.random.SeedSequence``."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:16], "big")


def _generator(seed: int, *keys: Any) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *(stable_key(k) for k in keys)])))


def _pick(pool: list[int], k: int, usage: Counter, rng: np.random.Generator) -> list[int]:
    """``k`` condition indices from ``pool``: least used first, ties in seeded random order."""
    if k >= len(pool):
        return list(pool)
    shuffled = [pool[i] for i in rng.permutation(len(pool))]
    shuffled.sort(key=lambda c: usage[c])
    return shuffled[:k]


def expand_grid(sources: Sequence[Any], design: DesignConfig) -> Grid:
    """Choose templates by stratum and give each its conditions.

    Args:
        sources: :class:`~counterfactory.generation.sources.SourceRecord` s, :class:`~counterfactory.generation.sources.Source` s
            (their ``.record`` is used) or anything with ``id`` and the stratum fields.
            :class:`~counterfactory.generation.sources.FailedSource` items are listed in ``excluded``.
        design: the study design.

    Returns:
        The :class:`Grid`. Each stratum contributes ``templates_per_stratum`` templates drawn
        without replacement, or all it has (a shortfall); every template has its cells, each
        cell id once.

    Raises:
        ValueError: duplicate source ids, a short stratum with ``on_short_stratum="error"``, or
            no ``templates_per_stratum`` (only an editor that plans its own grid may leave it out).
    """
    if design.templates_per_stratum is None:
        raise ValueError("design.templates_per_stratum is needed to draw templates from the strata")
    excluded: list[Exclusion] = []
    records: dict[str, Any] = {}
    for item in sources:
        if isinstance(item, FailedSource):
            excluded.append(Exclusion(item.id, f"failed to load: {item.reason}"))
            continue
        record = _record(item)
        if record.id in records:
            raise ValueError(f"source id {record.id!r} appears more than once; ids must be unique")
        records[record.id] = record

    axis_genders = {v.casefold() for v in design.axes.get(GENDER_AXIS, [])}
    eligible: list[Any] = []
    for sid in sorted(records):
        record = records[sid]
        gender = _gender(record)
        mode = design.gender_balance
        if mode != "any":
            if gender is None:
                reason = f"presented_gender unknown; gender_balance {mode!r} needs it"
                excluded.append(Exclusion(sid, reason))
                continue
            if mode in ("match", "balanced") and gender not in axis_genders:
                reason = (
                    f"presented_gender {record.presented_gender!r} is none of the "
                    f"{GENDER_AXIS!r} axis values {design.axes[GENDER_AXIS]}, "
                    "so no condition can match it"
                )
                excluded.append(Exclusion(sid, reason))
                continue
        eligible.append(record)

    groups: dict[tuple[str | None, ...], list[Any]] = {}
    for record in eligible:
        key = tuple(_field_value(record, name) for name in design.strata)
        groups.setdefault(key, []).append(record)
    keys = sorted(groups, key=_stratum_order)

    requested = design.templates_per_stratum
    short = [(k, len(groups[k])) for k in keys if len(groups[k]) < requested]
    if short and design.on_short_stratum == "error":
        listed = "; ".join(f"{dict(zip(design.strata, k))}: {n} of {requested}" for k, n in short)
        raise ValueError(
            f"{len(short)} strata have fewer eligible sources than "
            f"templates_per_stratum={requested} ({listed}); "
            "add sources or set on_short_stratum: take_all"
        )

    templates: list[Template] = []
    summaries: list[StratumSummary] = []
    for key in keys:
        members = groups[key]
        if len(members) > requested:
            chosen_idx = _generator(design.seed, list(key)).permutation(len(members))[:requested]
            chosen = sorted((members[i] for i in chosen_idx), key=lambda r: r.id)
        else:
            chosen = members
        stratum = dict(zip(design.strata, key))
        summaries.append(StratumSummary(stratum, len(members), requested, tuple(r.id for r in chosen)))
        templates += [Template(r.id, dict(stratum), i) for i, r in enumerate(chosen)]

    all_conditions = conditions(design)
    cond_gender = [c.get(GENDER_AXIS, "").casefold() or None for c in all_conditions]
    # conditions are balanced within a stratum only, so one stratum's sources never move another's
    usage_by_stratum: dict[tuple, Counter] = {}
    cpt = design.conditions_per_template
    cells: list[Cell] = []
    for template in templates:
        stratum_key = tuple(template.stratum.get(name) for name in design.strata)
        usage = usage_by_stratum.setdefault(stratum_key, Counter())
        rng = _generator(design.seed, list(stratum_key), template.source_id)
        gender = _gender(records[template.source_id])
        everything = list(range(len(all_conditions)))
        matched = [i for i in everything if cond_gender[i] == gender]
        mismatched = [i for i in everything if cond_gender[i] != gender]
        if design.gender_balance == "balanced":
            n = cpt // 2 if cpt is not None else min(len(matched), len(mismatched))
            picked = _pick(matched, n, usage, rng) + _pick(mismatched, n, usage, rng)
        else:
            pool = {"any": everything, "match": matched, "mismatch": mismatched}[design.gender_balance]
            picked = _pick(pool, cpt if cpt is not None else len(pool), usage, rng)
        usage.update(picked)
        for i in sorted(picked):
            condition = dict(all_conditions[i])
            match = None
            if cond_gender[i] is not None and gender is not None:
                match = cond_gender[i] == gender
            cells.append(Cell(template.source_id, condition, cell_id(template.source_id, condition), match))

    return Grid(design, tuple(templates), tuple(cells), tuple(summaries), tuple(excluded))


def for_editor(cells: Sequence[Cell], editor: str | None) -> list[Cell]:
    """``cells`` as the editor labelled ``editor`` fills them: each id ends ``|editor=<label>``
    (None: the cells as they are, a one-editor spec's). The condition, and so every attempt id,
    is unchanged: the editor's lineage already tells the attempts apart."""
    if editor is None:
        return list(cells)
    return [dataclasses.replace(c, cell_id=f"{c.cell_id}|editor={editor}", editor=editor) for c in cells]


def with_editors(grid: Grid, editors: Sequence[str | None]) -> Grid:
    """``grid`` with every cell once per editor (:func:`for_editor`), templates and strata as
    they are: the grid a release over several editors reports."""
    if list(editors) == [None]:
        return grid
    cells = tuple(c for label in editors for c in for_editor(grid.cells, label))
    return dataclasses.replace(grid, cells=cells)


def grid_summary(grid: Grid) -> dict[str, Any]:
    """A JSON-ready report of a grid: sizes, strata, shortfalls, exclusions, cells per condition.

    Returns:
        ``{"kind", "seed", "axes", "gender_balance", "conditions_per_template", "n_conditions",
        "n_templates", "n_cells", "strata": [...], "shortfalls": [...], "excluded": [...],
        "cells_per_condition": {"race=Black|gender=female": n, ...},
        "gender_match": {"matched": n, "mismatched": n, "unknown": n}}``.
    """
    design = grid.design
    per_condition = Counter("|".join(f"{k}={v}" for k, v in c.condition.items()) for c in grid.cells)
    condition_keys = ["|".join(f"{k}={v}" for k, v in c.items()) for c in conditions(design)]
    return {
        "kind": design.kind,
        "seed": design.seed,
        "axes": {k: list(v) for k, v in design.axes.items()},
        "gender_balance": design.gender_balance,
        "conditions_per_template": design.conditions_per_template,
        "n_conditions": len(condition_keys),
        "n_templates": len(grid.templates),
        "n_cells": len(grid.cells),
        "strata": [
            {
                "stratum": dict(s.stratum),
                "available": s.available,
                "requested": s.requested,
                "selected": len(s.source_ids),
                "source_ids": list(s.source_ids),
            }
            for s in grid.strata
        ],
        "shortfalls": [
            {
                "stratum": dict(s.stratum),
                "available": s.available,
                "requested": s.requested,
                "missing": s.missing,
            }
            for s in grid.shortfalls
        ],
        "excluded": [{"source_id": e.source_id, "reason": e.reason} for e in grid.excluded],
        "cells_per_condition": {k: per_condition.get(k, 0) for k in condition_keys},
        "gender_match": {
            "matched": sum(c.gender_match is True for c in grid.cells),
            "mismatched": sum(c.gender_match is False for c in grid.cells),
            "unknown": sum(c.gender_match is None for c in grid.cells),
        },
    }


__all__ = [
    "Cell",
    "DesignConfig",
    "Exclusion",
    "GENDER_AXIS",
    "Grid",
    "StratumSummary",
    "Template",
    "cell_id",
    "conditions",
    "expand_grid",
    "grid_summary",
]
