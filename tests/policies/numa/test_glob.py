"""The pod-name patterns of Oenuma CRs: matched like shell patterns with `*` and `?`, with
no regular expression built from them, in time linear in the name."""

from __future__ import annotations

import fnmatch
import random
import time

from anolisnuma.policies.numa import glob
from anolisnuma.policies.numa.glob import Glob, is_pattern


def test_it_matches_as_a_shell_pattern_of_stars_and_question_marks_does() -> None:
    rnd = random.Random(27)
    for _ in range(50000):
        pattern = "".join(rnd.choice("ab-*?") for _ in range(rnd.randint(0, 8)))
        name = "".join(rnd.choice("ab-") for _ in range(rnd.randint(0, 10)))
        assert Glob(pattern).matches(name) == fnmatch.fnmatchcase(name, pattern), (pattern, name)


def test_the_usual_shapes() -> None:
    assert Glob("web-*").matches("web-0") and not Glob("web-*").matches("api-0")
    assert Glob("*-canary").matches("web-7-canary") and not Glob("*-canary").matches("web-canary-2")
    assert Glob("db-?").matches("db-1") and not Glob("db-?").matches("db-10")
    assert Glob("web-*-?").matches("web-a-b-1") and Glob("*").matches("") and Glob("").matches("")
    assert Glob("nginx").matches("nginx") and not Glob("nginx").matches("nginx-0")
    assert not Glob("Web-*").matches("web-0")   # case-sensitive, as pod names are


def test_brackets_and_backslashes_are_plain_characters() -> None:
    assert Glob("[ab]").matches("[ab]") and not Glob("[ab]").matches("a")
    assert not is_pattern("[a-z]") and is_pattern("a?") and is_pattern("*")


def test_no_regular_expression_is_built() -> None:
    source = open(glob.__file__).read()
    assert "import re" not in source and "fnmatch" not in source.split('"""', 2)[2]


def test_a_hostile_pattern_costs_time_linear_in_the_name() -> None:
    """The worst shape for a search: the ends match, and the middle segment's first piece
    is found at every place of the name and fails there."""
    def cost(n: int) -> float:
        g = Glob("*a?a?a?a?a?c*b")   # 7 wildcards (an Oenuma may have 8)
        name = "a" * n + "b"
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(20):
                assert not g.matches(name)
            best = min(best, time.perf_counter() - t)
        return best

    small, large = cost(2000), cost(8000)
    # 4x the name: about 4x the time (a quadratic matcher would take 16x)
    assert large < 8 * small, (small, large)
