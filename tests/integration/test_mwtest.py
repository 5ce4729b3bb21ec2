# SPDX-License-Identifier: Apache-2.0
"""The suite's own loop devices leave the host as they found them: a node that `losetup --find` added
because every other was attached is removed again at detach (a CI host collected dozens before)."""
import os

import pytest

from conftest import LoopDevice
from mwtest import loop_nodes

pytestmark = pytest.mark.privileged


def unattached(nodes):
    return {n for n in nodes if not os.path.exists(f"/sys/block/{n}/loop/backing_file")}


def test_a_loop_node_the_suite_added_is_removed_at_detach():
    before = loop_nodes()
    made = []
    try:
        # One more device than there are free nodes: the last attach must add a node.
        for _ in range(len(unattached(before)) + 1):
            made.append(LoopDevice(size_mb=1))
        added = [dev for dev in made if dev.added_node]
        assert added, (sorted(before), [dev.name for dev in made])
        assert all(dev.name not in before for dev in added)
    finally:
        for dev in made:
            dev.detach()
    assert loop_nodes() == before
    assert not any(os.path.exists(dev.backing) for dev in made)
