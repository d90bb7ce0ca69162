"""The placement rules of :class:`~anolisnuma.placement.service.PlacementService` (a part of it).

Three sources pin pods, behind one selector, first match winning: the config's
``[numa] pins``, the rule files of ``rules_dir`` (re-read when a file changed) and the
Oenuma CRs naming this node (given by the cluster side). When they change, the running pods
they concern are moved live where the rules now say (:meth:`PlacementRules.reconcile_rules`,
through the service's live move).

Why a part of the service and not an object of its own: a rule change re-pins running
pods, under the service's lock, in its ledger, through its moves; as a part of one class
it reads that state directly, and every caller keeps calling the service.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import structlog

from anolisnuma.placement.moves import MoveInFlight
from anolisnuma.policies.numa.balance import NoPlacement, Placement, PodRequest, balance, pin
from anolisnuma.policies.numa.ledger import Allocation
from anolisnuma.policies.numa.rules import PinRule, RuleFileError, parse_oenuma_documents
from anolisnuma.policies.numa.selection import Selection
from anolisnuma.state.records import PodRecord

log = structlog.get_logger("anolisnuma.numa")


class PlacementRules:
    """The rule sources and the re-pins they cause, for
    :class:`~anolisnuma.placement.service.PlacementService` (a part of it: the state is the
    service's, see ``PlacementService.__init__``)."""

    # ================================================================== queries
    def select(self, pod: PodRecord) -> Selection:
        """Whether ``pod`` is managed, and the rule that pins it."""
        return self._selector.select(pod.namespace, pod.name, pod.annotations, pod.labels)

    def rule_pinned(self, alloc: Allocation) -> bool:
        """Whether a placement rule pins this pod (it never moves)."""
        return alloc.source == "rule" or self._selector.select(alloc.namespace, alloc.name, {}, {}).rule is not None

    @property
    def rule_count(self) -> int:
        return len(self._selector.rules)

    def rule_of(self, alloc: Allocation) -> Optional[PinRule]:
        """The rule that names this pod now (the first that matches), if any."""
        return self._selector.select(alloc.namespace, alloc.name, {}, {}).rule

    def rule_failure(self, pod_uid: str) -> str:
        """Why the pod's rule could not be applied to it ("" when it was, or none names it)."""
        return self._rule_failures.get(pod_uid, "")

    # ================================================================== rule files, Oenuma CRs
    def reload_rules(self) -> None:
        """Re-read the rule directory when a file in it changed."""
        if self._rules is None:
            return
        sig = self._rules.signature()
        if sig == self._rules_sig:
            return
        if not sig[0]:
            log.warning("NUMA rules directory does not exist", rules_dir=self._rules.path)
        files, problems = self._rules.read()
        rules: List[PinRule] = []
        for path, documents in files:
            try:
                r, p = parse_oenuma_documents(documents, path, self.node_name, self.topology)
            except RuleFileError as e:
                problems.append(f"rule file {path} skipped: {' '.join(str(e).split())[:400]}")
                self.rule_files_skipped += 1
                continue
            except Exception as e:  # noqa: BLE001 - one file's failure is its own (issue 33)
                problems.append(f"rule file {path} skipped: it could not be parsed ({type(e).__name__})")
                self.rule_files_skipped += 1
                continue
            rules.extend(r)
            problems.extend(p)
        for problem in problems:
            log.error("placement rule problem", problem=problem)
        self._rules_sig = sig
        self._file_rules = rules
        self._use_rules()
        log.info("NUMA placement rules loaded", rules_dir=self._rules.path, node_name=self.node_name,
                 rules=[r.describe() for r in rules], problems=len(problems))

    def set_cluster_rules(self, rules: Sequence[PinRule]) -> bool:
        """The rules of the Oenuma CRs naming this node, in their order (they come after the
        config pins and the rule files). True when they changed; the running pods they
        concern are re-pinned by the next :meth:`reconcile_rules`."""
        rules = list(rules)
        if rules == self._cluster_rules:
            return False
        self._cluster_rules = rules
        self._use_rules()
        return True

    def _use_rules(self) -> None:
        """One rules engine for every source; first match wins: config pins, rule files, CRs."""
        with self._lock:
            self._selector = self._selector.with_rules(list(self._config_rules) + self._file_rules
                                                       + self._cluster_rules)
            self._rules_dirty = True
            self._rule_failures.clear()

    # ================================================================== re-pins after a rule change
    def reconcile_rules(self) -> int:
        """After the rules changed: every running pod a rule now names is moved live where
        the rule says (unless it is there), and every pod a rule pinned that no rule names
        any more is moved back to where balance puts it. The moves are those of
        :meth:`move` (listed for the re-pinner, memory following, rolled back when a re-pin
        fails). Pods with kubelet-exclusive CPUs stay; a pod whose move is still being
        applied is taken again at the next call. Returns the moves decided."""
        if not self._rules_dirty:
            return 0
        self.follow_pool()
        moved = 0
        with self._lock:
            self._rules_dirty = False
            for alloc in list(self.ledger):
                if not alloc.containers or self._kubelet.has_exclusive(alloc.pod_uid):
                    continue
                if alloc.pod_uid in self._moves:
                    self._rules_dirty = True   # (again once that move is done)
                    continue
                target = self._rule_target(alloc)
                if target is None:
                    continue
                placement, source = target
                if (placement.nodes == alloc.nodes and placement.home == alloc.home
                        and (source == "balance" or placement.mems == alloc.mems)):
                    if alloc.source != source:
                        self.ledger.move(alloc.pod_uid, placement, source=source)
                    continue
                old = MoveInFlight(alloc.nodes, alloc.home, alloc.mems, alloc.source,
                                    placement.reason or "placement rules changed")
                self._start_move(alloc, placement, source, old)
                moved += 1
            self._changed()
        return moved

    def _rule_target(self, alloc: Allocation) -> Optional[Tuple[Placement, str]]:
        """Where the rules want a placed pod now, and the placement's source ("rule" or
        "balance"); None to leave it where it is."""
        rule = self.rule_of(alloc)
        if rule is None and alloc.source != "rule":
            return None
        pool = self.ledger.pool
        request = PodRequest(alloc.demand_millicpu(), alloc.demand_memory(), near=alloc.nodes)
        self.ledger.remove(alloc.pod_uid)
        try:
            if rule is not None:
                placement = pin(self.topology, pool, self.ledger.loads(), rule.nodes, request, cpus=rule.cpus,
                                mems=rule.mems, memory_pinning=self.config.memory_pinning,
                                reason=f"pinned by {rule.source}")
                if rule.mems is None and tuple(placement.nodes) == tuple(alloc.nodes):
                    # (memory widened by today's loads is no reason to move a pod the rule keeps)
                    placement = Placement(placement.nodes, placement.home, placement.cpus, alloc.mems,
                                          placement.reason)
                return placement, "rule"
            log.info("the rule that pinned the pod is gone; back to balance", pod=alloc.ref, pod_uid=alloc.pod_uid)
            return balance(self.topology, pool, self.ledger.loads(), request,
                           memory_pinning=self.config.memory_pinning), "balance"
        except NoPlacement as e:
            self._rule_failures[alloc.pod_uid] = str(e)
            log.warning("placement rule cannot be applied to a running pod; it stays", pod=alloc.ref,
                        rule=rule.describe() if rule else None, reason=str(e))
            return None
        finally:
            self.ledger.add(alloc)
