"""The watch loop against an API server that misbehaves in ways a real one will not on
demand: replies that are not JSON, a watch event larger than any object, an endless line,
an unknown event type, a list slower than the request timeout, a reply compressed though
the daemon asked for none. A small HTTPS server of
the test's own stands in (the real one is in the other tests of this folder); the
watcher's session (``run_once``) runs on the test's thread."""

from __future__ import annotations

import gzip
import http.server
import json
import shutil
import ssl
import threading
import time
import tracemalloc
import zlib
from typing import Any, Callable, Dict, Iterator, List

import pytest

from anolisnuma.cluster.kube_client import MAX_EVENT_BYTES, ApiError, KubeClient
from anolisnuma.cluster.kubeconfig import load_kubeconfig
from anolisnuma.cluster.oenumas import OenumaSet
from anolisnuma.cluster.watcher import OenumaWatcher
from anolisnuma.testing.kube_apiserver import kubeconfig_text, make_certificates

NODE = "w1"
CR = {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
      "metadata": {"name": "a", "namespace": "batch", "resourceVersion": "5", "generation": 1},
      "spec": {"node": [{"name": NODE, "podAffinity": [{"podName": "x", "numaNum": 1}]}]}}


class Script:
    """What the fake server answers: ``list(handler)`` and ``watch(handler)`` write the reply."""

    def __init__(self) -> None:
        self.list: Callable[[Any], None] = lambda h: h.reply(200, {"items": [CR], "metadata": {"resourceVersion": "5"}})
        self.watch: Callable[[Any], None] = lambda h: h.reply(200, b"", chunks=events(
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}}))
        self.requests: List[str] = []
        self.encodings: List[str] = []    # the Accept-Encoding of each request


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Script

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, status: int, body: Any, chunks: Any = None, encoding: str = "") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if encoding:
            self.send_header("Content-Encoding", encoding)
        if chunks is None:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in chunks:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass

    def do_GET(self) -> None:
        self.script.requests.append(self.path)
        self.script.encodings.append(self.headers.get("Accept-Encoding", ""))
        (self.script.watch if "watch=true" in self.path else self.script.list)(self)


@pytest.fixture
def server(tmp_path: Any) -> Iterator[Any]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found: apt-get install openssl")
    make_certificates(str(tmp_path))
    script = Script()
    handler = type("H", (Handler,), {"script": script})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(tmp_path / "server.crt"), str(tmp_path / "server.key"))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    (tmp_path / "kubeconfig").write_text(kubeconfig_text(f"https://127.0.0.1:{httpd.server_address[1]}",
                                                         str(tmp_path / "ca.crt"), token="t"))
    changes: List[int] = []
    crs = OenumaSet(NODE)
    watcher = OenumaWatcher(KubeClient(load_kubeconfig(str(tmp_path / "kubeconfig")), timeout=1.0), crs,
                            lambda: changes.append(crs.version), watch_timeout=5, jitter=lambda: 0.5)
    try:
        yield script, watcher, crs
    finally:
        watcher.client.close()
        httpd.shutdown()
        httpd.server_close()


def events(*objs: Dict[str, Any]) -> List[bytes]:
    return [json.dumps(o).encode() + b"\n" for o in objs]


def test_a_list_that_is_not_json_keeps_the_crs_and_backs_off(server) -> None:
    script, w, crs = server
    w.run_once()
    assert w.state == "synced" and len(crs.mine()[1]) == 1
    w.resource_version = ""            # list again: now garbage
    script.list = lambda h: h.reply(200, b"<html>proxy error</html>")
    w.run_once()
    assert w.state == "down" and "Garbage" in w.last_error and len(crs.mine()[1]) == 1
    assert 0.5 * 0.8 <= w.interval <= 0.5 * 1.2
    w.run_once()
    assert w.failures_in_a_row == 2 and 1.0 * 0.8 <= w.interval <= 1.0 * 1.2   # doubled


def test_a_watch_event_larger_than_the_bound_ends_the_watch_and_memory_stays_bounded(server) -> None:
    script, w, crs = server
    # an endless line: 64 MiB without a newline, sent as it is read
    script.watch = lambda h: h.reply(200, b"", chunks=(b'{"type":"MODIFIED","object":"' + b"x" * (1 << 20)
                                                        for _ in range(64)))
    w.run_once()
    assert w.state == "down" and f"larger than {MAX_EVENT_BYTES}" in w.last_error
    assert len(crs.mine()[1]) == 1      # the CR listed before is kept


def test_unknown_event_types_and_non_objects_are_garbage_and_error_events_are_failures(server) -> None:
    script, w, crs = server
    for body, problem in ((events({"type": "WEIRD", "object": {"metadata": {"resourceVersion": "6"}}}), "WEIRD"),
                          (events({"type": "ADDED", "object": {}}), "Garbage"),   # (no metadata)
                          ([b"[1, 2]\n"], "Garbage"), ([b"{not json\n"], "Garbage"),
                          (events({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd"}}),
                           "etcd")):
        script.watch = lambda h, body=body: h.reply(200, b"", chunks=body)
        w.resource_version = "5"
        w.run_once()
        assert w.state == "down" and problem in w.last_error, w.last_error


def test_events_update_the_crs_and_410_relists(server) -> None:
    script, w, crs = server
    changed = dict(CR, metadata=dict(CR["metadata"], resourceVersion="7", generation=2),
                   spec={"node": [{"name": NODE, "podAffinity": [{"podName": "y", "numaNum": 2}]}]})
    other = {"metadata": {"name": "b", "namespace": "batch", "resourceVersion": "8"},
             "spec": {"node": [{"name": "w2"}]}}
    script.watch = lambda h: h.reply(200, b"", chunks=events(
        {"type": "MODIFIED", "object": changed}, {"type": "ADDED", "object": other},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}))
    w.run_once()
    assert w.resource_version == "9" and crs.seen == 2 and crs.mine()[1][0]["spec"] == changed["spec"]
    assert w.bookmarks == 1 and w.events == 2
    watch = [r for r in script.requests if "watch=true" in r][-1]
    assert "allowWatchBookmarks=true" in watch and "resourceVersion=5" in watch   # (lightkube has no parameter for it)
    script.watch = lambda h: h.reply(200, b"", chunks=events(
        {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}))
    w.run_once()
    assert w.gone == 1 and w.resource_version == ""
    w.run_once()                        # lists again (the fake's list has the first CR only)
    assert w.lists == 2 and crs.seen == 1 and "resourceVersion=5" in script.requests[-1]


def test_a_list_slower_than_the_request_timeout_fails_within_it(server) -> None:
    script, w, crs = server
    script.list = lambda h: (time.sleep(5), h.reply(200, {"items": []}))
    started = time.monotonic()
    w.run_once()
    took = time.monotonic() - started
    assert w.state == "down" and "Timeout" in w.last_error
    assert took < 3 * w.client.timeout, took


def test_a_reply_nested_past_the_decoder_takes_the_backoff_too(server) -> None:
    """JSON nested deeper than the decoder goes raises RecursionError, not a ValueError:
    a failure all the same, backed off (not a retry at once with a traceback each)."""
    script, w, crs = server
    w.run_once()
    w.resource_version = ""
    deep = b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b', "metadata": {"resourceVersion": "6"}}'
    script.list = lambda h: h.reply(200, deep)
    w.run_once()
    assert w.state == "down" and "RecursionError" in w.last_error and len(crs.mine()[1]) == 1
    assert 0.5 * 0.8 <= w.interval <= 0.5 * 1.2
    script.watch = lambda h: h.reply(200, b"", chunks=[b'{"type": "ADDED", "object": ' + b"[" * 100_000 +
                                                       b"]" * 100_000 + b"}\n"])
    w.resource_version = "5"
    w.run_once()
    assert w.failures_in_a_row == 2 and "RecursionError" in w.last_error and 1.0 * 0.8 <= w.interval <= 1.0 * 1.2


def crs_list(size: int) -> bytes:
    """A list of 8 Oenumas, ``size`` bytes of JSON in all (their annotations fill it)."""
    pad = max(0, size // 8 - len(json.dumps(CR)) - 40)
    items = [dict(CR, metadata=dict(CR["metadata"], name=f"cr-{i}", annotations={"pad": "x" * pad}))
             for i in range(8)]
    return json.dumps({"items": items, "metadata": {"resourceVersion": "5"}}).encode()


def listed_with_peak(client: KubeClient) -> Any:
    """(the CRs listed, or the ApiError; the peak of memory traced meanwhile)."""
    tracemalloc.start()
    try:
        try:
            got: Any = list(client.list_oenumas(500))
        except ApiError as e:
            got = e
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_compressed_reply_is_bounded_by_its_decoded_size_and_memory_stays_bounded(server, tmp_path) -> None:
    """Given a client whose reply bound is 4 MiB (the daemon's is 64 MiB: the same code,
    a smaller test), when the server sends 32 MiB of JSON gzipped into a few tens of kB,
    then the list is refused as garbage past the bound, and the memory it took stays near
    what a reply within the bound takes."""
    script, _, _ = server
    bound = 4 << 20
    client = KubeClient(load_kubeconfig(str(tmp_path / "kubeconfig")), timeout=10.0, max_reply_bytes=bound)
    try:
        within = crs_list(bound - (512 << 10))
        script.list = lambda h: h.reply(200, within)
        got, baseline = listed_with_peak(client)
        assert [c["metadata"]["name"] for c in got] == [f"cr-{i}" for i in range(8)]

        bomb = gzip.compress(crs_list(32 << 20), 9)
        assert len(bomb) < bound // 16    # (what the wire carries: far under the bound)
        script.list = lambda h: h.reply(200, bomb, encoding="gzip")
        got, peak = listed_with_peak(client)
        assert isinstance(got, ApiError) and got.reason == "Garbage", got
        assert f"larger than {bound} bytes (decoded)" in got.message
        assert peak < 1.5 * baseline, (peak, baseline)
        assert set(script.encodings) == {"identity"}   # (asked for none: httpx's default asks gzip)
    finally:
        client.close()


def test_a_compressed_reply_within_the_bound_still_lists_and_a_compressed_watch_line_is_bounded(server) -> None:
    script, w, crs = server
    listed = json.dumps({"items": [CR], "metadata": {"resourceVersion": "5"}}).encode()
    script.list = lambda h: h.reply(200, zlib.compress(listed), encoding="deflate")
    script.watch = lambda h: h.reply(200, b"", encoding="gzip", chunks=[gzip.compress(b"".join(events(
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}})))])
    w.run_once()
    assert w.state == "synced" and len(crs.mine()[1]) == 1 and w.resource_version == "6", w.last_error

    # one line of 64 MiB, gzipped to a few tens of kB, as one chunk of the wire
    endless = gzip.compress(b'{"type":"MODIFIED","object":"' + b"x" * (64 << 20), 9)
    script.watch = lambda h: h.reply(200, b"", encoding="gzip", chunks=[endless])
    w.run_once()
    assert w.state == "down" and f"a watch event larger than {MAX_EVENT_BYTES} bytes" in w.last_error
    assert len(crs.mine()[1]) == 1


@pytest.mark.parametrize("encoding", ["br", "gzip, gzip", "compress"])
def test_a_reply_in_an_encoding_not_decoded_here_is_garbage(server, encoding: str) -> None:
    script, w, crs = server
    script.list = lambda h: h.reply(200, b"\x00" * 64, encoding=encoding)
    w.run_once()
    assert w.state == "down" and "Garbage" in w.last_error and "Content-Encoding" in w.last_error, w.last_error


def test_corrupt_gzip_is_garbage(server) -> None:
    script, w, crs = server
    script.list = lambda h: h.reply(200, gzip.compress(b'{"items": []}')[:12] + b"junkjunk", encoding="gzip")
    w.run_once()
    assert w.state == "down" and "Garbage" in w.last_error and "does not decode" in w.last_error, w.last_error
