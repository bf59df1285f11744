"""Every reason code a cell's verdict can carry, each in one line a person reads.

A verdict's ``reasons`` (rejected) and ``review`` (needs_review) are stable codes; some carry a
detail after a colon (``align_registration_failed: no keypoint matches ...``). :data:`REASONS`
says what each code means; the release's ``report.html`` prints that line beside every code it
counts, and ``docs/gates.md`` lists the same lines under "Reason codes", each code an anchor
(``tests/validation/test_reasons.py`` holds the three together: every code the gates, the
aligner and the judge can write is here, and every one of these is on the docs page).
"""

from __future__ import annotations

#: where a code is explained on the docs site: the page, with the code as its anchor
DOCS_PAGE = "docs/gates.md"

#: code -> (what gave it, what it means); ``*`` in a code stands for a measure's name
REASONS: dict[str, tuple[str, str]] = {
    # registration (generation/align.py): the output could not be laid over its source
    "align_bad_candidate": ("align", "the editor returned something that is not an RGB 8-bit image"),
    "align_candidate_blank": ("align", "the output has no texture to register (a blank or flat image)"),
    "align_registration_failed": (
        "align",
        "no keypoint matches and ECC did not converge: the output could not be laid over its source",
    ),
    "align_residual_above_max": (
        "align",
        "the best transform explains too few keypoint matches: the scene moved, not only the region",
    ),
    "align_transform_out_of_bounds": (
        "align",
        "the transform that registers the output shifts, scales or shears it beyond the aligner's bounds",
    ),
    "align_coverage_below_min": ("align", "the registered output covers too little of the source's frame"),
    "align_correlation_below_min": (
        "align",
        "outside the edit region the registered output correlates too little with the source: something outside changed",
    ),
    "align_no_mask": ("align", "compositing was asked for but the cell has no edit mask"),
    "align_failed": ("align", "registration failed without a more precise reason"),
    # the editor and the judge (validation/judging.py)
    "editor_failed": ("editor", "the editor returned no output for this attempt (its error is in the ledger)"),
    "editor_refused": (
        "editor",
        "the editor declined the request (a content filter, a refusal); its words follow the colon",
    ),
    "editor_not_run": ("editor", "no attempt of this cell was run"),
    "import_source_gates_skipped": (
        "import",
        "a set without source photos: the gates that compare with a source were skipped, so people decide",
    ),
    # face gate
    "face_count_mismatch": ("face", "the output does not show exactly the one face its source shows"),
    "face_low_confidence": ("face", "the face detector is unsure of the output's face: people look"),
    "face_accessory_changed": (
        "face",
        "glasses were added or removed (a frame's edges about the eyes): an accessory, not a brow",
    ),
    "face_pose_change_above_max": ("face", "the head turned or tilted more than the bound"),
    "face_pose_unavailable": ("face", "the head pose could not be measured on source or output"),
    "face_position_change_above_max": ("face", "the face moved in the frame more than the bound"),
    "face_scale_change_above_max": ("face", "the face grew or shrank more than the bound"),
    # identity gate
    "identity_below_band": ("identity", "the output's face embedding is too far from the source's: another person"),
    "identity_above_band": (
        "identity",
        "the output's face embedding is nearly the source's: perhaps no edit at all, people look",
    ),
    "identity_source_no_face": ("identity", "the identity model found no face in the source"),
    "identity_candidate_no_face": ("identity", "the identity model found no face in the output"),
    "identity_embedding_not_finite": ("identity", "the identity model returned a broken embedding (NaN or infinity)"),
    # expression gate
    "expression_au_change_above_max": (
        "expression",
        "one facial action unit (a smile, a frown, a blink) changed more than the bound",
    ),
    "expression_mean_au_change_above_max": ("expression", "the action units changed more than the bound on average"),
    "expression_mouth_corner_change_above_max": (
        "expression",
        "the mesh's mouth corners moved more than the bound (inter-ocular units)",
    ),
    "expression_mouth_corner_shift_above_max": (
        "expression",
        "a mouth corner's pixels moved more than the bound: a smile added or taken away",
    ),
    "expression_brow_change_above_max": (
        "expression",
        "a brow's pixels moved more than the bound: a raised or lowered brow",
    ),
    "expression_mouth_open_change_above_max": ("expression", "the mouth opened or closed more than the bound"),
    "expression_source_no_face": ("expression", "the expression model found no face in the source"),
    "expression_candidate_no_face": ("expression", "the expression model found no face in the output"),
    "expression_aus_not_finite": ("expression", "the expression model returned broken action units"),
    # locality gate: nothing changed but what the study varies
    "locality_face_unchanged": (
        "locality",
        'a near-copy: the face changed no more than the editor\'s own "unchanged" output does, so people look',
    ),
    "locality_nonface_diff_above_max": ("locality", "FOCUS's diff_nonface: too much changed away from the face"),
    "locality_ratio_below_min": ("locality", "FOCUS's ratio: the face changed too little against the change elsewhere"),
    "locality_band_ratio_below_min": (
        "locality",
        "the face's band-limited change is too small against the change away from the edit region",
    ),
    "locality_changed_share_above_max": (
        "locality",
        "too large a share of the image away from the edit region changed",
    ),
    "locality_excess_share_above_max": (
        "locality",
        'compared with the editor\'s "unchanged" output, areas away from the edit region changed: an object, text, an erased patch',
    ),
    "locality_largest_change_above_max": (
        "locality",
        "one connected area away from the edit region changed a lot: a pasted object, text or an erased patch",
    ),
    "locality_global_shift_above_max": (
        "locality",
        "the colour of everything away from the edit region shifted: a cast",
    ),
    "locality_global_gain_above_max": ("locality", "the contrast of everything away from the edit region changed"),
    "locality_body_skin_above_max": ("locality", "skin outside the edit region (arms, chest) changed colour"),
    "locality_hair_above_max": ("locality", "the hair around the head changed colour"),
    "locality_no_face_mask": ("locality", "no face region could be drawn, so the face's change could not be measured"),
    "locality_no_edit_mask": ("locality", "a limb cell without its edit mask"),
    "locality_edit_mask_shape_mismatch": ("locality", "the edit mask is not the size of its source"),
    "locality_outside_edit_diff_above_max": ("locality", "a limb edit changed pixels outside its mask"),
    "locality_face_drift_above_max": ("locality", "a limb edit changed the face"),
    "locality_limb_unchanged": (
        "locality",
        "the limb's mask barely changed (a same-cue control goes to review, a treatment is rejected)",
    ),
    # skin gate
    "skin_tone_shift": (
        "skin",
        "a same-group control or a limb edit moved the skin tone (ITA°), which it was not asked to",
    ),
    "skin_against_direction": ("skin", "the face's tone moved against the direction the condition asks for"),
    "skin_body_tone_shift": ("skin", "skin outside the region the prompt names changed tone"),
    "skin_inpaint_mismatch": ("skin", "skin painted where a limb cue was does not match the person's own"),
    "skin_face_body_mismatch": (
        "skin",
        "the face's tone no longer matches the body's (only with skin.require_congruent)",
    ),
    # attribute gate (opt-in): does the output read as the requested group?
    "attribute_mismatch": (
        "attribute",
        "the attribute model perceives another group than the one requested: people look",
    ),
    "attribute_label_unmapped": ("attribute", "the attribute model gave a label the spec's label map does not name"),
    "attribute_no_face": ("attribute", "the attribute model found no face"),
    "attribute_vlm_malformed": ("attribute", "the vision LLM's answer was not the JSON asked for"),
    "attribute_vlm_label_invalid": ("attribute", "the vision LLM answered a label outside the spec's labels"),
    "attribute_vlm_refused": ("attribute", "the vision LLM refused to answer"),
    "attribute_vlm_unanswered": ("attribute", "the vision LLM gave no answer (an error or the spend cap)"),
    # people
    "review_rejected": ("review", "a reviewer rejected it; the code after the colon is the reviewer's reason"),
}


def code_of(reason: str) -> str:
    """The code of a reason as stored: the part before any ``: detail``."""
    return reason.split(":", 1)[0].strip()


def explain(reason: str) -> str | None:
    """The one line that says what ``reason`` means, or None for a code this table lacks (a
    plug-in gate's own)."""
    found = REASONS.get(code_of(reason))
    return None if found is None else found[1]


def docs_anchor(reason: str) -> str:
    """Where ``reason`` is explained: ``docs/gates.md#<code>``."""
    return f"{DOCS_PAGE}#{code_of(reason)}"


def markdown_table() -> str:
    """The "Reason codes" table of ``docs/gates.md``, each code its own anchor."""
    rows = ["| code | gate | what it means |", "|---|---|---|"]
    for code, (gate, line) in REASONS.items():
        rows.append(f'| <a id="{code}"></a>`{code}` | {gate} | {line} |')
    return "\n".join(rows)
