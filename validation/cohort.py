"""The cohort floor: what an editor alone did to a photo, read from several of its outputs.

A verdict compares an output with what the same editor does to the photo when asked for
nothing (the *floor*). A run can pay for that output (the ``request`` path); a set made
elsewhere has none, but it usually has several candidates per source (a grid's cells; an
imported set shaped like FOCUS has ten per photo). Registered to the source, what they agree
on outside the edit region is the editor's rendition of the unchanged content: texture and
grain re-synthesised, a colour bias of its decoder. Each candidate is judged against the
pixelwise median of the *others* (leave one out), so what it alone changed (an object added,
text, a cast, skin lightened outside the region) stands out, while the re-rendering they
share cancels. Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: A candidate is judged against a cohort floor only when at least this many other
#: registered outputs of its source make the median: with one, the floor is that output, and
#: whatever it changed would hide the same change in the candidate; with two, a change in one
#: of them moves the median halfway. Fewer: the lone-pair path (``floor_path: none``).
COHORT_MIN_OTHERS = 3


@dataclass(frozen=True)
class CohortFloor:
    """The floor of one cohort member.

    Attributes:
        image: ``(h, w, 3)`` uint8, the median of the other members (working grid).
        members: how many outputs the median was taken over.
    """

    image: np.ndarray
    members: int


def median_image(images: Sequence[np.ndarray]) -> np.ndarray:
    """``(h, w, 3)`` uint8: the per-pixel, per-channel median of ``images`` (all of one shape,
    uint8), rounded half to even; for an even count the mean of the two middle values."""
    if not images:
        raise ValueError("the median of no images is undefined")
    shapes = {im.shape for im in images}
    if len(shapes) != 1:
        raise ValueError(f"cohort images differ in shape: {sorted(shapes)}")
    stack = np.stack([np.asarray(im, np.uint8) for im in images])
    n = stack.shape[0]
    if n == 1:
        return stack[0].copy()
    part = np.partition(stack, [(n - 1) // 2, n // 2], axis=0)
    low = part[(n - 1) // 2].astype(np.uint16)
    high = part[n // 2].astype(np.uint16)
    return np.rint((low + high) / 2.0).astype(np.uint8)


def cohort_floors(
    images: Sequence[np.ndarray | None], members: Sequence[np.ndarray] = (), *, min_others: int = COHORT_MIN_OTHERS
) -> list[CohortFloor | None]:
    """Leave-one-out cohort floors.

    Args:
        images: each candidate's output registered to the source (one grid for all, uint8
            ``(h, w, 3)``), or None where it could not be registered (it gets no floor and
            is in no other's).
        members: more registered outputs of the same source that are not judged here (earlier
            rounds' cells); they join every candidate's median.
        min_others: fewer other outputs than this: that candidate's floor is None.

    Returns: one :class:`CohortFloor` (or None) per entry of ``images``: the median of every
    other registered image and of ``members``.
    """
    present = [(i, im) for i, im in enumerate(images) if im is not None]
    out: list[CohortFloor | None] = [None] * len(images)
    n_others = len(present) - 1 + len(members)
    if not present or n_others < min_others:
        return out
    if n_others < 1:
        median_image([])  # raises: the median of no images
    everyone = [np.asarray(im, np.uint8) for _, im in present] + [np.asarray(m, np.uint8) for m in members]
    shapes = {im.shape for im in everyone}
    if len(shapes) != 1:
        raise ValueError(f"cohort images differ in shape: {sorted(shapes)}")
    # Every floor is the median of all the images but one: sort them once per pixel, and
    # drop each candidate's own value from the sorted order. With the values ``s[0] <= ... <=
    # s[n-1]`` and ``v`` the candidate's, its position may be taken as the first of its ties
    # (the same multiset stays whichever copy of ``v`` goes), so the ``j``-th smallest of the
    # others is ``s[j]`` where ``s[j] < v`` (at least ``j + 1`` values lie below ``v``), else
    # ``s[j + 1]``: median_image of the others, exactly, without a partition per candidate.
    ordered = np.sort(np.stack(everyone), axis=0)
    n = n_others  # each floor's count
    low_at, high_at = (n - 1) // 2, n // 2
    for (i, _), value in zip(present, everyone):
        low = np.where(ordered[low_at] < value, ordered[low_at], ordered[low_at + 1])
        if low_at == high_at:
            out[i] = CohortFloor(low, n)
            continue
        high = np.where(ordered[high_at] < value, ordered[high_at], ordered[high_at + 1])
        # the mean of the two, rounded half to even (np.rint), in integers
        total = low.astype(np.uint16) + high
        half = total >> 1
        out[i] = CohortFloor((half + (total & half & 1)).astype(np.uint8), n)
    return out
