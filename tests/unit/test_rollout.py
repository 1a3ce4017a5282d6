"""Fleet rollout turns (deploys/rollout.py): which hosts deploy together, in which order."""

from deploys.rollout import assign_turns


def test_each_host_has_its_own_turn_in_inventory_order():
    assert assign_turns([("b", False), ("a", False), ("c", False)]) == {"b": 0, "a": 1, "c": 2}


def test_parallel_hosts_share_the_first_turn_and_the_others_follow():
    hosts = [("s1", False), ("p1", True), ("s2", False), ("p2", True)]
    assert assign_turns(hosts) == {"p1": 0, "p2": 0, "s1": 1, "s2": 2}


def test_a_single_host_has_one_turn():
    assert assign_turns([("kpro6", False)]) == {"kpro6": 0}
    assert assign_turns([("kpro6", True)]) == {"kpro6": 0}
