"""A release verified whole: the bottom layer's checks with the derived files' own.

:func:`counterfactory.manifests.release_verify.verify_release` checks a release's bytes and what its
tables say about each other; ``stats.json`` and ``report.html`` are re-derived by the code that
wrote them (:func:`counterfactory.validation.release_derived.check_derived`), above that layer,
so every command that verifies (``verify``, ``release export``, ``push``, ``pull``) goes through
here, which passes that check in, and the card names what each editor backend declares a
release of its edits must say first (``release_caveat`` on its options).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from counterfactory.generation.editors import EDITORS
from counterfactory.generation.editors.base import hooks_of
from counterfactory.manifests import hub
from counterfactory.manifests.release import release_digest
from counterfactory.manifests.release_verify import ReleaseCheck
from counterfactory.manifests.release_verify import verify_release as verify_bytes
from counterfactory.validation.release_derived import check_derived

#: what ``verify`` re-derives beyond the release's own tables
DERIVED_CHECKS: tuple[ReleaseCheck, ...] = (check_derived,)

__all__ = ["DERIVED_CHECKS", "editor_caveat", "export_release", "pull_release", "push_release", "release_digest"]


def editor_caveat(backend: str) -> str | None:
    """What the editor backend ``backend`` declares a release of its edits must say first
    (``release_caveat`` on its options model); None for a backend this installation lacks."""
    if backend not in EDITORS:
        return None
    return hooks_of(EDITORS.get(backend).options).release_caveat


def verify_release(path: str | Path, **kwargs: Any) -> list[str]:
    """:func:`counterfactory.manifests.release_verify.verify_release` with :data:`DERIVED_CHECKS`."""
    return verify_bytes(path, checks=DERIVED_CHECKS, **kwargs)


def export_release(release_dir: str | Path, out_dir: str | Path, **kwargs: Any) -> hub.Export:
    """:func:`counterfactory.manifests.hub.export_release`, verified whole, with the editors' caveats."""
    return hub.export_release(release_dir, out_dir, checks=DERIVED_CHECKS, caveat_of=editor_caveat, **kwargs)


def push_release(release_dir: str | Path, repo_id: str, **kwargs: Any) -> hub.PushResult:
    """:func:`counterfactory.manifests.hub.push_release`, verified whole, with the editors' caveats."""
    return hub.push_release(release_dir, repo_id, checks=DERIVED_CHECKS, caveat_of=editor_caveat, **kwargs)


def pull_release(ref: str, out_dir: str | Path, **kwargs: Any) -> Path:
    """:func:`counterfactory.manifests.hub.pull_release`, the download verified whole."""
    return hub.pull_release(ref, out_dir, checks=DERIVED_CHECKS, **kwargs)
