"""Oenumas as the fuzz suite generates them (a CR from the API server, a document of a rule
file): shaped like real ones, every list at, below and just past its bound, and a hostile
value in place of any part now and then."""

from __future__ import annotations

from hypothesis import strategies as st

from anolisnuma.policies.numa import oenuma_bounds as b
from anolisnuma.policies.numa.rules import OENUMA_API_VERSION, OENUMA_KIND
from anolisnuma.policies.numa.topology import NumaTopology

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
