from __future__ import annotations

import pytest

from cachetier.errors import BadInputError, ConflictError, IntegrityError, NotFoundError, UsageError
from tests.versioning.helpers import make_version, put_shard
from versioning import RefStore, validate_ref_name


@pytest.fixture
def refs(store):
    return RefStore(store)


@pytest.fixture
def chain(store, objects):
    """Three versions v0 <- v1 <- v2."""
    ids = []
    for i in range(3):
        ids.append(make_version(store, objects, [put_shard(objects, [f"r{i}"])], tuple(ids[-1:]), f"v{i}"))
    return ids


@pytest.mark.parametrize(
    "name", ["main", "feature/x", "v1.0", "release-2024_05", "a/b/c", "ünïcode", "HEADish"]
)
def test_valid_names(name):
    assert validate_ref_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a..b",
        "has space",
        "tab\there",
        "ctl\x01",
        "-lead",
        "/lead",
        "trail/",
        "a//b",
        "end.",
        ".hidden",
        "a/.hidden",
        "x.lock",
        "a/b.lock/c",
        "tilde~1",
        "caret^",
        "co:lon",
        "q?",
        "st*r",
        "br[ack",
        "back\\slash",
        "at@{1}",
        "@",
        "del\x7f",
        "x" * 201,
    ],
)
def test_invalid_names_are_refused_quoting_the_name(name):
    with pytest.raises(BadInputError) as info:
        validate_ref_name(name, "branch")
    assert repr(name)[:60] in str(info.value) or "longer than" in str(info.value)
    assert "\n" not in str(info.value)


def test_branch_lifecycle(refs, chain):
    v0, v1, _ = chain
    assert refs.get_branch("main") is None
    refs.set_branch("main", v0, None)
    assert refs.get_branch("main") == v0
    refs.set_branch("main", v1, v0)
    assert refs.get_branch("main") == v1
    refs.create_branch("dev", v0)
    assert refs.list_branches() == {"dev": v0, "main": v1}
    assert refs.delete_branch("dev") == v0
    assert refs.list_branches() == {"main": v1}
    with pytest.raises(NotFoundError, match="dev"):
        refs.delete_branch("dev")


def test_set_branch_conflicts_say_conflict_and_what_to_do(refs, chain):
    v0, v1, v2 = chain
    refs.set_branch("main", v0, None)
    with pytest.raises(ConflictError) as info:
        refs.set_branch("main", v2, v1)  # stale expectation
    text = str(info.value)
    assert "conflict" in text and "'main'" in text and "retry" in text
    with pytest.raises(ConflictError, match="conflict"):
        refs.set_branch("main", v2, None)  # expected absent, but exists
    with pytest.raises(ConflictError, match="conflict"):
        refs.set_branch("other", v2, v0)  # expected a value, but absent
    assert refs.get_branch("main") == v0


def test_set_branch_refuses_unknown_versions(refs):
    with pytest.raises(NotFoundError, match="f" * 64):
        refs.set_branch("main", "f" * 64, None)
    with pytest.raises(BadInputError, match="'nope'"):
        refs.set_branch("main", "nope", None)


def test_create_branch_twice_and_path_clash(refs, chain):
    refs.create_branch("main", chain[0])
    with pytest.raises(UsageError, match="already exists"):
        refs.create_branch("main", chain[1])
    with pytest.raises(UsageError, match="clashes"):
        refs.create_branch("main/sub", chain[1])
    refs.create_branch("team/a", chain[1])
    with pytest.raises(UsageError, match="clashes"):
        refs.create_branch("team", chain[1])


def test_names_that_would_resolve_two_ways_are_refused(refs, chain):
    v0, v1, _ = chain
    refs.create_tag("v1", v1)
    refs.create_branch("main", v0)
    for make, name in [
        (refs.create_branch, "HEAD"),
        (refs.create_tag, "HEAD"),
        (refs.create_branch, v1),  # a whole version id
        (refs.create_tag, v0),
        (refs.create_branch, "v1"),  # a tag's name
        (refs.create_tag, "main"),  # a branch's name
    ]:
        with pytest.raises(UsageError, match=repr(name)):
            make(name, v0)
    assert refs.list_branches() == {"main": v0} and refs.list_tags() == {"v1": v1}
    assert refs.resolve(v1) == v1 and refs.resolve("v1") == v1
    refs.create_branch(v1[:12], v0)  # a short prefix may be a name: branches win (as in git)
    assert refs.resolve(v1[:12]) == v0


def test_tags_never_move(refs, chain):
    refs.create_tag("v1", chain[1])
    assert refs.get_tag("v1") == chain[1]
    with pytest.raises(UsageError, match="never move"):
        refs.create_tag("v1", chain[2])
    assert refs.list_tags() == {"v1": chain[1]}
    assert refs.get_tag("v1") == chain[1]


def test_resolve_branch_tag_id_prefix_and_ancestry(refs, chain):
    v0, v1, v2 = chain
    refs.set_branch("main", v2, None)
    refs.create_tag("first", v0)
    assert refs.resolve("main") == v2
    assert refs.resolve("first") == v0
    assert refs.resolve(v1) == v1
    assert refs.resolve(v1[:12]) == v1
    assert refs.resolve("main~1") == v1
    assert refs.resolve("main~") == v1
    assert refs.resolve("main~2") == v0
    assert refs.resolve("main~1~1") == v0
    assert refs.resolve("main~0") == v2
    assert refs.resolve(f"{v2[:8]}~2") == v0


def test_resolve_shortest_unique_prefix(refs, store, objects):
    ids = [make_version(store, objects, [], (), f"m{i}") for i in range(40)]
    # With 40 ids some pairs share their first hex digit; 4 digits are needed at least.
    for vid in ids:
        assert refs.resolve(vid[:10]) == vid
    with pytest.raises(NotFoundError, match="at least 4"):
        refs.resolve(ids[0][:3])


def test_resolve_ambiguous_prefix(refs, store):
    a, b = "abcd" + "0" * 60, "abcd" + "1" * 60
    store.put(f"versions/{a}", b"{}")
    store.put(f"versions/{b}", b"{}")
    with pytest.raises(BadInputError, match=r"ambiguous.*'abcd'.*2 versions") as info:
        refs.resolve("abcd")
    assert "abcd00000000" in str(info.value)
    assert refs.resolve("abcd1") == b


def test_resolve_unknown_refs_name_the_ref(refs, chain):
    refs.set_branch("main", chain[0], None)
    with pytest.raises(NotFoundError, match="'nosuch'"):
        refs.resolve("nosuch")
    with pytest.raises(NotFoundError, match="deadbeef"):
        refs.resolve("deadbeef")
    with pytest.raises(NotFoundError, match="e" * 64):
        refs.resolve("e" * 64)
    with pytest.raises(NotFoundError, match=r"main~1.*no parent"):
        refs.resolve("main~1")
    with pytest.raises(BadInputError, match="'a b'"):
        refs.resolve("a b")
    with pytest.raises(BadInputError):
        refs.resolve("~2")
    with pytest.raises(NotFoundError):
        refs.resolve("nosuch")
    assert isinstance(NotFoundError("x"), FileNotFoundError)


def test_branch_wins_over_prefix(refs, chain):
    v0, v1, _ = chain
    refs.set_branch(v1[:6], v0, None)
    assert refs.resolve(v1[:6]) == v0
    assert refs.resolve(v1[:7]) == v1


def test_corrupt_ref_is_an_integrity_error(refs, store):
    store.put("refs/heads/main", b"garbage\n")
    with pytest.raises(IntegrityError, match="refs/heads/main"):
        refs.get_branch("main")
