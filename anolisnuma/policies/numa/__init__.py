"""NUMA placement policy: pure decisions, no I/O.

- :mod:`.cpuset`      ``CpuSet``, the kernel's CPU list format and set arithmetic
- :mod:`.topology`    ``NumaTopology``: nodes, CPUs, memory, distances, SMT siblings
- :mod:`.cpu_manager` the kubelet's exclusive CPUs and shared pool
- :mod:`.balance`     placement decisions (balance, rule pins, memory widening)
- :mod:`.ledger`      allocations and per-node loads
- :mod:`.rules`       placement rules (config pins, ``Oenuma`` files)
- :mod:`.oenuma_cr`   an Oenuma CR's rules under the node's trust
- :mod:`.oenuma_bounds` an Oenuma CR's bounds, checked before it is parsed
- :mod:`.glob`        CR name patterns matched in linear time, no regular expression
- :mod:`.rule_index`  the first rule naming a pod, without a scan
- :mod:`.selection`   which pods are managed
- :mod:`.config`      the ``[numa]`` configuration section
"""
