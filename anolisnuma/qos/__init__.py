"""The QoS service: the one owner of what the kernel is kept at for each managed pod.

:class:`~anolisnuma.qos.service.QosService` keeps the managed pods
(:mod:`~anolisnuma.qos.state`), decides each pod's level when it is first seen
(:mod:`~anolisnuma.qos.admission`, through ``policies/qos``), writes the knobs
(:mod:`~anolisnuma.qos.applier`, through ``system/``), keeps the LLC/MBA resctrl groups
(:mod:`~anolisnuma.qos.llc`) and tells each pod's decision to the decision sink. The QoS
hook asks it to admit, apply and forget pods as the kubelet's calls pass; its reconciler
(``reconcile/qos.py``) asks it to re-apply what drifted. NUMA's counterpart is
:mod:`anolisnuma.placement`.
"""
