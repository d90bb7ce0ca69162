"""What the proxy remembers about pods and containers.

StartContainer, StopContainer, RemoveContainer and UpdateContainerResources carry only an
ID, so everything a hook needs later is recorded when RunPodSandbox and CreateContainer
pass through (or when the start-up resync reads it back from containerd).

Records read back from a state file go through :func:`decode`, which checks every field
against the type the dataclass declares: a file that parses but is not what the daemon
wrote (edited by hand, planted, from a version whose fields had other types) must be
refused whole, saying where it is wrong, before anything uses it. A list where a sandbox ID
belongs once crashed the start-up, after the socket listened, into a restart loop.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple, Type, TypeVar

R = TypeVar("R")


@dataclass
class PodRecord:
    sandbox_id: str
    uid: str
    name: str
    namespace: str
    cgroup_parent: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    annotations: Dict[str, str] = field(default_factory=dict)
    runtime_handler: str = ""

    @property
    def ref(self) -> str:
        """``namespace/name`` for log lines and rule matching."""
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> Dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies recursively and costs ~10x more.
        return {"sandbox_id": self.sandbox_id, "uid": self.uid, "name": self.name,
                "namespace": self.namespace, "cgroup_parent": self.cgroup_parent,
                "labels": self.labels, "annotations": self.annotations,
                "runtime_handler": self.runtime_handler}

    @classmethod
    def from_json(cls, data: Any) -> "PodRecord":
        """Raises ValueError naming the field when ``data`` is not a pod record."""
        return decode(cls, data)


@dataclass
class ContainerResources:
    """The LinuxContainerResources fields the policies read, as last sent to containerd."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""


@dataclass
class ContainerRecord:
    container_id: str
    sandbox_id: str
    name: str
    labels: Dict[str, str] = field(default_factory=dict)
    annotations: Dict[str, str] = field(default_factory=dict)
    resources: ContainerResources = field(default_factory=ContainerResources)

    def to_json(self) -> Dict[str, Any]:
        return {"container_id": self.container_id, "sandbox_id": self.sandbox_id, "name": self.name,
                "labels": self.labels, "annotations": self.annotations,
                "resources": dataclasses.asdict(self.resources)}

    @classmethod
    def from_json(cls, data: Any) -> "ContainerRecord":
        """Raises ValueError naming the field when ``data`` is not a container record."""
        return decode(cls, data)


# ---------------------------------------------------------------- decoding

def decode(cls: Type[R], data: Any, where: str = "") -> R:
    """An instance of the dataclass ``cls`` from its JSON form.

    Keys the class has no field for are ignored (a newer version's); a missing field takes
    its default. A missing field that has none, or a value whose type is not the declared
    one (``str``, ``int``, ``Dict[str, X]``, ``List[X]`` or a dataclass, checked all the
    way down), raises ValueError naming where: ``pods[2].labels.app: must be a string,
    not an integer``.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'record'}: must be an object, not {_kind(data)}")
    values = {}
    for name, hint, required in _fields(cls):
        at = f"{where}.{name}" if where else name
        if name in data:
            values[name] = _value(hint, data[name], at)
        elif required:
            raise ValueError(f"{at}: missing")
    return cls(**values)  # type: ignore[call-arg]


def decode_list(cls: Type[R], data: Any, where: str) -> List[R]:
    """:func:`decode` of each item of the JSON list ``data``."""
    return _value(List[cls], data, where)  # type: ignore[valid-type]


def _value(hint: Any, value: Any, at: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return decode(hint, value, at)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{at}: must be an object, not {_kind(value)}")
        return {k: _value(args[1], v, f"{at}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{at}: must be a list, not {_kind(value)}")
        return [_value(args[0], v, f"{at}[{i}]") for i, v in enumerate(value)]
    # Exact types: JSON's true is an int to Python, and no count or ID of anything here.
    if type(value) is not hint:
        raise ValueError(f"{at}: must be {_KINDS.get(hint, hint.__name__)}, not {_kind(value)}")
    return value


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> Tuple[Tuple[str, Any, bool], ...]:
    """(name, declared type, required) of each field, resolved once per class (the
    annotations are strings under ``from __future__ import annotations``)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING and
                  f.default_factory is dataclasses.MISSING) for f in dataclasses.fields(cls))


_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
          dict: "an object", type(None): "null"}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)
