"""anolisnuma: a CRI proxy that applies QoS and NUMA placement policies per pod."""

__version__ = "0.1.0"
