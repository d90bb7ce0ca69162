"""Bootstrap of the rpm's launchers (/usr/bin/anolisnuma, /usr/bin/anolisnuma-ctl).

Installed as /usr/lib/anolisnuma/launch.py and run by the launcher as

    python3.X -I -S -B /usr/lib/anolisnuma/launch.py PROG MODULE:FUNCTION [ARGS...]

-I -S: neither PYTHON* variables, the user's site nor the system's site-packages (where a
distribution's python3-protobuf 3.x, or its namespace .pth files, would shadow ours) are
seen; sys.path is the standard library, the dependencies bundled for this Python
(/usr/lib/anolisnuma/pythonX.Y) and anolisnuma itself (/usr/lib/anolisnuma/app).
-B: the package's __pycache__ is read, never written (nothing appears that rpm does not own).
Runs on any Python 3 so that it can say which one it needs.
"""

import os
import sys


def main():
    if len(sys.argv) < 3:
        sys.stderr.write("usage: launch.py PROG MODULE:FUNCTION [ARGS...]\n")
        return 2
    prog, entry = sys.argv[1], sys.argv[2]
    libdir = os.path.dirname(os.path.abspath(__file__))
    version = "%d.%d" % sys.version_info[:2]
    if sys.version_info < (3, 9):
        sys.stderr.write("%s: Python %s (%s) is too old: anolisnuma needs Python >= 3.9\n"
                         % (prog, version, sys.executable))
        return 1
    bundle = os.path.join(libdir, "python" + version)
    if not os.path.isdir(bundle):
        have = sorted(d[len("python"):] for d in os.listdir(libdir) if d.startswith("python3."))
        sys.stderr.write("%s: no dependencies bundled for Python %s (%s) in %s; this package has them for "
                         "Python %s\n" % (prog, version, sys.executable, libdir, ", ".join(have) or "none"))
        return 1
    sys.path[:0] = [os.path.join(libdir, "app"), bundle]
    if os.environ.get("ANOLISNUMA_LAUNCHER_DEBUG"):
        sys.stderr.write("%s: python %s (%s), sys.path %s\n" % (prog, sys.version.split()[0], sys.executable,
                                                                 os.pathsep.join(sys.path)))
    sys.argv = [prog] + sys.argv[3:]
    module, _, function = entry.partition(":")
    try:
        __import__(module)
    except ImportError as e:
        name = getattr(e, "name", None) or ""
        if name and (module == name or module.startswith(name + ".")):
            sys.stderr.write("%s: this installation has no %s (%s)\n" % (prog, module, e))
            return 1
        raise
    return getattr(sys.modules[module], function)()


if __name__ == "__main__":
    sys.exit(main())
