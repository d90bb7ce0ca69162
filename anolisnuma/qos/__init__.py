"""The QoS half's own package: the managed pods (:mod:`~anolisnuma.qos.state`) and the
writes that keep the kernel at their values (:mod:`~anolisnuma.qos.applier`)."""
