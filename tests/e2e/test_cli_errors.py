"""Every command answers a mistake with one line on stderr and exit code 2.

Each case is a flag value a person gets wrong (a negative seed, a broken
kubeconfig, a path that cannot be a folder, a name too long for the file
system, a value click refuses) given to the real `lmedge` process; none may
end in a traceback. These were found by trying each command's flags with
out-of-range numbers, odd paths and odd strings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

LONG = "x" * 300

KUBECONFIGS = {
    "not-yaml": "garbage: [\n",
    "clusters-is-a-number": "apiVersion: v1\nclusters: 5\n",
    "a-list": "- a\n- b\n",
    "server-url-does-not-parse": (
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        'clusters: [{name: c, cluster: {server: "http://[::1"}}]\n'
        "users: [{name: u, user: {token: t}}]\n"
    ),
}


def _kubeconfig(kind: str) -> Callable[[Path], list[str]]:
    def args(tmp: Path) -> list[str]:
        f = tmp / "kubeconfig"
        f.write_text(KUBECONFIGS[kind])
        return ["controller", "--kubeconfig", str(f), "--store", str(tmp / "store")]

    return args


def _node_agent_kubeconfig(tmp: Path) -> list[str]:
    f = tmp / "kubeconfig"
    f.write_text(KUBECONFIGS["clusters-is-a-number"])
    return ["node-agent", "--node", "worker-1", "--kubeconfig", str(f), "--store", str(tmp / "s")]


def _out_is_a_file(tmp: Path) -> list[str]:
    (tmp / "report").write_text("a file, not a folder")
    return ["bench", "--slots", "1", "--policies", "rr", "--out", str(tmp / "report")]


def _a_file(tmp: Path) -> Path:
    (tmp / "file").write_text("not a folder")
    return tmp / "file"


def _gateway(tmp: Path) -> list[str]:
    services = Path(__file__).resolve().parents[2] / "examples" / "testbed" / "services.yaml"
    return ["gateway", "--node", "w1", "--services", str(services), "--store", str(tmp / "s")]


def _services_not_utf8(tmp: Path) -> list[str]:
    (tmp / "services.yaml").write_bytes(b"\xff\xfe\x00binary")
    return ["gateway", "--node", "w1", "--services", str(tmp / "services.yaml")]


def _spill_dir_a_file(tmp: Path) -> list[str]:
    (tmp / ".lmedge").mkdir()
    (tmp / ".lmedge" / "spill").write_text("a file where the spill directory goes")
    return ["simulate", "--slots", "1", "--store", str(tmp / "store")]


CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("simulate-negative-seed", lambda t: ["simulate", "--seed", "-1", "--slots", "1"], "--seed"),
    ("bench-negative-seed", lambda t: ["bench", "--seeds", "1,-2", "--slots", "1"], "-2"),
    ("demo-negative-seed", lambda t: ["demo", "--seed", "-1"], "--seed"),
    ("controller-negative-seed", lambda t: ["controller", "--seed", "-1"], "--seed"),
    ("calibrate-negative-seed", lambda t: ["calibrate", "--seed", "-1"], "--seed"),
    ("calibration-check-negative-seed", lambda t: ["calibration-check", "--seeds", "-1"], "-1"),
    *(
        (f"kubeconfig-{kind}", _kubeconfig(kind), "kubeconfig")
        for kind in KUBECONFIGS
    ),
    ("node-agent-kubeconfig", _node_agent_kubeconfig, "kubeconfig"),
    ("bench-out-is-a-file", _out_is_a_file, "--out"),
    ("bench-scenario-name-too-long", lambda t: ["bench", "-f", LONG, "--slots", "1"], "too long"),
    ("status-store-name-too-long", lambda t: ["status", "--store", LONG], "too long"),
    ("simulate-store-admin-database", lambda t: ["simulate", "--slots", "1", "--store",
     "mongodb://127.0.0.1:9/admin"], "the MongoDB server's own database 'admin'"),
    ("simulate-spill-dir-not-writable", _spill_dir_a_file,
     "the spill directory .lmedge/spill is not writable"),
    ("gateway-services-not-utf8", _services_not_utf8, "not UTF-8"),
    ("crds-out-is-a-file", lambda t: ["crds", "-o", str(_a_file(t))], "--out"),
    ("calibration-check-workers-huge", lambda t: ["calibration-check", "--workers", "9" * 20],
     "--workers"),
    ("calibration-check-out-is-a-folder", lambda t: ["calibration-check", "--out", str(t)],
     "directory"),
    ("controller-slot-nan", lambda t: ["controller", "--slot-s", "nan"], "--slot-s"),
    ("node-agent-slot-inf", lambda t: ["node-agent", "--node", "w1", "--slot-s", "inf"],
     "--slot-s"),
    ("gateway-tau-nan", lambda t: [*_gateway(t), "--tau", "nan"], "tau"),
    ("node-agent-policy-is-the-runs", lambda t: ["node-agent", "--node", "w1", "-p", "rf"],
     "--policy"),
    ("controller-lam-above-one", lambda t: ["controller", "--lam", "1.5"], "--lam"),
    ("gateway-node-not-a-name", lambda t: [*_gateway(t)[:2], "/etc/passwd", *_gateway(t)[3:]],
     "not a node name"),
    ("gateway-template-bad-field", lambda t: [*_gateway(t), "--peer-url-template",
     "http://{nod}:8080"], "--peer-url-template"),
    ("gateway-template-without-node", lambda t: [*_gateway(t), "--peer-url-template", "-"],
     "--peer-url-template"),
    ("gateway-peer-not-http", lambda t: [*_gateway(t), "--peer", "w2=ftp://w2"], "--peer w2"),
    ("gateway-host-label-too-long", lambda t: [*_gateway(t), "--host", "h" * 70], "--host"),
    ("gateway-drain-inf", lambda t: [*_gateway(t), "--drain-s", "inf"], "--drain-s"),
    ("model-server-stub-inf", lambda t: ["model-server", "--lm", "lm1", "--stub-seconds", "inf"],
     "--stub-seconds"),
    ("click-refuses-a-value", lambda t: ["simulate", "--slots", "many"], "--slots"),
    ("click-unknown-option", lambda t: ["simulate", "--sed", "1"], "--sed"),
    ("click-missing-option", lambda t: ["node-agent"], "--node"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_and_exit_2(
    tmp_path: Path, args: Callable[[Path], list[str]], names: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME")}
    env["LMEDGE_STORE"] = str(tmp_path / "default-store")
    done = subprocess.run(
        [sys.executable, "-c", "from lmedge.cli import main; main()", *args(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert names in lines[0]
