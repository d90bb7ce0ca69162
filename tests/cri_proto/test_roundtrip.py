"""cri_proto against the full CRI v1 stubs of ``container-runtime-interface-api``.

1. Every field cri_proto declares has the CRI v1 number, type, cardinality and
   message/enum type.
2. Fields cri_proto does not declare survive decode -> edit -> encode: a fully populated
   message built with the full stubs, parsed with cri_proto, edited, re-encoded and parsed
   again with the full stubs equals the original with only the edited fields changed.
"""

import copy
from typing import Any, Callable, Dict, Iterator, Tuple

import pytest

full = pytest.importorskip("cri_api.v1.api_pb2")

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor  # noqa: E402
from google.protobuf.message import Message  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cri_proto import api_pb2 as ours  # noqa: E402

OUR_PACKAGE = "anolisnuma.cri.v1"
FULL_PACKAGE = "runtime.v1"

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------- schema


def _local_name(full_name: str, package: str) -> str:
    assert full_name.startswith(package + "."), full_name
    return full_name[len(package) + 1:]


def _walk_messages(desc: Descriptor) -> Iterator[Descriptor]:
    yield desc
    for nested in desc.nested_types:
        yield from _walk_messages(nested)


def _all_our_messages() -> Iterator[Descriptor]:
    for desc in ours.DESCRIPTOR.message_types_by_name.values():
        yield from _walk_messages(desc)


def _full_message(local: str) -> Descriptor:
    return full.DESCRIPTOR.pool.FindMessageTypeByName(FULL_PACKAGE + "." + local)


def test_package_is_not_runtime_v1() -> None:
    assert ours.DESCRIPTOR.package == OUR_PACKAGE
    assert not ours.DESCRIPTOR.services_by_name


@pytest.mark.parametrize(
    "local",
    sorted(_local_name(d.full_name, OUR_PACKAGE) for d in _all_our_messages()),
)
def test_fields_match_cri_v1(local: str) -> None:
    mine = ours.DESCRIPTOR.pool.FindMessageTypeByName(OUR_PACKAGE + "." + local)
    theirs = _full_message(local)
    assert mine.GetOptions().map_entry == theirs.GetOptions().map_entry
    for field in mine.fields:
        other = theirs.fields_by_name.get(field.name)
        assert other is not None, "%s.%s is not in CRI v1" % (local, field.name)
        where = "%s.%s" % (local, field.name)
        assert field.number == other.number, where
        assert field.type == other.type, where
        assert field.is_repeated == other.is_repeated, where
        assert field.has_presence == other.has_presence, where
        assert field.containing_oneof is None and other.containing_oneof is None, where
        if field.message_type is not None:
            assert _local_name(field.message_type.full_name, OUR_PACKAGE) == _local_name(
                other.message_type.full_name, FULL_PACKAGE
            ), where
        if field.enum_type is not None:
            assert _local_name(field.enum_type.full_name, OUR_PACKAGE) == _local_name(
                other.enum_type.full_name, FULL_PACKAGE
            ), where


def test_every_message_exists_in_cri_v1() -> None:
    for desc in _all_our_messages():
        local = _local_name(desc.full_name, OUR_PACKAGE)
        assert _full_message(local).name == desc.name


@pytest.mark.parametrize("name", sorted(ours.DESCRIPTOR.enum_types_by_name))
def test_enums_match_cri_v1(name: str) -> None:
    mine: EnumDescriptor = ours.DESCRIPTOR.enum_types_by_name[name]
    theirs: EnumDescriptor = full.DESCRIPTOR.enum_types_by_name[name]
    for value in mine.values:
        assert theirs.values_by_name[value.name].number == value.number


# --------------------------------------------------------------------------- generation

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12
)
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _scalar(draw: Callable[[Any], Any], field: FieldDescriptor) -> Any:
    """A non-default value, so that every field is present on the wire."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return draw(_text)
    if kind == FieldDescriptor.TYPE_BYTES:
        return draw(st.binary(min_size=1, max_size=12))
    if kind == FieldDescriptor.TYPE_BOOL:
        return True
    if kind == FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values if v.number != 0]
        return draw(st.sampled_from(numbers or [1]))
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return float(draw(st.integers(min_value=1, max_value=1000)))
    low, high = _INT_RANGES[kind]
    value = draw(st.integers(min_value=low, max_value=high))
    return value if value != 0 else 1


def _fill(draw: Callable[[Any], Any], msg: Message) -> None:
    """Set every field of ``msg`` (recursively; CRI v1 has no recursive types)."""
    for field in msg.DESCRIPTOR.fields:
        assert field.containing_oneof is None  # CRI v1 has no oneofs
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            container = getattr(msg, field.name)
            for _ in range(draw(st.integers(min_value=1, max_value=2))):
                key = _scalar(draw, field.message_type.fields_by_name["key"])
                if value_field.message_type is not None:
                    _fill(draw, container[key])
                else:
                    container[key] = _scalar(draw, value_field)
        elif field.is_repeated:
            container = getattr(msg, field.name)
            for _ in range(draw(st.integers(min_value=1, max_value=2))):
                if field.message_type is not None:
                    _fill(draw, container.add())
                else:
                    container.append(_scalar(draw, field))
        elif field.message_type is not None:
            _fill(draw, getattr(msg, field.name))
        else:
            setattr(msg, field.name, _scalar(draw, field))


@st.composite
def full_messages(draw: Callable[[Any], Any], cls: type) -> Message:
    msg = cls()
    _fill(draw, msg)
    return msg


def _assert_fully_populated(msg: Message, where: str = "") -> None:
    for field in msg.DESCRIPTOR.fields:
        name = where + "." + field.name
        if field.is_repeated:
            values = getattr(msg, field.name)
            assert len(values) > 0, name
            if field.message_type is not None and not field.message_type.GetOptions().map_entry:
                for item in values:
                    _assert_fully_populated(item, name)
        else:
            assert msg.HasField(field.name) if field.has_presence else getattr(msg, field.name), name
            if field.message_type is not None:
                _assert_fully_populated(getattr(msg, field.name), name)


def _assert_declared_fields_equal(mine: Message, theirs: Message, where: str = "") -> None:
    """Every field cri_proto declares decodes to the same value as in the full stub."""
    for field in mine.DESCRIPTOR.fields:
        name = where + "." + field.name
        a, b = getattr(mine, field.name), getattr(theirs, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            assert dict(a) == dict(b), name
        elif field.is_repeated and field.message_type is not None:
            assert len(a) == len(b), name
            for x, y in zip(a, b):
                _assert_declared_fields_equal(x, y, name)
        elif field.is_repeated:
            assert list(a) == list(b), name
        elif field.message_type is not None:
            _assert_declared_fields_equal(a, b, name)
        else:
            assert a == b, name


# --------------------------------------------------------------------------- round trips

Edit = Callable[[Message], None]

# name -> (edit applied identically to our message and to the full-stub expectation).
CASES: Dict[str, Tuple[Edit, ...]] = {
    "RunPodSandboxRequest": (
        lambda m: m.config.annotations.__setitem__("anolisnuma.io/qos", "LS"),
        lambda m: m.config.linux.resources.__setattr__("cpuset_cpus", "0-3"),
        lambda m: m.config.linux.overhead.__setattr__("cpuset_mems", "0"),
        lambda m: m.config.labels.pop(min(m.config.labels)),
    ),
    "CreateContainerRequest": (
        lambda m: m.config.linux.resources.__setattr__("cpuset_cpus", "4-7,12"),
        lambda m: m.config.linux.resources.__setattr__("cpuset_mems", "1"),
        lambda m: m.config.linux.resources.__setattr__("cpu_shares", 1024),
        lambda m: m.config.linux.resources.unified.__setitem__("cpu.idle", "1"),
        lambda m: m.config.annotations.__setitem__("anolisnuma.io/numa", "1"),
        lambda m: m.sandbox_config.annotations.__setitem__("x", "y"),
    ),
    "UpdateContainerResourcesRequest": (
        lambda m: m.linux.__setattr__("cpuset_cpus", "0-15"),
        lambda m: m.linux.__setattr__("cpuset_mems", ""),
        lambda m: m.annotations.__setitem__("anolisnuma.io/merged", "true"),
    ),
    "StartContainerRequest": (lambda m: m.__setattr__("container_id", "b" * 64),),
    "ListContainersResponse": (
        lambda m: m.containers[0].annotations.__setitem__("k", "v"),
        lambda m: m.containers[-1].labels.clear(),
    ),
    "ContainerStatusResponse": (
        lambda m: m.status.resources.linux.__setattr__("cpuset_cpus", "2"),
        lambda m: m.info.__setitem__("info", "{}"),
    ),
    "PodSandboxStatusResponse": (
        lambda m: m.status.annotations.__setitem__("k", "v"),
        lambda m: m.status.__setattr__("runtime_handler", "kata"),
    ),
}


def _roundtrip(name: str, data: Any) -> None:
    full_cls = getattr(full, name)
    our_cls = getattr(ours, name)
    original = data.draw(full_messages(full_cls))
    _assert_fully_populated(original)
    wire = original.SerializeToString()

    # Without edits: same meaning (bytes may differ: map order, unknown fields last).
    mine = our_cls.FromString(wire)
    _assert_declared_fields_equal(mine, original)
    assert full_cls.FromString(mine.SerializeToString()) == original

    # With edits: exactly the edited fields change.
    edits = CASES[name]
    chosen = data.draw(st.lists(st.sampled_from(range(len(edits))), min_size=1, unique=True))
    expected = copy.deepcopy(original)
    for index in chosen:
        edits[index](mine)
        edits[index](expected)
    again = full_cls.FromString(mine.SerializeToString())
    assert again == expected
    # A second pass through cri_proto changes nothing more.
    assert full_cls.FromString(our_cls.FromString(again.SerializeToString()).SerializeToString()) == expected


@pytest.mark.parametrize("name", sorted(CASES))
@SETTINGS
@given(data=st.data())
def test_unknown_fields_survive_edit(name: str, data: Any) -> None:
    _roundtrip(name, data)


def test_subset_really_is_a_subset() -> None:
    """The round trips above would prove little if cri_proto declared everything."""
    for name in ("CreateContainerRequest", "ContainerConfig", "LinuxContainerResources",
                 "PodSandboxConfig", "ContainerStatus"):
        mine = set(getattr(ours, name).DESCRIPTOR.fields_by_name)
        theirs = set(getattr(full, name).DESCRIPTOR.fields_by_name)
        assert mine <= theirs
    assert {"hugepage_limits"} <= set(full.LinuxContainerResources.DESCRIPTOR.fields_by_name) - set(
        ours.LinuxContainerResources.DESCRIPTOR.fields_by_name
    )
    assert {"mounts", "envs", "devices"} <= set(full.ContainerConfig.DESCRIPTOR.fields_by_name) - set(
        ours.ContainerConfig.DESCRIPTOR.fields_by_name
    )


# Bytes of a field that no CRI version defines (yet): number 1000, length-delimited.
_FUTURE_FIELD = bytes([0xC2, 0x3E, 0x05]) + b"later"


@pytest.mark.parametrize("name", sorted(CASES))
def test_future_fields_survive(name: str) -> None:
    """A field newer than both stubs is carried along, even through the full stubs."""
    seed = getattr(full, name)()
    if name == "ListContainersResponse":
        seed.containers.add(id="c" * 64)
    wire = seed.SerializeToString() + _FUTURE_FIELD
    mine = getattr(ours, name).FromString(wire)
    CASES[name][0](mine)
    out = mine.SerializeToString()
    assert _FUTURE_FIELD in out
    assert _FUTURE_FIELD in getattr(full, name).FromString(out).SerializeToString()


def test_generated_code_runs_on_the_protobuf_floor() -> None:
    """api_pb2.py must not demand a protobuf newer than pyproject's floor (6.31.0)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    gencode = re.search(
        r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)",
        (root / "cri_proto" / "api_pb2.py").read_text(),
        re.M,
    )
    floor = re.search(r'"protobuf>=(\d+)\.(\d+)(?:\.(\d+))?', (root / "pyproject.toml").read_text())
    assert gencode and floor
    gen = tuple(int(x) for x in gencode.groups())
    low = tuple(int(x or 0) for x in floor.groups())
    assert gen <= low, "regenerate with scripts/gen-proto.sh (gencode %s > floor %s)" % (gen, low)
