"""The walk behind every check of "only root may change this path" (credentials, NRI's
socket): each component is judged on the descriptor the walk goes on from, so a component
swapped after it was judged changes nothing, and a link refused is never followed."""

from __future__ import annotations

import errno
import os
import stat
from typing import List, Tuple

import pytest

from anolisnuma.system.pathwalk import walk


class Judge:
    """Records what the walk showed it; ``refuse`` names a path it refuses, ``then`` is run
    once when it is shown ``when`` (to change the tree in the middle of the walk)."""

    def __init__(self, refuse: str = "", when: str = "", then=None) -> None:
        self.seen: List[Tuple[str, str, bool]] = []
        self.refuse, self.when, self.then = refuse, when, then

    def __call__(self, at: str, st: os.stat_result, fd: int, above: bool) -> None:
        kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
        self.seen.append((at, kind, above))
        if at == self.refuse:
            raise PermissionError(f"refused {at}")
        if at == self.when and self.then is not None:
            then, self.then = self.then, None
            then()


def test_every_component_is_judged_in_order_and_a_link_before_it_is_followed(tmp_path):
    # given /…/etc/kubeconfig -> ../real/kubeconfig
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "kubeconfig").write_text("x")
    (tmp_path / "etc").mkdir()
    os.symlink("../real/kubeconfig", tmp_path / "etc" / "kubeconfig")
    judge = Judge()
    # when it is walked
    with walk(str(tmp_path / "etc" / "kubeconfig"), judge) as w:
        # then it leads to the file, judged last, and everything on the way was judged
        assert w.at == str(tmp_path / "real" / "kubeconfig") and w.st.st_ino == os.stat(w.at).st_ino
        fd = os.open(w.name, os.O_RDONLY, dir_fd=w.parent)
        assert os.read(fd, 10) == b"x"
        os.close(fd)
    base = [(p, "dir", True) for p in ["/"] + [str(q) for q in reversed(tmp_path.parents) if str(q) != "/"]]
    assert judge.seen == base + [(str(tmp_path), "dir", True), (str(tmp_path / "etc"), "dir", True),
                                 (str(tmp_path / "etc" / "kubeconfig"), "link", True),
                                 (str(tmp_path), "dir", True), (str(tmp_path / "real"), "dir", True),
                                 (str(tmp_path / "real" / "kubeconfig"), "file", False)]


def test_a_directory_swapped_for_a_link_after_it_was_judged_changes_nothing(tmp_path):
    # given a/d/f, and elsewhere/f that a swap would lead to
    (tmp_path / "a" / "d").mkdir(parents=True)
    (tmp_path / "a" / "d" / "f").write_text("judged")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("swapped in")
    original = os.stat(tmp_path / "a" / "d" / "f").st_ino

    def swap() -> None:
        os.rename(tmp_path / "a" / "d", tmp_path / "a" / "d.old")
        os.symlink(tmp_path / "elsewhere", tmp_path / "a" / "d")

    # when d is swapped for a link right after the walk judged it
    judge = Judge(when=str(tmp_path / "a" / "d"), then=swap)
    with walk(str(tmp_path / "a" / "d" / "f"), judge) as w:
        # then the walk went on from what it judged: the original file, never elsewhere
        assert w.st.st_ino == original
    assert os.path.islink(tmp_path / "a" / "d")   # (the swap did happen)
    assert not any("elsewhere" in at for at, _, _ in judge.seen)


def test_a_link_refused_is_never_followed(tmp_path):
    # given a link to a directory
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "f").write_text("x")
    os.symlink(tmp_path / "target", tmp_path / "link")
    judge = Judge(refuse=str(tmp_path / "link"))
    # when the judge refuses the link
    with pytest.raises(PermissionError):
        walk(str(tmp_path / "link" / "f"), judge)
    # then nothing past it was looked at
    assert judge.seen[-1] == (str(tmp_path / "link"), "link", True)


def test_dot_dot_is_the_parent_of_where_a_link_led(tmp_path):
    # given link -> deep/er, so that link/../f is deep/f (not tmp_path/f, as the name reads)
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "f").write_text("deep")
    (tmp_path / "f").write_text("shallow")
    os.symlink("deep/er", tmp_path / "link")
    judge = Judge()
    with walk(str(tmp_path / "link" / ".." / "f"), judge) as w:
        assert w.at == str(tmp_path / "deep" / "f") and w.st.st_ino == os.stat(tmp_path / "deep" / "f").st_ino
    assert (str(tmp_path / "deep"), "dir", True) in judge.seen


def test_missing_components_loops_and_files_on_the_way_are_named(tmp_path):
    (tmp_path / "file").write_text("")
    os.symlink("loop", tmp_path / "loop")
    with pytest.raises(FileNotFoundError) as e:
        walk(str(tmp_path / "nope" / "f"), Judge())
    assert e.value.filename == str(tmp_path / "nope")
    with pytest.raises(NotADirectoryError) as e:
        walk(str(tmp_path / "file" / "f"), Judge())
    assert e.value.filename == str(tmp_path / "file")
    with pytest.raises(OSError) as e:
        walk(str(tmp_path / "loop"), Judge())
    assert e.value.errno == errno.ELOOP


def test_no_descriptor_is_left_open(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    os.symlink("d", tmp_path / "l")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with walk(str(tmp_path / "l" / "f"), Judge()):
            pass
        with pytest.raises(PermissionError):
            walk(str(tmp_path / "l" / "f"), Judge(refuse=str(tmp_path / "d" / "f")))
        with pytest.raises(FileNotFoundError):
            walk(str(tmp_path / "l" / "g"), Judge())
    assert len(os.listdir("/proc/self/fd")) == before
