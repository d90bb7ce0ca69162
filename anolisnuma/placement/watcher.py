"""Follows what the placement depends on outside the CRI: the kubelet's CPU manager
checkpoint (its shared pool) and the placement-rule files; when the rules changed (files or
Oenuma CRs), the running pods they concern are re-pinned (applied by the re-pinner)."""

from __future__ import annotations

from anolisnuma.controller import Controller
from anolisnuma.placement.service import PlacementService


class PlacementWatcher(Controller):
    name = "numa-watch"

    def __init__(self, service: PlacementService, interval_seconds: float) -> None:
        super().__init__()
        self.service = service
        self.interval = interval_seconds

    def run_once(self) -> None:
        # Each costs a stat when nothing changed; the CRI path also refreshes the pool
        # right before deciding, this keeps it current between calls.
        self.service.follow_pool()
        self.service.reload_rules()
        self.service.reconcile_rules()
