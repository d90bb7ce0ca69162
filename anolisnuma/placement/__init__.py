"""The NUMA placement service: the one owner of where managed pods run.

:class:`~anolisnuma.placement.service.PlacementService` holds the ledger of allocations,
its lock, its persistence and the re-pins waiting to reach containerd; its rule sources
(``rules.py``) and live moves (``moves.py``) are parts of that one class. The NUMA hook asks
it to place and release pods as the kubelet's calls pass; the traffic-affinity controller
asks it to move them; the re-pinner applies what it lists; its watcher follows the
kubelet's shared pool and the rule files. Decisions are the policies' (balance, rules,
affinity in ``policies/numa``); host files are ``system/``'s.
"""
