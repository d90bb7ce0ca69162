"""A rule file has the power of the node's configuration, so it is read like it: one that
another user may change (or sits where another user may write), or that is no regular file,
is skipped with a problem naming it and the fix; fixing it makes the next poll take it."""

from __future__ import annotations

import os
import threading

from structlog.testing import capture_logs
from test_numa_hook import FakeNode

from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.testing import fake_sysfs as F
from anolisnuma.testing.waiting import wait_until

RULE = """
apiVersion: resource.sop.huawei.com/v1alpha1
kind: Oenuma
metadata: {name: plan, namespace: default}
spec: {node: [{name: worker-1, podAffinity: [{namespace: default, podName: nginx, numaNum: 2}]}]}
"""


def test_a_rule_file_others_may_write_is_skipped_until_it_is_fixed(tmp_path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    path = rules / "10-plan.yaml"
    path.write_text(RULE)
    os.chmod(path, 0o666)
    with capture_logs() as logs:
        node = FakeNode(str(tmp_path), F.seed_16cpu(), NumaConfig(enabled=True, node_name="worker-1",
                                                                  rules_dir=str(rules)))
    (problem,) = [e["problem"] for e in logs if "problem" in e]
    assert problem == (f"rule file skipped: {path} is not safe to trust: {path} is writable by every user (mode "
                       f"0666): whoever may write there may swap what the daemon reads as root; fix: chmod go-w {path}")
    assert node.hook.placement.rule_count == 0
    os.chmod(path, 0o644)                       # (its ctime moves: the poll reads it again)
    node.hook.placement.reload_rules()
    assert node.hook.placement.rule_count == 1
    os.chmod(rules, 0o777)
    node.hook.placement.reload_rules()
    assert node.hook.placement.rule_count == 0


def test_a_fifo_among_the_rule_files_does_not_block_the_reread(tmp_path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "10-plan.yaml").write_text(RULE)
    fifo = str(rules / "20-fifo.yaml")
    os.mkfifo(fifo, 0o600)
    made = []
    start = threading.Thread(target=lambda: made.append(FakeNode(
        str(tmp_path), F.seed_16cpu(), NumaConfig(enabled=True, node_name="worker-1", rules_dir=str(rules)))),
        daemon=True)
    with capture_logs() as logs:
        start.start()
        try:
            wait_until(lambda: made, "the placement service to start with a FIFO among its rule files")
        finally:
            if start.is_alive():
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert made[0].hook.placement.rule_count == 1
    assert [e["problem"] for e in logs if "problem" in e] == [
        f"rule file skipped: {fifo} is not a regular file (a FIFO)"]
