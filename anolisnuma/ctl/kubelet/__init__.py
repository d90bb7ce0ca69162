"""``anolisnuma-ctl kubelet``: being split into small modules (see view.py for now)."""

from __future__ import annotations

from anolisnuma.ctl.kubelet.view import *  # noqa: F401,F403
