"""The one resync with containerd: the store and every hook agree with one listing; what
calls named since the window before the listing is left alone; stopped sandboxes and exited
containers hold nothing. (The real containerd case: tests/e2e/test_resync_e2e.py.)"""

from typing import Dict, List

from anolisnuma.pipeline.journal import JournalEntry, PodJournal
from anolisnuma.pipeline.recent import RecentCalls
from anolisnuma.reconcile.resync import RuntimeResync, resync_store
from anolisnuma.state.gone import PodKeys, Reaper
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.state.store import Store
from cri_proto import api_pb2 as pb


def sid(n: int) -> str:
    return f"{n:064x}"


def cid(n: int) -> str:
    return f"{n + 1000:064x}"


class Listing:
    """What containerd lists (the CriClient calls resync_store makes)."""

    def __init__(self) -> None:
        self.sandboxes: Dict[str, pb.PodSandbox] = {}
        self.containers: Dict[str, pb.Container] = {}
        self.closed = False

    def pod(self, n: int, state: int = pb.SANDBOX_READY) -> str:
        self.sandboxes[sid(n)] = pb.PodSandbox(
            id=sid(n), state=state, metadata=pb.PodSandboxMetadata(name=f"p{n}", namespace="ns", uid=f"uid-{n}"))
        return sid(n)

    def container(self, n: int, pod: int, state: int = pb.CONTAINER_RUNNING) -> str:
        self.containers[cid(n)] = pb.Container(id=cid(n), pod_sandbox_id=sid(pod), state=state,
                                               metadata=pb.ContainerMetadata(name=f"c{n}"))
        return cid(n)

    def list_pod_sandboxes(self) -> List[pb.PodSandbox]:
        return list(self.sandboxes.values())

    def list_containers(self) -> List[pb.Container]:
        return list(self.containers.values())

    def pod_sandbox_status(self, sandbox_id: str, verbose: bool = True):
        return None, {"config": {"linux": {"cgroup_parent": f"/kubepods/pod{sandbox_id[-4:]}"}}}

    def container_status(self, container_id: str, verbose: bool = True):
        return None, {"runtimeSpec": {"linux": {"resources": {"cpu": {"cpus": "0-1"}}}}}

    def close(self) -> None:
        self.closed = True


def record(n: int) -> PodRecord:
    return PodRecord(sandbox_id=sid(n), uid=f"uid-{n}", name=f"p{n}", namespace="ns")


def test_the_store_follows_containerd_but_never_what_calls_named():
    ctd, store, recent = Listing(), Store(), RecentCalls()
    for n in (1, 2, 3):
        store.put_pod(record(n))
    store.put_container(ContainerRecord(cid(10), sid(1), "c10"))
    ctd.pod(1)
    ctd.container(11, pod=1)          # created behind the proxy's back: adopted
    ctd.pod(4)                        # a pod never seen: adopted
    ctd.pod(5)                        # named by a call meanwhile (e.g. being removed): left alone
    recent.note("uid-5")
    recent.note(sid(3))               # gone from the listing, but a call named it: kept
    pods, containers, changes = resync_store(ctd, store, recent)
    assert {p.sandbox_id for p in store.pods()} == {sid(1), sid(3), sid(4)}
    assert [c.container_id for c in store.containers()] == [cid(11)]
    assert store.container(cid(11)).resources.cpuset_cpus == "0-1"
    assert store.pod(sid(4)).cgroup_parent.startswith("/kubepods/pod")
    assert changes == {"dropped_pods": 1, "dropped_containers": 1, "adopted_pods": 1, "adopted_containers": 1}
    # what runs: the listed ready sandboxes the store has, and their containers
    assert {p.sandbox_id for p in pods} == {sid(1), sid(4)} and [c.container_id for c in containers] == [cid(11)]


def test_stopped_sandboxes_and_exited_containers_hold_nothing_but_stay_in_the_store():
    ctd, store = Listing(), Store()
    ctd.pod(1)
    ctd.pod(2, state=pb.SANDBOX_NOTREADY)
    ctd.container(10, pod=1)
    ctd.container(11, pod=1, state=pb.CONTAINER_EXITED)
    ctd.container(12, pod=1, state=pb.CONTAINER_CREATED)
    ctd.container(13, pod=2)            # (a running container of a stopped sandbox: not the pod's)
    pods, containers, _ = resync_store(ctd, store)
    assert {p.sandbox_id for p in store.pods()} == {sid(1), sid(2)}   # RemovePodSandbox resolves from it
    assert len(store.containers()) == 4
    assert [p.sandbox_id for p in pods] == [sid(1)]
    assert sorted(c.container_id for c in containers) == [cid(10), cid(12)]


class Hook:
    def __init__(self, name: str, fail: bool = False) -> None:
        self.name = name
        self.fail = fail
        self.seen: List[tuple] = []

    def resync(self, pods, containers, fresh) -> None:
        self.seen.append(([p.sandbox_id for p in pods], [c.container_id for c in containers], fresh))
        if self.fail:
            raise RuntimeError("boom")


def test_every_hook_gets_the_same_listing_and_one_failing_does_not_stop_the_others():
    ctd, store, recent = Listing(), Store(), RecentCalls()
    ctd.pod(1)
    ctd.container(10, pod=1)
    hooks = [Hook("numa", fail=True), Hook("qos")]
    loop = RuntimeResync(lambda: ctd, store, hooks, recent, interval_seconds=60)
    assert loop.step() == (1, 1)
    assert ctd.closed            # one client per pass: none is held between passes
    assert hooks[0].seen == hooks[1].seen == [([sid(1)], [cid(10)], recent)]
    assert loop.hook_errors == 1 and loop.errors == 0 and loop.runs == 1
    assert loop.counts()["adopted_pods"] == 1 and loop.counts()["adopted_containers"] == 1


class Telling(Hook):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.adopted: List[List[str]] = []

    def pods_adopted(self, pods) -> None:
        self.adopted.append([p.sandbox_id for p in pods])


def test_the_pods_new_to_the_store_are_named_to_the_hooks_after_their_resync():
    """Created while the daemon was away (or NRI not registered): the hooks tell their
    decisions about them (Hook.pods_adopted); the pods the store knew, and those a call
    named meanwhile, are not named."""
    ctd, store, recent = Listing(), Store(), RecentCalls()
    store.put_pod(record(1))
    for n in (1, 2, 3):
        ctd.pod(n)
    hook, plain = Telling("qos"), Hook("numa")   # (a hook without pods_adopted is fine)
    loop = RuntimeResync(lambda: ctd, store, [plain, hook], recent, interval_seconds=60)
    recent.note("uid-3")
    assert loop.step() == (2, 0)   # (pod 3 is left to its call)
    assert hook.adopted == [[sid(2)]] and [p.sandbox_id for p in loop.adopted] == [sid(2)]
    assert loop.step() == (3, 0)   # the call's window is over: pod 3 is read back
    assert hook.adopted == [[sid(2)], [sid(3)]]   # pod 2 named once: the store knows it now


def test_each_pass_the_hooks_saw_is_followed_by_after_pass():
    """(The daemon wakes its re-pinners there: what a pass adopted unpinned is pinned now.)"""
    ctd, calls = Listing(), []
    ctd.pod(1)
    loop = RuntimeResync(lambda: ctd, Store(), [Hook("numa")], RecentCalls(), interval_seconds=60)
    loop.after_pass = lambda: calls.append(len(loop.adopted))
    loop.step()
    loop.step()
    assert calls == [1, 0]


def test_recent_calls_are_left_alone_for_the_next_two_listings_only():
    recent = RecentCalls()
    recent.note("a", "", "b")
    recent.new_window()                  # listing 1 begins: a call before it may still run
    recent.note("c")
    assert "a" in recent and "c" in recent and "" not in recent and len(recent) == 3
    recent.new_window()                  # listing 2
    assert "a" not in recent and "c" in recent
    recent.new_window()
    assert "c" not in recent and len(recent) == 0


def test_pods_that_opted_out_are_never_handed_to_the_hooks_but_stay_in_the_store():
    ctd, store, recent = Listing(), Store(), RecentCalls()
    ctd.pod(1)
    ctd.pod(2)
    ctd.container(10, pod=1)
    ctd.container(20, pod=2)
    hook = Hook("numa")
    loop = RuntimeResync(lambda: ctd, store, [hook], recent, 60, opted_out=lambda pod: pod.sandbox_id == sid(2))
    loop.step()
    assert hook.seen[0][:2] == ([sid(1)], [cid(10)])
    assert {p.sandbox_id for p in store.pods()} == {sid(1), sid(2)}


def test_a_failed_listing_does_not_age_what_calls_named():
    class Down(Listing):
        def list_pod_sandboxes(self):
            raise OSError("containerd is down")

    store, recent = Store(), RecentCalls()
    recent.note("created-before-the-first-attempt")
    loop = RuntimeResync(Down, store, [], recent, 60)
    for _ in range(3):                       # the daemon retries the start-up listing
        assert loop.step() is None and loop.errors
    recent.note("during-the-retries")
    ctd = Listing()
    loop.connect = lambda: ctd
    loop.step()                              # the first listing that happens
    assert "created-before-the-first-attempt" in recent and "during-the-retries" in recent


def test_with_no_periodic_resync_nothing_is_noted():
    recent = RecentCalls()
    recent.note("a")
    recent.set_enabled(False)
    recent.note("b")
    assert len(recent) == 0 and "a" not in recent
    recent.set_enabled(True)
    recent.note("c")
    assert "c" in recent


def test_each_pass_tells_every_holder_what_the_store_no_longer_knows_once_no_call_names_it():
    """A removal sent straight to containerd, and a RunPodSandbox that failed and was never
    retried (its pod never had a sandbox): the pass after the one that still saw calls
    naming them forgets them in every holder, before the hooks' resync."""
    ctd, store, recent = Listing(), Store(), RecentCalls()
    journal = PodJournal()
    reaper = Reaper(store)
    reaper.add(journal)
    store.put_pod(record(1))
    store.put_pod(record(2))                  # its teardown went behind the proxy's back
    ctd.pod(1)
    for uid in ("uid-1", "uid-2", "uid-failed"):
        journal.record(uid, JournalEntry("RunPodSandbox", "OK", 1.0, "", {}, [], "containerd"))
        recent.note(uid)
    loop = RuntimeResync(lambda: ctd, store, [], recent, 60, reaper=reaper)
    loop.step()
    assert store.pod(sid(2)) is None and len(journal) == 3       # the calls are newer than the listing
    loop.step()
    assert journal.held() == PodKeys.of(["uid-1"]) and loop.counts()["forgotten_pods"] == 2
