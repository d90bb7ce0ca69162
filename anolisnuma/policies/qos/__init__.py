"""QoS policies (the anolisbox feature set, on every kernel family): level resolution, knob
values per level, resctrl schemata math, and the ``[qos]`` configuration. Pure: no I/O.

- :mod:`.levels` -- ``QosLevel`` and :func:`resolve_level` (anolisbox, koordinator, rubik);
- :mod:`.table` -- the knob rows of every kernel family: place and value per level;
- :mod:`.plan` -- what this kernel gets, decided once from the rows and the probe's facts,
  and each pod's writes picked from it (an offline pod never turned online);
- :mod:`.resctrl` -- LLC/MBA classes, masks and CLOSID planning;
- :mod:`.config` -- :class:`QosConfig`.
"""
