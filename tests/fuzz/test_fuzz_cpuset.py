"""CPU and memory node lists (``CpuSet.parse``): written by the kernel, the kubelet, an
Oenuma's author and containerd. Every text is a set or a CpuSetError, read as the kernel
reads it, printed back to itself, at a cost linear in the text and bounded by the CPUs it
names (the grouped form ``A-B:U/G`` included)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from anolisnuma.policies.numa.cpuset import MAX_CPU, CpuSet, CpuSetError
from anolisnuma.testing.fuzzing import PARSERS, assert_linear, cpu_per_call, forget, fuzz_settings, outcome

OWN = (CpuSetError,)

# Numbers around every edge the parser has: 0, MAX_CPU, the int() digit limit, 2^31/2^64.
numbers = st.one_of(
    st.integers(0, 80),
    st.integers(MAX_CPU - 40, MAX_CPU + 40),
    st.sampled_from([2 ** 31, 2 ** 32, 2 ** 63, 2 ** 64, 10 ** 19, 10 ** 40]),
)
U32 = 2 ** 32 - 1
digit_runs = st.integers(6, 6000).map(lambda n: "9" * n)   # up to past int()'s 4300 digits
number_text = st.one_of(numbers.map(str), numbers.map(lambda n: "00" + str(n)), digit_runs)


@st.composite
def items(draw):
    """One item as ``(text, its CPUs or None when the kernel refuses it)``."""
    kind = draw(st.sampled_from(["n", "range", "grouped", "junk"]))
    if kind == "junk":
        return draw(st.text(alphabet="0123456789-:/+x \u0663\u00a0", min_size=1, max_size=12)), "?"
    texts = [draw(number_text) for _ in range({"n": 1, "range": 2, "grouped": 4}[kind])]
    text = {"n": "{}", "range": "{}-{}", "grouped": "{}-{}:{}/{}"}[kind].format(*texts)
    if any(len(t) > 10 or int(t) > U32 for t in texts):
        # The kernel reads numbers up to 2^32-1 (leading zeros and all), the parser numbers
        # of up to 10 characters: where they differ (a group of 2^32, a CPU written
        # 000000000001) only properties 1-3 are checked, not which of the two it follows.
        return text, "?"
    return text, kernel_cpus([int(t) for t in texts])


def kernel_cpus(values):
    """What the kernel's bitmap_parselist makes of an item's numbers; None: it refuses them."""
    first, last = values[0], values[-1] if len(values) < 4 else values[1]
    if last < first or last > MAX_CPU:
        return None
    if len(values) < 4:
        return set(range(first, last + 1))
    used, group = values[2], values[3]
    if not 0 < used <= group:
        return None
    if (last - first) // group > 2000:
        return "?"   # (the model below would take too long: only properties 1-3 are checked)
    return {c for s in range(first, last + 1, group) for c in range(s, min(s + used, last + 1))}


@fuzz_settings(300)
@given(st.lists(items(), max_size=12), st.sampled_from([",", ", ", " ,", ",\n"]))
@example([("0-0:100000000/100000000", {0})], ",")   # a group of 10^8 built a 10^8-bit integer
@example([("0-0:18446744073709551616/18446744073709551616", "?")], ",")   # (2^64: OverflowError)
@example([("1" * 5000, "?")], ",")                   # past int()'s digit limit: its ValueError
def test_any_list_is_a_set_or_the_parsers_error(listed, comma):
    # given a list of items, some the kernel would refuse
    text = comma.join(t for t, _ in listed)
    # when it is parsed
    got, error = outcome("cpuset", lambda: CpuSet.parse(text), OWN, size=len(text))
    # then it is the set the kernel reads, or refused when the kernel refuses an item
    expected = [cpus for _, cpus in listed]
    if "?" in expected:
        return
    if None in expected:
        assert error is not None, text
    else:
        assert error is None, (text, error)
        assert set(got) == set().union(*expected)


@fuzz_settings(150)
@given(st.text(max_size=300))
def test_any_text_is_a_set_or_the_parsers_error(text):
    got, _ = outcome("cpuset", lambda: CpuSet.parse(text), OWN, size=len(text))
    if got is not None:
        assert CpuSet.parse(str(got)) == got


@fuzz_settings(150)
@given(st.sets(st.one_of(st.integers(0, 300), st.integers(0, MAX_CPU)), max_size=400))
def test_a_set_printed_reads_back_as_itself(cpus):
    # given a set, when it is printed and read back, then it is the same set
    s = CpuSet(cpus)
    text = str(s)
    got, error = outcome("cpuset", lambda: CpuSet.parse(text), OWN, size=len(text))
    assert error is None and got == s


@st.composite
def valid_items(draw):
    """An item the kernel reads, spanning at most 1024 CPUs (the grouped form's cost over
    wide spans is the next test's)."""
    first = draw(st.integers(0, MAX_CPU - 1024))
    last = first + draw(st.integers(0, 1024))
    kind = draw(st.sampled_from(["n", "range", "grouped"]))
    if kind == "n":
        return str(first)
    if kind == "range":
        return f"{first}-{last}"
    group = draw(st.integers(1, 64))
    return f"{first}-{last}:{draw(st.integers(1, group))}/{group}"


@fuzz_settings(4)
@given(st.lists(valid_items(), min_size=1, max_size=6))
def test_time_is_linear_in_the_items(unit):
    # given a list of valid items, repeated into a list 64 times longer
    body = ",".join(unit)

    def run(text):
        try:
            CpuSet.parse(text)
        except CpuSetError:
            pass
    # then it costs no more than the bound's times more
    assert_linear("cpuset", lambda n: ",".join([body] * n), run, small=2)


GROUPED_OVER_PLAIN = 16


@fuzz_settings(4)
@given(st.integers(0, 1000), st.integers(0, MAX_CPU - 1000), st.integers(1, 64), st.integers(1, 64))
@example(0, MAX_CPU, 1, 1)   # `0-65535:1/1`: 13 ms before, for 11 characters
def test_a_grouped_item_costs_about_what_the_plain_range_over_its_cpus_costs(first, span, group, used):
    # given an item of the grouped form and the plain range over the same CPUs
    used = min(used, group)
    grouped = ",".join([f"{first}-{first + span}:{used}/{group}"] * 32)
    plain = ",".join([f"{first}-{first + span}"] * 32)

    def cost(text):
        def call():
            forget()
            CpuSet.parse(text)
        return cpu_per_call(call, repeats=3)
    # when each is parsed, then the grouped one costs at most a bounded multiple: its cost
    # follows the CPUs it spans, not the product of its numbers
    took, base = cost(grouped), cost(plain)
    assert took <= GROUPED_OVER_PLAIN * base, (
        f"{grouped[:40]}...: {took * 1e3:.2f} ms, the plain ranges {base * 1e3:.3f} ms")


def test_the_bounds_are_stated():
    assert PARSERS["cpuset"].memory_base >= 64 * 1024
