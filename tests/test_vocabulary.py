"""One vocabulary per meaning: a record's status, how an attempt leaves its record, what begin found and
what a transition answered are four enums whose members equal their own text (and hash as it) but never
a member of another; and an operator's verdict is normalised in one place."""

from __future__ import annotations

import json

import pytest

from airlock_redis.core.records import BeginKind, Settlement, Status, TransitionResult
from airlock_redis.core.verdicts import parse_verdict
from airlock_redis.stores.base import check_verdict

VOCABULARIES = (Status, Settlement, BeginKind, TransitionResult)


def test_members_of_two_vocabularies_never_compare_equal() -> None:
    assert Settlement.UNKNOWN != Status.UNKNOWN
    assert not Settlement.UNKNOWN == Status.UNKNOWN  # noqa: SIM201  # both operators, both ways
    assert BeginKind.COMMITTED != Status.COMMITTED and Status.COMMITTED != BeginKind.COMMITTED
    assert BeginKind.MISMATCH != TransitionResult.MISMATCH
    for one in VOCABULARIES:
        for other in VOCABULARIES:
            if one is not other:
                for member in one:
                    assert all(member != theirs for theirs in other), (member, other)


@pytest.mark.parametrize("member", [m for vocabulary in VOCABULARIES for m in vocabulary])
def test_a_member_equals_its_text_hashes_as_it_and_serialises_as_it(member: Status) -> None:
    text = member.value
    assert member == text and text == member and not member != text  # noqa: SIM202
    by_member: dict[object, int] = {member: 2}
    assert {text: 1}[member] == 1 and by_member[text] == 2
    assert json.dumps(member) == json.dumps(text)
    assert type(member)(text) is member


@pytest.mark.parametrize(
    ("given", "verdict"),
    [
        ("committed", Status.COMMITTED),
        (Status.COMMITTED, Status.COMMITTED),
        ("unknown", Status.UNKNOWN),
        (Status.UNKNOWN, Status.UNKNOWN),
        (Settlement.UNKNOWN, Status.UNKNOWN),
        ("release", Settlement.RELEASE),
        (Settlement.RELEASE, Settlement.RELEASE),
    ],
)
def test_one_normaliser_for_a_verdict_used_by_the_guard_and_the_stores(
    given: object, verdict: object
) -> None:
    assert parse_verdict(given) is verdict  # type: ignore[arg-type]
    assert check_verdict(given) is verdict  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["pending", Status.PENDING, "released", "", "COMMITTED"])
def test_a_verdict_that_is_not_one_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="committed, unknown or release"):
        check_verdict(bad)  # type: ignore[arg-type]
