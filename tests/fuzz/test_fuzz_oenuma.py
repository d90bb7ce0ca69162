"""Whole Oenuma CRs from the API server, written by whoever may create one (a tenant): the
bounds check, the trim kept per CR, the set of CRs seen, the rule book and the CR parser.
Shaped like real CRs, with every list at, below and just past its bound and hostile leaves.
Nothing raises but the parser's RuleFileError; the rule book marks a CR malformed at most."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st
from oenuma_shapes import NODE, TOPO, crs, node_entry

from anolisnuma.cluster.oenumas import OenumaSet, RuleBook, key_of, trim
from anolisnuma.policies.numa.oenuma_bounds import entries_for_node
from anolisnuma.policies.numa.oenuma_cr import parse_cr
from anolisnuma.policies.numa.rules import OENUMA_API_VERSION, OENUMA_KIND, RuleFileError
from anolisnuma.testing.fuzzing import assert_linear, fuzz_settings, outcome


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
    assert cr.refused == ("refused" in kept)   # (a "refused" the CR itself carries is not kept)
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


# Found by a long run (cluster/oenumas.py's placeholders, reported in issue 33): a
# namespace that is not a string is kept as "<dict>", which the parser takes as a namespace
# and a second trim (the saved file read back at start) refuses.
PLACEHOLDER = {"apiVersion": OENUMA_API_VERSION, "kind": OENUMA_KIND, "metadata": {"name": "plan", "namespace": "ops"},
               "spec": {"node": [{"name": NODE, "podAffinity": [{"podName": "web", "namespace": {}, "numaNum": 0}]}]}}


# Found by the next long run: the placeholder of a value that is no scalar (a list as a
# namespace, a list as a podAffinity item) was made again, differently, by a second trim.
PLACEHOLDER_TWICE = {"apiVersion": OENUMA_API_VERSION, "kind": OENUMA_KIND,
                     "metadata": {"name": "plan", "namespace": "ops"},
                     "spec": {"node": [{"name": NODE, "podAffinity": [{"podName": "web", "namespace": [], "numaNum": 0},
                                                                      [281474976710655, 2]]}]}}


@fuzz_settings(100)
@given(crs)
@example(PLACEHOLDER)
@example(PLACEHOLDER_TWICE)
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
