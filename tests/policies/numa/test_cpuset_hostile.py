"""CpuSet.parse on hostile strings (issue 33, H1 and H2): what a tenant's Oenuma, a rule
file or an NRI peer can write costs a bounded amount and fails with CpuSetError alone.

Time limits are ratios to a baseline parsed in the same test (CPU time of this thread, the
least of several repeats), so a busy machine does not fail them."""

import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anolisnuma.policies.numa import cpuset
from anolisnuma.policies.numa.cpuset import MAX_CPU, CpuSet, CpuSetError


def cpu_seconds(fn, repeats=5):
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def parse_or_error(text):
    try:
        return CpuSet.parse(text)
    except CpuSetError:
        return None


def kernel_grouped(first, last, used, group):
    """The kernel's bitmap_parselist for ``first-last:used/group``, one CPU at a time."""
    out = set()
    for start in range(first, last + 1, group):
        out.update(range(start, min(start + used, last + 1)))
    return out


def test_a_huge_group_costs_no_memory():
    # given the H1 string that built a 2^31-bit integer (558 MB peak)
    text = "0-0:2147483648/2147483648"
    # when it is parsed, then it is the one CPU the kernel would read, for a few kB
    assert peak_bytes(lambda: CpuSet.parse(text)) < 256 * 1024
    assert list(CpuSet.parse(text)) == [0]


@pytest.mark.parametrize("text", [
    "0-0:18446744073709551616/18446744073709551616",   # H2: OverflowError / MemoryError before
    "0-0:1/18446744073709551616",
    "1" * 5000,                                         # past int()'s digit limit: ValueError before
    "0-" + "9" * 4000,
    "0-3:" + "1" * 11 + "/4",
])
def test_numbers_too_long_are_the_parsers_own_error(text):
    with pytest.raises(CpuSetError) as caught:
        CpuSet.parse(text)
    assert len(str(caught.value)) < 300   # (the message quotes a hostile string cut short)


def test_grouped_ranges_cost_what_the_cpus_they_span_cost():
    # given 1 KiB of `0-65535:1/1` items (1.7 s of CPU before) and 1 KiB of plain
    # full ranges, which span as many CPUs
    grouped = ",".join(["0-65535:1/1"] * 85)
    plain = ",".join(["0-65535"] * 128)
    assert len(grouped) <= 1024 and len(plain) <= 1024
    # when each is parsed, then the grouped one costs no more than a few times the plain one
    base = cpu_seconds(lambda: cpuset._parse_mask_uncached(plain))
    hostile = cpu_seconds(lambda: cpuset._parse_mask_uncached(grouped))
    assert hostile <= 10 * base + 0.002, (hostile, base)
    assert len(CpuSet.parse(grouped)) == MAX_CPU + 1


def test_long_strings_are_not_kept_by_the_cache():
    cpuset._parse_mask_cached.cache_clear()
    CpuSet.parse(",".join(str(i) for i in range(0, 4000, 2)))
    CpuSet.parse("0-3")
    assert cpuset._parse_mask_cached.cache_info().currsize == 1


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(first=st.integers(0, 300), span=st.integers(0, 300), group=st.integers(1, 80), data=st.data())
def test_grouped_ranges_read_as_the_kernel_reads_them(first, span, group, data):
    used = data.draw(st.integers(1, group))
    text = f"{first}-{first + span}:{used}/{group}"
    assert set(CpuSet.parse(text)) == kernel_grouped(first, first + span, used, group)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.text(alphabet="0123456789-:/, ", max_size=200))
def test_any_string_of_list_characters_is_a_set_or_the_parsers_error(text):
    got = parse_or_error(text)
    if got is not None:
        assert CpuSet.parse(str(got)) == got
