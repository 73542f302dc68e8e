"""The exact search on Ray (hetpar.solvers.ray_executor): the same optimum as the local
backend, workers that die have their tasks retried, and one-line refusals."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

import hetpar
from hetpar.problem import Problem
from hetpar.solvers import solve

from cli_helpers import assert_one_line_error, run
from test_solvers import tiny_instance

ray = pytest.importorskip("ray")

# One test worker runs this module (pyproject's --dist loadgroup): a second local Ray
# beside it would start its own processes on the same two cores, and each Ray test took
# several times as long.
pytestmark = pytest.mark.xdist_group("ray")

from hetpar.solvers.ray_executor import RayExecutor  # noqa: E402


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray of two CPUs for this module; its workers inherit the fault switch."""
    flag = tmp_path_factory.mktemp("fault") / "died"
    os.environ["HETPAR_RAY_FAULT"] = f"die-once:{flag}"
    flag.touch()  # armed per test by removing it
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 2**20)
    yield flag
    ray.shutdown()
    os.environ.pop("HETPAR_RAY_FAULT", None)


# Three instances by default, one of them a larger search (seeds 3-5 took 11-19 s each on
# Ray beside other tests, 0-2 a second or two); HETPAR_LONG_TESTS=1 runs all six.
@pytest.mark.parametrize("seed", range(6) if os.environ.get("HETPAR_LONG_TESTS") else (0, 2, 4))
def test_ray_finds_the_optimum_the_local_backend_proves(local_ray, seed):
    cluster, model, training, objective = tiny_instance(seed)
    problem = Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed)
    local = solve(problem, "exact", workers=2)
    remote = solve(problem, "exact", workers=2, executor=RayExecutor(2))
    assert remote.certificate.optimal
    assert remote.value == pytest.approx(local.value, rel=1e-12)
    assert remote.certificate.workers == 2


def test_ray_on_a_bundled_cluster_and_a_worker_that_dies(local_ray):
    # trace-demo: proven in about 2 s on two local workers (amp-het-16 took 7 s locally
    # and over a minute on Ray beside other tests, for the same check).
    problem = Problem.of(hetpar.load_cluster("trace-demo"), hetpar.load_model("gpt2-medium"),
                         hetpar.load_training(), samples=4)
    local = solve(problem, "exact", workers=2)
    local_ray.unlink()  # the next task kills its worker; Ray retries it elsewhere
    remote = solve(problem, "exact", workers=2, executor=RayExecutor(2))
    assert local_ray.exists(), "no worker died: the fault was not injected"
    assert remote.certificate.optimal
    assert remote.value == pytest.approx(local.value, rel=1e-12)


def _hetpar(*argv: str) -> tuple[int, str]:
    # A process of its own: this one may have a Ray session already (the fixture's),
    # which the command would join instead of the address it is given.
    proc = subprocess.run([sys.executable, "-m", "hetpar", *argv], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return proc.returncode, proc.stderr


def test_cli_refuses_an_unreachable_cluster_in_one_line():
    code, err = _hetpar("solve", "--cluster", "trace-demo", "--model", "gpt2-medium",
                        "--backend", "ray", "--address", "127.0.0.1:1", "--no-policy-start")
    assert_one_line_error(code, err, "--address", "no Ray cluster reachable")


def test_cli_ray_options_are_checked(capsys):
    code, _, err = run(capsys, "solve", "--cluster", "trace-demo", "--model", "gpt2-medium",
                       "--address", "auto")
    assert_one_line_error(code, err, "--address", "--backend ray")
    code, _, err = run(capsys, "solve", "--cluster", "trace-demo", "--model", "gpt2-medium",
                       "--backend", "ray", "--method", "metis")
    assert_one_line_error(code, err, "--backend", "metis")


def test_evaluate_on_ray_gives_the_local_rows(local_ray):
    """Deterministic methods (the baselines, the policy's greedy rollout) give the same
    rows on both backends, in instance order."""
    pytest.importorskip("torch")
    from hetpar.agents.evaluate import evaluate
    from hetpar.agents.io import load_policy

    bundle = load_policy(None)
    methods = ("metis", "megatron", "random", "policy-raw")
    local = evaluate("test-iid", 3, methods, bundle=bundle, samples=4)
    remote = evaluate("test-iid", 3, methods, bundle=bundle, samples=4, backend="ray",
                      workers=2)
    key = [(r.index, r.method, r.value_s, r.error) for r in local.rows]
    assert [(r.index, r.method, r.value_s, r.error) for r in remote.rows] == key
    def gaps(rows):
        return [None if math.isnan(r.gap) else r.gap for r in rows]

    assert gaps(remote.rows) == gaps(local.rows)


def test_reference_build_on_ray_saves_each_entry_and_resumes(local_ray, tmp_path):
    from hetpar.agents.reference import build, load_references

    out = tmp_path / "ref.json"
    report = build("test-iid", 2, time_limit=1.0, workers=1, out=out, seeds=("metis",),
                   grace_s=5.0, backend="ray", jobs=2)
    assert sorted(report.solved) == [0, 1]
    refs = load_references(out)
    assert sorted(refs.entries) == [0, 1]
    for entry in refs.entries.values():
        assert entry.plan is not None
        assert entry.value_s <= entry.seeds["metis"] * (1 + 1e-12)  # never worse than a seed
    again = build("test-iid", 2, time_limit=1.0, workers=1, out=out, seeds=("metis",),
                  grace_s=5.0, backend="ray", jobs=2)
    assert again.skipped == [0, 1] and not again.solved


def test_ray_environments_step_as_local_ones(local_ray):
    """Training's environments on Ray actors: the same observations, rewards, dones,
    infos and masks as in local worker processes, given the same seeds and actions."""
    pytest.importorskip("sb3_contrib")
    from hetpar.agents.vecenv import GroupedVecEnv, RayVecEnv
    from test_vecenv import _fns, assert_steps_alike

    fns = _fns(5)
    remote, local = RayVecEnv(fns, workers=2), GroupedVecEnv(fns, workers=2)
    try:
        assert remote.workers == 2 and remote.num_envs == 5
        assert_steps_alike(remote, local, 80, 5)
        assert remote.get_attr("max_hosts", indices=[4, 0]) == [8, 8]
        assert remote.has_attr("action_masks")
    finally:
        remote.close()
        local.close()


def test_a_short_training_run_with_its_environments_on_ray(local_ray, tmp_path):
    """hetpar train --backend ray: PPO's environments as Ray actors, the learner here;
    the run ends, and its checkpoint and final policy load."""
    pytest.importorskip("sb3_contrib")
    from hetpar.agents.io import load_policy
    from hetpar.agents.train import train
    from test_train import _ci_config

    cfg = _ci_config(512)
    assert cfg.n_envs >= 1
    result = train(cfg, run_name="ray", runs_dir=tmp_path, progress=False, backend="ray")
    assert not result.interrupted and result.timesteps == 512
    run = tmp_path / "ray"
    assert load_policy(run / "checkpoints" / "policy_256_steps.zip").meta["timesteps"] == 256
    assert (run / "final_policy.zip").is_file()


def test_expert_plans_on_ray_are_the_local_ones(local_ray, tmp_path):
    """The imitation's expert plans computed as Ray tasks: the same plans as locally, in
    a cache a local run then reads without recomputing."""
    from hetpar.agents.imitation import ImitationConfig, expert_plans

    cfg = ImitationConfig(experts=("metis", "megatron"), workers=2)
    local = expert_plans("tiny", range(4), objective="mean", samples=8, cfg=cfg,
                         cache=tmp_path / "local.jsonl")
    cache = tmp_path / "ray.jsonl"
    remote = expert_plans("tiny", range(4), objective="mean", samples=8, cfg=cfg,
                          cache=cache, backend="ray")
    assert {i: p.to_dict() for i, p in remote.items()} == {i: p.to_dict()
                                                           for i, p in local.items()}
    assert len(cache.read_text().splitlines()) == 5
    again = expert_plans("tiny", range(4), objective="mean", samples=8, cfg=cfg, cache=cache)
    assert {i: p.to_dict() for i, p in again.items()} == {i: p.to_dict()
                                                          for i, p in local.items()}
