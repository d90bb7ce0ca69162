"""QoS levels and how a pod gets one.

Resolution order (first that applies wins):

1. annotation ``anolisbox.sh/qoslevel`` (anolisbox pods keep working unchanged);
2. label ``koordinator.sh/qosClass`` (koordinator pods too);
3. the Kubernetes QoS class read from the pod's ``cgroup_parent``, mapped by configuration
   (default guaranteed -> LS, burstable -> LS, besteffort -> BE);
4. ``LS`` when even the Kubernetes class is unknown.

Values are case-insensitive. A value that is not a level is a warning naming the pod (the
caller logs it) and the next source decides. Pure functions: no I/O, no logging.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Tuple

from anolisnuma.system.cgroups import KubeQosClass, preview

ANNOTATION_QOS_LEVEL = "anolisbox.sh/qoslevel"
LABEL_QOS_CLASS = "koordinator.sh/qosClass"
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
    if kube_class is not None:
        level = mapping[kube_class]
        return LevelDecision(level, SOURCE_KUBE_CLASS,
                             f"kube QoS class {kube_class.value} maps to {level.value}", tuple(warnings))
    return LevelDecision(QosLevel.LS, SOURCE_DEFAULT,
                         "no annotation, label or known kube QoS class: LS", tuple(warnings))
