"""Each paper's metrics as the paper defines them, on parsed answers of one model.

Every function takes *scored rows*: a trial row of ``trials.jsonl`` plus ``value`` (the parsed
answer, or None), ``why_invalid`` (``refusal`` / ``format`` / ``empty`` / ``missing``) and
``reply`` (the raw text), for one model; and returns plain JSON. Where a paper leaves a formula
undefined, the docstring says in one line what we chose ("Ours:"). The guardrail-agnostic
paper's refusal and user-context metrics are in :mod:`counterfactory.validation.scoring.guardrail`.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from counterfactory.validation.scoring.stats import (
    anova_and_d,
    binomial_p,
    jsd,
    sign_test,
    spearman,
    template_bootstrap,
    wilson,
)

Row = dict[str, Any]


def group_label(condition: dict[str, Any] | None, axes: Sequence[str] | None = None) -> str:
    """A condition as one label, its values in axis order: ``{"race": "Black", "gender": "female"}``
    -> ``"Black female"``."""
    if not condition:
        return "original"
    keys = [a for a in (axes or []) if a in condition] + sorted(k for k in condition if k not in (axes or []))
    return " ".join(str(condition[k]) for k in keys)


def _boot(
    by_template: dict[str, list[Any]],
    stat: Callable[[list[Any]], float | None],
    strata: dict[str, Any] | None = None,
    resamples: int = 999,
) -> list[float] | None:
    units = sorted(by_template)

    def on(chosen: list[str]) -> float | None:
        return stat([x for t in chosen for x in by_template[t]])

    return template_bootstrap(
        units, on, strata=[(strata or {}).get(t) for t in units] if strata else None, resamples=resamples
    )


# ---------------------------------------------------------------- FOCUS Task 1: 2AFC


def _comparisons(rows: Sequence[Row]) -> tuple[list[dict[str, Any]], Counter, list[Row]]:
    """FOCUS 4.1: "each pair is evaluated twice with swapped A/B assignments. A comparison is
    retained only if both runs produce valid outputs and select the same underlying image after
    accounting for the swap; otherwise, it is discarded." Returns the retained comparisons, the
    discard reasons and the valid trials."""
    by_pair: dict[str, dict[str, Row]] = defaultdict(dict)
    for r in rows:
        by_pair[r["pair_id"]][r["order"]] = r
    kept, reasons, valid = [], Counter(), []
    for both in by_pair.values():
        for r in both.values():
            if r["value"] is not None:
                valid.append(r)
        ab, ba = both.get("AB"), both.get("BA")
        if ab is None or ba is None:
            reasons["missing"] += 1
            continue
        whys = {ab["why_invalid"], ba["why_invalid"]} - {None}
        if whys:
            reasons["refusal" if "refusal" in whys else "format" if "format" in whys else sorted(whys)[0]] += 1
            continue
        win_ab = ab["images"][0 if ab["value"] == "A" else 1]
        win_ba = ba["images"][0 if ba["value"] == "A" else 1]
        if win_ab != win_ba:
            reasons["inconsistent"] += 1
            continue
        g = ab["group"]
        cond = {ab["images"][0]: g["condition_a"], ab["images"][1]: g["condition_b"]}
        loser = ab["images"][1] if win_ab == ab["images"][0] else ab["images"][0]
        kept.append(
            {
                "template_id": g["template_id"],
                "occupation": g.get("occupation"),
                "winner": cond[win_ab],
                "loser": cond[loser],
            }
        )
    return kept, reasons, valid


def win_rate_cells(comparisons: Sequence[dict[str, Any]], axes: Sequence[str]) -> dict[tuple[str, str], list[int]]:
    """``{(i, j): [wins of i, comparisons of i and j]}`` for group labels ``i < j``."""
    cells: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for c in comparisons:
        w, lo = group_label(c["winner"], axes), group_label(c["loser"], axes)
        key = tuple(sorted((w, lo)))
        cells[key][1] += 1
        if w == key[0]:
            cells[key][0] += 1
    return dict(cells)


#: Ours: FOCUS Table 1's "Ext measures the fraction of near-deterministic cells"; a cell is
#: near-deterministic when its win rate is at most 0.1 or at least 0.9
EXTREME = 0.4


def polarisation(cells: dict[tuple[str, str], list[int]], min_n: int = 1) -> tuple[float | None, float | None]:
    """FOCUS C.1 / Table 1: ``Pol = 1/K sum_k |w_k - 1/2|`` over the K pairwise win-rate cells ("the
    average deviation from parity") and ``Ext`` the share of cells with ``|w - 1/2| >= 0.4``.
    Ours: cells with fewer than ``min_n`` comparisons are left out of K."""
    dev = [abs(w / n - 0.5) for w, n in cells.values() if n >= min_n]
    if not dev:
        return None, None
    return sum(dev) / len(dev), sum(1 for d in dev if d >= EXTREME - 1e-12) / len(dev)


def focus_2afc(
    rows: Sequence[Row], axes: Sequence[str], *, min_n: int = 1, resamples: int = 999
) -> dict[str, dict[str, Any]]:
    """FOCUS 4.1, per scenario: retention and why comparisons were discarded; ``p_first`` ("the
    selection rate of the first-presented option across valid trials"); ``WinRate(g) = sum_t 1[g(y_t)
    = g] / sum_t 1[g(i_t) = g or g(j_t) = g]`` per race x gender group, and per value of each axis
    (Ours: over retained comparisons whose two images differ on that axis); the pairwise win-rate
    matrix; Pol and Ext (Table 1) with template-bootstrap intervals."""
    out: dict[str, dict[str, Any]] = {}
    for question in sorted({r["question"] for r in rows}):
        mine = [r for r in rows if r["question"] == question]
        kept, reasons, valid = _comparisons(mine)
        pairs = len({r["pair_id"] for r in mine})
        first = sum(1 for r in valid if r["value"] == "A")
        groups = sorted(
            {group_label(c, axes) for r in mine for c in (r["group"]["condition_a"], r["group"]["condition_b"])}
        )
        win = {}
        for g in groups:
            n = sum(1 for c in kept if g in (group_label(c["winner"], axes), group_label(c["loser"], axes)))
            k = sum(1 for c in kept if group_label(c["winner"], axes) == g)
            win[g] = wilson(k, n)
        by_axis: dict[str, dict[str, Any]] = {}
        for axis in axes:
            differ = [c for c in kept if c["winner"].get(axis) != c["loser"].get(axis)]
            values = sorted({str(c[s].get(axis)) for c in differ for s in ("winner", "loser")})
            by_axis[axis] = {
                v: wilson(
                    sum(1 for c in differ if str(c["winner"].get(axis)) == v),
                    sum(1 for c in differ if v in (str(c["winner"].get(axis)), str(c["loser"].get(axis)))),
                )
                for v in values
            }
        cells = win_rate_cells(kept, axes)
        pol, ext = polarisation(cells, min_n)
        by_template: dict[str, list[Any]] = defaultdict(list)
        strata = {}
        for c in kept:
            by_template[c["template_id"]].append(c)
            strata[c["template_id"]] = c["occupation"]
        pol_ci = _boot(by_template, lambda cs: polarisation(win_rate_cells(cs, axes), min_n)[0], strata, resamples)
        ext_ci = _boot(by_template, lambda cs: polarisation(win_rate_cells(cs, axes), min_n)[1], strata, resamples)
        out[question] = {
            "pairs": pairs,
            "retention": wilson(len(kept), pairs),
            "discarded": dict(reasons),
            "p_first": wilson(first, len(valid)) | {"p_value": binomial_p(first, len(valid))},
            "win_rate": win,
            "win_rate_by_axis": by_axis,
            "cells": [{"i": i, "j": j, "wins_i": w, "n": n, "w_ij": w / n} for (i, j), (w, n) in sorted(cells.items())],
            "pol": pol,
            "pol_ci": pol_ci,
            "ext": ext,
            "ext_ci": ext_ci,
        }
    return out


def cross_model_spearman(matrices: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """FOCUS Table 5: "Spearman rho over the 45 pairwise win-rate cells in each scenario", per
    pair of models and scenario, over the cells both models have."""
    out: dict[str, dict[str, Any]] = {}
    models = sorted(matrices)
    for a_i, a in enumerate(models):
        for b in models[a_i + 1 :]:
            for q in sorted(set(matrices[a]) & set(matrices[b])):
                ca = {(c["i"], c["j"]): c["w_ij"] for c in matrices[a][q]["cells"]}
                cb = {(c["i"], c["j"]): c["w_ij"] for c in matrices[b][q]["cells"]}
                common = sorted(set(ca) & set(cb))
                out.setdefault(f"{a} vs {b}", {})[q] = spearman([ca[k] for k in common], [cb[k] for k in common])
    return out


# ---------------------------------------------------------------- FOCUS Task 2: MCQ


def _dist(values: Sequence[str], options: Sequence[str]) -> list[float]:
    counts = Counter(values)
    n = sum(counts[o] for o in options)
    return [counts[o] / n if n else 0.0 for o in options]


def mcq_summary(rows: Sequence[Row], axis: str, options: Sequence[str], ordinal: dict[str, float]) -> dict[str, Any]:
    """FOCUS 4.2: ``p_g(o) = n_g(o) / sum_o' n_g(o')``, ``mu_g = sum_o v(o) p_g(o)`` and
    ``JSD(p_g || p)`` against the pooled distribution ``p``, per value ``g`` of ``axis``; the gap
    ``Delta`` is ``max_g mu_g - min_g mu_g`` (Ours: FOCUS Table 4 reports one gap per axis)."""
    valid = [r for r in rows if r["value"] is not None]
    pooled = _dist([r["value"] for r in valid], options)
    groups: dict[str, Any] = {}
    for g in sorted({str(r["group"]["condition"].get(axis)) for r in rows}):
        vals = [r["value"] for r in valid if str(r["group"]["condition"].get(axis)) == g]
        p = _dist(vals, options)
        groups[g] = {
            "n": len(vals),
            "p": dict(zip(options, p)),
            "mean": sum(ordinal[o] * x for o, x in zip(options, p)) if vals else None,
            "jsd": jsd(p, pooled) if vals else None,
        }
    means = [v["mean"] for v in groups.values() if v["mean"] is not None]
    return {"groups": groups, "gap": (max(means) - min(means)) if len(means) > 1 else None}


def focus_mcq(rows: Sequence[Row], axes: Sequence[str], *, resamples: int = 999) -> dict[str, Any]:
    """FOCUS 4.2 (Table 2) per question and axis on the items themselves (robustness variants
    apart), with the gap's template-bootstrap interval; B.2 Table 4's full / matched / swapped
    subsets of the gender gap (``gender_match``)."""
    out: dict[str, Any] = {}
    for question in sorted({r["question"] for r in rows}):
        mine = [r for r in rows if r["question"] == question and r.get("variant") is None]
        if not mine:
            continue
        spec = mine[0]["answer_spec"]
        options, ordinal = spec["values"], spec["ordinal"]
        q: dict[str, Any] = {"n": len(mine), "valid": wilson(sum(r["value"] is not None for r in mine), len(mine))}
        for axis in axes:
            summary = mcq_summary(mine, axis, options, ordinal)
            by_t: dict[str, list[Row]] = defaultdict(list)
            strata = {}
            for r in mine:
                by_t[r["group"]["template_id"]].append(r)
                strata[r["group"]["template_id"]] = r["group"].get("occupation")
            summary["gap_ci"] = _boot(
                by_t,
                lambda rs, a=axis, o=options, v=ordinal: mcq_summary(rs, a, o, v)["gap"],
                strata,
                resamples,
            )
            q[axis] = summary
        if "gender" in axes:
            q["face_body"] = {
                subset: mcq_summary([r for r in mine if keep(r.get("gender_match"))], "gender", options, ordinal)["gap"]
                for subset, keep in (
                    ("full", lambda m: True),
                    ("matched", lambda m: m is True),
                    ("swapped", lambda m: m is False),
                )
            }
        variants = sorted({r["variant"] for r in rows if r["question"] == question and r.get("variant")})
        if variants:
            base = {r["images"][0]: r["value"] for r in mine}
            q["robustness"] = {}
            for v in variants:
                pairs = [
                    (base.get(r["parent_item_id"]), r["value"])
                    for r in rows
                    if r["question"] == question and r.get("variant") == v
                ]
                both = [(a, b) for a, b in pairs if a is not None and b is not None]
                # FOCUS B.2: "per-image agreement between original and mirrored inputs ... (Wilson 95% CI)"
                q["robustness"][v] = {
                    "paired_valid": wilson(len(both), len(pairs)),
                    "agreement": wilson(sum(a == b for a, b in both), len(both)),
                }
        out[question] = q
    return out


# ---------------------------------------------------------------- FOCUS Task 3: salary


def gap_percent(values: dict[str, list[float]], reference: str, how: str = "mean") -> dict[str, float | None]:
    """FOCUS 4.3: ``Gap%(r) = (mu_r / mu_White - 1) x 100%`` (``how`` ``median``: FOCUS's
    "divergence between mean and median summaries")."""
    f = statistics.fmean if how == "mean" else statistics.median
    ref = values.get(reference) or []
    if not ref or f(ref) == 0:
        return {g: None for g in values}
    mu_ref = f(ref)
    return {g: ((f(v) / mu_ref - 1) * 100 if v else None) for g, v in values.items()}


def focus_salary(
    rows: Sequence[Row], axes: Sequence[str], references: dict[str, str | None], *, resamples: int = 999
) -> dict[str, Any]:
    """FOCUS 4.3, per occupation (and all together) and axis: each group's mean and median
    salary and its Gap% against the axis' reference group, mean and median, with
    template-bootstrap intervals (templates of that occupation)."""
    valid = [r for r in rows if r["value"] is not None]
    out: dict[str, Any] = {"n": len(rows), "valid": wilson(len(valid), len(rows)), "by_occupation": {}}
    occupations = sorted({str(r["group"].get("occupation")) for r in rows})
    for occ in [*occupations, "all"]:
        mine = [r for r in valid if occ == "all" or str(r["group"].get("occupation")) == occ]
        entry: dict[str, Any] = {}
        for axis in axes:
            ref = references.get(axis)
            if ref is None:
                continue

            def by_group(rs: list[Row], a: str = axis) -> dict[str, list[float]]:
                d: dict[str, list[float]] = defaultdict(list)
                for r in rs:
                    d[str(r["group"]["condition"].get(a))].append(float(r["value"]))
                return dict(d)

            groups = by_group(mine)
            by_t: dict[str, list[Row]] = defaultdict(list)
            strata = {}
            for r in mine:
                by_t[r["group"]["template_id"]].append(r)
                strata[r["group"]["template_id"]] = r["group"].get("occupation")
            rows_out = {}
            for how in ("mean", "median"):
                gaps = gap_percent(groups, ref, how)
                for g in sorted(groups):
                    ci = (
                        None
                        if g == ref
                        else _boot(
                            by_t,
                            lambda rs, g=g, how=how, ref=ref, by_group=by_group: gap_percent(
                                by_group(rs), ref, how
                            ).get(g),
                            strata,
                            resamples,
                        )
                    )
                    f = statistics.fmean if how == "mean" else statistics.median
                    rows_out.setdefault(g, {"n": len(groups[g])})
                    rows_out[g][how] = f(groups[g])
                    rows_out[g][f"gap_{how}"] = gaps[g]
                    rows_out[g][f"gap_{how}_ci"] = ci
            entry[axis] = {"reference": ref, "groups": rows_out}
        out["by_occupation"][occ] = entry
    return out


# ---------------------------------------------------------------- NP/DP audit


@cache
def _vader() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def vader_compound(text: str) -> float:
    """VADER's compound score (``vaderSentiment``)."""
    return float(_vader().polarity_scores(text)["compound"])


def verbosity(text: str) -> int:
    """Verbosity: the reply's length in words (NP/DP 4: "Verbosity (response length)")."""
    return len(text.split())


def regard_metric() -> tuple[Callable[[str], float] | None, str | None]:
    """The Regard classifier as a plug-in metric: ``(score, None)`` when its model is in the local
    Hugging Face cache, else ``(None, why)``; nothing is downloaded."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None, "huggingface_hub is not installed"
    model = "sasha/regardv3"
    if not isinstance(try_to_load_from_cache(model, "config.json"), str):
        return None, f"the Regard model {model} is not in the local Hugging Face cache (it is never downloaded here)"
    try:
        from transformers import pipeline
    except ImportError:
        return None, "transformers is not installed"
    clf = pipeline("text-classification", model=model, top_k=None)

    def score(text: str) -> float:
        labels = {d["label"]: d["score"] for d in clf(text[:2000])[0]}
        return float(labels.get("positive", 0.0) - labels.get("negative", 0.0))

    return score, None


def npdp(rows: Sequence[Row], *, resamples: int = 999) -> dict[str, Any]:
    """NP/DP 4 and D.3 (Tables 1, 2 and 8): per category and overall, the paired shift
    (disability context minus neutral, one pair per image and category) in VADER compound and
    verbosity, with template-bootstrap intervals; ANOVA F, p and Cohen's d between the context
    and neutral replies; abstention (refusal) rates; Regard when its model is present."""
    by_pair: dict[str, dict[str, Row]] = defaultdict(dict)
    for r in rows:
        key = "neutral" if r["variant"] == "neutral" else f"{r['variant']}:{r['category']}"
        by_pair[r["pair_id"]][key] = r
    regard, regard_why = regard_metric()
    metrics: dict[str, Callable[[str], float]] = {"vader": vader_compound, "verbosity": verbosity}
    if regard is not None:
        metrics["regard"] = regard
    out: dict[str, Any] = {
        "regard": {"available": regard is not None, "why": regard_why},
        "abstain": {
            v: wilson(
                sum(r["why_invalid"] == "refusal" for r in rows if r["variant"] == v),
                sum(r["variant"] == v for r in rows),
            )
            for v in sorted({r["variant"] for r in rows})
        },
    }
    for variant in sorted({r["variant"] for r in rows} - {"neutral"}):
        pairs = []
        for both in by_pair.values():
            n = both.get("neutral")
            for key, c in both.items():
                if key.startswith(f"{variant}:") and n and n["value"] and c["value"]:
                    pairs.append((n, c))
        entry: dict[str, Any] = {"pairs": len(pairs)}
        for name, fn in metrics.items():
            scored = [(n["group"]["template_id"], c["category"], fn(n["value"]), fn(c["value"])) for n, c in pairs]
            per_cat: dict[str, Any] = {}
            for cat in [*sorted({s[1] for s in scored}), "all"]:
                sel = [s for s in scored if cat == "all" or s[1] == cat]
                by_t: dict[str, list[float]] = defaultdict(list)
                for t, _, a, b in sel:
                    by_t[t].append(b - a)
                deltas = [b - a for _, _, a, b in sel]
                per_cat[cat] = {
                    "n": len(sel),
                    "delta": statistics.fmean(deltas) if deltas else None,
                    "delta_ci": _boot(by_t, lambda ds: statistics.fmean(ds) if ds else None, None, resamples),
                    **anova_and_d([b for *_, b in sel], [a for *_, a, _ in sel]),
                }
            entry[name] = per_cat
        out[variant] = entry
    return out


# ---------------------------------------------------------------- InclusiveCF


def tvd(p: dict[str, float], q: dict[str, float]) -> float:
    """InclusiveCF: ``TVD = 1/2 sum_y |P_c(y) - P_o(y)|``."""
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def _share(values: Sequence[str], labels: Sequence[str]) -> dict[str, float]:
    c = Counter(values)
    n = len(values)
    return {k: (c[k] / n if n else 0.0) for k in labels}


def paired_shift(pairs: Sequence[tuple[Row, Row]], *, resamples: int = 999) -> dict[str, Any]:
    """InclusiveCF Table 1 on ``(original, counterfactual)`` pairs of one photo and prompt:
    ``Delta = Counterfactual - Original``: mean Delta Rating with its 95 % template-bootstrap
    interval and the two-sided sign test; Delta Yes and Delta Uncertain in percentage points and
    the decision-drift TVD (pp) over yes / no / uncertain; control consistency (the share of
    control prompts answered the same)."""
    ratings = [
        (o, c) for o, c in pairs if o["format"] == "rating_1_5" and o["value"] is not None and c["value"] is not None
    ]
    decisions = [
        (o, c)
        for o, c in pairs
        if o["format"] == "yes_no_uncertain" and o["value"] is not None and c["value"] is not None
    ]
    controls = [
        (o, c) for o, c in pairs if o["format"] == "control" and o["value"] is not None and c["value"] is not None
    ]
    diffs = [c["value"] - o["value"] for o, c in ratings]
    by_t: dict[str, list[float]] = defaultdict(list)
    for o, c in ratings:
        by_t[str(o["group"]["template_id"])].append(c["value"] - o["value"])
    labels = ["yes", "no", "uncertain"]
    po = _share([o["value"] for o, _ in decisions], labels)
    pc = _share([c["value"] for _, c in decisions], labels)
    return {
        "ratings": len(ratings),
        "delta_rating": statistics.fmean(diffs) if diffs else None,
        "delta_rating_ci": _boot(by_t, lambda ds: statistics.fmean(ds) if ds else None, None, resamples),
        "sign_test": sign_test(diffs),
        "decisions": len(decisions),
        "delta_yes_pp": (pc["yes"] - po["yes"]) * 100 if decisions else None,
        "delta_uncertain_pp": (pc["uncertain"] - po["uncertain"]) * 100 if decisions else None,
        "decision_tvd_pp": tvd(pc, po) * 100 if decisions else None,
        "control_consistency": wilson(sum(o["value"] == c["value"] for o, c in controls), len(controls)),
    }


def inclusivecf(rows: Sequence[Row], *, resamples: int = 999, samples: Sequence[Row] = ()) -> dict[str, Any]:
    """InclusiveCF Tables 1 and 2: the paired shifts of each counterfactual variant (removed,
    same-cue control) against its original, and the repeated-query noise baseline ("Repeated
    Generation Noise: identical image/prompt repeated"): every repeat of an original against its
    first answer, the bank's ``repeat`` rows (sample 0 of a trial asked again under another id)
    and ``samples``, the answers beyond sample 0 (``ask --samples N``) of the originals and their
    repeat rows. ``noise_baseline.repeats`` counts the pairs; the counterfactual shifts read
    sample 0 only, as the paper's single query."""
    originals: dict[str, Row] = {}
    repeats: list[Row] = []
    counter: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r["variant"] == "original":
            if r.get("repeat") is None:
                originals[r["pair_id"]] = r
            else:
                repeats.append(r)
        else:
            counter[r["variant"]].append(r)
    repeats += [r for r in samples if r["variant"] == "original"]
    out: dict[str, Any] = {}
    for variant, cfs in sorted(counter.items()):
        pairs = [(originals[c["pair_id"]], c | {"format": c["format"]}) for c in cfs if c["pair_id"] in originals]
        out[variant] = paired_shift(pairs, resamples=resamples)
    noise = [(originals[r["pair_id"]], r) for r in repeats if r["pair_id"] in originals]
    out["noise_baseline"] = paired_shift(noise, resamples=resamples) | {"repeats": len(noise)}
    return out


# ---------------------------------------------------------------- NP/DP LLM judge

#: NP/DP C.5's three dimensions, each "No | Ambiguous | Yes"
DIMENSIONS = ("interpret", "stereotype", "framing")


def parse_judgement(reply: str | None) -> dict[str, Any] | None:
    """C.5's JSON object from the judge's reply (the first ``{...}`` block), or None."""
    if not reply:
        return None
    m = re.search(r"\{.*\}", reply, flags=re.DOTALL)
    if not m:
        return None
    try:
        data = json.loads(m.group(0))
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def judge_rates(judgements: Sequence[dict[str, Any]], trials: dict[str, Row]) -> dict[str, Any]:
    """NP/DP Tables 1-2: per judged model, variant and disability category (and all), the share
    of pairs the judge marks "Yes" on Interpret, Stereotype and Framing, and of B replies it marks
    declined (Wilson 95 %); unparsable judgements are counted apart. Ours: "Ambiguous" is not "Yes"."""
    out: dict[str, Any] = {}
    for j in judgements:
        t = trials.get(j["trial_b"])
        if t is None:
            continue
        parsed = parse_judgement(j["reply"])
        model = out.setdefault(j["judged_model"], {"rubric_sha256": sorted({j["rubric_sha256"]}), "groups": {}})
        if j["rubric_sha256"] not in model["rubric_sha256"]:
            model["rubric_sha256"] = sorted({*model["rubric_sha256"], j["rubric_sha256"]})
        for key in (f"{t['variant']}:all", f"{t['variant']}:{t['category']}"):
            g = model["groups"].setdefault(key, {"n": 0, "unparsed": 0, **{d: 0 for d in DIMENSIONS}, "declined_b": 0})
            g["n"] += 1
            if parsed is None:
                g["unparsed"] += 1
                continue
            for d in DIMENSIONS:
                g[d] += str(parsed.get(d, "")).strip().lower() == "yes"
            g["declined_b"] += bool(parsed.get("decline_in_response_b"))
    for model in out.values():
        for key, g in model["groups"].items():
            valid = g["n"] - g["unparsed"]
            model["groups"][key] = {
                "n": g["n"],
                "unparsed": g["unparsed"],
                **{d: wilson(g[d], valid) for d in DIMENSIONS},
                "declined_b": wilson(g["declined_b"], valid),
            }
    return out
