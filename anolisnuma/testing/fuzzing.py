"""The fuzz suite's measuring, and its catalogue of the parsers it fuzzes (issue 33).

``tests/fuzz`` holds one file per parser family; each test feeds a parser what Hypothesis
generates and checks, for every input, the three properties a parser of outside input
must have here:

1. it returns a value or raises its own error, never anything else (:func:`outcome`);
2. its CPU time grows no worse than linearly with the input (:func:`assert_linear`: a
   small input and one ``size_ratio`` times larger of the same shape, measured in the same
   test; the larger may cost at most ``time_ratio`` times more);
3. its peak memory (``tracemalloc``: what the call allocates, the input excluded) stays
   under ``memory_base + memory_per_byte * input size`` (:func:`outcome` checks it on every
   input, :func:`assert_linear` on the large one).

The bounds are stated once, here (:data:`PARSERS`), so that the tests assert exactly what
``scripts/fuzz.py --list`` prints. They are generous on purpose: a linear parser measures
well within them on a busy machine, a quadratic one misses them by a factor of
``size_ratio`` or so. A test that fails now and then is worse than none.

Runs are shaped by two environment variables, read when a test module is imported:
``ANOLISNUMA_FUZZ_PROFILE`` (``ci``, the default: each test's own ``max_examples``,
derandomized, so CI is deterministic; ``long``: ``ANOLISNUMA_FUZZ_SCALE`` times the
examples, random, for ``scripts/fuzz.py --minutes``) and ``ANOLISNUMA_FUZZ_REPORT`` (a file the run's
observations are written to as JSON at its end, per parser: inputs tried, the worst CPU
time and peak memory of one).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Type

ENV_PROFILE = "ANOLISNUMA_FUZZ_PROFILE"
ENV_REPORT = "ANOLISNUMA_FUZZ_REPORT"
ENV_SCALE = "ANOLISNUMA_FUZZ_SCALE"
LONG_SCALE = 10
KIB = 1 << 10
MIB = 1 << 20


@dataclass(frozen=True)
class Parser:
    """One parser of outside input: where it is, who writes its input, what the suite
    generates for it, and its bounds."""

    name: str
    entry: str
    error: str                 # its own error ("none": it never raises)
    writer: str                # who writes its input
    generator: str             # what the suite feeds it
    memory_base: int           # peak bytes allocated for any input, at most ...
    memory_per_byte: int       # ... plus this many per byte of input
    size_ratio: int = 100      # the large input of the time test, over the small one
    time_ratio: float = 300.0  # its CPU time over the small one's, at most

    def memory_bound(self, size: int) -> int:
        return self.memory_base + self.memory_per_byte * size

    def describe_bounds(self) -> str:
        return (f"time: {self.size_ratio}x the input costs at most {self.time_ratio:g}x the CPU time; "
                f"memory: peak at most {_size(self.memory_base)} + {self.memory_per_byte} B per input byte")


PARSERS: Dict[str, Parser] = {p.name: p for p in (
    Parser("cpuset", "policies/numa/cpuset.py CpuSet.parse", "CpuSetError",
           "the kernel (sysfs cpulists), the kubelet (cpu_manager_state), an Oenuma's author (cpuset, memset), "
           "containerd (NRI cpusets)",
           "lists of N, A-B and A-B:U/G items with numbers at 0, MAX_CPU and past it, long digit runs, blanks, "
           "stray characters; any text", 256 * KIB, 64),
    Parser("oenuma-cr", "policies/numa/oenuma_bounds.py entries_for_node, cluster/oenumas.py trim, "
           "OenumaSet.upsert, RuleBook.parse, policies/numa/oenuma_cr.py parse_cr",
           "none (RuleBook.parse marks a CR malformed: CrRules.error); parse_cr: RuleFileError",
           "whoever may create oenumas in some namespace (a tenant), through the API server",
           "dicts shaped like Oenuma CRs, each list at, below and just past its bound, hostile leaves (long "
           "and odd strings, wildcards, huge and negative numbers, wrong types)", 2 * MIB, 64, 30, 90.0),
    Parser("qos-annotations", "policies/qos/levels.py resolve_level, policies/qos/resctrl.py llc_class_for, "
           "qos/admission.py Admission.decide", "none (a value it does not take is a warning)",
           "the pod's author (annotations, labels), the kubelet (cgroup_parent)",
           "annotation and label maps with anolisbox.sh/qoslevel, koordinator.sh/qosClass, volcano.sh/preemptable, "
           "anolisbox.sh/llc_limit set to levels in any case, blanks, look-alikes, long and odd text",
           256 * KIB, 64),
    Parser("numa-selection", "policies/numa/selection.py PodSelector.select", "none",
           "the pod's author (namespace, name, annotations, labels)",
           "namespaces, names and the skip annotation against shell patterns (config) and Oenuma globs (CRs)",
           256 * KIB, 64),
    Parser("rule-files", "system/rule_files.py RuleDirectory.read, policies/numa/rules.py parse_oenuma_documents",
           "none from read (a file it cannot use is a problem); RuleFileError from parse_oenuma_documents",
           "root (files in the rule directory)",
           "YAML text: Oenuma documents with hostile leaves, anchors and alias bombs, deep nesting, up to the "
           "reader's own 1 MiB", 4 * MIB, 256, 30, 90.0),
    Parser("kubeconfig", "cluster/kubeconfig.py load_kubeconfig, cluster/token_file.py read_token_file, "
           "cluster/token_auth.py TokenFileAuth", "KubeconfigError; TokenError; BadToken",
           "root (the kubeconfig and the files it names)",
           "kubeconfig YAML with hostile contexts, servers, users, file names; token files as bytes",
           2 * MIB, 256, 30, 90.0),
    Parser("config", "config.py Config.load (configfile.py load_toml, Table)", "ConfigError (ConfigErrors: several)",
           "root (the configuration file)",
           "TOML text of the real sections and keys with values of every type, huge, deep, odd; any text; "
           "files of 100,000 errors (unknown keys and tables, escape codes in keys)",
           2 * MIB, 256, 30, 90.0),
    Parser("kubelet-state", "system/kubelet_state.py parse_cpu_manager_state, read_cpu_manager_state",
           "KubeletStateError", "the kubelet (cpu_manager_state)",
           "checkpoints with hostile entries, wrong types, deep nesting; any bytes", 2 * MIB, 64),
    Parser("state-files", "state/persist.py load_json_state: Store.load (store.json), NumaStateFile.load "
           "(numa.json), cluster/oenumas.py RulesFile.load (cluster-oenumas.json)",
           "none (an unusable file is moved aside: None); StateFormatTooNew",
           "the daemon itself (a file planted or torn there, an older version's)",
           "records of each file with wrong types, odd versions, deep nesting; any bytes", 2 * MIB, 64),
    Parser("nri", "nri/frames.py MuxDecoder.feed, TtrpcDecoder.feed; ttrpc Request and NRI requests parsed; "
           "nri/translate.py sandbox_config, create_container, update_container, adjustment",
           "FrameError; protobuf's DecodeError; translate: none",
           "containerd (the NRI socket, root only), or whatever listens at its path",
           "byte streams cut anywhere with hostile lengths and ids; NRI pods and containers with huge strings, odd "
           "cpusets, many annotations", 2 * MIB, 64),
)}


# ---------------------------------------------------------------- run shape

def long_run() -> bool:
    return os.environ.get(ENV_PROFILE, "ci") == "long"


def examples(n: int) -> int:
    """A test's ``max_examples``: its own in CI, ``$ANOLISNUMA_FUZZ_SCALE`` (default
    :data:`LONG_SCALE`) times more in a long run."""
    return n * int(os.environ.get(ENV_SCALE) or LONG_SCALE) if long_run() else n


def register_profiles() -> None:
    """``fuzz-ci`` and ``fuzz-long`` (see ``tests/fuzz/conftest.py``)."""
    from hypothesis import HealthCheck, Phase, settings

    settings.register_profile("fuzz-ci", deadline=None, derandomize=True, database=None, print_blob=False,
                              # (the generators build inputs of many kilobytes on purpose)
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.large_base_example],
                              # No shrinking: a finding fails the suite in a second, not a minute
                              # (each one known has its smallest input as a test of its own); a
                              # long run prints the blob that replays one, to shrink it then.
                              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.register_profile("fuzz-long", parent=settings.get_profile("fuzz-ci"), derandomize=False,
                              print_blob=True)


def fuzz_settings(max_examples: int, **overrides: Any) -> Any:
    """A fuzz test's Hypothesis settings: the run's profile, and ``max_examples`` scaled
    by :func:`examples`."""
    from hypothesis import settings

    register_profiles()   # (idempotent; a test module imported without the conftest works too)
    profile = settings.get_profile("fuzz-long" if long_run() else "fuzz-ci")
    return settings(profile, max_examples=examples(max_examples), **overrides)


# ---------------------------------------------------------------- observations

@dataclass
class Seen:
    inputs: int = 0
    worst_cpu: float = 0.0
    worst_peak: int = 0
    worst_ratio: float = 0.0     # large/small CPU time of the time tests

    def as_dict(self) -> Dict[str, Any]:
        return {"inputs": self.inputs, "worst_cpu_seconds": self.worst_cpu, "worst_peak_bytes": self.worst_peak,
                "worst_time_ratio": self.worst_ratio}


SEEN: Dict[str, Seen] = {}


def _seen(name: str) -> Seen:
    if name not in PARSERS:
        raise KeyError(f"{name} is not in fuzzing.PARSERS")
    return SEEN.setdefault(name, Seen())


def write_report(path: Optional[str] = None) -> None:
    """The observations so far, as JSON, to ``path`` (default: ``$ANOLISNUMA_FUZZ_REPORT``)."""
    path = path or os.environ.get(ENV_REPORT)
    if path:
        with open(path, "w") as f:
            json.dump({name: seen.as_dict() for name, seen in SEEN.items()}, f)


# ---------------------------------------------------------------- measuring

def forget() -> None:
    """Empty the parsers' memo caches, so each input is parsed, not looked up (every
    ``lru_cache`` of the modules that keep one, whatever it is called there)."""
    for module in ("anolisnuma.policies.numa.cpuset", "anolisnuma.policies.numa.rules"):
        mod = sys.modules.get(module)
        for value in vars(mod).values() if mod is not None else ():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


Outcome = Tuple[Any, Optional[BaseException]]


def outcome(name: str, fn: Callable[[], Any], own: Tuple[Type[BaseException], ...] = (), size: int = 0,
            traced: bool = True) -> Outcome:
    """``(value, None)`` or ``(None, its own error)`` of ``fn()``; any other exception goes
    through (property 1: the test fails with it). Its peak memory is checked against the
    parser's bound for an input of ``size`` bytes (property 3; not when ``traced`` is false,
    for the few inputs tracemalloc slows down a hundredfold), and its CPU time noted."""
    forget()
    start = time.process_time()
    try:
        result: Outcome = (fn(), None)
    except own as e:
        result = (None, e)
    cpu = time.process_time() - start
    forget()
    peak = traced_peak(fn, own) if traced else 0
    seen = _seen(name)
    seen.inputs += 1
    seen.worst_cpu = max(seen.worst_cpu, cpu)
    seen.worst_peak = max(seen.worst_peak, peak)
    bound = PARSERS[name].memory_bound(size)
    assert peak <= bound, f"{name}: peak {peak} bytes for an input of {size} bytes, over the bound {bound}"
    return result


def traced_peak(fn: Callable[[], Any], own: Tuple[Type[BaseException], ...] = ()) -> int:
    """The peak of what ``fn()`` allocates (tracemalloc), its own error swallowed."""
    tracemalloc.start()
    try:
        fn()
    except own:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def cpu_per_call(fn: Callable[[], Any], repeats: int = 5, at_least: float = 0.004) -> float:
    """The CPU time of one ``fn()``: the best of ``repeats`` measurements, each of as many
    calls as make ``at_least`` seconds (a timer's step and a stray interrupt vanish). The
    collector is paused meanwhile: its passes are the interpreter's, not the parser's."""
    calls = 1
    while True:   # (calibrate on the first measurement)
        took = _timed(fn, calls)
        if took >= at_least or calls >= 1 << 16:
            break
        calls = calls * 2 if took <= 0 else max(calls * 2, int(calls * at_least / took) + 1)
    best = took / calls
    for _ in range(repeats - 1):
        best = min(best, _timed(fn, calls) / calls)
    return max(best, 1e-9)


def _timed(fn: Callable[[], Any], calls: int) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(calls):
            fn()
        return time.process_time() - start
    finally:
        gc.enable()


def assert_linear(name: str, make: Callable[[int], Any], run: Callable[[Any], Any], small: int,
                  size: Callable[[Any], int] = len) -> float:
    """Property 2 (and 3 on the large input): ``run(make(small))`` against
    ``run(make(small * size_ratio))``, where ``make(n)`` is an input of ``n`` units of one
    shape. ``run`` swallows the parser's own error. Returns the measured ratio."""
    parser = PARSERS[name]
    little, big = make(small), make(small * parser.size_ratio)

    def once(value: Any) -> Callable[[], Any]:
        def call() -> Any:
            forget()
            return run(value)
        return call

    t_small = cpu_per_call(once(little))
    t_big = cpu_per_call(once(big), repeats=3)
    ratio = t_big / t_small
    seen = _seen(name)
    seen.worst_ratio = max(seen.worst_ratio, ratio)
    seen.worst_cpu = max(seen.worst_cpu, t_big)
    assert ratio <= parser.time_ratio, (
        f"{name}: {parser.size_ratio}x the input took {ratio:.0f}x the CPU time ({t_small * 1e3:.3f} ms -> "
        f"{t_big * 1e3:.1f} ms), more than the bound {parser.time_ratio:g}x")
    forget()
    peak = traced_peak(once(big))
    seen.worst_peak = max(seen.worst_peak, peak)
    bound = parser.memory_bound(size(big))
    assert peak <= bound, f"{name}: peak {peak} bytes for the large input ({size(big)} bytes), over {bound}"
    return ratio


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n // KIB} KiB"
