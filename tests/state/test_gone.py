"""The Reaper: one place decides what is gone and tells every holder of pod state."""

from __future__ import annotations

from typing import Dict, List

import pytest

from anolisnuma.pipeline.recent import RecentCalls
from anolisnuma.state.gone import PodGone, PodKeys, PodStateHolder, Reaper
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.state.store import Store


class Holder(PodStateHolder):
    """Keeps a set of keys; forgets what it is told."""

    def __init__(self, name: str = "holder", uids=(), sandbox_ids=(), container_ids=()) -> None:
        self.name = name
        self.keys = PodKeys.of(uids, sandbox_ids, container_ids)
        self.told: List[PodGone] = []

    def held(self) -> PodKeys:
        return self.keys

    def forget(self, gone: PodGone) -> None:
        self.told.append(gone)
        k = self.keys
        self.keys = PodKeys(k.uids - gone.uids, k.sandbox_ids - gone.sandbox_ids,
                            k.container_ids - gone.container_ids)

    def structures(self) -> Dict[str, int]:
        return {"keys": len(self.keys.uids) + len(self.keys.sandbox_ids) + len(self.keys.container_ids)}


class Broken(Holder):
    def forget(self, gone: PodGone) -> None:
        raise RuntimeError("a bug")


def pod(n: int, uid: str = "") -> PodRecord:
    return PodRecord(sandbox_id=f"sandbox-{n}", uid=uid or f"uid-{n}", name=f"p{n}", namespace="ns")


def test_a_removed_sandbox_ends_its_containers_and_the_pod_with_its_last_sandbox():
    store = Store()
    store.put_pod(pod(1))
    store.put_pod(pod(2, uid="uid-1"))     # the same pod restarted into a new sandbox
    store.put_container(ContainerRecord("c-1", "sandbox-1", "app"))
    reaper = Reaper(store)
    gone = reaper.sandbox_removed("sandbox-1")
    assert gone == PodGone.of_ids("removed", [], ["sandbox-1"], ["c-1"])   # the pod lives on
    assert store.pod("sandbox-1") is None and store.container("c-1") is None
    assert reaper.sandbox_removed("sandbox-2") == PodGone.of_ids("removed", ["uid-1"], ["sandbox-2"])
    assert reaper.container_removed("c-9") == PodGone.of_ids("removed", container_ids=["c-9"])


def test_the_resync_reaps_what_the_store_does_not_know_but_not_what_calls_named():
    store, recent = Store(), RecentCalls()
    store.put_pod(pod(1))
    store.put_container(ContainerRecord("c-1", "sandbox-1", "app"))
    a = Holder("a", uids=["uid-1", "uid-lost", "uid-failed-run"], sandbox_ids=["sandbox-1", "sandbox-lost"],
               container_ids=["c-1", "c-lost"])
    b = Holder("b", uids=["uid-new"])
    reaper = Reaper(store)
    reaper.add(a)
    reaper.add(b)
    recent.note("uid-new")                # a call newer than the listing named it
    gone = reaper.reap(recent)
    assert gone == PodGone.of_ids("resync", ["uid-lost", "uid-failed-run"], ["sandbox-lost"], ["c-lost"])
    assert a.keys == PodKeys.of(["uid-1"], ["sandbox-1"], ["c-1"]) and b.keys == PodKeys.of(["uid-new"])
    assert b.told == [gone]               # every holder is told everything that is gone
    assert reaper.reap(recent) == PodGone.of_ids("resync") and len(a.told) == 1   # nothing more: nobody told
    assert reaper.structures() == {"a": {"keys": 3}, "b": {"keys": 1}}


def test_a_holder_that_raises_does_not_keep_the_others_state():
    reaper = Reaper(Store())
    broken, good = Broken("broken", uids=["u"]), Holder("good", uids=["u"])
    reaper.add(broken)
    reaper.add(good)
    reaper.reap()
    assert good.keys == PodKeys() and reaper.errors == 1


def test_a_pod_the_store_knows_again_is_not_told_gone():
    store = Store()
    reaper = Reaper(store)
    holder = Holder(uids=["uid-1"], sandbox_ids=["sandbox-old"])
    reaper.add(holder)
    store.put_pod(pod(1))                 # a new sandbox of uid-1 came while the removal's hooks ran
    reaper.tell(PodGone.of_ids("removed", ["uid-1"], ["sandbox-old"]))
    assert holder.told == [PodGone.of_ids("removed", [], ["sandbox-old"])]


def test_only_pod_state_holders_are_told():
    with pytest.raises(TypeError):
        Reaper(Store()).add(object())   # type: ignore[arg-type]
