"""pytest plugin for the GPU device: each failing test's report is appended to $OUT/failures.txt as it
happens (the controller's hook under xdist), so a run stopped by the device's time limit still says
which tests failed and why (pytest's own summary prints only at the end).

  cp scripts/gpu_failures.py <site on PYTHONPATH>/ && python3 -m pytest -p gpu_failures ...
"""

import os

LOG = open(os.path.join(os.environ.get("OUT", "/tmp"), "failures.txt"), "a")


def pytest_runtest_logreport(report):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # (under xdist the controller logs every worker's reports once)
        return
    if report.failed:
        text = report.longreprtext
        LOG.write(f"=== {report.nodeid} ({report.when})\n{text[:1500]}\n...\n{text[-2500:]}\n")
        LOG.flush()
    elif report.when == "call":
        LOG.write(f"--- {report.outcome} {report.nodeid}\n")
        LOG.flush()
