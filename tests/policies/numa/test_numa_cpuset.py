"""CpuSet: the kernel list format and set arithmetic."""

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anolisnuma.policies.numa.cpuset import EMPTY, MAX_CPU, CpuSet, CpuSetError, union_all


@pytest.mark.parametrize("text,members", [
    ("", []),
    ("   \n", []),
    ("0", [0]),
    ("0-3", [0, 1, 2, 3]),
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
    ("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]),
    (" 1 , 3-4 ", [1, 3, 4]),
    ("3,1,2", [1, 2, 3]),
    ("0-3,2-5", [0, 1, 2, 3, 4, 5]),
    ("0-15:2/4", [0, 1, 4, 5, 8, 9, 12, 13]),
    ("127", [127]),
])
def test_parse_reads_the_kernel_list_format(text, members):
    assert list(CpuSet.parse(text)) == members


@pytest.mark.parametrize("garbage", [
    "a", "1-", "-1", "1,,2", ",", "1-2-3", "3-1", "1 2", "0x3", "1.5", "0-3:0/4", "0-3:5/4",
    f"0-{MAX_CPU + 1}", "९",
])
def test_parse_rejects_garbage(garbage):
    with pytest.raises(CpuSetError):
        CpuSet.parse(garbage)


def test_parse_rejects_non_strings():
    with pytest.raises(CpuSetError):
        CpuSet.parse(None)  # type: ignore[arg-type]


def test_prints_canonical_ranges():
    assert str(CpuSet([0, 1, 2, 3, 8, 10, 11])) == "0-3,8,10-11"
    assert str(CpuSet.parse(" 3,2,1,0 ")) == "0-3"
    assert str(EMPTY) == ""
    assert repr(CpuSet.parse("1,3")) == "CpuSet('1,3')"


def test_set_arithmetic():
    a, b = CpuSet.parse("0-7"), CpuSet.parse("4-11")
    assert str(a | b) == "0-11"
    assert str(a & b) == "4-7"
    assert str(a - b) == "0-3"
    assert str(a ^ b) == "0-3,8-11"
    assert CpuSet.parse("4-5").issubset(a) and not b.issubset(a)
    assert a.issuperset(CpuSet.parse("1")) and a.isdisjoint(CpuSet.parse("8-9"))
    assert len(a) == 8 and bool(a) and not EMPTY
    assert 3 in a and 9 not in a and -1 not in a
    assert a.min() == 0 and b.max() == 11
    assert union_all([CpuSet([1]), CpuSet([5]), EMPTY]) == CpuSet.parse("1,5")
    assert CpuSet.range(2, 4) == CpuSet.parse("2-4") and CpuSet.range(4, 2) == EMPTY


def test_equality_hash_and_pickling():
    assert CpuSet.parse("0-3") == CpuSet([3, 2, 1, 0])
    assert len({CpuSet.parse("0-3"), CpuSet([0, 1, 2, 3])}) == 1
    assert CpuSet.parse("1") != "1"
    s = CpuSet.parse("0-3,9")
    assert pickle.loads(pickle.dumps(s)) == s


def test_bad_members_are_refused():
    with pytest.raises(CpuSetError):
        CpuSet([-1])
    with pytest.raises(CpuSetError):
        CpuSet([True])
    with pytest.raises(ValueError):
        EMPTY.min()


cpu_sets = st.sets(st.integers(min_value=0, max_value=300), max_size=60)


@settings(max_examples=200, deadline=None)
@given(cpu_sets, cpu_sets)
def test_behaves_like_a_python_set(xs, ys):
    a, b = CpuSet(xs), CpuSet(ys)
    assert CpuSet.parse(str(a)) == a
    assert list(a) == sorted(xs)
    assert len(a) == len(xs)
    assert set(a | b) == xs | ys
    assert set(a & b) == xs & ys
    assert set(a - b) == xs - ys
    assert a.issubset(b) == xs.issubset(ys)
    assert a.isdisjoint(b) == xs.isdisjoint(ys)
    ranges = a.ranges()
    assert sum(hi - lo + 1 for lo, hi in ranges) == len(xs)
    assert all(ranges[i][1] + 1 < ranges[i + 1][0] for i in range(len(ranges) - 1))
