"""The generated NRI and ttrpc message classes carry the field numbers and wire types of
the sources the plugin talks to. The numbers below were read from
containerd/nri v0.11.0 ``pkg/api/api.proto`` (commit 1078130fa016884b4c03880d9d587e6691a67d98)
and containerd/ttrpc v1.2.7 ``request.proto`` (commit 3b8c8b75577584e412043afb7b561193a4a47d2e,
whose Status is google.rpc.Status), by hand: the mirrors are not there on a fresh machine,
so a regenerated ``nri_proto`` that moved a number must fail here."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from nri_proto import api_pb2, ttrpc_pb2

STR, BYTES, MSG, I32, I64, U32, BOOL, ENUM = (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE, F.TYPE_INT32,
                                              F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_BOOL, F.TYPE_ENUM)

# (message, dotted path from it, number of the last field, its type)
FIELDS = [
    ("PodSandbox", "id", 1, STR),
    ("PodSandbox", "name", 2, STR),
    ("PodSandbox", "uid", 3, STR),
    ("PodSandbox", "namespace", 4, STR),
    ("PodSandbox", "labels", 5, MSG),          # map<string, string>
    ("PodSandbox", "annotations", 6, MSG),
    ("PodSandbox", "linux", 8, MSG),
    ("PodSandbox", "linux.pod_resources", 2, MSG),
    ("PodSandbox", "linux.cgroup_parent", 3, STR),
    ("Container", "id", 1, STR),
    ("Container", "pod_sandbox_id", 2, STR),
    ("Container", "name", 3, STR),
    ("Container", "state", 4, ENUM),
    ("Container", "labels", 5, MSG),
    ("Container", "annotations", 6, MSG),
    ("Container", "linux", 11, MSG),
    ("Container", "linux.resources", 3, MSG),
    ("Container", "linux.resources.cpu", 2, MSG),
    ("Container", "linux.resources.cpu.cpus", 6, STR),
    ("Container", "linux.resources.cpu.mems", 7, STR),
    ("ContainerAdjustment", "linux", 6, MSG),
    ("ContainerAdjustment", "linux.resources", 2, MSG),
    ("ContainerAdjustment", "linux.resources.cpu.cpus", 6, STR),
    ("ContainerAdjustment", "linux.resources.cpu.mems", 7, STR),
    ("ContainerUpdate", "container_id", 1, STR),
    ("ContainerUpdate", "linux", 2, MSG),
    ("ContainerUpdate", "linux.resources", 1, MSG),
    ("ContainerUpdate", "ignore_failure", 3, BOOL),
    ("ConfigureRequest", "config", 1, STR),
    ("ConfigureRequest", "runtime_name", 2, STR),
    ("ConfigureRequest", "request_timeout", 5, I64),
    ("ConfigureResponse", "events", 2, I32),
    ("RegisterPluginRequest", "plugin_name", 1, STR),
    ("RegisterPluginRequest", "plugin_idx", 2, STR),
    ("SynchronizeRequest", "pods", 1, MSG),
    ("SynchronizeRequest", "containers", 2, MSG),
    ("SynchronizeRequest", "more", 3, BOOL),
    ("SynchronizeResponse", "update", 1, MSG),
    ("SynchronizeResponse", "more", 2, BOOL),
    ("CreateContainerRequest", "pod", 1, MSG),
    ("CreateContainerRequest", "container", 2, MSG),
    ("CreateContainerResponse", "adjust", 1, MSG),
    ("CreateContainerResponse", "update", 2, MSG),
    ("UpdateContainerRequest", "linux_resources", 3, MSG),
    ("StateChangeEvent", "event", 1, ENUM),
    ("StateChangeEvent", "pod", 2, MSG),
    ("StateChangeEvent", "container", 3, MSG),
    ("UpdateContainersRequest", "update", 1, MSG),
    ("UpdateContainersResponse", "failed", 1, MSG),
]

TTRPC_FIELDS = [
    ("Request", "service", 1, STR), ("Request", "method", 2, STR), ("Request", "payload", 3, BYTES),
    ("Request", "timeout_nano", 4, I64), ("Request", "metadata", 5, MSG),
    ("Response", "status", 1, MSG), ("Response", "payload", 2, BYTES),
    ("KeyValue", "key", 1, STR), ("KeyValue", "value", 2, STR),
    ("Status", "code", 1, I32), ("Status", "message", 2, STR), ("Status", "details", 3, MSG),
    ("Any", "type_url", 1, STR), ("Any", "value", 2, BYTES),
]


def _field(module, message: str, path: str):
    desc = module.DESCRIPTOR.message_types_by_name[message]
    field = None
    for name in path.split("."):
        field = desc.fields_by_name[name]
        desc = field.message_type
    return field


@pytest.mark.parametrize("message,path,number,ftype", FIELDS, ids=[f"{m}.{p}" for m, p, _, _ in FIELDS])
def test_nri_field_numbers_are_v0_11_0(message, path, number, ftype):
    field = _field(api_pb2, message, path)
    assert (field.number, field.type) == (number, ftype)


@pytest.mark.parametrize("message,path,number,ftype", TTRPC_FIELDS, ids=[f"{m}.{p}" for m, p, _, _ in TTRPC_FIELDS])
def test_ttrpc_field_numbers_are_v1_2_7(message, path, number, ftype):
    field = _field(ttrpc_pb2, message, path)
    assert (field.number, field.type) == (number, ftype)


def _repeated(field) -> bool:
    # protobuf 6.33 deprecates .label for .is_repeated, which 6.31 (our floor) lacks
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == F.LABEL_REPEATED


def test_repeated_and_map_fields():
    assert _field(api_pb2, "PodSandbox", "labels").message_type.GetOptions().map_entry
    assert _field(api_pb2, "Container", "annotations").message_type.GetOptions().map_entry
    assert _repeated(_field(api_pb2, "SynchronizeRequest", "pods"))
    assert _repeated(_field(ttrpc_pb2, "Status", "details"))


def test_events_and_states_are_v0_11_0():
    assert [(v.name, v.number) for v in api_pb2.Event.DESCRIPTOR.values] == [
        ("UNKNOWN", 0), ("RUN_POD_SANDBOX", 1), ("STOP_POD_SANDBOX", 2), ("REMOVE_POD_SANDBOX", 3),
        ("CREATE_CONTAINER", 4), ("POST_CREATE_CONTAINER", 5), ("START_CONTAINER", 6),
        ("POST_START_CONTAINER", 7), ("UPDATE_CONTAINER", 8), ("POST_UPDATE_CONTAINER", 9),
        ("STOP_CONTAINER", 10), ("REMOVE_CONTAINER", 11), ("UPDATE_POD_SANDBOX", 12),
        ("POST_UPDATE_POD_SANDBOX", 13), ("VALIDATE_CONTAINER_ADJUSTMENT", 14), ("LAST", 15)]
    assert api_pb2.ContainerState.Value("CONTAINER_RUNNING") == 3


def test_services_are_the_ones_on_the_wire():
    assert api_pb2.DESCRIPTOR.package == "nri.pkg.api.v1alpha1"
    plugin = api_pb2.DESCRIPTOR.services_by_name["Plugin"]
    assert plugin.full_name == "nri.pkg.api.v1alpha1.Plugin"
    from anolisnuma.nri.session import PLUGIN_METHODS, PLUGIN_SERVICE, RUNTIME_SERVICE
    assert {m.name for m in plugin.methods} == PLUGIN_METHODS and PLUGIN_SERVICE == plugin.full_name
    assert api_pb2.DESCRIPTOR.services_by_name["Runtime"].full_name == RUNTIME_SERVICE
    assert ttrpc_pb2.DESCRIPTOR.package == "anolisnuma.nri.ttrpc"


def test_status_decodes_as_google_rpc_status_would_encode_it():
    # google.rpc.Status{code: 8, message: "x", details: [Any{type_url: "t", value: b"v"}]}
    wire = b"\x08\x08" + b"\x12\x01x" + b"\x1a\x06" + b"\x0a\x01t" + b"\x12\x01v"
    status = ttrpc_pb2.Status.FromString(wire)
    assert (status.code, status.message, status.details[0].type_url, status.details[0].value) == (8, "x", "t", b"v")
    assert status.SerializeToString() == wire


def test_nri_and_cri_messages_load_in_one_process():
    """The daemon imports both: protobuf knows each file by the name protoc was given, and
    two files named api.proto would not load side by side (scripts/gen-proto.sh, -I .)."""
    from cri_proto import api_pb2 as cri
    from nri_proto import api_pb2 as nri_api, ttrpc_pb2

    assert cri.DESCRIPTOR.name == "api.proto"
    assert (nri_api.DESCRIPTOR.name, ttrpc_pb2.DESCRIPTOR.name) == ("nri_proto/api.proto", "nri_proto/ttrpc.proto")
