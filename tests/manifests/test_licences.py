"""Source licences combine as the Creative Commons compatibility chart says, or the push stops.

Expected answers come from Creative Commons' licence compatibility chart
(https://wiki.creativecommons.org/wiki/Wiki/cc_license_compatibility): an adaptation of BY
material may carry BY-SA or BY-NC, BY-SA material only BY-SA, and ND material none.
"""

from __future__ import annotations

import pytest

from counterfactory.manifests.licences import LicenceError, combine_licences, hub_licence_fields, parse_licence


@pytest.mark.parametrize(
    ("text", "hub_id"),
    [
        ("public domain (NASA)", "cc0-1.0"),
        ("CC0", "cc0-1.0"),
        ("CC BY 4.0", "cc-by-4.0"),
        ("cc-by-sa-4.0", "cc-by-sa-4.0"),
        ("CC BY-NC-SA 3.0", "cc-by-nc-sa-3.0"),
        ("CC-BY-NC", "cc-by-nc-4.0"),
        ("MIT", "mit"),
    ],
)
def test_parse_known_licences(text, hub_id):
    assert parse_licence(text).hub_id == hub_id


@pytest.mark.parametrize("text", [None, "", "unknown", "All rights reserved", "see sources", "Getty editorial"])
def test_parse_unknown_licences(text):
    assert parse_licence(text) is None


@pytest.mark.parametrize(
    ("licences", "expected"),
    [
        (["public domain (NASA)", "public domain (White House)"], "cc0-1.0"),
        (["public domain", "CC BY 4.0"], "cc-by-4.0"),
        (["CC BY 4.0", "CC BY-SA 4.0"], "cc-by-sa-4.0"),
        (["CC BY 4.0", "CC BY-NC 4.0", "CC0"], "cc-by-nc-4.0"),
        (["CC BY-NC 4.0", "CC BY-NC-SA 4.0"], "cc-by-nc-sa-4.0"),
    ],
)
def test_compatible_sources_take_the_strictest_licence(licences, expected):
    decision = combine_licences([(f"s{i}", text) for i, text in enumerate(licences)])
    assert decision.hub_id == expected
    assert sorted(i for ids in decision.sources_by_licence.values() for i in ids) == [
        f"s{i}" for i in range(len(licences))
    ]


@pytest.mark.parametrize(
    ("licences", "message", "named"),
    [
        (["CC BY-SA 4.0", "CC BY-NC 4.0"], "cannot absorb", ["photo_0", "photo_1"]),
        (["CC BY-SA 4.0", "CC BY-SA 3.0"], "share-alike sources require different licences", ["photo_0", "photo_1"]),
        (["CC BY 4.0", "CC BY-ND 4.0"], "no-derivatives", ["photo_1"]),
        (["CC BY 2.0", "CC BY 4.0"], "different licence versions", ["photo_0", "photo_1"]),
    ],
)
def test_conflicting_sources_are_refused_naming_them(licences, message, named):
    with pytest.raises(LicenceError, match=message) as info:
        combine_licences([(f"photo_{i}", text) for i, text in enumerate(licences)])
    assert [f"photo_{i}" for i in range(len(licences)) if f"photo_{i}" in str(info.value)] == named


def test_unknown_licence_names_the_rows_and_the_fix():
    with pytest.raises(LicenceError, match="missing or unknown licence") as info:
        combine_licences([("ok", "CC0"), ("mystery", "Getty editorial"), ("blank", None)])
    text = str(info.value)
    assert "mystery ('Getty editorial')" in text and "blank (None)" in text and "ok" not in text.split(":")[1]
    assert "metadata" in text


def test_declared_licence_must_honour_the_sources():
    assert combine_licences([("a", "CC BY 4.0")], declared="CC BY-NC 4.0").hub_id == "cc-by-nc-4.0"
    assert combine_licences([("a", "CC BY 4.0")], declared="see sources").hub_id == "cc-by-4.0"
    with pytest.raises(LicenceError, match="looser than the sources allow"):
        combine_licences([("a", "CC BY-NC 4.0")], declared="CC BY 4.0")


def test_a_version_the_hub_does_not_list_goes_in_as_other_with_its_deed():
    assert hub_licence_fields("cc-by-sa-4.0") == {"license": "cc-by-sa-4.0"}
    assert hub_licence_fields("cc-by-sa-2.0") == {
        "license": "other",
        "license_name": "cc-by-sa-2.0",
        "license_link": "https://creativecommons.org/licenses/by-sa/2.0/",
    }
