"""QoS levels and how a pod gets one.

Resolution order (first that applies wins):

1. annotation ``anolisbox.sh/qoslevel`` (anolisbox pods keep working unchanged);
2. label ``koordinator.sh/qosClass`` (koordinator pods too);
3. rubik's ``volcano.sh/preemptable``, annotation or label: ``"true"`` (offline) -> BE,
   ``"false"`` (online) -> LS (pods written for openEuler's rubik too);
4. the Kubernetes QoS class read from the pod's ``cgroup_parent``, mapped by configuration
   (default guaranteed -> LS, burstable -> LS, besteffort -> BE);
5. ``LS`` when even the Kubernetes class is unknown.

Level values are case-insensitive; rubik's are read as rubik reads them: exactly ``true``
or ``false``, and ``true`` in either the annotation or the label wins. A value that is none
of these is a warning naming the pod (the caller logs it) and the next source decides.
Pure functions: no I/O, no logging.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Tuple

from anolisnuma.system.cgroups import KubeQosClass, preview

ANNOTATION_QOS_LEVEL = "anolisbox.sh/qoslevel"
LABEL_QOS_CLASS = "koordinator.sh/qosClass"
# rubik's marking (openEuler): an annotation, or a label (newer rubik reads both).
PREEMPTABLE = "volcano.sh/preemptable"
ANNOTATION_LLC_LIMIT = "anolisbox.sh/llc_limit"

# koordinator also knows SYSTEM (host agents) and NONE; such pods fall back quietly.
_KOORD_NOT_LEVELS = ("SYSTEM", "NONE")
# No valid value is longer; anything longer is rejected before it is even compared.
_MAX_VALUE_LEN = 16


class QosLevel(str, enum.Enum):
    LSE = "LSE"   # latency sensitive, exclusive CPUs
    LSR = "LSR"   # latency sensitive, reserved CPUs
    LS = "LS"     # latency sensitive
    BE = "BE"     # best effort

    @classmethod
    def parse(cls, value: object) -> Optional["QosLevel"]:
        """The level ``value`` names (any case, surrounding blanks ignored), else ``None``."""
        choice = normalize_choice(value, [lv.value for lv in cls])
        return cls(choice) if choice else None


LEVELS: Tuple[str, ...] = tuple(lv.value for lv in QosLevel)

SOURCE_ANNOTATION = "annotation"
SOURCE_LABEL = "label"
SOURCE_KUBE_CLASS = "kube_class"
SOURCE_DEFAULT = "default"


@dataclass(frozen=True)
class LevelDecision:
    """The level, which source decided (``annotation``, ``label``, ``kube_class`` or
    ``default``), a human-readable why for the log, and warnings about ignored values."""

    level: QosLevel
    source: str
    why: str
    warnings: Tuple[str, ...] = ()


def normalize_choice(value: object, choices: Iterable[str]) -> Optional[str]:
    """The member of ``choices`` that ``value`` names case-insensitively, else ``None``.
    Non-strings, over-long strings and strings with NUL or other junk never match."""
    if not isinstance(value, str) or len(value) > _MAX_VALUE_LEN or not value.isascii():
        return None  # ASCII only: Unicode case folding would accept look-alikes ("lſe")
    v = value.strip(" \t\r\n").upper()
    for c in choices:
        if v == c.upper():
            return c
    return None


def resolve_level(annotations: Mapping[str, str], labels: Mapping[str, str],
                  kube_class: Optional[KubeQosClass],
                  mapping: Mapping[KubeQosClass, QosLevel]) -> LevelDecision:
    """Decide a pod's level; see the module docstring for the order."""
    warnings = []
    value = annotations.get(ANNOTATION_QOS_LEVEL)
    if value is not None:
        level = QosLevel.parse(value)
        if level is not None:
            return LevelDecision(level, SOURCE_ANNOTATION,
                                 f"annotation {ANNOTATION_QOS_LEVEL}={level.value}", tuple(warnings))
        warnings.append(f"annotation {ANNOTATION_QOS_LEVEL} has unknown value {preview(value)}; "
                        f"expected one of {', '.join(LEVELS)}")
    value = labels.get(LABEL_QOS_CLASS)
    if value is not None:
        level = QosLevel.parse(value)
        if level is not None:
            return LevelDecision(level, SOURCE_LABEL,
                                 f"label {LABEL_QOS_CLASS}={level.value}", tuple(warnings))
        if normalize_choice(value, _KOORD_NOT_LEVELS) is None:
            warnings.append(f"label {LABEL_QOS_CLASS} has unknown value {preview(value)}; "
                            f"expected one of {', '.join(LEVELS)}")
    rubik = _preemptable(annotations, labels, warnings)
    if rubik is not None:
        level, source, why = rubik
        return LevelDecision(level, source, why, tuple(warnings))
    if kube_class is not None:
        level = mapping[kube_class]
        return LevelDecision(level, SOURCE_KUBE_CLASS,
                             f"kube QoS class {kube_class.value} maps to {level.value}", tuple(warnings))
    return LevelDecision(QosLevel.LS, SOURCE_DEFAULT,
                         "no annotation, label or known kube QoS class: LS", tuple(warnings))


def _preemptable(annotations: Mapping[str, str], labels: Mapping[str, str],
                 warnings: List[str]) -> Optional[Tuple[QosLevel, str, str]]:
    """rubik's marking as rubik reads it: ``true`` in the annotation or the label is
    offline (BE), else ``false`` in either is online (LS); other values are warned about.
    Returns (level, source, why)."""
    found = []
    for source, marks in ((SOURCE_ANNOTATION, annotations), (SOURCE_LABEL, labels)):
        value = marks.get(PREEMPTABLE)
        if value is None:
            continue
        if value in ("true", "false"):   # exactly: rubik takes "True" for online
            found.append((value, source))
        else:
            warnings.append(f"{source} {PREEMPTABLE} has unknown value {preview(value)}; expected true or false")
    for value, source in sorted(found, key=lambda f: f[0] != "true"):   # a "true" wins, as in rubik
        level, state = (QosLevel.BE, "offline") if value == "true" else (QosLevel.LS, "online")
        return level, source, f"{source} {PREEMPTABLE}={value} (rubik: {state}): {level.value}"
    return None
