"""QoS level resolution: annotation, then label, then rubik's marking, then the kube QoS class."""

import pytest
from hypothesis import given, strategies as st

from anolisnuma.policies.qos.levels import (
    ANNOTATION_QOS_LEVEL, LABEL_QOS_CLASS, PREEMPTABLE, QosLevel, normalize_choice, resolve_level,
)
from anolisnuma.system.cgroups import KubeQosClass

MAPPING = {KubeQosClass.GUARANTEED: QosLevel.LS, KubeQosClass.BURSTABLE: QosLevel.LS,
           KubeQosClass.BESTEFFORT: QosLevel.BE}


def test_annotation_wins_over_label_and_kube_class():
    d = resolve_level({ANNOTATION_QOS_LEVEL: "LSE"}, {LABEL_QOS_CLASS: "BE"},
                      KubeQosClass.BESTEFFORT, MAPPING)
    assert (d.level, d.source) == (QosLevel.LSE, "annotation")
    assert ANNOTATION_QOS_LEVEL in d.why
    assert d.warnings == ()


def test_label_decides_without_annotation():
    d = resolve_level({}, {LABEL_QOS_CLASS: "LSR"}, KubeQosClass.BURSTABLE, MAPPING)
    assert (d.level, d.source) == (QosLevel.LSR, "label")


def test_kube_class_mapped_by_config():
    assert resolve_level({}, {}, KubeQosClass.BESTEFFORT, MAPPING).level is QosLevel.BE
    assert resolve_level({}, {}, KubeQosClass.GUARANTEED, MAPPING).level is QosLevel.LS
    custom = dict(MAPPING)
    custom[KubeQosClass.GUARANTEED] = QosLevel.LSR
    d = resolve_level({}, {}, KubeQosClass.GUARANTEED, custom)
    assert (d.level, d.source) == (QosLevel.LSR, "kube_class")


def test_no_source_at_all_is_ls_by_default():
    d = resolve_level({}, {}, None, MAPPING)
    assert (d.level, d.source) == (QosLevel.LS, "default")


def test_values_are_case_insensitive():
    assert resolve_level({ANNOTATION_QOS_LEVEL: "be"}, {}, None, MAPPING).level is QosLevel.BE
    assert resolve_level({ANNOTATION_QOS_LEVEL: " Lse "}, {}, None, MAPPING).level is QosLevel.LSE
    assert resolve_level({}, {LABEL_QOS_CLASS: "ls"}, None, MAPPING).level is QosLevel.LS


def test_unknown_annotation_warns_and_falls_back_to_label():
    d = resolve_level({ANNOTATION_QOS_LEVEL: "gold"}, {LABEL_QOS_CLASS: "BE"}, None, MAPPING)
    assert (d.level, d.source) == (QosLevel.BE, "label")
    assert len(d.warnings) == 1 and "'gold'" in d.warnings[0]


def test_unknown_label_warns_and_falls_back_to_kube_class():
    d = resolve_level({}, {LABEL_QOS_CLASS: "PLATINUM"}, KubeQosClass.BESTEFFORT, MAPPING)
    assert (d.level, d.source) == (QosLevel.BE, "kube_class")
    assert len(d.warnings) == 1


def test_koordinator_system_class_falls_back_quietly():
    d = resolve_level({}, {LABEL_QOS_CLASS: "SYSTEM"}, KubeQosClass.BURSTABLE, MAPPING)
    assert d.source == "kube_class" and d.warnings == ()


def test_hostile_values_are_cut_and_escaped_in_warnings():
    hostile = ["../../etc/passwd", "BE\x00", "x" * 10240, "B\udcffE", "/BE", "LS/../BE"]
    for value in hostile:
        d = resolve_level({ANNOTATION_QOS_LEVEL: value}, {}, KubeQosClass.BURSTABLE, MAPPING)
        assert d.level is QosLevel.LS and d.source == "kube_class"
        (w,) = d.warnings
        assert len(w) < 300
        w.encode("ascii")  # printable in any log sink: NUL, surrogates escaped


@given(st.text(max_size=200))
def test_any_string_resolves_to_a_level(value):
    d = resolve_level({ANNOTATION_QOS_LEVEL: value}, {LABEL_QOS_CLASS: value}, None, MAPPING)
    assert isinstance(d.level, QosLevel)
    for w in d.warnings:
        w.encode("ascii")


def test_normalize_choice_rejects_non_strings():
    assert normalize_choice(None, ["LS"]) is None
    assert normalize_choice(b"LS", ["LS"]) is None
    assert normalize_choice("ls", ["LS"]) == "LS"


# ------------------------------------------------------------------ rubik's volcano.sh/preemptable

def test_rubiks_marking_comes_after_anolisbox_and_koordinator_and_before_the_kube_class():
    d = resolve_level({PREEMPTABLE: "true"}, {}, KubeQosClass.GUARANTEED, MAPPING)
    assert (d.level, d.source) == (QosLevel.BE, "annotation") and "rubik: offline" in d.why
    d = resolve_level({PREEMPTABLE: "false"}, {}, KubeQosClass.BESTEFFORT, MAPPING)
    assert (d.level, d.source) == (QosLevel.LS, "annotation") and "rubik: online" in d.why
    assert resolve_level({ANNOTATION_QOS_LEVEL: "LSE", PREEMPTABLE: "true"}, {}, None, MAPPING).level is QosLevel.LSE
    assert resolve_level({PREEMPTABLE: "true"}, {LABEL_QOS_CLASS: "LSR"}, None, MAPPING).level is QosLevel.LSR


def test_rubiks_label_counts_and_a_true_anywhere_wins_as_in_rubik():
    d = resolve_level({}, {PREEMPTABLE: "true"}, KubeQosClass.BURSTABLE, MAPPING)
    assert (d.level, d.source) == (QosLevel.BE, "label")
    d = resolve_level({PREEMPTABLE: "false"}, {PREEMPTABLE: "true"}, KubeQosClass.BURSTABLE, MAPPING)
    assert (d.level, d.source) == (QosLevel.BE, "label")


def test_rubiks_values_are_read_exactly_as_rubik_reads_them():
    # rubik takes anything but "true" for online; here anything but true/false is warned
    # about and the next source decides (a "True" meant offline would otherwise be online)
    for value in ("True", "TRUE", " true", "true\n", "yes", "1", "", "offline", "t" * 10240, "tr\x00ue",
                  "\uff54\uff52\uff55\uff45", "../../x", "B\udcffE"):
        d = resolve_level({PREEMPTABLE: value}, {}, KubeQosClass.BESTEFFORT, MAPPING)
        assert (d.level, d.source) == (QosLevel.BE, "kube_class"), repr(value)
        (w,) = d.warnings
        assert len(w) < 300 and PREEMPTABLE in w
        w.encode("ascii")


@pytest.mark.parametrize("value", [None, 1, True, b"true", ["true"], {"v": "true"}])
def test_rubiks_marking_of_another_type_is_ignored(value):
    d = resolve_level({PREEMPTABLE: value}, {}, KubeQosClass.BURSTABLE, MAPPING)
    assert (d.level, d.source) == (QosLevel.LS, "kube_class")
    assert len(d.warnings) == (0 if value is None else 1)


@given(st.text(max_size=200))
def test_any_rubik_value_resolves_to_a_level(value):
    d = resolve_level({PREEMPTABLE: value}, {PREEMPTABLE: value}, None, MAPPING)
    assert d.level in (QosLevel.BE, QosLevel.LS)
    for w in d.warnings:
        w.encode("ascii")
