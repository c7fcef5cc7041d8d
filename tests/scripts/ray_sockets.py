"""Start Ray as the HPO notebook does and list what its processes listen on (tests/test_hpo_ray.py).

ray and ray.tune are imported first, then ``hpo.ray_start``; one task runs (so a worker exists), then every TCP
socket in LISTEN state and every UDP socket bound without a peer, of this process (the driver) and of every process
it started, is recorded. Usage: ``ray_sockets.py TMP_DIR``; prints one JSON line.
"""
import json
import os
import sys

import psutil
import ray
from ray import tune  # noqa: F401  (the notebook imports Tune before starting Ray)

from dlo.lessons import hpo


def kind(proc: psutil.Process, me: psutil.Process) -> str:
    if proc.pid == me.pid:
        return "driver"
    command = " ".join(proc.cmdline())
    if "gcs_server" in command:
        return "gcs_server"
    if "raylet/raylet" in command:
        return "raylet"
    if command.startswith("ray::"):
        title = command.split()[0][5:]
        return {"RuntimeEnvAgent": "runtime_env_agent", "DashboardAgent": "dashboard_agent"}.get(title, "worker")
    script = next((os.path.basename(a) for a in proc.cmdline() if a.endswith(".py")), proc.name())
    return script


info = hpo.ray_start(num_cpus=2, num_gpus=0, temp_dir=sys.argv[1])
try:
    @ray.remote
    def answer() -> int:
        return 42

    task = ray.get(answer.remote(), timeout=600)
    me = psutil.Process()
    sockets, processes = [], 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            name = kind(proc, me)
            conns = proc.net_connections(kind="inet")
        except psutil.Error:  # ended meanwhile
            continue
        processes += 1
        for c in conns:
            tcp_listen = c.type == 1 and c.status == psutil.CONN_LISTEN
            udp_bound = c.type == 2 and not c.raddr
            if tcp_listen or udp_bound:
                sockets.append({"process": name, "pid": proc.pid, "ip": c.laddr.ip, "port": c.laddr.port,
                                "type": "tcp" if c.type == 1 else "udp"})
    record = {"sockets": sockets, "processes": processes, "task": task, "node_ip": ray.util.get_node_ip_address(),
              "address": info["address"], "attempts": info["attempts"]}
finally:
    ray.shutdown()
print(json.dumps(record))
