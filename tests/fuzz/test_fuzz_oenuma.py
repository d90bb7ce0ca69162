"""Whole Oenuma CRs from the API server, written by whoever may create one (a tenant): the
bounds check, the trim kept per CR, the set of CRs seen, the rule book and the CR parser.
Shaped like real CRs, with every list at, below and just past its bound and hostile leaves.
Nothing raises but the parser's RuleFileError; the rule book marks a CR malformed at most."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from anolisnuma.cluster.oenumas import OenumaSet, RuleBook, key_of, trim
from anolisnuma.policies.numa import oenuma_bounds as b
from anolisnuma.policies.numa.oenuma_bounds import entries_for_node
from anolisnuma.policies.numa.oenuma_cr import parse_cr
from anolisnuma.policies.numa.rules import OENUMA_API_VERSION, OENUMA_KIND, RuleFileError
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.testing.fuzzing import assert_linear, fuzz_settings, outcome

NODE = "worker-1"
TOPO = NumaTopology.build({0: "0-3", 1: "4-7"})


def at_bound(limit, text="a"):
    """Strings just under, at and just past a length bound."""
    return st.sampled_from([limit - 1, limit, limit + 1]).map(lambda n: (text * n)[:n])


hostile_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "*", "?", "[a-z]", "web-*", "a*b?c", "Web", "ns/name", "\x00", "\u212a", "..",
                     "*?" * 4, "*?" * 5, "a*" * 9, "kube-system", "t", NODE, NODE.upper() + " "]),
    at_bound(b.MAX_NAME), at_bound(b.MAX_NAMESPACE), at_bound(b.MAX_NAME, "*"),
)
numbers = st.one_of(st.integers(-3, 3), st.sampled_from([b.MAX_NUMA_NUM, b.MAX_NUMA_NUM + 1, 2 ** 63, -2 ** 63,
                                                          10 ** 300]))
cpu_lists = st.one_of(
    st.sampled_from(["0-3", "4-7", "0", "0-7:1/2", "0-65535", "0-65536", "1-0", " 0 , 1 ", "", "0-3:0/0",
                     "0-0:4096/4096", "0,,1"]),
    st.text(alphabet="0123456789,-:/ ", max_size=20),
    at_bound(b.MAX_CPU_LIST, "0,"),
)
leaves = st.one_of(hostile_text, numbers, cpu_lists, st.booleans(), st.none(), st.floats(),
                   st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@st.composite
def maybe(draw, odd, usual):
    """Mostly the usual kind of value, else (about 1 in 10) anything. (Not a draw of 0:
    Hypothesis draws the ends of a range more often than the middle.)"""
    return draw(odd) if draw(st.integers(0, 9)) == 5 else draw(usual)


def repeated(item, limit):
    """A list of one drawn item, at lengths around its bound (the item is shared: cheap)."""
    return st.tuples(item, st.sampled_from([0, 1, 2, limit - 1, limit, limit + 1])).map(lambda t: [t[0]] * t[1])


# The usual values are what a real CR holds; `maybe` puts a hostile one in their place.
pod_names = maybe(hostile_text, st.sampled_from(["web-0", "web-*", "db-?", "*", "api"]))
namespaces = maybe(hostile_text, st.sampled_from(["tenant-a", "ops", "t*", "kube-system"]))
numa_nums = maybe(numbers, st.integers(0, 2))
affinity_item = maybe(leaves, st.fixed_dictionaries(
    {"podName": maybe(leaves, pod_names), "numaNum": maybe(leaves, numa_nums)},
    optional={"namespace": maybe(leaves, namespaces)}))
numa_item = maybe(leaves, st.fixed_dictionaries(
    {"numaNum": maybe(leaves, numa_nums)}, optional={"cpuset": maybe(leaves, cpu_lists), "memset": maybe(leaves, cpu_lists)}))
node_entry = maybe(leaves, st.fixed_dictionaries(
    {"name": maybe(leaves, st.sampled_from([NODE, NODE, NODE, "worker-2", " Worker-1 "])),
     "podAffinity": maybe(leaves, st.one_of(st.lists(affinity_item, min_size=1, max_size=4),
                                            repeated(affinity_item, b.MAX_AFFINITY)))},
    optional={"numa": maybe(leaves, st.one_of(st.lists(numa_item, max_size=3), repeated(numa_item, b.MAX_NUMA)))}))


@st.composite
def node_lists(draw):
    entries = draw(st.lists(node_entry, min_size=1, max_size=4))
    copies = draw(st.sampled_from([0, 0, 0, b.MAX_SAME_NODE - 1, b.MAX_SAME_NODE]))   # (+ the one above: past it)
    entries += [{"name": NODE}] * copies
    padding = draw(st.sampled_from([0, 0, 0, b.MAX_NODES - len(entries), b.MAX_NODES + 1 - len(entries)]))
    entries += [{"name": "other"}] * max(padding, 0)
    return entries


# (nodeIndex and refused are what the daemon adds to what it keeps: found in a planted
# cluster-oenumas.json, or in a CR whose schema let unknown fields through)
crs = st.tuples(st.fixed_dictionaries({
    "apiVersion": maybe(leaves, st.just(OENUMA_API_VERSION)),
    "kind": maybe(leaves, st.just(OENUMA_KIND)),
    "metadata": maybe(leaves, st.fixed_dictionaries(
        {"name": maybe(leaves, st.just("plan")), "namespace": maybe(leaves, st.sampled_from(["tenant-a", "ops"]))},
        optional={"uid": leaves, "generation": leaves, "resourceVersion": leaves})),
    "spec": maybe(leaves, st.fixed_dictionaries({"node": maybe(leaves, node_lists())})),
}), maybe(st.fixed_dictionaries({}, optional={"nodeIndex": st.lists(numbers, max_size=3), "refused": leaves}),
          st.just({}))).map(lambda t: {**t[0], **t[1]})


def size_of(obj):
    return len(json.dumps(obj, default=repr))


def kept_of(obj):
    """``trim`` as the daemon calls it: on an object with a key (``trim`` reads the
    metadata that ``key_of`` found to be a mapping)."""
    return trim(obj, NODE) if key_of(obj) is not None else None


def everything(obj):
    """The daemon's path for one CR: bounds, trim, the set of CRs, the rule book."""
    at, why = entries_for_node(obj, NODE)
    kept = kept_of(obj)
    seen = OenumaSet(NODE)
    seen.upsert(obj)
    book = RuleBook(NODE, TOPO, trusted=["ops"])
    return at, why, kept, book.rules_of(seen.mine()[1])


@fuzz_settings(150)
@given(crs)
def test_a_cr_is_kept_refused_or_ignored_never_an_exception(obj):
    # given a CR shaped like a real one, with hostile parts
    # when the daemon takes it in
    (at, why, kept, rules), _ = outcome("oenuma-cr", lambda: everything(obj), size=size_of(obj))
    # then it is ignored (not naming the node), refused over a bound, or parsed into rules
    # or a malformed mark, as one CR
    if key_of(obj) is None:
        assert kept is None and rules == []
        return
    assert (at is None) == (kept is None)
    if kept is None:
        assert rules == []
        return
    assert ("refused" in kept) == bool(why)
    [cr] = rules
    assert cr.refused == ("refused" in kept or isinstance(obj.get("refused"), str))
    assert isinstance(cr.error, str) and len(cr.error) <= 500


@fuzz_settings(150)
@given(crs, st.booleans())
def test_the_parser_of_a_kept_cr_gives_rules_or_its_own_error(obj, trusted):
    # given what the daemon keeps of a CR that names the node within the bounds
    kept = kept_of(obj)
    if kept is None or "refused" in kept:
        return
    # when it is parsed, then it is rules or a RuleFileError; and the rule book says the same
    parsed, error = outcome("oenuma-cr", lambda: parse_cr(kept, "fuzz", NODE, TOPO, trusted), (RuleFileError,),
                            size=size_of(kept))
    cr = RuleBook(NODE, TOPO, ["tenant-a", "ops"] if trusted else []).parse(("tenant-a", "plan"), kept)
    assert bool(cr.error) == (error is not None)
    if parsed is not None:
        assert parsed.entries >= 1 and parsed.patterns <= len(parsed.rules)


@fuzz_settings(100)
@given(crs)
def test_what_is_kept_of_a_cr_is_kept_again_unchanged(obj):
    # given what the daemon keeps of a CR (and saves in cluster-oenumas.json)
    kept = kept_of(obj)
    if kept is None or "refused" in kept:
        return
    # when it is trimmed again (the saved file read back), then it is the same
    assert trim(kept, NODE) == kept


@fuzz_settings(3)
@given(node_entry)
def test_time_is_linear_in_the_entries(entry):
    # given a CR of one drawn entry and n entries for other nodes
    def make(n):
        return {"apiVersion": OENUMA_API_VERSION, "kind": OENUMA_KIND, "metadata": {"name": "p", "namespace": "ops"},
                "spec": {"node": [entry] + [{"name": f"worker-{i}", "podAffinity": [{"podName": "x"}] * 3}
                                            for i in range(n)]}}
    # when the daemon takes it in, then 30x the entries cost no more than 90x the time
    assert_linear("oenuma-cr", make, everything, small=40, size=size_of)
