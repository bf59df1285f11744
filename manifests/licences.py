"""Source licences: read the free text of the metadata, combine them into one dataset licence.

A counterfactual is an adaptation of its source photo, so the released set can carry no licence
looser than any of its sources. Licences are described by their conditions: ``BY``
(attribution), ``NC`` (non-commercial), ``SA`` (share-alike: adaptations must carry the same
licence) and ``ND`` (no adaptations). The combined licence is the one whose conditions are the
union of the sources' conditions; sources conflict when that union has no licence that honours
every source:

- an ``ND`` source can never be edited (its licence forbids adaptations);
- an ``SA`` source forces its exact licence on the whole set, so every other source must fit
  inside it (``cc-by-sa-4.0`` with ``cc-by-nc-4.0`` conflicts; with ``cc-by-4.0`` it does not);
- two licences with the same conditions but different versions (``cc-by-2.0`` and
  ``cc-by-4.0``) are not merged silently.

Identifiers are the Hugging Face Hub's ``license:`` values. Public-domain sources (the text
starts with "public domain", ``pd``, ``pdm``, ``cc0``) have no conditions; a set made only of
them is released as ``cc0-1.0``. Reference: Creative Commons, "Licence compatibility chart"
(https://wiki.creativecommons.org/wiki/Wiki/cc_license_compatibility).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from counterfactory.manifests.errors import CounterfactoryError

PUBLIC_DOMAIN = "cc0-1.0"
_CC = re.compile(r"^cc[-_ ]?(by(?:[-_ ](?:nc|sa|nd))*)(?:[-_ ]?(\d\.\d))?$")
_PD = re.compile(r"^(public[-_ ]domain|pd|pdm|pdm[-_ ]?1\.0|cc[-_ ]?0(?:[-_ ]?1\.0)?|cc[-_ ]zero)\b")
_PERMISSIVE = {"mit": frozenset({"BY"}), "apache-2.0": frozenset({"BY"}), "bsd-3-clause": frozenset({"BY"})}


#: The Creative Commons and permissive ids the Hub's ``license:`` field accepts
#: (https://huggingface.co/docs/hub/repositories-licenses); any other version goes in as
#: ``license: other`` with its name and deed.
HUB_LICENCE_IDS = frozenset(
    {
        "cc0-1.0",
        "cc-by-2.0",
        "cc-by-2.5",
        "cc-by-3.0",
        "cc-by-4.0",
        "cc-by-sa-3.0",
        "cc-by-sa-4.0",
        "cc-by-nc-2.0",
        "cc-by-nc-3.0",
        "cc-by-nc-4.0",
        "cc-by-nc-sa-2.0",
        "cc-by-nc-sa-3.0",
        "cc-by-nc-sa-4.0",
        "mit",
        "apache-2.0",
        "bsd-3-clause",
    }
)


class LicenceError(CounterfactoryError, ValueError):
    """A source's licence is missing or unknown, or the sources' licences conflict."""


@dataclass(frozen=True)
class Licence:
    """One licence: its Hub identifier and its conditions (subset of BY, NC, SA, ND)."""

    hub_id: str
    conditions: frozenset[str]


def parse_licence(text: str | None) -> Licence | None:
    """Hub licence for a metadata ``licence`` text, or None when it is missing or unknown.

    Accepts "CC BY 4.0", "cc-by-sa-4.0", "CC-BY-NC 3.0", "public domain (NASA)", "CC0", "MIT".
    A CC licence without a version is read as 4.0, the current one.
    """
    if text is None:
        return None
    cleaned = re.sub(r"\s*\(.*\)\s*$", "", str(text)).strip().lower()
    if not cleaned or cleaned in {"unknown", "none", "n/a", "all rights reserved", "see sources"}:
        return None
    if _PD.match(cleaned):
        return Licence(PUBLIC_DOMAIN, frozenset())
    match = _CC.match(cleaned)
    if match:
        parts = re.split(r"[-_ ]", match.group(1))
        conditions = frozenset(p.upper() for p in parts)
        if "NC" in conditions and "SA" in conditions:
            name = "by-nc-sa"
        else:
            name = "-".join(["by", *[c.lower() for c in ("NC", "ND", "SA") if c in conditions]])
        return Licence(f"cc-{name}-{match.group(2) or '4.0'}", conditions)
    key = cleaned.replace(" ", "-")
    if key in _PERMISSIVE:
        return Licence(key, _PERMISSIVE[key])
    return None


@dataclass(frozen=True)
class LicenceDecision:
    """The licence the released set carries and which sources hold each input licence."""

    hub_id: str
    sources_by_licence: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def hub_licence_fields(hub_id: str) -> dict[str, str]:
    """The card's licence keys: ``{"license": id}``, or ``other`` with name and link for an id
    the Hub does not list (e.g. ``cc-by-sa-2.0``)."""
    if hub_id in HUB_LICENCE_IDS:
        return {"license": hub_id}
    match = re.match(r"^cc-(by(?:-[a-z]{2})*)-(\d\.\d)$", hub_id)
    link = f"https://creativecommons.org/licenses/{match.group(1)}/{match.group(2)}/" if match else ""
    return {"license": "other", "license_name": hub_id, "license_link": link}


def combine_licences(sources: Iterable[tuple[str, str | None]], *, declared: str | None = None) -> LicenceDecision:
    """The dataset licence for ``(source_id, licence text)`` pairs; raises :class:`LicenceError`.

    Args:
        sources: one pair per source row (duplicates are fine).
        declared: the licence the spec declares (``release.licence``); None or "see sources"
            means "derive it from the sources". A declared licence must honour every source.

    Raises:
        LicenceError: naming the source ids whose licence is missing or unknown, or the ids
            behind each of the conflicting licences, and how to fix it.
    """
    by_id: dict[str, str | None] = dict(sources)
    unknown = sorted(sid for sid, text in by_id.items() if parse_licence(text) is None)
    if unknown:
        listing = ", ".join(f"{sid} ({by_id[sid]!r})" for sid in unknown)
        raise LicenceError(
            f"{len(unknown)} source(s) have a missing or unknown licence: {listing}; set each row's "
            "`licence` in the metadata to a known licence (e.g. 'CC BY 4.0', 'public domain (…)') "
            "or remove the rows, then run again"
        )
    if not by_id:
        raise LicenceError("the release has no sources, so it has no licence to publish under")
    licences = {sid: parse_licence(text) for sid, text in by_id.items()}
    groups: dict[str, list[str]] = {}
    for sid, lic in sorted(licences.items()):
        groups.setdefault(lic.hub_id, []).append(sid)
    named = {hub_id: tuple(ids) for hub_id, ids in groups.items()}

    def describe(hub_ids: Iterable[str]) -> str:
        return "; ".join(f"{h}: {', '.join(named[h])}" for h in sorted(hub_ids))

    distinct = {lic.hub_id: lic for lic in licences.values()}
    nd = [h for h, lic in distinct.items() if "ND" in lic.conditions]
    if nd:
        raise LicenceError(
            f"no-derivatives licences forbid edited copies ({describe(nd)}); remove these sources "
            "from the metadata, then run again"
        )
    union = frozenset().union(*(lic.conditions for lic in distinct.values()))
    sharealike = [h for h, lic in distinct.items() if "SA" in lic.conditions]
    if len(sharealike) > 1:
        raise LicenceError(
            f"share-alike sources require different licences on the whole set ({describe(sharealike)}); "
            "keep sources of one share-alike licence only"
        )
    if sharealike:
        target = distinct[sharealike[0]]
        if not union <= target.conditions:
            raise LicenceError(
                f"share-alike source licence {target.hub_id} cannot absorb the others ({describe(distinct)}); "
                "remove the sources with extra conditions or the share-alike ones"
            )
        result = target
    else:
        widest = [lic for lic in distinct.values() if lic.conditions == union]
        if not widest:
            raise LicenceError(f"no single licence honours every source ({describe(distinct)})")
        if len({lic.hub_id for lic in widest}) > 1:
            raise LicenceError(
                f"sources carry the same conditions under different licence versions "
                f"({describe(lic.hub_id for lic in widest)}); declare one in the spec's "
                "release.licence (it must honour every source)"
            )
        result = widest[0]
    if declared is not None and declared.strip().lower() not in {"", "see sources"}:
        chosen = parse_licence(declared)
        if chosen is None:
            raise LicenceError(f"release.licence {declared!r} is not a licence this tool knows; use a Hub id")
        if not result.conditions <= chosen.conditions or ("SA" in result.conditions and chosen != result):
            raise LicenceError(
                f"release.licence {chosen.hub_id} is looser than the sources allow ({describe(distinct)}); "
                f"use {result.hub_id} or stricter"
            )
        result = chosen
    return LicenceDecision(result.hub_id, named)
