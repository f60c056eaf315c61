"""cluster-seeds: the parse and the seeding rule (bus/seeds.py), without sockets, on a
fake clock; the resolution step against the loopback (no DNS needed)."""

from __future__ import annotations

import asyncio

import pytest

from bus import seeds
from bus.membership import Node
from bus.seeds import Seed, SeedDialer, Seeder, SeedError
from disque_mp.node import config


def node(handshake: bool = False) -> Node:
    n = Node("a" * 40, "10.0.0.2", 7711, 0)
    n.handshake = handshake
    return n


# --------------------------------------------------------------------------- parse


def test_parse_reads_ips_names_and_bracketed_v6_in_order_without_repeats():
    got = seeds.parse("10.0.0.1:7711, db-2.example.com:7712 [::1]:7713,10.0.0.1:7711")
    assert got == [Seed("10.0.0.1", 7711), Seed("db-2.example.com", 7712), Seed("::1", 7713)]
    assert seeds.normalize(" a:1 ,b:2 ") == "a:1,b:2"
    assert seeds.normalize("[::1]:7711") == "[::1]:7711"
    assert seeds.parse("") == [] and seeds.parse("  ") == []


@pytest.mark.parametrize(("text", "why"), [
    ("10.0.0.1", "is not host:port"),
    (":7711", "is not host:port"),
    ("h:0", "bad port '0'"),
    ("h:55536", "bad port '55536'"),  # its bus port would be past 65535
    ("h:x1", "bad port 'x1'"),
    ("h:99999999999999999999", "bad port"),
    ("::1:7711", "write an IPv6 address as [address]:port"),
    ("[::1:7711", "is not [IPv6]:port"),
    ("[zz]:7711", "is not an IPv6 address"),
    ("bad_-.-name!:7711", "neither an IP nor a host name"),
    ("-lead.example:7711", "neither an IP nor a host name"),
    ("a" * 300 + ":7711", "neither an IP nor a host name"),
])
def test_parse_names_the_bad_entry_and_why(text, why):
    with pytest.raises(SeedError) as exc:
        seeds.parse(f"10.0.0.9:7711,{text}")
    assert why in str(exc.value) and "cluster-seeds" in str(exc.value)


def test_too_many_seeds_are_refused():
    many = ",".join(f"10.0.{i // 250}.{i % 250 + 1}:7711" for i in range(seeds.seeds_max + 1))
    with pytest.raises(SeedError, match=f"at most {seeds.seeds_max}"):
        seeds.parse(many)


def test_the_directive_in_a_file_on_the_command_line_and_config_set():
    cfg = config.parse_text('cluster-seeds "10.0.0.1:7711, node-b:7711"')
    assert config.config_get(cfg, "cluster-seeds") == [("cluster-seeds", "10.0.0.1:7711,node-b:7711")]
    assert config.Config().cluster_seeds == ""
    with pytest.raises(config.ConfigError) as exc:
        config.load(None, [["cluster-seeds", "node-b"]])
    assert "--cluster-seeds node-b" in exc.value.report() and "is not host:port" in exc.value.report()
    err = config.config_set(cfg, "cluster-seeds", "node-b:0")
    assert err is not None and "bad port '0'" in err
    assert cfg.cluster_seeds == "10.0.0.1:7711,node-b:7711"  # unchanged by the refusal
    assert config.config_set(cfg, "cluster-seeds", "") is None and cfg.cluster_seeds == ""
    assert "cluster-seeds" in config.rewrite_text(config.parse_text("cluster-seeds a:1"), "")


# --------------------------------------------------------------------------- the rule


def test_backoff_doubles_from_the_shortest_to_the_longest_delay():
    delays = [0]
    for _ in range(8):
        delays.append(seeds.next_backoff_ms(delays[-1]))
    assert delays[1] == seeds.seed_backoff_ms_min
    assert delays[2] == 2 * seeds.seed_backoff_ms_min
    assert delays[-1] == seeds.seed_backoff_ms_max
    assert all(a <= b for a, b in zip(delays, delays[1:], strict=False))


def test_alone_it_meets_every_seed_then_waits_the_backoff():
    rule = Seeder()
    rule.configure("10.0.0.1:7711,10.0.0.2:7711")
    assert rule.due(0, peer_known=False) == [Seed("10.0.0.1", 7711), Seed("10.0.0.2", 7711)]
    assert rule.due(seeds.seed_backoff_ms_min - 1, peer_known=False) == []
    t = seeds.seed_backoff_ms_min
    assert len(rule.due(t, peer_known=False)) == 2  # nobody answered: again
    assert rule.due(t + 2 * seeds.seed_backoff_ms_min - 1, peer_known=False) == []
    t += 2 * seeds.seed_backoff_ms_min
    assert len(rule.due(t, peer_known=False)) == 2
    for _ in range(20):  # bounded: the delay never passes the longest
        t = rule.next_ms
        assert rule.due(t, peer_known=False)
    assert rule.backoff_ms == seeds.seed_backoff_ms_max


def test_a_known_peer_stops_seeding_and_forgetting_every_peer_starts_it_again():
    rule = Seeder()
    rule.configure("10.0.0.1:7711")
    assert rule.due(0, peer_known=False)
    assert rule.due(5000, peer_known=True) == []  # joined
    assert rule.due(10**9, peer_known=True) == []
    assert rule.due(10**9 + 1, peer_known=False) == [Seed("10.0.0.1", 7711)]  # at once
    assert rule.backoff_ms == seeds.seed_backoff_ms_min  # from the shortest delay again


def test_no_seeds_never_meets_and_a_changed_value_starts_over():
    rule = Seeder()
    rule.configure("")
    assert rule.due(0, peer_known=False) == []
    rule.configure("10.0.0.1:7711")
    assert rule.due(1, peer_known=False)
    t = rule.next_ms
    rule.due(t, peer_known=False)
    rule.configure("10.0.0.3:7711")  # CONFIG SET: at once, not at the end of the delay
    assert rule.due(t + 1, peer_known=False) == [Seed("10.0.0.3", 7711)]


def test_only_a_finished_handshake_counts_as_a_peer():
    assert not seeds.knows_peer([])
    assert not seeds.knows_peer([node(handshake=True)])
    assert seeds.knows_peer([node(handshake=True), node()])


def test_an_outcome_is_news_only_when_it_changes():
    rule = Seeder()
    assert rule.outcome("met a:1")
    assert not rule.outcome("met a:1")
    assert rule.outcome("a:1 does not resolve")


# --------------------------------------------------------------------------- the dialer


class _Cfg:
    def __init__(self, seeds_text: str) -> None:
        self.cluster_seeds = seeds_text


def test_the_dialer_meets_other_nodes_and_skips_itself():
    met: list[tuple[str, int]] = []

    async def run() -> None:
        dialer = SeedDialer(_Cfg("127.0.0.1:7711,127.0.0.1:7712,localhost:7713"), 7711)
        dialer.tick(0, [], lambda ip, port: met.append((ip, port)))
        assert dialer.task is not None
        await dialer.task
        dialer.tick(1, [], lambda ip, port: met.append((ip, port)))  # before the backoff
        await dialer.close()
        assert "127.0.0.1:7711 is this node" in dialer.rule.last_outcome

    asyncio.run(run())
    assert ("127.0.0.1", 7712) in met and ("127.0.0.1", 7711) not in met
    assert [p for _, p in met].count(7713) == 1 and len(met) == 2  # localhost resolved once
    assert seeds.is_local("127.0.0.1") and not seeds.is_local("192.0.2.1")
