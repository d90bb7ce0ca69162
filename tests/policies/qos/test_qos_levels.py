"""QoS level resolution: annotation, then label, then the kube QoS class."""

from hypothesis import given, strategies as st

from anolisnuma.policies.qos.levels import (
    ANNOTATION_QOS_LEVEL, LABEL_QOS_CLASS, QosLevel, normalize_choice, resolve_level,
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
