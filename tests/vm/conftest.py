"""The scenario boot, shared: test_vm.py and test_vm_stacking.py read the same VM run (guest-scenario.sh,
then guest-stacking.sh in the same guest), booted once per pytest session by whichever needs it first."""
import pytest

import vmtest


@pytest.fixture(scope="session")
def scenario_run():
    """One scenario boot (run-vm.sh --part-disk --multipath, a few minutes under TCG) with the project's
    mergewatchd in the guest; returns run-vm.sh's stdout."""
    return vmtest.boot(vmtest.SCENARIO, "--daemon", vmtest.DAEMON,
                       "--daemon-args", "--web.listen-address=127.0.0.1:9863",
                       "--metrics-url", "http://127.0.0.1:9863/metrics",
                       "--part-disk", "--multipath", timeout=1200)
