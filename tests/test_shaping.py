"""What PPO learns from (hetpar/agents/shaping.py) and PPO anchored to its start
(hetpar/agents/anchored.py), and ``hetpar train``'s ``finetune`` section."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")

from hetpar.agents.anchored import AnchoredMaskablePPO, kl_to  # noqa: E402
from hetpar.agents.io import load_policy, save_policy  # noqa: E402
from hetpar.agents.policy import HostAttentionPolicy  # noqa: E402
from hetpar.agents.shaping import (LogRatioReward, RandomOpening,  # noqa: E402
                                   RepeatInstance, reference_table, reference_value,
                                   shaping)
from hetpar.agents.train import load_train_config, parse_train_config, train  # noqa: E402
from hetpar.envs.env import PlanBuilderEnv  # noqa: E402
from hetpar.errors import ConfigError  # noqa: E402
from hetpar.solvers.api import solve  # noqa: E402
from test_agents import SMALL, _one_thread  # noqa: E402,F401  (the small network; one thread)


def _env(**kw) -> PlanBuilderEnv:  # noqa: ANN003
    return PlanBuilderEnv("tiny", max_hosts=6, instances=8, bandwidth="robust", samples=4,
                          **kw)


def _episode(env, rng: np.random.Generator, options=None):  # noqa: ANN001
    """A random masked episode: (the reset's instance name, the final info, the reward)."""
    _, first = env.reset(options=options)
    while True:
        action = int(rng.choice(np.flatnonzero(env.action_masks())))
        _, reward, done, _, info = env.step(action)
        if done:
            return first["instance"], info, reward


def test_log_ratio_reward_has_one_reference_per_instance_and_is_zero_at_it() -> None:
    env = LogRatioReward(_env())
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    refs: dict[str, set[float]] = {}
    for _ in range(12):
        for index in (0, 1):
            name, info, reward = _episode(env, rng, {"instance": index})
            refs.setdefault(name, set()).add(info["reference_s"])
            assert reward == pytest.approx(math.log(info["reference_s"] / info["objective_s"]))
            assert 0 < info["reward"] <= 1  # the utilisation stays in info
    assert len(refs) == 2 and all(len(r) == 1 for r in refs.values())
    # The reference is the Metis-style plan under the env's states and objective: that
    # plan, built in the env, earns 0.
    base = env.unwrapped
    base.reset(options={"instance": 0})
    metis = solve(base.context.problem, "metis").plan
    assert reference_value(base) == pytest.approx(next(iter(refs[base.instance.name])))
    env.reset(options={"instance": 0})
    for action in base.actions_for(metis):
        _, reward, done, _, info = env.step(action)
    assert done and reward == pytest.approx(0.0, abs=1e-12)


def test_reference_table_is_what_the_workers_compute_and_is_cached(tmp_path: Path) -> None:
    cache = tmp_path / "refs.json"
    table = reference_table("tiny", 3, objective="mean", samples=4, cache=cache, workers=2)
    env = _env()
    for i in range(3):
        env.reset(options={"instance": i})
        assert table[env.instance.name] == reference_value(env)
    # Reused (nothing recomputed: a poisoned solver would show), extended on demand.
    import hetpar.agents.shaping as shaping_module

    calls = []
    real = shaping_module._metis_value
    shaping_module._metis_value = lambda job: calls.append(job) or real(job)  # type: ignore
    try:
        again = reference_table("tiny", 4, objective="mean", samples=4, cache=cache)
    finally:
        shaping_module._metis_value = real
    assert len(calls) == 1 and {k: again[k] for k in table} == table
    with pytest.raises(ConfigError, match="refs.json: key: reward references for"):
        reference_table("tiny", 2, objective="p90", samples=4, cache=cache)
    # The wrapper with the table gives the same rewards as without.
    wrapped = LogRatioReward(_env(), table)
    rng = np.random.default_rng(3)
    wrapped.reset(seed=0)
    _, info, _ = _episode(wrapped, rng, {"instance": 1})
    assert info["reference_s"] == table[info["instance"]]


def test_repeat_instance_groups_episodes_by_instance() -> None:
    env = RepeatInstance(_env(), 3)
    env.reset(seed=1)
    rng = np.random.default_rng(1)
    names = [env.unwrapped.instance.name]
    while True:
        action = int(rng.choice(np.flatnonzero(env.unwrapped.action_masks())))
        *_, done, _, _ = env.step(action)
        if done:
            if len(names) == 12:
                break
            env.reset()
            names.append(env.unwrapped.instance.name)
    groups = [names[i:i + 3] for i in range(0, 12, 3)]
    assert all(len(set(g)) == 1 for g in groups)
    assert len({g[0] for g in groups}) > 1  # new draws between groups
    # Naming an instance starts a new group.
    env.reset(options={"instance": 5})
    assert env.unwrapped.instance_index == 5


def test_random_opening_draws_the_memory_option_and_count_among_the_allowed() -> None:
    env = RandomOpening(_env(), 1.0)
    seen: set[tuple[int, str, int]] = set()
    for seed in range(12):
        obs, info = env.reset(seed=seed)
        base = env.unwrapped
        # The agent starts at its first stage decision, with both drawn decisions made.
        assert info["opening_drawn"] == 2 and base.phase_name() not in ("memory",
                                                                         "micro_batches")
        ep = base._ep
        seen.add((ep.micro_batches, ep.recompute, ep.zero))
        assert obs.keys() == base.observation_space.spaces.keys()
        # The episode goes on as usual and ends with a plan.
        rng = np.random.default_rng(seed)
        while True:
            *_, done, _, info = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
            if done:
                break
        assert info["feasible"] and np.isfinite(info["objective_s"])
    assert len({m for m, _, _ in seen}) > 1 and len({(r, z) for _, r, z in seen}) > 1
    # Seeded: the same draws again; p = 0 leaves every decision to the agent.
    again = RandomOpening(_env(), 1.0)
    for seed in range(3):
        env.reset(seed=seed)
        again.reset(seed=seed)
        assert again.unwrapped._ep.micro_batches == env.unwrapped._ep.micro_batches
    never = RandomOpening(_env(), 0.0)
    _, info = never.reset(seed=0)
    assert "opening_drawn" not in info and never.unwrapped.phase_name() == "memory"
    half = RandomOpening(_env(), 0.5)
    drawn = sum("opening_drawn" in half.reset(seed=s)[1] for s in range(40))
    assert 8 < drawn < 32
    with pytest.raises(ValueError):
        RandomOpening(_env(), 1.5)


def test_shaping_picks_the_wrappers() -> None:
    assert shaping("mfu", 1) is None
    wrapped = shaping("log_metis", 2)(_env())
    assert isinstance(wrapped, LogRatioReward) and isinstance(wrapped.env, RepeatInstance)
    opened = shaping("mfu", 1, opening=0.5)(_env())
    assert isinstance(opened, RandomOpening) and opened.p == 0.5
    both = shaping("log_metis", 2, opening=1.0)(_env())
    assert isinstance(both.env.env, RandomOpening)  # inside the repeat: each episode draws
    with pytest.raises(ValueError):
        shaping("speed", 1)


def test_kl_to_is_zero_on_itself_and_ignores_masked_actions() -> None:
    logits = torch.tensor([[0.0, 1.0, -1e8], [2.0, -1e8, 0.5]])
    a = torch.log_softmax(logits, -1)
    b = torch.log_softmax(torch.tensor([[1.0, 0.0, -1e8], [2.0, -1e8, 0.5]]), -1)
    assert torch.allclose(kl_to(a, a), torch.zeros(2))
    kl = kl_to(a, b)
    assert kl[0] > 0 and kl[1] == pytest.approx(0.0, abs=1e-7)
    assert torch.isfinite(kl).all()


def _model(env, **kw) -> AnchoredMaskablePPO:  # noqa: ANN001, ANN003
    return AnchoredMaskablePPO(HostAttentionPolicy, env, policy_kwargs=SMALL, n_steps=64,
                               batch_size=32, n_epochs=2, seed=0, device="cpu", **kw)


def test_value_warmup_moves_only_the_value_head_and_the_anchor_pulls_back() -> None:
    env = LogRatioReward(_env())
    model = _model(env, value_warmup=1, anchor_coef=1.0, learning_rate=1e-3)
    model.set_anchor()
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    model.learn(64)  # one rollout, one update: the warm-up
    after = model.policy.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    # (The shared extractor is also listed as pi_ / vf_features_extractor.)
    assert moved and all(k.startswith(("value_net.", "features_extractor.value.",
                                       "pi_features_extractor.value.",
                                       "vf_features_extractor.value.")) for k in moved)
    logged = model.logger.name_to_value
    assert logged["train/value_warmup"] == 1.0
    model.learn(128, reset_num_timesteps=False)  # the policy moves now, near the anchor
    moved = {k for k in before if not torch.equal(before[k], model.policy.state_dict()[k])}
    assert any(k.startswith("features_extractor.blocks") for k in moved)
    assert model.logger.name_to_value["train/value_warmup"] == 0.0
    assert 0.0 <= model.logger.name_to_value["train/kl_anchor"] < 1.0


def test_anchor_log_probs_are_cached_per_update_on_sb3s_minibatches() -> None:
    import copy

    from hetpar.agents.anchored import _masked_log_probs, _minibatches

    model = _model(LogRatioReward(_env()), anchor_coef=1.0)
    model.set_anchor()
    model.train = lambda: None  # type: ignore[method-assign]  # a full, unflattened buffer
    model.learn(64)
    ours, theirs = copy.deepcopy(model.rollout_buffer), copy.deepcopy(model.rollout_buffer)
    np.random.seed(3)
    mine = list(_minibatches(ours, 32))
    np.random.seed(3)
    sb3 = list(theirs.get(32))
    assert len(mine) == len(sb3) == 2
    for (rows, a), b in zip(mine, sb3):
        assert torch.equal(a.actions, b.actions) and torch.equal(a.action_masks, b.action_masks)
        for key in a.observations:
            assert torch.equal(a.observations[key], b.observations[key])
    model.rollout_buffer = ours
    cached = model._anchor_log_probs()
    assert cached.shape[0] == 64
    for rows, data in mine:
        with torch.no_grad():
            fresh, _, _ = _masked_log_probs(model.anchor, data.observations, data.action_masks)
        assert torch.allclose(cached[torch.as_tensor(rows)], fresh, atol=1e-5)


def test_anchor_is_not_saved_with_the_policy(tmp_path: Path) -> None:
    env = _env()
    model = _model(env, anchor_coef=0.5)
    model.set_anchor()
    path = save_policy(model, tmp_path / "p.zip", {"max_hosts": 6, "env_kwargs": {
        "bandwidth": "robust", "samples": 4}})
    plain = _model(env)
    bare = save_policy(plain, tmp_path / "q.zip", {"max_hosts": 6, "env_kwargs": {
        "bandwidth": "robust", "samples": 4}})
    assert path.stat().st_size < bare.stat().st_size * 1.2
    bundle = load_policy(path)
    for k, v in model.policy.state_dict().items():
        assert torch.equal(bundle.model.policy.state_dict()[k], v)


def test_finetune_config_is_checked() -> None:
    base = {"suite": "tiny", "total_timesteps": 10}
    cfg = parse_train_config({**base, "finetune": {"reward": "log_metis", "repeat": 4,
                                                   "anchor_coef": 0.1, "value_warmup": 2,
                                                   "init_policy": "shipped"}}, "x")
    assert cfg.finetune["reward"] == "log_metis" and cfg.as_dict()["finetune"]["repeat"] == 4
    assert cfg.finetune["explore_openings"] == 0.0
    opened = parse_train_config({**base, "finetune": {"explore_openings": 0.5}}, "x")
    assert opened.as_dict()["finetune"]["explore_openings"] == 0.5
    assert "finetune" not in parse_train_config(base, "x").as_dict()  # defaults: unsaid
    for bad, field in (({"reward": "speed"}, "finetune.reward"),
                       ({"repeat": 0}, "finetune.repeat"),
                       ({"anchor_coef": -1}, "finetune.anchor_coef"),
                       ({"init_policy": 3}, "finetune.init_policy"),
                       ({"explore_openings": 1.5}, "finetune.explore_openings"),
                       ({"explore_openings": -0.1}, "finetune.explore_openings"),
                       ({"warmup": 1}, "finetune.warmup")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            parse_train_config({**base, "finetune": bad}, "x")


def _finetune_config(init: str, timesteps: int = 512):  # noqa: ANN202
    data = load_train_config("tiny").as_dict()
    data.pop("imitation")
    data["total_timesteps"] = timesteps
    data["ppo"].update(n_steps=128, batch_size=64, n_epochs=1)
    data["eval"].update(n=1, freq=256, exact_time_limit=2)
    data["checkpoint"].update(freq=256, keep=2)
    data["finetune"] = {"init_policy": init, "reward": "log_metis", "repeat": 2,
                        "anchor_coef": 0.1, "value_warmup": 1, "explore_openings": 0.5}
    return parse_train_config(data, "ft", name="ft")


def test_ppo_from_a_policy_file_logs_its_gap_and_its_checkpoint_reloads(tmp_path: Path) -> None:
    """A short real fine-tuning run: the start policy's gap is the first evaluation, the
    KL to it is logged, and a checkpoint and the final policy reload; a start policy of
    another architecture is one ConfigError."""
    start = PlanBuilderEnv("tiny", max_hosts=8, instances=32, bandwidth="robust", samples=8)
    from sb3_contrib import MaskablePPO

    seed_model = MaskablePPO(HostAttentionPolicy, start, policy_kwargs=SMALL, seed=1,
                             device="cpu", n_steps=64)
    init = save_policy(seed_model, tmp_path / "start.zip",
                       {"max_hosts": 8, "env_kwargs": {"bandwidth": "robust", "samples": 8}})
    res = train(_finetune_config(str(init)), run_name="ft", runs_dir=tmp_path, progress=False)
    run = tmp_path / "ft"
    history = (run / "eval_history.jsonl").read_text().splitlines()
    assert '"phase": "init"' in history[0] and len(history) >= 2
    assert res.last_eval is not None and np.isfinite(res.last_eval["gap_exact_mean"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for event in (run / "tb").rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(event))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"train/kl_anchor", "train/value_warmup", "hetpar/eval/gap_exact_mean"} <= tags
    ckpt = sorted((run / "checkpoints").glob("*.zip"))
    assert ckpt and load_policy(ckpt[-1]).meta["training"]["finetune"]["reward"] == "log_metis"
    assert load_policy(ckpt[-1]).meta["training"]["finetune"]["explore_openings"] == 0.5
    assert load_policy(res.final_policy).meta["timesteps"] == 512
    with pytest.raises(ConfigError, match="finetune.init_policy.*does not match"):
        train(_finetune_config("shipped"), run_name="other", runs_dir=tmp_path,
              progress=False)
    # A start policy that is not there fails before anything is written or computed.
    with pytest.raises(ConfigError, match="missing.zip"):
        train(_finetune_config(str(tmp_path / "missing.zip")), run_name="none",
              runs_dir=tmp_path, progress=False)
    assert not (tmp_path / "none").exists()


def test_the_default_config_starts_from_the_clone_weights() -> None:
    from hetpar.agents.io import load_policy
    from hetpar.agents.train import make_model, make_vec_env

    data = load_train_config("default").as_dict()
    data["n_envs"] = 1
    data["env"]["instances"] = 2
    cfg = parse_train_config(data, "default", name="default")
    vec = make_vec_env(cfg, reward_refs={})
    try:
        model = make_model(cfg, vec)
    finally:
        vec.close()
    assert isinstance(model, AnchoredMaskablePPO)
    assert model.anchor_coef == 0.1 and model.value_warmup == 5
    clone = load_policy("clone").model.policy.state_dict()
    for k, v in model.policy.state_dict().items():
        assert torch.equal(v, clone[k]), k
    # The shipped policy is that clone after PPO: the same network, other weights.
    shipped = load_policy(None).model.policy.state_dict()
    assert shipped.keys() == clone.keys()
    assert any(not torch.equal(shipped[k], clone[k]) for k in clone)
