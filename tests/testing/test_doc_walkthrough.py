"""How a document's walk-through is read (anolisnuma/testing/doc_walkthrough.py): only the
marked blocks, in order; a console block's commands with their here-documents and
continuations, and the output each shows; what counts as the output shown."""

from __future__ import annotations

import pytest

from anolisnuma.testing.doc_walkthrough import Command, as_shown, cut_sample_differs, output_matches, steps

DOC = '''# Install

```sh
echo an example, not a step
```

<!-- walkthrough: admin -->
```sh
kubectl apply -f deploy/rbac.yaml
```

<!-- walkthrough: node-config -->
```toml
[kubernetes]
kubeconfig = "/etc/anolisnuma/kubeconfig"
```

<!-- walkthrough: node -->
```console
# a comment, not output
$ anolisnuma-ctl kubeconfig --server https://10.0.0.10:6443 \\
    --check
wrote /etc/anolisnuma/kubeconfig for https://10.0.0.10:6443
$ cat > web.yaml <<'EOF'
kind: Oenuma
$ not a command: inside the here-document
EOF
$ systemctl restart anolisnuma
```
'''


def test_only_the_marked_blocks_are_steps_in_the_documents_order() -> None:
    found = steps(DOC)
    assert [(s.role, s.kind) for s in found] == [("admin", "sh"), ("node-config", "toml"), ("node", "console")]
    assert found[0].text == "kubectl apply -f deploy/rbac.yaml\n" and found[0].line == 9
    with pytest.raises(ValueError):
        found[0].commands()


def test_a_console_blocks_commands_keep_their_continuations_and_here_documents() -> None:
    commands = steps(DOC)[2].commands()
    assert [c.text.splitlines()[0] for c in commands] == [
        "anolisnuma-ctl kubeconfig --server https://10.0.0.10:6443 \\", "cat > web.yaml <<'EOF'",
        "systemctl restart anolisnuma"]
    assert commands[0].text.endswith("--check") and commands[1].text.endswith("\nEOF")
    assert commands[0].expected == ["wrote /etc/anolisnuma/kubeconfig for https://10.0.0.10:6443"]
    assert commands[1].expected == [] and commands[2].expected == []


def test_a_mark_without_a_block_it_knows_is_refused() -> None:
    for bad in ("<!-- walkthrough: admin -->\ntext\n", "<!-- walkthrough: admin -->\n```python\nx\n```\n",
                "<!-- walkthrough: elsewhere -->\n```sh\nx\n```\n"):
        with pytest.raises(ValueError):
            steps(bad)


def test_outputs_match_but_for_blanks_and_durations() -> None:
    shown = ["NAME   REPORT                  AGE", "web    worker-1: 1/1 pinned   3s"]
    assert output_matches(shown, "NAME REPORT AGE\nweb worker-1: 1/1 pinned 5m02s\n")
    assert not output_matches(shown, "NAME REPORT AGE\nweb worker-1: 0/1 pinned 3s\n")
    assert not output_matches(shown, "NAME REPORT AGE\n")                  # a line missing
    assert output_matches([], "anything at all")


def test_a_command_shown_with_its_output_may_answer_with_its_exit_status() -> None:
    assert as_shown(Command("kubectl auth can-i get oenumas", ["no"]), 1, "no\n")
    assert not as_shown(Command("kubectl auth can-i get oenumas", ["no"]), 0, "yes\n")
    assert as_shown(Command("systemctl restart anolisnuma"), 0, "")
    assert not as_shown(Command("systemctl restart anolisnuma"), 1, "")


def test_what_differs_from_run_to_run_is_read_past_and_nothing_else() -> None:
    import re

    shown = ["anolisnuma: 0.1.0, pid 1787, up 3h12m05s, ready",
             "16:31:13  CreateContainer  app  OK  1.303ms  numa: placed on node 1 cpus 4-6",
             "app  3746d945fb02d  4-6  1",
             "containerd: reachable: fake-cri 1.0.0, CRI v1, 1.6 ms"]
    printed = ("anolisnuma: 0.1.0, pid 42, up 2s, ready\n"
               "09:02:59  CreateContainer  app  OK  0.9ms  numa: placed on node 1 cpus 4-6\n"
               "app  0a1b2c3d4e5f6  4-6  1\n"
               "containerd: reachable: fake-cri 1.0.0, CRI v1, 12 ms\n")
    assert output_matches(shown, printed)
    assert not output_matches(shown, printed.replace("cpus 4-6", "cpus 0-3"))
    assert not output_matches(shown, printed.replace("4-6  1", "4-6  0"))
    loops = ["numa-repin  running  5s  2307  0  0.02 ms  applied=4"]
    assert not output_matches(loops, "numa-repin  running  5s  12  0  0.01 ms  none\n")
    counts = [re.compile(r"(?<=running ).*")]
    assert output_matches(loops, "numa-repin  running  5s  12  0  0.01 ms  none\n", volatile=counts)
    assert not output_matches(loops, "numa-repin  stopped  5s  12  0  0.01 ms  none\n", volatile=counts)


def test_a_cut_sample_may_leave_lines_out_where_it_says_and_nowhere_else() -> None:
    printed = "start (pid 7)\nsandbox 0a1b2c3d4e5f6\n\nmiddle 1\nmiddle 2\nmiddle 3\nend\n"
    assert cut_sample_differs("start (pid 42)\n…\nmiddle 2\n…\nend\n", printed) is None
    assert cut_sample_differs("start (pid 42)\nsandbox 3746d945fb02d\n…\n", printed) is None
    assert cut_sample_differs("…\nmiddle 3\n\nend\n", printed) is None
    assert cut_sample_differs(printed, printed) is None                          # no cut: all of it
    assert "printed more" in cut_sample_differs("start (pid 42)\nsandbox 3746d945fb02d\n", printed)
    # a cut leaves lines out, never changes them, nor their order, nor the ends not cut
    assert "'middle 4'" in cut_sample_differs("start (pid 7)\n…\nmiddle 4\n…\nend\n", printed)
    assert "'middle 1'" in cut_sample_differs("…\nmiddle 2\nmiddle 1\n…\n", printed)
    assert "'middle 1'" in cut_sample_differs("start (pid 7)\nmiddle 1\n…\nend\n", printed)  # not its start
    assert "'middle 2'" in cut_sample_differs("start (pid 7)\n…\nmiddle 2\n", printed)       # not its end
    assert "'end'" in cut_sample_differs("…\nend\nmiddle 1\n…\nmiddle 2 and more\n…\n", printed)
