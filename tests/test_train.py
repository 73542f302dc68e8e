"""``hetpar train``: configs, a short real training run, Ctrl-C and --resume, CLI errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")

from hetpar.agents import callbacks as cb  # noqa: E402
from hetpar.agents.io import load_policy  # noqa: E402
from hetpar.agents.train import (load_train_config, parse_train_config,  # noqa: E402
                                 resolve_train_config_path, train)
from hetpar.cli.main import main  # noqa: E402
from hetpar.errors import ConfigError  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _ci_config(timesteps: int):
    """The tiny config, shrunk further: one evaluation instance exact solves at once."""
    data = load_train_config("tiny").as_dict()
    data["total_timesteps"] = timesteps
    data["ppo"].update(n_steps=256, batch_size=64, n_epochs=1)
    data["eval"].update(n=1, freq=256, exact_time_limit=2)
    data["checkpoint"].update(freq=256, keep=2)
    return parse_train_config(data, "ci", name="ci")


def test_bundled_configs_parse() -> None:
    for name in ("tiny", "default", "clone"):
        cfg = load_train_config(name)
        # PPO steps, or cloning alone (the clone's config).
        assert cfg.total_timesteps > 0 or cfg.imitation is not None
        assert cfg.env["max_hosts"] >= 4
    assert resolve_train_config_path("configs/train/tiny.yaml").is_file()
    default = load_train_config("default")
    assert default.suite == "train-mixed" and default.env["max_hosts"] >= 16
    assert default.eval["start"] >= 1000  # held-out evaluation instances
    # The shipped policy's config is PPO from the bundled clone, whose architecture it keeps.
    clone = load_train_config("clone")
    assert default.finetune["init_policy"] == "clone" and default.total_timesteps > 0
    assert clone.imitation is not None and clone.total_timesteps == 0
    assert clone.policy_kwargs == default.policy_kwargs
    assert clone.env["max_hosts"] == default.env["max_hosts"]


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such training config"):
        load_train_config("nope")
    with pytest.raises(ConfigError, match=r"ppo.n_stepz: unknown field"):
        parse_train_config({"suite": "tiny", "total_timesteps": 10, "ppo": {"n_stepz": 3}}, "x")
    with pytest.raises(ConfigError, match=r"env.bandwidth"):
        parse_train_config({"suite": "tiny", "total_timesteps": 10,
                            "env": {"bandwidth": "wild"}}, "x")
    with pytest.raises(ConfigError, match="learning_rate"):
        parse_train_config({"suite": "tiny", "total_timesteps": 10,
                            "ppo": {"learning_rate": "fast"}}, "x")
    with pytest.raises(ConfigError, match="total_timesteps: is required"):
        parse_train_config({"suite": "tiny"}, "x")


def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--config", "does-not-exist", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hetpar: error:") and "\n" not in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"suite": "tiny", "total_timesteps": 10, "colour": "red"}))
    assert main(["train", "--config", str(bad), "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "colour: unknown field" in err and str(bad) in err and "\n" not in err
    assert main(["train", "--config", "tiny", "--timesteps", "0"]) == 2
    assert main(["train", "--resume", "nothing-here", "--runs-dir", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["train"]) == 2


def _rollout(bundle, suite: str = "tiny") -> dict:  # noqa: ANN001
    env = bundle.make_env(suite, instances=4)
    obs, _ = env.reset(seed=3)
    for _ in range(1000):
        obs, _, done, trunc, info = env.step(bundle.act(obs, env.action_masks()))
        assert not trunc
        if done:
            return info
    raise AssertionError("the episode did not end")


def test_short_training_run_interrupt_and_resume(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _ci_config(768)
    # Ctrl-C after the second rollout: a resumable checkpoint, no traceback.
    original = cb.StatsCallback._on_rollout_end
    calls = {"n": 0}

    def interrupt(self) -> None:  # noqa: ANN001
        original(self)
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(cb.StatsCallback, "_on_rollout_end", interrupt)
    first = train(cfg, run_name="ci", runs_dir=tmp_path, progress=False)
    run = tmp_path / "ci"
    assert first.interrupted and (run / "interrupted_policy.zip").is_file()
    assert first.timesteps == 512
    assert (run / "config.yaml").is_file() and (run / "eval_reference.json").is_file()
    assert yaml.safe_load((run / "config.yaml").read_text())["total_timesteps"] == 768
    assert list((run / "checkpoints").glob("policy_256_steps.zip"))
    ckpt = load_policy(run / "checkpoints" / "policy_256_steps.zip")
    assert ckpt.meta["timesteps"] == 256 and ckpt.max_hosts == cfg.env["max_hosts"]
    monkeypatch.setattr(cb.StatsCallback, "_on_rollout_end", original)

    with pytest.raises(ConfigError, match="--resume ci"):
        train(cfg, run_name="ci", runs_dir=tmp_path, progress=False)
    second = train(cfg, run_name="ci", runs_dir=tmp_path, resume=True, progress=False)
    assert not second.interrupted and second.timesteps == 768
    assert not (run / "interrupted_policy.zip").exists()
    events = list((run / "tb").rglob("events.out.tfevents.*"))
    assert events
    assert (run / "best_policy.zip").is_file()
    assert second.last_eval is not None and np.isfinite(second.last_eval["gap_exact_mean"])
    assert second.last_eval["infeasible_frac"] == 0.0
    # Refinement never makes the rollout's plan worse.
    assert second.last_eval["gap_refined_mean"] <= second.last_eval["gap_exact_mean"] + 1e-12

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags: set[str] = set()
    for event in events:
        acc = EventAccumulator(str(event))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    for tag in ("train/policy_gradient_loss", "rollout/ep_rew_mean",
                "hetpar/throughput_tokens_per_s", "hetpar/infeasible_frac",
                "hetpar/env_steps_per_s", "hetpar/eval/gap_exact_mean",
                "hetpar/eval/gap_exact_p90", "hetpar/eval/gap_metis_mean",
                "hetpar/eval/gap_refined_median", "hetpar/eval/gap_refined_p90",
                "hetpar/eval/refined_as_good_as_metis_frac",
                # PPO after cloning: how far it moved from the clone (logged, not optimised).
                "train/kl_anchor", "train/entropy_loss", "time/fps"):
        assert tag in tags, tag

    bundle = load_policy(second.final_policy)
    assert bundle.meta["timesteps"] == 768
    assert bundle.meta["training"]["suite"] == "tiny"
    info = _rollout(bundle)
    assert info["feasible"] and np.isfinite(info["objective_s"])
    plan = info["plan"]
    assert plan.micro_batches >= 1 and plan.stages


def _wait_for(path_glob, proc, timeout: float = 240.0) -> None:  # noqa: ANN001
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if list(path_glob()):
            return
        if proc.poll() is not None:
            raise AssertionError(f"training ended early: {proc.communicate()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no checkpoint appeared")


def test_sigterm_saves_a_resumable_checkpoint_and_damage_is_skipped(tmp_path: Path) -> None:
    """SIGTERM (kill, timeout, Slurm) saves like Ctrl-C; no temporary file survives;
    --resume skips a damaged newest checkpoint for the one before; the run folder is
    locked while a run writes it, and an earlier run is not overwritten without asking."""
    import os
    import signal
    import subprocess
    import sys

    data = _ci_config(10**6).as_dict()
    data["imitation"] = None
    config = tmp_path / "ci.yaml"
    config.write_text(yaml.safe_dump(data))
    run = tmp_path / "runs" / "term"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetpar", "train", "--config", str(config), "--run-name", "term",
         "--runs-dir", str(tmp_path / "runs"), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    _wait_for(lambda: (run / "checkpoints").glob("policy_512_steps.zip"), proc)
    assert (run / ".lock").read_text().strip() == str(proc.pid)
    # A second run on the folder while the first writes it: refused, nothing touched.
    with pytest.raises(ConfigError, match=f"in use by another 'hetpar train' \\(pid {proc.pid}"):
        train(_ci_config(256), run_name="term", runs_dir=tmp_path / "runs", progress=False)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted at" in out and "Traceback" not in err
    saved = load_policy(run / "interrupted_policy.zip")
    steps = saved.meta["timesteps"]
    assert steps >= 512 and saved.meta["format_version"] == 2
    assert not list(run.rglob("*.tmp")) and not (run / ".lock").exists()

    # A damaged newest checkpoint: skipped with a line, training goes on from the previous.
    path = run / "interrupted_policy.zip"
    path.write_bytes(path.read_bytes()[:5000])
    said: list[str] = []
    cfg = parse_train_config({**data, "total_timesteps": 768}, str(config), name="ci")
    result = train(cfg, run_name="term", runs_dir=tmp_path / "runs", resume=True,
                   progress=False, log=said.append)
    skipped = [s for s in said if s.startswith("skipping checkpoint interrupted_policy.zip")]
    assert len(skipped) == 1 and "\n" not in skipped[0]
    assert any(s.startswith("continuing from policy_") for s in said)
    assert not result.interrupted and result.timesteps == 768

    # A finished run is kept unless --overwrite; a lock left by a dead process is taken over.
    with pytest.raises(ConfigError, match="--overwrite"):
        train(cfg, run_name="term", runs_dir=tmp_path / "runs", progress=False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / ".lock").write_text(f"{dead.pid}\n")
    (run / "checkpoints" / f".policy_9_steps.zip.{dead.pid}.tmp").write_bytes(b"")
    said.clear()
    short = parse_train_config({**data, "total_timesteps": 256,
                                "eval": {**data["eval"], "n": 0}}, str(config), name="ci")
    again = train(short, run_name="term", runs_dir=tmp_path / "runs", overwrite=True,
                  progress=False, log=said.append)
    assert again.timesteps == 256 and not (run / ".lock").exists()
    assert any("--overwrite: removed" in s for s in said)
    assert any("cut short" in s for s in said)
    assert not (run / "interrupted_policy.zip").exists()
    assert not list(run.rglob("*.tmp"))
