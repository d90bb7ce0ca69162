"""What a reload says about the keys that need a restart: how to restart without a
disturbance, which depends on whether systemd holds the socket."""

from __future__ import annotations

from anolisnuma.reload import ReloadPlan, restart_hint


def test_nothing_to_restart_says_nothing():
    assert restart_hint(ReloadPlan(live=["log.level"], restart=[]), socket_activated=True) == ""


def test_with_the_socket_unit_a_service_restart_is_enough():
    hint = restart_hint(ReloadPlan(live=[], restart=["numa.namespaces"]), socket_activated=True)
    assert "systemctl restart anolisnuma.service" in hint and "backlog" in hint and "no call fails" in hint


def test_the_socket_keys_belong_to_the_socket_unit():
    hint = restart_hint(ReloadPlan(live=[], restart=["server.listen"]), socket_activated=True)
    assert "anolisnuma.socket" in hint and "ListenStream=" in hint and "drops the connections" in hint


def test_without_the_socket_unit_the_hint_says_what_the_kubelet_will_see():
    hint = restart_hint(ReloadPlan(live=[], restart=["runtime.endpoint"]), socket_activated=False)
    assert "UNAVAILABLE" in hint and "enable the socket unit" in hint
