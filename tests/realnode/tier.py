"""The real-node test tier: the local control plane plus two real worker nodes.

Each worker is a kubelet with its own containerd, kube-proxy and CNI bridge,
all inside the worker's own network namespace (``lmedge-n1``, ``lmedge-n2``)
and its own mount namespace, on a private host bridge (``lmedge-br0``,
172.31.250.0/24). The API server listens on the bridge address, so kubelets and
pods reach it; CoreDNS (on the bridge address too) answers cluster names and
the worker names. Pods get addresses from their worker's subnet
(10.250.<n>.0/24), routed between the workers over the bridge; nothing has a
route out of the machine.

Why namespaces: two kubelets in one network namespace would fight over the
node address, the hostPorts (the gateways' 8080) and iptables; in one mount
namespace over /var/lib/kubelet, /var/log/pods, /run/containerd, /var/lib/cni,
/run/netns and the chart's hostPath (/var/lib/lmedge). Inside its mount
namespace each worker has a tmpfs on /run and its own directories bound on
/var/lib, /var/log and /etc/cni, so everything it writes lands in its own
directory under the tier's workdir (``n1/var-lib/lmedge/progress`` is the
worker's hostPath) and vanishes from the host when the worker stops. Pods live
in their worker's cgroup subtree (``cgroupRoot: /lmedge-n<i>``).

Global state the tier changes and restores: the kubelet sets
``vm.overcommit_memory``, ``kernel.panic`` and ``kernel.panic_on_oops`` (with
``protectKernelDefaults`` it would refuse to start instead); teardown writes
the values back. One tier at a time: ``/run/lmedge-realnode/state.json``
records the running one, and ``up`` refuses while its processes live (and
cleans up after one that died).

As a script: ``python -m tests.realnode.tier up DIR`` / ``down`` (what
``tools/realnode/up.sh`` and ``down.sh`` wrap); ``clean`` tears down only a
tier whose owning test process died without doing so (``make realnode`` runs
it after the tests, so even a killed run leaves nothing behind).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fixtures.cluster import KubeCluster, tools_dir, wait_until

STATE_DIR = Path("/run/lmedge-realnode")
STATE_FILE = STATE_DIR / "state.json"
LOCK_FILE = Path("/run/lmedge-realnode.lock")
BRIDGE = "lmedge-br0"
HOST_IP = "172.31.250.1"
PREFIX = 24
CLUSTER_DOMAIN = "cluster.local"
POD_CIDR = "10.250.0.0/16"
#: Sysctls the kubelet rewrites (container manager's kernel tunables).
SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
#: Binaries the tier needs on PATH (Debian: containerd, runc, containernetworking-plugins,
#: iptables, iproute2, util-linux).
HOST_TOOLS = ("containerd", "ctr", "runc", "ip", "iptables", "nsenter", "unshare")
CNI_BIN = Path("/usr/lib/cni")
#: Tools under .tools/bin beyond the control plane's.
TIER_BINARIES = ("kubelet", "kube-proxy", "coredns")
IMAGES = ("lmedge", "model-server", "agent-llm", "ferretdb", "pause")
#: Imported when built; a test needing one skips without it (fails under LMEDGE_REQUIRE_TOOLS).
OPTIONAL_IMAGES = ("llama-cpp",)
GPU_RESOURCE = "nvidia.com/gpu"
START_TIMEOUT = 240.0


class TierError(RuntimeError):
    """The tier cannot start here, or a part of it did not come up (message says which)."""


@dataclass(frozen=True)
class Worker:
    """One real worker node: its names and addresses."""

    index: int
    gpus: int = 2

    @property
    def name(self) -> str:
        return f"worker-{self.index}"

    @property
    def netns(self) -> str:
        return f"lmedge-n{self.index}"

    @property
    def ip(self) -> str:
        return f"172.31.250.{10 + self.index}"

    @property
    def subnet(self) -> str:
        return f"10.250.{self.index}.0/24"

    @property
    def veth(self) -> str:
        return f"lmedge-v{self.index}"

    @property
    def cgroup(self) -> str:
        return f"lmedge-n{self.index}"


WORKERS = (Worker(1), Worker(2))


def images_dir() -> Path:
    return tools_dir() / "images"


def image_refs() -> dict[str, str]:
    """The reference of each image `make images` built, by short name.

    Read from each archive's own index (the name it is imported under), so a
    rebuild replacing an archive can never leave the tier naming another tag.
    """
    refs: dict[str, str] = {}
    for name in (*IMAGES, *OPTIONAL_IMAGES):
        path = images_dir() / f"{name}.oci.tar"
        if not path.is_file():
            continue
        with tarfile.open(path) as tar:
            member = tar.extractfile("index.json")
            assert member is not None
            index = json.load(member)
        refs[name] = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    return refs


def unmet_requirements() -> list[str]:
    """Why the tier cannot run on this machine (empty when it can)."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("not root (the tier creates network namespaces and cgroups)")
    for tool in HOST_TOOLS:
        if shutil.which(tool) is None:
            problems.append(f"{tool} not on PATH")
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        if not (CNI_BIN / plugin).is_file():
            problems.append(f"CNI plugin {CNI_BIN / plugin} missing")
    for name in TIER_BINARIES:
        if not os.access(tools_dir() / "bin" / name, os.X_OK):
            problems.append(f"{tools_dir() / 'bin' / name} not built")
    for name in IMAGES:
        if not (images_dir() / f"{name}.oci.tar").is_file():
            problems.append(f"image {name} not built ({images_dir() / (name + '.oci.tar')})")
    if not Path("/sys/fs/cgroup/memory").is_dir():
        problems.append("no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
    if problems and shutil.which("containerd") is None:
        problems.append(
            "install: apt-get install containerd runc containernetworking-plugins iptables"
        )
    if any("not built" in p for p in problems):
        problems.append("build: make tools images")
    return problems


def _run(*cmd: str, check: bool = True, netns: str | None = None) -> str:
    full = ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)
    proc = subprocess.run(full, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TierError(f"{' '.join(full)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise up/down of every tier on this machine."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class RealNodeTier:
    """The control plane (``cluster``), CoreDNS, and the two workers, rooted in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()
        self.cluster = KubeCluster(self.workdir / "control-plane", address=HOST_IP, kwok=False)
        self.pids: dict[str, int] = {}
        # Held so they are reaped (not garbage-collected while running).
        self._procs: list[subprocess.Popen[bytes]] = []
        self.sysctls: dict[str, str] = {}
        self.images = image_refs()

    # -- lifecycle ---------------------------------------------------------

    def up(self, timeout: float = START_TIMEOUT) -> None:
        """Start everything and wait until both workers are Ready with their GPUs."""
        problems = unmet_requirements()
        if problems:
            raise TierError("real-node tier cannot run here: " + "; ".join(problems))
        with _locked():
            _clean_stale()
            if STATE_FILE.exists():
                other = json.loads(STATE_FILE.read_text())
                raise TierError(
                    f"another real-node tier is running (workdir {other['workdir']}, "
                    f"owner pid {other['owner']}); stop it with tools/realnode/down.sh "
                    f"{other['workdir']}"
                )
            self.sysctls = {n: _sysctl_path(n).read_text().strip() for n in SYSCTLS}
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._save_state()
        deadline = time.monotonic() + timeout
        try:
            self._network()
            self.cluster.start()
            self._save_state()
            self._coredns()
            for worker in WORKERS:
                self._start_worker(worker)
                self._save_state()
            for worker in WORKERS:
                self._join(worker, deadline)
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        """Stop every process, remove namespaces, links and cgroups, restore sysctls."""
        with _locked():
            _teardown(self._state())
            with contextlib.suppress(Exception):
                self.cluster.stop()
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._procs.clear()

    def __enter__(self) -> RealNodeTier:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @classmethod
    def attach(cls, workdir: Path) -> RealNodeTier:
        """The tier `up.sh` left running in `workdir` (tests then neither start nor stop it)."""
        state = json.loads(STATE_FILE.read_text()) if STATE_FILE.exists() else {}
        if Path(state.get("workdir", "")) != workdir.resolve():
            raise TierError(f"no real-node tier running in {workdir} (tools/realnode/up.sh DIR)")
        tier = cls(workdir)
        tier.cluster = KubeCluster.attach(tier.workdir / "control-plane")
        tier.pids = state["pids"]
        return tier

    # -- use ---------------------------------------------------------------

    def worker_dir(self, worker: Worker) -> Path:
        return self.workdir / f"n{worker.index}"

    def host_path(self, worker: Worker, path: str) -> Path:
        """Where `path` under the worker's /var/lib lives on this machine."""
        rel = Path(path).relative_to("/var/lib")
        return self.worker_dir(worker) / "var-lib" / rel

    def ctr(self, worker: Worker, *args: str) -> str:
        """`ctr` against the worker's containerd, in the k8s.io namespace."""
        sock = self.worker_dir(worker) / "containerd.sock"
        return _run("ctr", "--address", str(sock), "--namespace", "k8s.io", *args)

    def logs(self) -> str:
        """The last lines of every worker process's log (for failure messages)."""
        out = []
        for path in sorted(self.workdir.glob("n*/logs/*.log")):
            tail = path.read_text(errors="replace").splitlines()[-15:]
            out.append(f"--- {path.relative_to(self.workdir)}\n" + "\n".join(tail))
        return "\n".join(out)

    # -- internals ---------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {
            "workdir": str(self.workdir),
            "owner": os.getpid(),
            "sysctls": self.sysctls,
            "pids": self.pids,
            "workers": [w.index for w in WORKERS],
        }

    def _save_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps(self._state(), indent=2))

    def _network(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{HOST_IP}/{PREFIX}", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for w in WORKERS:
            _run("ip", "netns", "add", w.netns)
            _run("ip", "link", "add", w.veth, "type", "veth", "peer", "name", "eth0",
                 "netns", w.netns)  # fmt: skip
            _run("ip", "link", "set", w.veth, "master", BRIDGE, "up")
            _run("ip", "addr", "add", f"{w.ip}/{PREFIX}", "dev", "eth0", netns=w.netns)
            _run("ip", "link", "set", "eth0", "up", netns=w.netns)
            _run("ip", "link", "set", "lo", "up", netns=w.netns)
            # ClusterIPs need some route before kube-proxy's DNAT applies; the
            # host answers nothing else (it does not forward).
            _run("ip", "route", "add", "default", "via", HOST_IP, netns=w.netns)
            _run("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward", netns=w.netns)
            for other in WORKERS:
                if other != w:
                    _run("ip", "route", "add", other.subnet, "via", other.ip, netns=w.netns)
            # The host (the tests) reaches pods directly.
            _run("ip", "route", "add", w.subnet, "via", w.ip)

    def _coredns(self) -> None:
        hosts = "\n".join(f"        {w.ip} {w.name}" for w in WORKERS)
        corefile = self.workdir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {HOST_IP}
    errors
    hosts {{
{hosts}
        fallthrough
    }}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.cluster.kubeconfig} lmedge-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""
        )
        log = self.workdir / "coredns.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(tools_dir() / "bin" / "coredns"), "-conf", str(corefile)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, start_new_session=True,
            )  # fmt: skip
        self._procs.append(proc)
        self.pids["coredns"] = proc.pid

    def _start_worker(self, w: Worker) -> None:
        base = self.worker_dir(w)
        for sub in ("var-lib/kubelet", "var-lib/cni", "var-lib/lmedge", "var-log", "etc-cni/net.d",
                    "containerd/root", "containerd/state", "logs"):  # fmt: skip
            (base / sub).mkdir(parents=True, exist_ok=True)
        self._cgroups(w)
        self._write_cni(w, base / "etc-cni" / "net.d")
        config = base / "containerd.toml"
        config.write_text(self._containerd_config(w, base))
        # One mount namespace per worker (slave of the host's: host mounts show
        # through, the worker's own never leak out), entered with its netns.
        mounts = " && ".join(
            [
                "mount -t tmpfs -o mode=0755 tmpfs /run",
                f"mount --bind {base / 'var-lib'} /var/lib",
                f"mount --bind {base / 'var-log'} /var/log",
                f"mount --bind {base / 'etc-cni'} /etc/cni",
                f"exec containerd --config {config}",
            ]
        )
        pid = self._spawn(
            w, "containerd",
            ["nsenter", f"--net=/run/netns/{w.netns}", "--", "unshare", "--mount",
             "--propagation", "slave", "--", "sh", "-c", mounts],
        )  # fmt: skip
        sock = base / "containerd.sock"
        wait_until(lambda: sock.exists() or not _alive(pid), 60, f"{w.name} containerd socket")
        if not _alive(pid):
            raise TierError(f"{w.name}: containerd exited\n{self.logs()}")
        for name in self.images:
            self.ctr(w, "images", "import", "--no-unpack=false",
                     str(images_dir() / f"{name}.oci.tar"))  # fmt: skip
        enter = ["nsenter", "-t", str(pid), "-m", "-n", "--"]
        kubelet_cfg = base / "kubelet.yaml"
        kubelet_cfg.write_text(json.dumps(self._kubelet_config(w, sock), indent=2))
        self._spawn(
            w, "kubelet",
            [*enter, str(tools_dir() / "bin" / "kubelet"), f"--config={kubelet_cfg}",
             f"--kubeconfig={self.cluster.kubeconfig}", "--root-dir=/var/lib/kubelet",
             f"--hostname-override={w.name}", f"--node-ip={w.ip}",
             f"--node-labels=nvidia.com/gpu.present=true,lmedge.io/test-worker={w.name}",
             "--v=1"],
        )  # fmt: skip
        proxy_cfg = base / "kube-proxy.yaml"
        proxy_cfg.write_text(json.dumps(self._proxy_config(w), indent=2))
        self._spawn(
            w, "kube-proxy",
            [*enter, str(tools_dir() / "bin" / "kube-proxy"), f"--config={proxy_cfg}", "--v=1"],
        )  # fmt: skip

    def _spawn(self, w: Worker, name: str, argv: list[str]) -> int:
        log = self.worker_dir(w) / "logs" / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self._procs.append(proc)
        self.pids[f"{w.name}/{name}"] = proc.pid
        return proc.pid

    def _cgroups(self, w: Worker) -> None:
        for ctrl in _cgroup_controllers():
            path = Path("/sys/fs/cgroup") / ctrl / w.cgroup
            path.mkdir(exist_ok=True)
            if ctrl == "cpuset":
                parent = path.parent
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (path / f).write_text((parent / f).read_text())

    def _write_cni(self, w: Worker, conf_dir: Path) -> None:
        conf = {
            "cniVersion": "0.4.0",
            "name": f"lmedge-{w.netns}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": w.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": "/var/lib/cni/networks",
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (conf_dir / "10-lmedge.conflist").write_text(json.dumps(conf, indent=2))

    def _containerd_config(self, w: Worker, base: Path) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{base / "containerd" / "root"}"
state = "{base / "containerd" / "state"}"
# /opt/containerd and the snapshotters the tier does not use stay off.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{base / "containerd.sock"}"
[ttrpc]
  address = "{base / "containerd.sock"}.ttrpc"
[{cri}]
  sandbox_image = "{self.images["pause"]}"
  # Without CAP_SYS_RESOURCE here runc cannot lower oom_score_adj: pods fail
  # with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "/etc/cni/net.d"
"""

    def _kubelet_config(self, w: Worker, sock: Path) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This host runs cgroup v1; the kubelet refuses it without this.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{w.cgroup}",
            "containerRuntimeEndpoint": f"unix://{sock}",
            "address": w.ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            # Only the API server and the tests reach it, on the private bridge.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDNS": [HOST_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": "/etc/resolv.conf",
            # A shared test machine: never evict for its disk or memory, never
            # garbage-collect the imported images (they cannot be pulled).
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "0%",
                "imagefs.available": "0%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "failSwapOn": False,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "maxPods": 30,
        }

    def _proxy_config(self, w: Worker) -> dict[str, Any]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.cluster.kubeconfig)},
            "hostnameOverride": w.name,
            "mode": "iptables",
            # Pod -> ClusterIP -> pod on one bridge needs the reply to come back
            # through the worker (no br_netfilter assumptions).
            "iptables": {"masqueradeAll": True},
            "clusterCIDR": POD_CIDR,
            # Leave the (host-global) conntrack sysctls alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "metricsBindAddress": "127.0.0.1:10249",
            "healthzBindAddress": "127.0.0.1:10256",
        }

    def _join(self, w: Worker, deadline: float) -> None:
        """Wait for the worker's Node to be Ready, then give it its fake GPUs."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        def ready() -> bool:
            for key, pid in self.pids.items():
                if key.startswith(w.name + "/") and not _alive(pid):
                    raise TierError(f"{key} exited\n{self.logs()}")
            try:
                node = core.read_node(w.name)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            conds = node.status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conds)

        with self.cluster.api_client() as api:
            core = client.CoreV1Api(api)
            try:
                wait_until(ready, deadline - time.monotonic(), f"node {w.name} Ready", 1.0)
            except TimeoutError as exc:
                raise TierError(f"{exc}\n{self.logs()}") from None
            # What the NVIDIA device plugin would advertise after time-slicing;
            # the kubelet keeps extended resources patched into status.
            patch = {"status": {"capacity": {GPU_RESOURCE: str(w.gpus)}}}
            core.patch_node_status(w.name, patch)

            def has_gpus() -> bool:
                alloc = core.read_node(w.name).status.allocatable or {}
                return str(alloc.get(GPU_RESOURCE, "0")) == str(w.gpus)

            wait_until(has_gpus, 60, f"{w.name} allocatable {GPU_RESOURCE}")


def _cgroup_controllers() -> list[str]:
    root = Path("/sys/fs/cgroup")
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "unified")


def _netns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except FileNotFoundError:
        return None


def _pids_in(worker: Worker) -> set[int]:
    """Every process of a worker: its daemons and shims (in its netns) and its
    pods' processes (in its cgroup subtree)."""
    pids: set[int] = set()
    inode = _netns_inode(worker.netns)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if inode is not None and os.stat(entry / "ns" / "net").st_ino == inode:
                pids.add(int(entry.name))
    tree = Path("/sys/fs/cgroup/pids") / worker.cgroup
    if tree.is_dir():
        for procs in tree.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    pids.discard(os.getpid())
    return pids


def _teardown(state: dict[str, Any]) -> None:
    """Undo everything `up` may have done, from its recorded state; idempotent."""
    workers = [w for w in WORKERS if w.index in state.get("workers", [])] or list(WORKERS)
    # Daemons first, politely (the kubelet and containerd), then everything.
    for pid in state.get("pids", {}).values():
        if pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + 10
    while time.monotonic() < end and any(_alive(p) for p in state.get("pids", {}).values()):
        time.sleep(0.2)
    for _ in range(5):
        left = set().union(*(_pids_in(w) for w in workers)) | {
            p for p in state.get("pids", {}).values() if _alive(p)
        }
        if not left:
            break
        for pid in left:
            if pid <= 0:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    for w in workers:
        for ctrl in _cgroup_controllers():
            root = Path("/sys/fs/cgroup") / ctrl / w.cgroup
            if not root.is_dir():
                continue
            for d in sorted(
                (p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
        _run("ip", "netns", "del", w.netns, check=False)
        _run("ip", "link", "del", w.veth, check=False)
    _run("ip", "link", "del", BRIDGE, check=False)
    for name, value in (state.get("sysctls") or {}).items():
        with contextlib.suppress(OSError):
            _sysctl_path(name).write_text(value)
    with contextlib.suppress(FileNotFoundError):
        STATE_FILE.unlink()


def _clean_stale() -> None:
    """Tear down after a tier whose owner died without `down` (called under the lock)."""
    if not STATE_FILE.exists():
        return
    state = json.loads(STATE_FILE.read_text())
    owner = int(state.get("owner", 0))
    if owner == os.getpid():
        return
    # A detached tier (owner -1, from `up.sh`) runs while any of its processes do.
    if _alive(owner) or (owner == -1 and any(_alive(p) for p in state.get("pids", {}).values())):
        return
    _teardown(state)
    cp = Path(state["workdir"]) / "control-plane"
    if (cp / "cluster.json").is_file():
        KubeCluster.attach(cp).stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start or stop the real-node test tier.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the tier in DIR and leave it running")
    up.add_argument("dir", type=Path)
    down = sub.add_parser("down", help="stop the tier (the one running, or DIR's)")
    down.add_argument("dir", type=Path, nargs="?")
    sub.add_parser("check", help="say whether this machine can run the tier")
    sub.add_parser(
        "clean", help="tear down a tier whose owner died (never a live one or an up.sh one)"
    )
    args = parser.parse_args(argv)
    if args.command == "clean":
        with _locked():
            stale = STATE_FILE.exists()
            _clean_stale()
            if stale and not STATE_FILE.exists():
                print("realnode: cleaned up after a tier whose owner had died")
        return 0
    if args.command == "check":
        problems = unmet_requirements()
        for p in problems:
            print(f"realnode: {p}", file=sys.stderr)
        return 1 if problems else 0
    if args.command == "down":
        with _locked():
            if not STATE_FILE.exists():
                print("realnode: no tier running", file=sys.stderr)
                return 0
            state = json.loads(STATE_FILE.read_text())
            _teardown(state)
            cp = Path(state["workdir"]) / "control-plane"
            if (cp / "cluster.json").is_file():
                KubeCluster.attach(cp).stop()
        print(f"realnode: stopped ({state['workdir']})")
        return 0
    tier = RealNodeTier(args.dir)
    try:
        tier.up()
    except (TierError, TimeoutError, OSError) as exc:
        print(f"realnode: {exc}", file=sys.stderr)
        return 1
    # Detached: a later `down` finds the processes through the state file; the
    # owner recorded is this (exiting) process, so mark the tier as detached.
    state = tier._state()
    state["owner"] = -1
    STATE_FILE.write_text(json.dumps(state, indent=2))
    print(f"realnode: up ({', '.join(w.name for w in WORKERS)}) at {tier.cluster.server}")
    print(f"export KUBECONFIG={tier.cluster.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
