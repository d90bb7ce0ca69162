"""A pod's annotations and labels, written by the pod's author: its QoS level (anolisbox's
annotation, koordinator's label, rubik's preemptable mark), its LLC class, whether NUMA
placement manages it. None of these may raise: a value that is not one is a warning, and
another source decides. Also the kubelet's cgroup_parent, which the QoS admission parses."""

from __future__ import annotations

import uuid

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from anolisnuma.config import PathsConfig
from anolisnuma.policies.numa.rules import PinRule
from anolisnuma.policies.numa.selection import SKIP_KEY, PodSelector
from anolisnuma.policies.qos.config import LLC_CLASSES, QosConfig
from anolisnuma.policies.qos.levels import (
    ANNOTATION_LLC_LIMIT, ANNOTATION_QOS_LEVEL, LABEL_QOS_CLASS, PREEMPTABLE, QosLevel, resolve_level,
)
from anolisnuma.policies.qos.resctrl import llc_class_for
from anolisnuma.qos.service import QosService
from anolisnuma.system.cgroups import KubeQosClass
from anolisnuma.testing.fake_kernel import FakeKernel
from anolisnuma.testing.fuzzing import assert_linear, fuzz_settings, outcome

CONFIG = QosConfig()
KEYS = [ANNOTATION_QOS_LEVEL, LABEL_QOS_CLASS, PREEMPTABLE, ANNOTATION_LLC_LIMIT, SKIP_KEY, "app"]

# Values near the ones taken: each level and class in any case, with blanks, look-alikes
# (Unicode that folds to ASCII), NUL, and long ones.
near = st.sampled_from([lv.value for lv in QosLevel] + list(LLC_CLASSES) + [
    "true", "false", "True", "1", "yes", "on", "SYSTEM", "none", " be ", "be\n", "l\u017fe", "\u212ae", "BE\x00",
    "LS" + " " * 14, "LS" + " " * 15, "", "\t"])
values = st.one_of(near, near.map(str.swapcase), st.text(max_size=20), st.integers(1, 20_000).map(lambda n: "B" * n))
marks = st.dictionaries(st.sampled_from(KEYS), values, max_size=len(KEYS))


def size_of(*maps):
    return sum(len(k) + len(v) for m in maps for k, v in m.items())


@fuzz_settings(150)
@given(marks, marks, st.sampled_from([None, *KubeQosClass]))
def test_a_level_is_always_decided(annotations, labels, kube_class):
    # given any annotations and labels, when the pod's level is resolved
    decision, _ = outcome("qos-annotations",
                          lambda: resolve_level(annotations, labels, kube_class, CONFIG.kube_class_mapping),
                          size=size_of(annotations, labels))
    # then it is a level, from the first source that names one (the annotation first)
    assert isinstance(decision.level, QosLevel)
    asked = QosLevel.parse(annotations.get(ANNOTATION_QOS_LEVEL))
    if asked is not None:
        assert decision.level is asked and decision.source == "annotation"
    assert all(len(w) < 400 for w in decision.warnings)   # (values cut in warnings)


@fuzz_settings(100)
@given(st.sampled_from(list(QosLevel)), st.sampled_from(["", " ", "\t", "\n"]), st.booleans())
def test_a_level_written_in_any_case_with_blanks_reads_back_as_itself(level, blank, lower):
    text = blank + (level.value.lower() if lower else level.value) + blank
    assert QosLevel.parse(text) is level


@fuzz_settings(100)
@given(marks, st.sampled_from(list(QosLevel)))
def test_an_llc_class_is_always_decided(annotations, level):
    (cls, warning), _ = outcome("qos-annotations", lambda: llc_class_for(CONFIG.resctrl, level, annotations),
                                size=size_of(annotations))
    assert cls in LLC_CLASSES
    assert (warning is None) == (annotations.get(ANNOTATION_LLC_LIMIT) is None or
                                 annotations[ANNOTATION_LLC_LIMIT].strip(" \t\r\n").lower() in LLC_CLASSES
                                 and len(annotations[ANNOTATION_LLC_LIMIT]) <= 16
                                 and annotations[ANNOTATION_LLC_LIMIT].isascii())


@pytest.fixture(scope="module")
def admission():
    with FakeKernel.temporary(resctrl={}) as fk:
        service = QosService(QosConfig(), PathsConfig(**fk.paths_table()), log=structlog.get_logger("fuzz"))
        parent = f"/kubepods/besteffort/pod{uuid.UUID(int=7)}"
        fk.make_pod(parent)
        yield service.admission, parent


cgroup_parents = st.one_of(
    st.sampled_from(["", "/", "/kubepods", f"/kubepods/besteffort/pod{uuid.UUID(int=7)}",
                     f"/kubepods/burstable/pod{uuid.UUID(int=8)}", "kubepods-besteffort-pod1_2.slice",
                     "/kubepods/../../etc", "/kubepods/besteffort/pod" + "a" * 600]),
    st.text(alphabet="/kubepods-_.slice0123456789abcdef", max_size=80), st.text(max_size=40))


@fuzz_settings(120)
@given(marks, marks, cgroup_parents)
def test_the_qos_admission_decides_or_skips_a_pod_never_raises(admission, annotations, labels, cgroup_parent):
    # given a pod's markings and the cgroup_parent the kubelet sent
    decide, known = admission
    # when it is admitted, then it is managed with a level, or skipped (None)
    pod, _ = outcome("qos-annotations", lambda: decide.decide(str(uuid.UUID(int=7)), "ns/p", labels, annotations,
                                                            cgroup_parent),
                     size=size_of(annotations, labels) + len(cgroup_parent))
    if cgroup_parent == known:
        assert pod is not None and isinstance(pod.level, QosLevel)


@fuzz_settings(3)
@given(st.sampled_from([ANNOTATION_QOS_LEVEL, LABEL_QOS_CLASS, PREEMPTABLE, ANNOTATION_LLC_LIMIT]),
       st.sampled_from("bB \t\u017f"))
def test_time_is_linear_in_the_values(key, char):
    # given a marking whose value is n characters long
    def make(n):
        return {key: char * n, "app": "x" * n}

    def run(marked):
        resolve_level(marked, marked, None, CONFIG.kube_class_mapping)
        llc_class_for(CONFIG.resctrl, QosLevel.LS, marked)
    assert_linear("qos-annotations", make, run, small=2000, size=lambda m: size_of(m))


# ---------------------------------------------------------------- NUMA selection

CONFIG_PATTERNS = ["web-*", "*-canary", "team-?/*", "[ab]*x"]
CLUSTER_RULES = [PinRule("tenant-a", "db-*", (0,), from_cluster=True, selects=False),
                 PinRule("ops", "*a*b*c", (1,), from_cluster=True),
                 PinRule("*", "exact", (0,), source="rule file")]
SELECTOR = PodSelector(["numa-*", "prod"], CONFIG_PATTERNS, CLUSTER_RULES)
names = st.one_of(st.sampled_from(["web-0", "a-canary", "db-1", "exact", "aabbcc", "", "/", "*", "x" * 300]),
                  st.text(max_size=30))


@fuzz_settings(150)
@given(names, names, marks, marks)
def test_a_pod_is_selected_or_not_never_an_exception(namespace, name, annotations, labels):
    sel, _ = outcome("numa-selection", lambda: SELECTOR.select(namespace, name, annotations, labels),
                     size=len(namespace) + len(name) + size_of(annotations, labels))
    # then an opted-out pod is never managed, and a managed one says why
    opted_out = any(m.get(SKIP_KEY, "").strip().lower() in ("true", "1", "yes", "on") for m in (annotations, labels))
    assert not (opted_out and sel.managed)
    assert sel.why or not sel.managed


@fuzz_settings(3)
@given(st.sampled_from(["a", "ab", "web-", "-canary", "aab"]))
def test_time_is_linear_in_the_names(unit):
    # given a pod whose namespace and name repeat a unit n times (the worst for the patterns)
    def make(n):
        return unit * n

    def run(text):
        SELECTOR.with_rules(CLUSTER_RULES).select(text, text, {SKIP_KEY: text}, {})
    assert_linear("numa-selection", make, run, small=200)
