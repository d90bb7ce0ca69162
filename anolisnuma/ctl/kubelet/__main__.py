"""``python -m anolisnuma.ctl.kubelet kubelet status``: the command without the rest of the CLI."""

from __future__ import annotations

import sys

from anolisnuma.ctl.kubelet.cli import main

sys.exit(main())
