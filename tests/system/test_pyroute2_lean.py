"""pyroute2's message modules load without the package's __init__, and the package still
answers whole to whoever asks it for a name.

Each case runs in a fresh interpreter: the point is what ``sys.modules`` holds after the
imports, which this test process has long since filled.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


def run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def pyroute2_modules_of(imports: str) -> dict:
    return run(f"""
        import json, sys
        {imports}
        from anolisnuma.system import pyroute2_lean
        mods = sorted(m for m in sys.modules if m == "pyroute2" or m.startswith("pyroute2."))
        print(json.dumps({{"mods": mods, "lean": pyroute2_lean.is_lean()}}))
    """)


def test_the_traffic_observer_loads_three_message_modules_not_the_whole_library():
    lean = pyroute2_modules_of("import anolisnuma.system.traffic")
    whole = pyroute2_modules_of("import pyroute2.netlink.diag")
    assert lean["lean"] is True
    assert {"pyroute2.netlink", "pyroute2.netlink.diag",
            "pyroute2.netlink.nfnetlink.nfctsocket"} <= set(lean["mods"])
    # What the package's __init__ alone would bring: the route, NDB and WireGuard sockets.
    for heavy in ("pyroute2.iproute", "pyroute2.ndb.main", "pyroute2.netlink.generic.wireguard"):
        assert heavy in whole["mods"]
        assert heavy not in lean["mods"]
    assert len(lean["mods"]) * 4 < len(whole["mods"])


def test_asking_the_package_for_a_name_completes_it_once():
    got = run("""
        import json
        from anolisnuma.system import pyroute2_lean
        import anolisnuma.system.sockdiag
        before = pyroute2_lean.is_lean()
        from pyroute2 import DiagSocket, IPRoute
        import pyroute2
        from pyroute2.netlink.diag import DiagSocket as Direct
        print(json.dumps({"before": before, "after": pyroute2_lean.is_lean(),
                          "same": DiagSocket is Direct, "iproute": IPRoute.__name__,
                          "version": pyroute2.__version__}))
    """)
    assert got == {"before": True, "after": False, "same": True, "iproute": "IPRoute",
                   "version": got["version"]}
    assert got["version"][0].isdigit()


def test_a_name_the_library_lacks_is_an_attribute_error_either_way():
    got = run("""
        import json
        from anolisnuma.system import pyroute2_lean
        pyroute2_lean.install()
        import pyroute2
        seen = {}
        for name in ("__no_such_dunder__", "NoSuchThing"):
            try:
                getattr(pyroute2, name)
            except AttributeError as e:
                seen[name] = [str(e), pyroute2_lean.is_lean()]
        print(json.dumps(seen))
    """)
    # A probe for a dunder (as copy, pickle or inspect make) leaves the package lean; a
    # plain name completes it, then fails as the whole package would.
    assert got["__no_such_dunder__"][1] is True
    assert "NoSuchThing" in got["NoSuchThing"][0]
    assert got["NoSuchThing"][1] is False


def test_install_after_the_whole_package_changes_nothing():
    got = run("""
        import json
        import pyroute2
        from anolisnuma.system import pyroute2_lean
        pyroute2_lean.install()
        import anolisnuma.system.sockdiag, sys
        print(json.dumps({"lean": pyroute2_lean.is_lean(), "same": sys.modules["pyroute2"] is pyroute2,
                          "iproute": hasattr(pyroute2, "IPRoute")}))
    """)
    assert got == {"lean": False, "same": True, "iproute": True}


@pytest.mark.parametrize("name", ["config", "netlink"])
def test_a_submodule_import_through_the_package_does_not_complete_it(name):
    got = run(f"""
        import json
        from anolisnuma.system import pyroute2_lean
        pyroute2_lean.install()
        from pyroute2 import {name}
        print(json.dumps({{"lean": pyroute2_lean.is_lean(), "mod": {name}.__name__}}))
    """)
    assert got == {"lean": True, "mod": f"pyroute2.{name}"}
