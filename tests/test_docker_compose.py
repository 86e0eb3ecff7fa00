"""compose.yaml proven by running it: the CPU profile's retriever and trainer images built on a
registry-free Debian base from an offline wheelhouse, `docker-compose up` on the host's network (all
traffic on 127.0.0.1), the trainer's smoke run to completion and its resume, the retriever's answers
and token; the GPU services checked statically. `make test-docker` runs this (marker `docker`, left
out of `make test`); it installs docker.io, docker-compose and debootstrap first where missing.

An existing Docker daemon (DOCKER_HOST, or one answering on the default socket) is used as it is;
otherwise dockerd is started on a socket and data root of its own, without a bridge or iptables
rules, and stopped by its PID at the end. Whatever happens, the compose project, its volumes, the
images and the base image this test built are removed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_CPU = ["-f", "compose.yaml", "-f", "docker/compose.host.yaml", "--profile", "cpu"]
# the world of configs/smoke.yaml's data.synthetic, which the trainer's questions come from
SMOKE_WORLD = "--seed 0 --n-entities 16 --n-relations 2 --max-hops 2 --questions-per-hop 8"
IMAGE_UID = 1000  # docker/Dockerfile's `pvpo` user
CATALOG_MODEL = "smollm2-135m-instruct"  # pvpo/model_catalog.py, installed into the images by docker/install.sh models
# Measured on 2 shared cores (make test-docker, two runs): base 40-103 s, wheelhouse 9-10 s with a warm
# pip cache, both images 161-199 s, `up` to the trained smoke run 24-38 s, resume 6-11 s; the limits
# leave room for a cold pip cache and a busier machine.
BUILD_TIMEOUT_S = 1500
RUN_TIMEOUT_S = 600


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in the repository root; on failure (or timeout) fail with its output's tail."""
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-3000:]
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout:.0f} s; output ends:\n{out!r}")
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    return done


def _daemon_answers(env: dict[str, str]) -> bool:
    return subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="module")
def docker_env() -> Iterator[dict[str, str]]:
    """The environment for docker and docker-compose: an existing daemon's, or one started here."""
    missing = [tool for tool in ("docker", "docker-compose", "dockerd", "debootstrap") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run `make test-docker`, which installs them (docker/host-tools.sh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVPO_")}
    if _daemon_answers(env):
        yield env
        return
    # /run keeps the daemon's socket paths short (a unix socket path has at most 107 bytes)
    home = Path(tempfile.mkdtemp(prefix="pvpo-dockerd-", dir="/run" if os.access("/run", os.W_OK) else None))
    data_root = Path(tempfile.mkdtemp(prefix="pvpo-docker-data-", dir="/var/tmp"))
    env["DOCKER_HOST"] = f"unix://{home}/docker.sock"
    log = open(home / "dockerd.log", "w")  # noqa: SIM115 - closed after the daemon stops
    daemon = subprocess.Popen(
        [
            "dockerd",
            "--host",
            env["DOCKER_HOST"],
            "--data-root",
            str(data_root),
            "--exec-root",
            str(home / "exec"),
            "--pidfile",
            str(home / "dockerd.pid"),
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not _daemon_answers(env):
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dockerd did not start; its log ends:\n{(home / 'dockerd.log').read_text()[-3000:]}")
            time.sleep(1)
        yield env
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        _unmount_under(home, data_root)
        shutil.rmtree(data_root, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def _unmount_under(*roots: Path) -> None:
    """Unmount what a stopped dockerd left mounted under `roots` (its exec root keeps the network
    namespace bind mount netns/default after a clean shutdown), deepest first, so they can be removed."""
    prefixes = tuple(f"{root}/" for root in roots)
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1].startswith(prefixes)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stack(docker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The CPU profile built and started: the trainer on the smoke config against the retriever."""
    build_id = uuid.uuid4().hex[:10]
    base = f"pvpo-test-base:{build_id}"
    work = tmp_path_factory.mktemp("compose")
    data, runs = work / "data", work / "runs"
    for d in (data, runs):
        d.mkdir()
        os.chown(d, IMAGE_UID, IMAGE_UID)  # the images' non-root user writes the volumes
    # the config volume holds the smoke preset with Group Sampling on: its oracle GT trajectories search,
    # so the run calls the retriever (the smoke policy itself, untrained, never writes a search)
    config = work / "config"
    config.mkdir()
    smoke = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    smoke["algorithm"]["group_sampling"] = {"enabled": True}
    (config / "smoke-gt.yaml").write_text(yaml.safe_dump(smoke))
    token = uuid.uuid4().hex
    (work / "token.env").write_text(f"PVPO_RETRIEVER_TOKEN={token}\n")
    port = _free_port()
    env = dict(docker_env) | {
        "PVPO_CPU_BASE": base,
        "PVPO_PIP_OFFLINE": "1",
        "PVPO_IMAGE_TAG": f"test-{build_id}",
        "PVPO_BUILD_LABEL": build_id,
        "PVPO_ENV_FILE": str(work / "token.env"),
        "PVPO_DATA": str(data),
        "PVPO_RUNS": str(runs),
        "PVPO_HF_CACHE": str(work / "hf"),
        "PVPO_RETRIEVER_PORT": str(port),
        "PVPO_CONFIG_DIR": str(config),
        "PVPO_CONFIG": "/config/smoke-gt.yaml",
        "PVPO_RUN": "smoke",
        "PVPO_SYNTHETIC_WORLD": SMOKE_WORLD,
    }
    (work / "hf").mkdir()
    os.chown(work / "hf", IMAGE_UID, IMAGE_UID)
    compose = ["docker-compose", "-p", f"pvpotest{build_id}", *COMPOSE_CPU]
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        _run(["docker/debootstrap-base.sh", base], env, timeout=600)
        timings["base_s"] = time.monotonic() - t0
        have = _run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                base,
                "python3",
                "-c",
                "import sys; print('%d.%d' % sys.version_info[:2])",
            ],
            env,
            timeout=120,
        ).stdout.strip()
        host = f"{sys.version_info[0]}.{sys.version_info[1]}"  # the wheelhouse is built by this interpreter
        assert have == host, f"the debootstrapped base has Python {have}, the wheelhouse is for {host}"
        t0 = time.monotonic()
        _run(["docker/wheelhouse.sh", "cpu"], env | {"PYTHON": sys.executable}, timeout=900)
        timings["wheelhouse_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        _run([*compose, "build", "retriever-cpu", "trainer-cpu"], env, timeout=BUILD_TIMEOUT_S)
        timings["build_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        _run([*compose, "up", "-d", "trainer-cpu"], env, timeout=RUN_TIMEOUT_S)
        yield {
            "env": env,
            "compose": compose,
            "runs": runs,
            "data": data,
            "token": token,
            "port": port,
            "build_id": build_id,
            "timings": timings,
            "up_t0": t0,
            "hf": work / "hf",
            "trainer_image": f"pvpo-trainer:{env['PVPO_IMAGE_TAG']}",
        }
    finally:
        logs = subprocess.run(
            [*compose, "logs", "--no-color", "--tail", "40"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        print(logs.stdout[-6000:])
        subprocess.run(
            [*compose, "down", "--volumes", "--rmi", "all", "--remove-orphans"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=300,
        )
        subprocess.run(["docker", "rmi", "-f", base], env=env, capture_output=True, timeout=120)
        # the build stages (venv, venv-retriever, ...) are untagged images carrying this build's label
        subprocess.run(
            ["docker", "image", "prune", "-a", "-f", "--filter", f"label=pvpo-search.build={build_id}"],
            env=env,
            capture_output=True,
            timeout=300,
        )
        shutil.rmtree(work, ignore_errors=True)


def _container(stack: dict[str, object], service: str) -> dict:
    compose, env = stack["compose"], stack["env"]
    cid = _run([*compose, "ps", "-q", service], env, timeout=60).stdout.strip()  # type: ignore[list-item, arg-type]
    assert cid, f"no container for {service}"
    return json.loads(_run(["docker", "inspect", cid], env, timeout=60).stdout)[0]  # type: ignore[arg-type]


def _logs(stack: dict[str, object], service: str) -> str:
    return _run([*stack["compose"], "logs", "--no-color", service], stack["env"], timeout=60).stdout  # type: ignore[list-item, arg-type]


def _wait_exit(stack: dict[str, object], service: str, timeout: float) -> dict:
    """The service's container once it has exited; fails when it restarts or outlives `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        state = _container(stack, service)
        if state["RestartCount"] > 0:
            pytest.fail(f"{service} failed and was restarted; its log ends:\n{_logs(stack, service)[-4000:]}")
        if state["State"]["Status"] == "exited":
            return state
        if time.monotonic() > deadline:
            pytest.fail(
                f"{service} still {state['State']['Status']} after {timeout:.0f} s; log ends:\n"
                f"{_logs(stack, service)[-4000:]}"
            )
        time.sleep(3)


def _retrieve(port: int, token: str | None, query: str) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/retrieve",
        method="POST",
        data=json.dumps({"queries": [query], "topk": 2, "return_scores": True}).encode(),
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_cpu_profile_trains_against_the_retriever_and_resumes(stack: dict[str, object]) -> None:
    trainer = _wait_exit(stack, "trainer-cpu", RUN_TIMEOUT_S)
    up_s = time.monotonic() - stack["up_t0"]  # type: ignore[operator]
    trainer_log = _logs(stack, "trainer-cpu")
    assert trainer["State"]["ExitCode"] == 0, trainer_log[-4000:]
    assert "done: 2 steps" in trainer_log, trainer_log[-4000:]
    assert trainer["Config"]["User"] == "pvpo" and trainer["HostConfig"]["NetworkMode"] == "host"

    # the retriever built its index from the world it wrote, logged it, and is healthy on loopback
    retriever = _container(stack, "retriever-cpu")
    assert retriever["State"]["Health"]["Status"] == "healthy"
    # compose set only the start period: the image's check itself is kept
    assert retriever["Config"]["Healthcheck"]["Test"][-1] == "retriever"
    assert retriever["Config"]["Healthcheck"]["StartPeriod"] == 6 * 3600 * 10**9
    assert retriever["Config"]["User"] == "pvpo" and retriever["HostConfig"]["NetworkMode"] == "host"
    retriever_log = _logs(stack, "retriever-cpu")
    assert (
        "writing the synthetic world" in retriever_log and "building it from /data/world/corpus.jsonl" in retriever_log
    )
    assert (stack["data"] / "world" / "index" / "meta.json").is_file()  # type: ignore[operator]

    # its answers: the token is required, and a passage's own text finds that passage first
    port, token = int(stack["port"]), str(stack["token"])  # type: ignore[call-overload]
    status, body = _retrieve(port, None, "anything")
    assert status == 401, body
    first = json.loads((stack["data"] / "world" / "corpus.jsonl").read_text().splitlines()[0])  # type: ignore[operator]
    status, body = _retrieve(port, token, first["contents"].split("\n", 1)[1])
    assert status == 200, body
    hits = body["result"][0]
    assert hits[0]["document"]["id"] == first["id"] and len(hits) == 2 and hits[0]["score"] >= hits[1]["score"]

    # the run: 2 PVPO steps of finite reward whose searches went to this retriever (the trainer built
    # no index of its own), checkpointed, written by the image's user
    run_dir = stack["runs"] / "smoke"  # type: ignore[operator]
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2], rows
    assert all(math.isfinite(r["reward/mean"]) for r in rows)
    assert rows[-1]["cost/cum_tool_calls"] > 0, rows[-1]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["retriever"]["url"] == f"http://127.0.0.1:{port}"
    assert not (run_dir / "index").exists()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert (run_dir / "metrics.jsonl").stat().st_uid == IMAGE_UID

    # a second start finds the checkpoint and continues the run (one more step) instead of refusing it
    t0 = time.monotonic()
    _run(
        [*stack["compose"], "run", "--rm", "--no-deps", "trainer-cpu", "run.steps=3"],
        stack["env"],
        timeout=RUN_TIMEOUT_S,
    )  # type: ignore[list-item, arg-type]
    resume_s = time.monotonic() - t0
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3], rows
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000003"
    timings = stack["timings"] | {"up_to_trained_s": up_s, "resume_s": resume_s}  # type: ignore[operator]
    print("timings: " + ", ".join(f"{k}={v:.0f}" for k, v in timings.items()))


def _models_path(stack: dict[str, object]) -> tuple[str, float]:
    """`pvpo models path` of the catalog model in the trainer image, with no network at all and the
    compose project's cache volume; its printed folder and wall time."""
    t0 = time.monotonic()
    done = _run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{stack['hf']}:/cache/huggingface",
            "--entrypoint",
            "pvpo",
            str(stack["trainer_image"]),
            "models",
            "path",
            CATALOG_MODEL,
        ],
        stack["env"],  # type: ignore[arg-type]
        timeout=RUN_TIMEOUT_S,
    )
    return done.stdout.strip().splitlines()[-1], time.monotonic() - t0


def test_trainer_image_converts_a_catalog_model_once_onto_the_cache_volume(stack: dict[str, object]) -> None:
    folder, first_s = _models_path(stack)
    # PVPO_CACHE_DIR (docker/Dockerfile) puts the converted folder on the /cache/huggingface volume
    assert folder == f"/cache/huggingface/pvpo/models/{CATALOG_MODEL}", folder
    on_host = stack["hf"] / "pvpo" / "models" / CATALOG_MODEL  # type: ignore[operator]
    manifest = on_host / "pvpo-model.json"
    assert (on_host / "config.json").is_file() and any(on_host.glob("*.safetensors")), sorted(on_host.iterdir())
    assert manifest.stat().st_uid == IMAGE_UID
    written = manifest.stat().st_mtime_ns, manifest.stat().st_ino
    # a second container reuses it (no conversion: the folder is not rewritten), still offline
    again, second_s = _models_path(stack)
    assert again == folder and (manifest.stat().st_mtime_ns, manifest.stat().st_ino) == written
    stack["timings"]["models_path_first_s"] = first_s  # type: ignore[index]
    stack["timings"]["models_path_again_s"] = second_s  # type: ignore[index]
    print(f"pvpo models path: {first_s:.0f} s converting, {second_s:.0f} s reusing")


def test_eval_entrypoint_runs_a_catalog_model(stack: dict[str, object]) -> None:
    """docker/eval-entrypoint.sh with PVPO_EVAL_MODEL set to a catalog name, against the retriever."""
    data, runs, port = stack["data"], stack["runs"], int(stack["port"])  # type: ignore[call-overload]
    questions = data / "eval" / "two.jsonl"  # type: ignore[operator]
    questions.parent.mkdir(exist_ok=True)
    corpus = [json.loads(line) for line in (data / "world" / "corpus.jsonl").read_text().splitlines()[:2]]  # type: ignore[operator]
    questions.write_text(
        "".join(
            json.dumps(
                {"id": f"q{i}", "question": f"What is {p['contents'].split(chr(10))[0]}?", "golden_answers": ["x"]}
            )
            + "\n"
            for i, p in enumerate(corpus)
        )
    )
    t0 = time.monotonic()
    _run(
        [
            *stack["compose"],  # type: ignore[misc]
            "run",
            "--rm",
            "--no-deps",
            "--entrypoint",
            "/opt/pvpo/eval-entrypoint.sh",
            "-e",
            f"PVPO_EVAL_MODEL={CATALOG_MODEL}",
            "-e",
            f"PVPO_RETRIEVER_URL=http://127.0.0.1:{port}",
            "trainer-cpu",
            "--dataset",
            "/data/eval/two.jsonl",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "48",
            "--quiet",
        ],
        stack["env"],  # type: ignore[arg-type]
        timeout=RUN_TIMEOUT_S,
    )
    eval_s = time.monotonic() - t0
    found = sorted((runs / "eval").rglob("metrics.json"))  # type: ignore[operator]
    assert len(found) == 1, found
    metrics = json.loads(found[0].read_text())
    print(f"pvpo eval of {CATALOG_MODEL} on 2 questions: {eval_s:.0f} s; metrics {metrics}")
    stack["timings"]["eval_catalog_model_s"] = eval_s  # type: ignore[index]
    assert metrics["n"] == 2 and math.isfinite(metrics["em"]), metrics
    assert metrics["model"] == metrics["label"] == CATALOG_MODEL, metrics  # the name, not /<name> (cwd is /)
    items = [json.loads(line) for line in (found[0].parent / "predictions.jsonl").read_text().splitlines()]
    assert sorted(it["id"] for it in items) == ["q0", "q1"] and all(it["output"]["final_response"] for it in items)


def test_gpu_services_validate(tmp_path: Path) -> None:
    """compose.yaml's default (GPU) services as docker-compose resolves them (no daemon, no GPU)."""
    if shutil.which("docker-compose") is None:
        pytest.fail("missing docker-compose: run `make test-docker`, which installs it (docker/host-tools.sh)")
    (tmp_path / "secret.env").write_text("PVPO_RETRIEVER_TOKEN=s3cret\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVPO_")} | {
        "PVPO_ENV_FILE": str(tmp_path / "secret.env")
    }
    done = _run(["docker-compose", "-f", "compose.yaml", "--profile", "eval", "config"], env, timeout=60)
    services = yaml.safe_load(done.stdout)["services"]
    assert {"retriever", "trainer", "eval"} <= services.keys()
    for name in ("retriever", "trainer", "eval"):
        svc = services[name]
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}], devices
        assert svc["environment"]["PVPO_RETRIEVER_TOKEN"] == "s3cret"  # from the env file, not the compose file
        assert any(str(v).endswith(":/cache/huggingface:rw") for v in svc["volumes"])
    assert services["trainer"]["depends_on"]["retriever"]["condition"] == "service_healthy"
    assert services["trainer"]["environment"]["PVPO_RETRIEVER_URL"] == "http://retriever:8000"
    for name in ("retriever", "trainer"):  # eval runs the trainer's image
        args = services[name]["build"]["args"]
        assert services[name]["build"]["target"] == name and args["VARIANT"] == "cuda", services[name]["build"]
        assert args["BASE_IMAGE"].startswith("nvidia/cuda:") and args["PIP_OFFLINE"] == "0"
    assert services["eval"]["image"] == services["trainer"]["image"] and services["eval"]["profiles"] == ["eval"]
