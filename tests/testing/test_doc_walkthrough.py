"""How a document's walk-through is read (anolisnuma/testing/doc_walkthrough.py): only the
marked blocks, in order; a console block's commands with their here-documents and
continuations, and the output each shows; what counts as the output shown."""

from __future__ import annotations

import pytest

from anolisnuma.testing.doc_walkthrough import Command, as_shown, output_matches, steps

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
