"""QoS policies (the anolisbox feature set): level resolution, knob values per level,
resctrl schemata math, and the ``[qos]`` configuration. Pure: no I/O.

- :mod:`.levels` -- ``QosLevel`` and :func:`resolve_level`;
- :mod:`.plan` -- which knob gets which value on pod, container, QoS-class and global level;
- :mod:`.resctrl` -- LLC/MBA classes, masks and CLOSID planning;
- :mod:`.config` -- :class:`QosConfig`.
"""
