"""``railover testbed up --rdma`` / ``list`` / ``down`` as a user runs them (one extra boot)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from railover.testbed.netns import poll_until
from railover.testbed.rdma import bed as rbed

pytestmark = pytest.mark.rdma

CLI = [sys.executable, "-c", "from railover.cli import main; main()"]


def _env():
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_cli_bad_option_is_a_clear_error():
    r = subprocess.run(CLI + ["testbed", "up", "--rdma", "--kernel", "5.10"], capture_output=True, text=True,
                       env=_env(), timeout=120)
    assert r.returncode == 2 and "kernel must be one of 6.1, 6.12" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(CLI + ["testbed", "up", "--rdma", "--detach"], capture_output=True, text=True, env=_env(),
                       timeout=120)
    assert r.returncode == 2 and "--detach is not supported with --rdma" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT])
def test_cli_up_list_and_signal_teardown_leave_nothing(sig):
    p = subprocess.Popen(CLI + ["testbed", "up", "--rdma"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_env())
    out, err = [], []
    pumps = [threading.Thread(target=lambda s=s, b=b: b.extend(iter(s.readline, "")), daemon=True)
             for s, b in ((p.stdout, out), (p.stderr, err))]
    for t in pumps:
        t.start()
    try:
        poll_until(lambda: any("press Ctrl-C" in line for line in err) or p.poll() is not None, 900, 0.5,
                   "the RDMA bed to come up")
        assert p.poll() is None, "".join(out + err)
        text = "".join(out)
        prefix = re.search(r"^prefix: (ro[a-z0-9]{4})$", text, re.M).group(1)
        assert re.search(r"accelerator: (tcg|kvm) \(", text)
        assert re.search(r"boot: [\d.]+ s", text) and "rxe0" in text and "rxe1" in text
        infos = {i.prefix: i for i in rbed.list_rdma_beds()}
        assert prefix in infos and infos[prefix].alive and len(infos[prefix].qemu_pids) == 2
        qemu = infos[prefix].qemu_pids
        r = subprocess.run(CLI + ["testbed", "list"], capture_output=True, text=True, env=_env(), timeout=120)
        assert prefix in r.stdout and "live" in r.stdout
        p.send_signal(sig)
        assert p.wait(120) == 0, "".join(err)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(60)
    for t in pumps:
        t.join(10)
    assert any("torn down" in line for line in err)
    assert not [q for q in qemu if Path(f"/proc/{q}").exists()], "QEMU survived"
    assert prefix not in {i.prefix for i in rbed.list_rdma_beds()}
    run_dir = re.search(r"^run dir: (\S+)", text, re.M).group(1)
    assert not Path(run_dir).exists()
