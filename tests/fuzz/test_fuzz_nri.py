"""NRI messages as bytes, from the NRI socket (containerd, or whatever listens at its path):
the mux and ttrpc decoders (frames, or FrameError; never more held than one frame or one
message), the ttrpc envelope and NRI requests parsed (protobuf's DecodeError), and the
translation of NRI's pods and containers into the CRI requests the hooks read (never an
exception; every field the hooks read carried over as it was)."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from anolisnuma.nri import frames as fr
from anolisnuma.nri import translate
from anolisnuma.testing.fuzzing import assert_linear, fuzz_settings, outcome
from nri_proto import api_pb2 as nri
from nri_proto import ttrpc_pb2

U32 = 2 ** 32 - 1


def cut(data, places):
    """``data`` cut at ``places`` (any offsets, any order): the chunks a socket may give."""
    marks = sorted({p % (len(data) + 1) for p in places} | {0, len(data)})
    return [data[a:b] for a, b in zip(marks, marks[1:])] or [b""]


@fuzz_settings(150)
@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=8),
       st.lists(st.integers(0, 10 ** 6), max_size=10))
def test_mux_frames_cut_anywhere_decode_to_what_was_sent(sent, places):
    # given frames on the two connections, the stream cut anywhere
    stream = b"".join(fr.mux_frame(conn, payload) for conn, payload in sent)
    def decode():
        decoder = fr.MuxDecoder(max_frame=1000)
        got = []
        for chunk in cut(stream, places):
            got += decoder.feed(chunk)
            assert decoder.buffered <= fr.MUX_HEADER_SIZE + 1000
        return got
    got, _ = outcome("nri", decode, size=len(stream))
    assert got == sent
    assert fr.MuxDecoder(max_frame=1000).feed(stream) == sent   # (and in one piece)


@fuzz_settings(150)
@given(st.binary(max_size=600), st.lists(st.integers(0, 10 ** 6), max_size=6))
def test_any_mux_stream_is_frames_or_a_frame_error(stream, places):
    def decode():
        decoder = fr.MuxDecoder(max_frame=256)
        for chunk in cut(stream, places):
            decoder.feed(chunk)
            assert decoder.buffered <= fr.MUX_HEADER_SIZE + 256
    outcome("nri", decode, (fr.FrameError,), size=len(stream))


messages = st.lists(st.tuples(st.integers(0, U32), st.integers(0, 255), st.integers(0, 255),
                              st.one_of(st.binary(max_size=200), st.integers(0, 3000).map(lambda n: b"x" * n))),
                    max_size=6)


@fuzz_settings(150)
@given(messages, st.lists(st.integers(0, 10 ** 6), max_size=10))
def test_ttrpc_messages_cut_anywhere_decode_to_what_was_sent_the_oversized_skipped(sent, places):
    # given ttrpc messages, some over the decoder's bound, the stream cut anywhere
    stream = b"".join(fr.ttrpc_frame(*m) for m in sent)
    def decode():
        decoder = fr.TtrpcDecoder(max_message=1000)
        got = []
        for chunk in cut(stream, places):
            got += decoder.feed(chunk)
            assert decoder.buffered <= fr.TTRPC_HEADER_SIZE + 1000
        return got
    got, _ = outcome("nri", decode, size=len(stream))
    # then each is the message sent, or said oversized (its payload dropped)
    assert got == [fr.TtrpcMessage(s, t, f, p) if len(p) <= 1000 else fr.Oversized(s, t, f, len(p))
                   for s, t, f, p in sent]


@fuzz_settings(150)
@given(st.binary(max_size=600), st.lists(st.integers(0, 10 ** 6), max_size=6))
def test_any_ttrpc_stream_is_messages_never_an_exception(stream, places):
    def decode():
        decoder = fr.TtrpcDecoder(max_message=128)
        for chunk in cut(stream, places):
            decoder.feed(chunk)
            assert decoder.buffered <= fr.TTRPC_HEADER_SIZE + 128
    outcome("nri", decode, size=len(stream))


# ---------------------------------------------------------------- requests and their translation

strings = st.one_of(st.text(max_size=20), st.sampled_from(["", "0-3", "0-65536", "x" * 5000, "\x00", "\udcff"[:0]]))
string_maps = st.dictionaries(st.text(max_size=10), strings, max_size=5)
cpusets = st.one_of(st.sampled_from(["", "0-3", "0-3,8-11", "0-0:4096/4096", "1" * 5000, "0-65536", " ", "a"]),
                    st.text(alphabet="0123456789,-:/ ", max_size=30))
i64 = st.integers(-2 ** 63, 2 ** 63 - 1)
u64_within = st.integers(0, 2 ** 63 - 1)   # (u64 past this: the finding below)


@st.composite
def resources(draw):
    res = nri.LinuxResources()
    cpu, mem = res.cpu, res.memory
    for field, values in (("shares", u64_within), ("period", u64_within), ("quota", i64)):
        if draw(st.booleans()):
            getattr(cpu, field).value = draw(values)
    cpu.cpus, cpu.mems = draw(cpusets), draw(cpusets)
    if draw(st.booleans()):
        mem.limit.value = draw(i64)
    return res


@st.composite
def pods(draw):
    pod = nri.PodSandbox(id=draw(strings), name=draw(strings), uid=draw(strings), namespace=draw(strings),
                         runtime_handler=draw(strings))
    pod.labels.update(draw(string_maps))
    pod.annotations.update(draw(string_maps))
    pod.linux.cgroup_parent = draw(strings)
    if draw(st.booleans()):
        pod.linux.pod_resources.CopyFrom(draw(resources()))
    return pod


@st.composite
def containers(draw):
    ctr = nri.Container(id=draw(strings), pod_sandbox_id=draw(strings), name=draw(strings))
    ctr.labels.update(draw(string_maps))
    ctr.annotations.update(draw(string_maps))
    if draw(st.booleans()):
        ctr.linux.resources.CopyFrom(draw(resources()))
    return ctr


def through_the_wire(request, method):
    """``request`` as containerd sends it: in a ttrpc envelope, parsed back on our side."""
    envelope = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method=method,
                                 payload=request.SerializeToString())
    back = ttrpc_pb2.Request.FromString(envelope.SerializeToString())
    return type(request).FromString(back.payload)


@fuzz_settings(120)
@given(pods(), containers())
def test_a_create_container_event_translates_into_the_request_the_kubelet_sends(pod, ctr):
    # given an NRI CreateContainer event of hostile fields, through the wire
    sent = nri.CreateContainerRequest(pod=pod, container=ctr)
    size = sent.ByteSize()

    def translated():
        got = through_the_wire(sent, "CreateContainer")
        return translate.create_container(got.pod, got.container)
    (req, resp), _ = outcome("nri", translated, size=size)
    # then the CRI request carries each field the hooks read as it was
    cfg = req.config
    assert (req.pod_sandbox_id, resp.container_id, cfg.metadata.name) == (pod.id or ctr.pod_sandbox_id, ctr.id,
                                                                           ctr.name)
    assert dict(cfg.labels) == dict(ctr.labels) and dict(cfg.annotations) == dict(ctr.annotations)
    box = req.sandbox_config
    assert (box.metadata.name, box.metadata.uid, box.metadata.namespace) == (pod.name, pod.uid, pod.namespace)
    assert dict(box.annotations) == dict(pod.annotations) and box.linux.cgroup_parent == pod.linux.cgroup_parent
    res = ctr.linux.resources
    assert (cfg.linux.resources.cpuset_cpus, cfg.linux.resources.cpuset_mems) == (res.cpu.cpus, res.cpu.mems)
    # and a hook's cpuset goes back as the adjustment, nothing else
    after = type(req)()
    after.CopyFrom(req)
    after.config.linux.resources.cpuset_cpus = "0-1"
    adjust = translate.adjustment(req, after)
    assert adjust.linux.resources.cpu.cpus == ("0-1" if res.cpu.cpus != "0-1" else "")


@fuzz_settings(60)
@given(containers(), resources())
def test_an_update_container_event_translates_into_the_update_the_kubelet_sends(ctr, res):
    sent = nri.UpdateContainerRequest(container=ctr, linux_resources=res)

    def translated():
        got = through_the_wire(sent, "UpdateContainer")
        return translate.update_container(got.container, got.linux_resources)
    req, _ = outcome("nri", translated, size=sent.ByteSize())
    assert req.container_id == ctr.id and req.linux.cpuset_cpus == res.cpu.cpus
    assert req.linux.cpu_shares == (res.cpu.shares.value if res.cpu.HasField("shares") else 0)


@fuzz_settings(150)
@given(st.binary(max_size=300), st.sampled_from([nri.CreateContainerRequest, nri.UpdateContainerRequest,
                                                 nri.StateChangeEvent, ttrpc_pb2.Request]))
def test_any_bytes_are_a_request_or_a_decode_error_and_a_request_translates(data, kind):
    def parsed():
        msg = kind.FromString(data)
        if kind is nri.CreateContainerRequest:
            translate.create_container(msg.pod, msg.container)
        elif kind is nri.UpdateContainerRequest:
            translate.update_container(msg.container, msg.linux_resources)
        elif kind is nri.StateChangeEvent:
            translate.run_pod_sandbox(msg.pod)
        return msg
    outcome("nri", parsed, (DecodeError,), size=len(data))


@pytest.mark.parametrize("field", ["shares", "period"])
def test_a_cpu_value_past_int64_is_translated_or_refused_never_a_value_error(field):
    # given a container whose NRI cpu shares (or period: uint64 in NRI, int64 in CRI) is 2^63
    ctr = nri.Container(id="c")
    getattr(ctr.linux.resources.cpu, field).value = 2 ** 63
    # when it is translated, then it is a request (a ValueError out of protobuf before)
    outcome("nri", lambda: translate.create_container(nri.PodSandbox(id="p"), ctr))


@fuzz_settings(2)
@given(st.sampled_from(["frames", "annotations"]))
def test_time_is_linear_in_the_stream(shape):
    def make(n):
        if shape == "frames":
            return b"".join(fr.message_frames(1, 2 * i + 1, fr.REQUEST, 0, b"p" * 50) for i in range(n))
        ctr = nri.Container(id="c", name="n")
        ctr.annotations.update({f"k{i}": "v" * 20 for i in range(n)})
        return nri.CreateContainerRequest(pod=nri.PodSandbox(id="p"), container=ctr).SerializeToString()

    def run(data):
        if shape == "frames":
            mux, tt = fr.MuxDecoder(), fr.TtrpcDecoder()
            for _, payload in mux.feed(data):
                tt.feed(payload)
        else:
            msg = nri.CreateContainerRequest.FromString(data)
            translate.create_container(msg.pod, msg.container)
    assert_linear("nri", make, run, small=20)
