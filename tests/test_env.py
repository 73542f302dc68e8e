"""The PlanBuilder-v0 environment: API conformance, masks, replay, symmetry, bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
pytest.importorskip("stable_baselines3")

import hetpar  # noqa: E402,F401  (registers the environment)
from hetpar.costmodel.estimate import CostModel  # noqa: E402
from hetpar.costmodel.objective import Objective  # noqa: E402
from hetpar.envs import ENV_ID  # noqa: E402
from hetpar.envs.env import PlanBuilderEnv, random_masked_action  # noqa: E402
from hetpar.envs.search import SearchEnv  # noqa: E402
from hetpar.envs.types import (GLOBAL_FEATURES, HOST_FEATURES, PAIR_FEATURES,  # noqa: E402
                               GlobalFeature, HostFeature, PairFeature, State)
from hetpar.problem.generator import load_suite  # noqa: E402
from hetpar.problem.instance import Instance  # noqa: E402
from hetpar.errors import ConfigError, InfeasibleError  # noqa: E402
from hetpar.problem import PlanSpace
from hetpar.problem import Problem
from hetpar.solvers import solve  # noqa: E402
from hetpar.solvers.brute import compositions, skeletons  # noqa: E402

GPU_TYPES = ("V100-SXM2-16GB", "T4-16GB", "A100-SXM4-40GB", "L4-24GB")


def small_instance(seed: int, *, tight: bool = True) -> Instance:
    """<= 3 hosts, <= 6 GPUs, <= 6 layers of a model large enough that memory binds."""
    rng = np.random.default_rng(seed)
    types = rng.choice(GPU_TYPES, 2, replace=False)
    hosts = []
    for i in range(int(rng.integers(2, 4))):
        gpu = str(types[i % 2] if i < 2 else types[rng.integers(2)])
        host = {"name": f"h{i}", "gpu": gpu, "gpus": int(rng.choice([1, 2, 2, 4])),
                "nic_gbps": float(rng.choice([10, 25, 100]))}
        if rng.random() < 0.5:
            host["uplink"] = {"bandwidth": {"kind": "lognormal",
                                            "mean_gbps": 0.8 * host["nic_gbps"],
                                            "cv": float(rng.uniform(0.1, 0.5))}}
        hosts.append(host)
    while sum(h["gpus"] for h in hosts) > 6:
        max(hosts, key=lambda h: h["gpus"])["gpus"] //= 2
    hidden = int(rng.choice([2048, 3072, 4096])) if tight else 1024
    model = {"name": f"m{seed}", "layers": int(rng.integers(2, 6)), "hidden": hidden,
             "heads": 16, "vocab": 50304, "seq_len": 2048 if tight else 1024}
    training = {"global_batch": int(rng.choice([4, 8])),
                "recompute": ["none", "selective", "full"][: int(rng.integers(1, 4))],
                "zero": [0, 1] if rng.random() < 0.5 else [0]}
    cluster = {"name": f"c{seed}", "hosts": hosts, "topology": {"kind": "single_switch"}}
    return Instance(f"small-{seed}", cluster, model, training, seed=seed)


def feasible_small_instances(n: int, start: int = 0, **kw) -> list[Instance]:
    out, seed = [], start
    while len(out) < n:
        inst = small_instance(seed, **kw)
        seed += 1
        try:
            PlanBuilderEnv(inst)
        except InfeasibleError:
            continue
        out.append(inst)
    return out


def play(env: PlanBuilderEnv, actions) -> dict:
    info: dict = {}
    for a in actions:
        assert env.action_masks()[a], (env.layout.decode(a), env.render_mode)
        _, _, term, trunc, info = env.step(a)
        assert not trunc
    assert term
    return info


# ---- conformance ---------------------------------------------------------------------------

def test_gymnasium_env_checker_passes():
    from gymnasium.utils.env_checker import check_env
    env = PlanBuilderEnv("tiny")
    check_env(env, skip_render_check=True)


def test_sb3_env_checker_passes():
    from stable_baselines3.common.env_checker import check_env
    check_env(PlanBuilderEnv("tiny"), warn=True)


def test_registered_with_gymnasium():
    env = gym.make(ENV_ID, suite="tiny", objective="p90", bandwidth="robust", samples=4)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert isinstance(env.unwrapped, PlanBuilderEnv)


def test_same_seed_same_instances_observations_and_rewards():
    def trace(seed):
        env = PlanBuilderEnv("train-small", instances=64)
        rng = np.random.default_rng(seed)
        out = []
        for ep in range(5):
            obs, info = env.reset(seed=seed * 100 + ep)
            out.append((info["instance"], {k: v.copy() for k, v in obs.items()}))
            done = False
            while not done:
                obs, r, term, trunc, info = env.step(random_masked_action(env, rng))
                out.append((r, {k: v.copy() for k, v in obs.items()}))
                done = term or trunc
        return out

    a, b = trace(3), trace(3)
    assert len(a) == len(b)
    for (x, ox), (y, oy) in zip(a, b):
        assert x == y
        for k in ox:
            np.testing.assert_array_equal(ox[k], oy[k])


@pytest.mark.parametrize("suite", ["tiny", "train-small", "test-iid", "test-larger",
                                   "test-unseen-gpus", "test-geo"])
def test_random_masked_episodes_always_end_feasible(suite):
    env = PlanBuilderEnv(suite, instances=24)
    rng = np.random.default_rng(0)
    episodes = 40 if suite == "test-larger" else 80
    for ep in range(episodes):
        obs, _ = env.reset(seed=ep)
        done = False
        while not done:
            mask = env.action_masks()
            assert mask.any(), f"dead end in {suite} episode {ep}"
            obs, r, term, trunc, info = env.step(random_masked_action(env, rng))
            assert env.observation_space.contains(obs)
            done = term or trunc
        assert term and info["feasible"] and 0 < r <= 1.0
        assert math.isfinite(info["objective_s"])
        hetpar.validate_plan(info["plan"], env.instance.cluster, env.instance.model,
                             env.instance.training)


# ---- masks are exact -------------------------------------------------------------------------

def all_plans(space: PlanSpace, layers: int):
    for stages in skeletons(space, layers):
        for split in compositions(layers, len(stages)):
            for m in space.micro_batch_options([s.dp for s in stages]):
                for rc in space.recompute_modes:
                    for zero in space.zero_stages:
                        yield space.to_plan(stages, split, m, rc, zero)


@pytest.mark.parametrize("seed", range(12))
def test_masks_allow_exactly_the_plans_that_fit(seed):
    """Every plan of the space that fits is buildable, and none that does not fit is."""
    (inst,) = feasible_small_instances(1, start=1000 * seed)
    env = PlanBuilderEnv(inst, bandwidth="robust", samples=2)
    env.reset(seed=0)
    cm = env.context.cm
    plans = list(itertools.islice(all_plans(env.context.space, cm.model.layers), 4000))
    fits = 0
    for plan in plans:
        env.reset(seed=0)
        actions = env.actions_for(plan)
        times, ok = cm.iteration_times(plan)
        allowed = True
        for a in actions:
            if not env.action_masks()[a]:
                allowed = False
                break
            _, _, term, _, info = env.step(a)
        assert allowed == ok, (plan, ok)
        if ok:
            fits += 1
            assert term
            assert info["objective_s"] == pytest.approx(float(np.mean(times)), rel=1e-12)
    assert fits > 0


# ---- replay of solver plans ---------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_replaying_exact_gives_its_objective_and_nothing_beats_it(seed):
    (inst,) = feasible_small_instances(1, start=500 + 1000 * seed)
    objective = ["mean", "p90", "cvar0.9"][seed % 3]
    env = PlanBuilderEnv(inst, bandwidth="robust", samples=4, objective=objective)
    env.reset(seed=0)
    sol = solve(Problem.of(inst.cluster, inst.model, inst.training, objective=objective, samples=4, seed=inst.seed), method="exact")
    info = play(env, env.actions_for(sol.plan))
    assert info["objective_s"] == pytest.approx(sol.value, rel=1e-9)
    rng = np.random.default_rng(seed)
    for ep in range(150):
        env.reset(seed=ep)
        done = False
        while not done:
            _, r, term, trunc, info = env.step(random_masked_action(env, rng))
            done = term or trunc
        assert info["objective_s"] >= sol.value * (1 - 1e-9)


def test_replaying_baseline_plans_on_a_bundled_instance():
    suite = load_suite("tiny")
    inst = suite.instance(3)
    env = PlanBuilderEnv([inst], bandwidth="robust", samples=8)
    env.reset(seed=0)
    for method in ("metis", "megatron"):
        sol = solve(Problem.of(inst.cluster, inst.model, inst.training, samples=8, seed=inst.seed), method=method)
        if not sol.found:
            continue
        env.reset(seed=0)
        info = play(env, env.actions_for(env.context.space.canonical(sol.plan)))
        assert info["objective_s"] == pytest.approx(sol.value, rel=1e-9)


# ---- host order carries no meaning ---------------------------------------------------------

def permuted(inst: Instance, order: list[int]) -> Instance:
    doc = dict(inst.cluster_doc)
    doc["hosts"] = [inst.cluster_doc["hosts"][i] for i in order]
    return Instance(inst.name + "-perm", doc, inst.model_doc, inst.training_doc, inst.seed)


@pytest.mark.parametrize("seed", range(4))
def test_permuting_hosts_permutes_observation_and_keeps_optimum(seed):
    (base,) = feasible_small_instances(1, start=77 + 1000 * seed, tight=False)
    # Make every link constant so that a permutation is an exact symmetry of the instance.
    doc = dict(base.cluster_doc)
    doc["hosts"] = [{k: v for k, v in h.items() if k != "uplink"} for h in doc["hosts"]]
    inst = Instance(base.name, doc, base.model_doc, base.training_doc, base.seed)
    n = len(inst.cluster_doc["hosts"])
    order = list(reversed(range(n)))
    other = permuted(inst, order)
    a = PlanBuilderEnv(inst, bandwidth="robust", samples=2)
    b = PlanBuilderEnv(other, bandwidth="robust", samples=2)
    oa, _ = a.reset(seed=0)
    ob, _ = b.reset(seed=0)
    np.testing.assert_allclose(ob["hosts"][:n], oa["hosts"][order])
    np.testing.assert_allclose(ob["pairs"][:n, :n], oa["pairs"][np.ix_(order, order)])
    np.testing.assert_array_equal(ob["globals"], oa["globals"])
    va = solve(Problem.of(inst.cluster, inst.model, inst.training, samples=2), method="exact").value
    vb = solve(Problem.of(other.cluster, other.model, other.training, samples=2), method="exact").value
    assert vb == pytest.approx(va, rel=1e-9)
    # The same actions with host slots relabelled build equally good plans.
    rng = np.random.default_rng(seed)
    inv = {old: new for new, old in enumerate(order)}
    host0 = a.layout.start("host")
    for ep in range(20):
        a.reset(seed=ep)
        b.reset(seed=ep)
        done = False
        while not done:
            act = random_masked_action(a, rng)
            kind, slot = a.layout.decode(act)
            mapped = host0 + inv[slot] if kind == "host" else act
            mb = b.action_masks()
            assert mb[mapped]
            _, ra, done, _, ia = a.step(act)
            _, rb, _, _, ib = b.step(mapped)
        assert rb == pytest.approx(ra, rel=1e-9)


# ---- bad input and invalid actions -----------------------------------------------------------

def test_unknown_suite_is_a_clear_error():
    with pytest.raises(ConfigError, match="no-such-suite"):
        PlanBuilderEnv("no-such-suite")


def test_suite_larger_than_max_hosts_is_refused_at_construction():
    with pytest.raises(ConfigError, match="max_hosts"):
        PlanBuilderEnv("test-larger", max_hosts=8)


def test_instance_whose_model_fits_nowhere_is_refused_at_construction():
    inst = small_instance(1)
    inst.model_doc.update({"layers": 4, "hidden": 16384, "heads": 128, "vocab": 256000})
    with pytest.raises(InfeasibleError, match="no feasible plan"):
        PlanBuilderEnv(inst)


def test_invalid_actions_leave_the_state_unchanged_and_truncate_eventually():
    env = PlanBuilderEnv("tiny", max_invalid_actions=3)
    obs, _ = env.reset(seed=0)
    bad = int(np.flatnonzero(~env.action_masks())[0])
    for i in range(3):
        obs2, r, term, trunc, info = env.step(bad)
        assert info["invalid_action"] and r == env.invalid_action_reward and not term
        for k in obs:
            np.testing.assert_array_equal(obs[k], obs2[k])
    assert trunc
    with pytest.raises(ValueError):
        env.layout.decode(env.action_space.n)


def test_other_objectives_and_modes():
    inst = load_suite("tiny").instance(0)
    for objective in ("mean", "p90", "cvar0.9"):
        env = PlanBuilderEnv([inst], bandwidth="robust", samples=8, objective=objective)
        env.reset(seed=1)
        rng = np.random.default_rng(1)
        done = False
        while not done:
            _, r, done, _, info = env.step(random_masked_action(env, rng))
        cm = CostModel(inst.cluster, inst.model, inst.training, samples=8, seed=inst.seed)
        times, _ = cm.iteration_times(info["plan"])
        assert info["objective_s"] == pytest.approx(Objective.parse(objective)(times))
        assert r == pytest.approx(env.context.ideal_s / info["objective_s"])
    with pytest.raises(ConfigError):
        PlanBuilderEnv("tiny", bandwidth="sometimes")


def test_sampled_mode_shows_the_draw():
    env = PlanBuilderEnv("tiny")
    seen = set()
    for seed in range(10):
        obs, _ = env.reset(seed=seed, options={"instance": 0})
        seen.add(obs["pairs"][..., PairFeature.BANDWIDTH_NOW].tobytes())
        np.testing.assert_array_equal(obs["pairs"][..., PairFeature.BANDWIDTH_MEAN],
                                      env._static[0][1][..., PairFeature.BANDWIDTH_MEAN])
    assert len(seen) > 1  # draws differ across episodes when links are stochastic


def test_observation_columns_are_named_in_order():
    env = PlanBuilderEnv("tiny")
    obs, _ = env.reset(seed=0)
    for names, enum, key, axis in ((HOST_FEATURES, HostFeature, "hosts", -1),
                                   (PAIR_FEATURES, PairFeature, "pairs", -1),
                                   (GLOBAL_FEATURES, GlobalFeature, "globals", 0)):
        assert [f.value for f in enum] == list(range(len(enum)))  # a member is its column
        assert names == tuple(f.name.lower() for f in enum)
        assert obs[key].shape[axis] == len(enum)
    assert obs["globals"][GlobalFeature.PHASE_MEMORY] == 1.0
    n = env.instance.num_hosts
    np.testing.assert_array_equal(obs["hosts"][:n, HostFeature.FREE_FRACTION], 1.0)


def test_state_is_a_frozen_copy_of_the_episode():
    import dataclasses

    env = PlanBuilderEnv("tiny")
    with pytest.raises(RuntimeError):
        env.state  # noqa: B018 - before reset
    env.reset(seed=3)
    rng = np.random.default_rng(3)
    first = env.state
    assert isinstance(first, State) and first.phase == "memory" and not first.built
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.layers_left = 0  # type: ignore[misc]
    done, info = False, {}
    while not done:
        _, _, done, _, info = env.step(random_masked_action(env, rng))
        st = env.state
        assert st.phase == env.phase_name()
        assert st.open_dp == sum(b for _, b in st.open_blocks)
    assert first.phase == "memory" and not first.built  # an earlier copy stays as it was
    assert st.phase == "done" and st.layers_left == 0
    assert sum(k for _, k in st.built) == env.instance.model.layers
    plan = info["plan"]
    assert [k for _, k in reversed(st.built)] == [s.layers for s in plan.stages]


def test_env_implements_the_planners_protocol():
    assert isinstance(PlanBuilderEnv("tiny"), SearchEnv)
    one = PlanBuilderEnv([load_suite("tiny").instance(0)])
    one.reset(seed=0)
    assert isinstance(one.retarget(one.instance), SearchEnv)


def test_rebind_draws_as_a_fresh_context_does():
    from hetpar.envs.context import InstanceContext, bandwidth_seed

    inst = load_suite("tiny").instance(1)
    ctx = InstanceContext.build(inst, samples=4, constants=None, max_micro=16)
    doc = dict(inst.cluster_doc)
    other = Instance(inst.name + "-other", doc, inst.model_doc, inst.training_doc,
                     seed=inst.seed + 1)
    moved = ctx.rebind(other)
    fresh = InstanceContext.build(other, samples=4, constants=None, max_micro=16)
    np.testing.assert_array_equal(moved.cm.link_gbps, fresh.cm.link_gbps)
    assert moved.problem.seed == bandwidth_seed(other) == inst.seed + 1
    assert moved.oracle("none", 0, 1) is ctx.oracle("none", 0, 1)  # memory tables shared
    assert bandwidth_seed(Instance("x", doc, inst.model_doc, inst.training_doc)) == 0


# ---- rendering -----------------------------------------------------------------------------

def test_render_modes():
    env = PlanBuilderEnv("tiny", render_mode="ansi")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(4):
        env.step(random_masked_action(env, rng))
    text = env.render()
    assert "layers left" in text and "free GPUs" in text
    env = PlanBuilderEnv("tiny", render_mode="rgb_array")
    env.reset(seed=0)
    img = env.render()
    assert img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8 and img.std() > 0


def test_training_pool_defaults_to_256_and_may_be_larger():
    from hetpar.envs.sources import DEFAULT_POOL

    assert PlanBuilderEnv("train-small").source.count == DEFAULT_POOL
    # An explicit pool larger than the default is honoured, not capped at it.
    assert PlanBuilderEnv("train-small", instances=768).source.count == 768
    assert PlanBuilderEnv("tiny", instances=5).source.count == 5
    with pytest.raises(ConfigError, match="instances"):
        PlanBuilderEnv("tiny", instances=0)


def test_environments_of_one_process_share_instance_tables() -> None:
    """``share_contexts``: the same instances and settings share the per-instance caches
    (built once between them) and run the same episodes as an environment of its own;
    other settings are refused."""
    kw = dict(max_hosts=6, instances=8, bandwidth="robust", samples=4)
    a, b, alone = (PlanBuilderEnv("tiny", **kw) for _ in range(3))
    assert b.share_contexts(a) and b._cache is a._cache
    assert not PlanBuilderEnv("tiny", **{**kw, "samples": 2}).share_contexts(a)
    assert not PlanBuilderEnv("tiny", **{**kw, "instances": 4}).share_contexts(a)
    rng = np.random.default_rng(0)
    for seed in range(6):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        obs_c, _ = alone.reset(seed=seed)
        done = False
        while not done:
            mask = alone.action_masks()
            assert np.array_equal(mask, b.action_masks())
            for key in obs_c:
                assert np.array_equal(obs_b[key], obs_c[key])
            action = int(rng.choice(np.flatnonzero(mask)))
            obs_b, r_b, done, _, _ = b.step(action)
            obs_c, r_c, _, _, _ = alone.step(action)
            assert r_b == r_c
    assert set(a._cache) == set(b._cache) and len(a._cache) >= 1
