"""A change of placement rules applies to running pods: ``PlacementService.reconcile_rules``
moves the pods a rule now names (live, through the re-pinner) and returns the pods a
removed rule pinned to balance. Rule files here; Oenuma CRs go the same way
(tests/cluster)."""

from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.rules import PinRule
from anolisnuma.reconcile.numa import CpusetRepinner
from anolisnuma.testing import fake_sysfs as F
from test_numa_hook import FakeNode
from test_numa_move import FakeContainerd

RULE = """apiVersion: resource.sop.huawei.com/v1alpha1
kind: Oenuma
metadata: {name: plan, namespace: batch}
spec:
  node:
  - name: worker-1
    podAffinity: [{podName: web, numaNum: NODE}]
"""


def test_rule_files_added_changed_removed_move_the_running_pod(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    node = FakeNode(str(tmp_path), F.seed_16cpu(), NumaConfig(enabled=True, namespaces=["batch"],
                                                              node_name="worker-1", rules_dir=str(rules)))
    p = node.hook.placement
    web = node.run_pod("web")
    cid = node.create(web, "app", request=1000)
    assert p.ledger.get(web.uid).nodes == (0,)
    client = FakeContainerd(node)
    repin = CpusetRepinner(p, client)

    (rules / "plan.yaml").write_text(RULE.replace("NODE", "2"))
    p.reload_rules()
    assert p.reconcile_rules() == 1 and p.reconcile_rules() == 0    # once per change
    assert repin.run_once() == 1 and str(node.cpus_of(cid)) == "8-11" and node.mems_of(cid) == "2"
    assert p.ledger.get(web.uid).source == "rule" and p.moves_in_flight() == []

    (rules / "plan.yaml").write_text(RULE.replace("NODE", "3"))
    p.reload_rules()
    assert p.reconcile_rules() == 1 and repin.run_once() == 1 and str(node.cpus_of(cid)) == "12-15"

    (rules / "plan.yaml").write_text(RULE.replace("NODE", "3") + "    numa: [{numaNum: 3, cpuset: '13'}]\n")
    p.reload_rules()
    assert p.reconcile_rules() == 1 and repin.run_once() == 1 and str(node.cpus_of(cid)) == "13"

    (rules / "plan.yaml").unlink()
    p.reload_rules()
    # back to balance: on an empty machine the node it is on (ties go to the nearest), all of it
    assert p.reconcile_rules() == 1 and repin.run_once() == 1
    assert p.ledger.get(web.uid).source == "balance" and str(node.cpus_of(cid)) == "12-15"


def test_a_failed_rule_re_pin_is_rolled_back_and_not_retried_until_the_rules_change(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    p = node.hook.placement
    pod = node.run_pod("db")
    cid = node.create(pod, "app", request=1000)
    client = FakeContainerd(node)
    client.fail.add(cid)
    assert p.set_cluster_rules([PinRule("batch", "db", (1,), source="apiserver batch/x")])
    assert not p.set_cluster_rules([PinRule("batch", "db", (1,), source="apiserver batch/x")])
    assert p.reconcile_rules() == 1
    CpusetRepinner(p, client).run_once()
    assert p.ledger.get(pod.uid).nodes == (0,) and "rolled back" in p.rule_failure(pod.uid)
    assert p.reconcile_rules() == 0
    client.fail.clear()
    assert p.set_cluster_rules([PinRule("batch", "db", (1,), cpus=CpuSet.parse("5"), source="apiserver batch/x")])
    assert p.reconcile_rules() == 1 and CpusetRepinner(p, client).run_once() == 1
    assert str(node.cpus_of(cid)) == "5" and p.rule_failure(pod.uid) == ""
