"""The policy network, policy files (hetpar.agents.io) and the shipped default policy."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")

from sb3_contrib import MaskablePPO  # noqa: E402

from hetpar.agents.io import (META_MEMBER, check_compatible, default_policy_path, load_policy,  # noqa: E402
                              observation_signature, save_policy)
from hetpar.agents.policy import HostAttentionPolicy, count_parameters  # noqa: E402
from hetpar.configio import bundled_dir  # noqa: E402
from hetpar.envs.env import PlanBuilderEnv  # noqa: E402
from hetpar.problem.instance import Instance  # noqa: E402
from hetpar.errors import ConfigError  # noqa: E402
from hetpar.plan import validate_plan  # noqa: E402

SMALL = {"dim": 32, "heads": 4, "rounds": 2, "edge_dim": 16, "value_dim": 32}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def env() -> PlanBuilderEnv:
    return PlanBuilderEnv("tiny", max_hosts=6, instances=8, bandwidth="robust", samples=4)


@pytest.fixture(scope="module")
def model(env: PlanBuilderEnv) -> MaskablePPO:
    return MaskablePPO(HostAttentionPolicy, env, policy_kwargs=SMALL, n_steps=64, batch_size=32,
                       seed=0, device="cpu")


@pytest.fixture(scope="module")
def saved(model: MaskablePPO, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "p.zip"
    return save_policy(model, path, {"max_hosts": 6, "env_kwargs": {"bandwidth": "robust",
                                                                    "samples": 4}})


def _obs_in_blocks_phase(env: PlanBuilderEnv, index: int) -> dict[str, np.ndarray]:
    """An observation where the host slots are allowed (a stage is open)."""
    obs, _ = env.reset(seed=0, options={"instance": index})
    lay = env.layout
    for _ in range(3):
        mask = env.action_masks()
        if mask[lay.start("host"):lay.start("host") + lay.max_hosts].any():
            break
        obs, *_ = env.step(int(np.flatnonzero(mask)[0]))
    return obs


def _batch(obs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v)[None] for k, v in obs.items()}


def test_policy_shapes_and_size(env: PlanBuilderEnv, model: MaskablePPO) -> None:
    obs = _obs_in_blocks_phase(env, 0)
    policy = model.policy
    logits = policy.logits(obs)
    assert logits.shape == (1, env.layout.n)
    values = policy.predict_values(_batch(obs))
    assert values.shape == (1, 1)
    # Parameters do not depend on max_hosts: the same network for 6 and 32 hosts.
    big = PlanBuilderEnv("tiny", max_hosts=32, instances=2)
    other = MaskablePPO(HostAttentionPolicy, big, policy_kwargs=SMALL, n_steps=64, device="cpu")
    assert count_parameters(other.policy) == count_parameters(policy)
    assert count_parameters(policy) < 300_000


def test_host_logits_permutation_equivariant(env: PlanBuilderEnv, model: MaskablePPO) -> None:
    index = next(i for i in range(8) if env.source.get(i).num_hosts == 3)
    obs = _obs_in_blocks_phase(env, index)
    n = int(obs["host_mask"].sum())
    assert n == 3
    perm = np.array([2, 0, 1] + list(range(3, env.max_hosts)))
    permuted = dict(obs)
    permuted["hosts"] = obs["hosts"][perm]
    permuted["host_mask"] = obs["host_mask"][perm]
    permuted["pairs"] = obs["pairs"][perm][:, perm]
    lay = env.layout
    s, e = lay.start("host"), lay.start("host") + lay.max_hosts
    a = model.policy.logits(obs)[0]
    b = model.policy.logits(permuted)[0]
    assert torch.allclose(b[s:e], a[s:e][perm], atol=1e-5)
    assert torch.allclose(torch.cat([b[:s], b[e:]]), torch.cat([a[:s], a[e:]]), atol=1e-5)
    # Padded hosts contribute nothing: zero logits.
    assert torch.all(a[s + n:e] == 0)


def test_masking_respected(env: PlanBuilderEnv, model: MaskablePPO) -> None:
    for index in range(4):
        obs, _ = env.reset(seed=index, options={"instance": index})
        done = False
        while not done:
            mask = np.array(env.action_masks())
            action, _ = model.predict(obs, action_masks=mask, deterministic=index % 2 == 0)
            assert mask[int(action)]
            obs, _, done, trunc, info = env.step(int(action))
            assert not trunc
        assert info["feasible"]


def test_save_load_roundtrip(env: PlanBuilderEnv, model: MaskablePPO, saved: Path) -> None:
    bundle = load_policy(saved)
    assert bundle.path == saved and bundle.max_hosts == 6
    assert bundle.meta["format_version"] == 2
    assert bundle.meta["observation_signature"] == observation_signature(6)
    assert bundle.env_kwargs["bandwidth"] == "robust" and bundle.env_kwargs["samples"] == 4
    obs = _obs_in_blocks_phase(env, 0)
    assert torch.allclose(bundle.model.policy.logits(obs), model.policy.logits(obs))
    e = bundle.make_env("tiny", instances=4)
    obs, _ = e.reset(seed=0)
    action = bundle.act(obs, e.action_masks())
    assert e.action_masks()[action]


def _one_line_error(path: Path | None, match: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    text = str(err.value)
    assert "\n" not in text
    if path is not None:
        assert str(path) in text
    assert match in text
    return err.value


def test_load_errors(saved: Path, tmp_path: Path) -> None:
    _one_line_error(tmp_path / "missing.zip", "not found")
    corrupt = tmp_path / "corrupt.zip"
    corrupt.write_bytes(b"\x00garbage" * 100)
    _one_line_error(corrupt, "corrupt")
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    _one_line_error(truncated, "corrupt")
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("data", "{}")
    _one_line_error(plain, "not a hetpar policy")


def _rewrite_meta(src: Path, dst: Path, change) -> None:  # noqa: ANN001
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == META_MEMBER:
                meta = json.loads(data)
                change(meta)
                data = json.dumps(meta).encode()
            zout.writestr(item, data)


def test_signature_and_format_mismatch(saved: Path, tmp_path: Path) -> None:
    old = tmp_path / "old_features.zip"
    _rewrite_meta(saved, old, lambda m: m["observation_signature"]["host_features"].pop())
    _one_line_error(old, "observation format mismatch")
    fmt = tmp_path / "future.zip"
    _rewrite_meta(saved, fmt, lambda m: m.update(format_version=99))
    _one_line_error(fmt, "format 99")
    shape = tmp_path / "shape.zip"
    _rewrite_meta(saved, shape, lambda m: m.update(max_hosts=7))
    _one_line_error(shape, "observation_signature")


def test_check_compatible(saved: Path) -> None:
    bundle = load_policy(saved)
    check_compatible(bundle, 6)
    with pytest.raises(ConfigError, match="7 hosts.*max_hosts=6") as err:
        check_compatible(bundle, 7, source="big.yaml")
    assert str(saved) in str(err.value) and "big.yaml" in str(err.value)
    with pytest.raises(ConfigError, match="max_layers"):
        check_compatible(bundle, 2, model_layers=1000)


# ---- the shipped policy ------------------------------------------------------------------

def _bundled_clusters() -> list[str]:
    return sorted(p.stem for p in (bundled_dir() / "clusters").glob("*.yaml"))


def _instance(cluster_name: str) -> Instance:
    from hetpar.cluster.topology import load_cluster
    from hetpar.workload.model import load_model
    from hetpar.workload.training import load_training

    inst = Instance(name=f"{cluster_name}/gpt3-350m", cluster_doc={}, model_doc={},
                    training_doc={}, seed=0)
    inst.__dict__.update(cluster=load_cluster(cluster_name), model=load_model("gpt3-350m"),
                         training=load_training(None))
    return inst


@pytest.fixture(scope="module")
def shipped():
    if not default_policy_path().is_file():
        pytest.skip("no shipped policy in this checkout")
    return load_policy(None)


def test_shipped_policy_is_small(shipped) -> None:  # noqa: ANN001
    assert default_policy_path().stat().st_size < 4 * 2**20
    assert shipped.max_hosts >= 16
    assert count_parameters(shipped.model.policy) < 500_000


def test_bundled_policies_by_name(shipped, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from hetpar.agents.io import BUNDLED_POLICIES, bundled_policy_path, policy_path

    # ``shipped`` is PPO from ``clone``; both are in the package and load by name.
    clone = load_policy("clone")
    assert clone.path == bundled_policy_path("clone") and clone.meta["timesteps"] == 0
    assert shipped.meta["timesteps"] > 0
    assert shipped.meta["training"]["finetune"]["init_policy"] == "clone"
    assert load_policy("shipped").path == default_policy_path() == policy_path(None)
    assert set(BUNDLED_POLICIES) == {"shipped", "clone"}
    # A file that happens to be called like a bundled policy is reached by its path.
    monkeypatch.chdir(tmp_path)
    assert policy_path("./clone") == Path("./clone")
    with pytest.raises(ConfigError, match="not found"):
        load_policy("./clone")


@pytest.mark.parametrize("cluster", _bundled_clusters())
def test_shipped_policy_plans_bundled_clusters(shipped, cluster: str) -> None:  # noqa: ANN001
    inst = _instance(cluster)
    if inst.num_hosts > shipped.max_hosts:
        with pytest.raises(ConfigError, match="max_hosts"):
            check_compatible(shipped, inst.num_hosts, source=cluster)
        return
    check_compatible(shipped, inst.num_hosts, source=cluster, model_layers=inst.model.layers)
    env = shipped.make_env([inst], samples=4)
    obs, _ = env.reset(seed=0, options={"instance": 0})
    info: dict = {}
    for _ in range(1000):
        obs, _, done, trunc, info = env.step(shipped.act(obs, env.action_masks()))
        assert not trunc
        if done:
            break
    assert info["feasible"], cluster
    assert np.isfinite(info["objective_s"]) and info["objective_s"] > 0
    validate_plan(info["plan"], inst.cluster, inst.model, inst.training, source=cluster)


def _episode_batch(env: PlanBuilderEnv, model: MaskablePPO, episodes: int,
                   ) -> tuple[dict[str, torch.Tensor], np.ndarray, torch.Tensor]:
    """Observations, masks and sampled actions of a few episodes, every phase included."""
    rng = np.random.default_rng(3)
    obs_l, masks, actions = [], [], []
    for e in range(episodes):
        obs, _ = env.reset(seed=e, options={"instance": e % 4})
        done = False
        while not done:
            mask = np.array(env.action_masks())
            action = int(rng.choice(np.flatnonzero(mask)))
            obs_l.append(obs)
            masks.append(mask)
            actions.append(action)
            obs, _, done, _, _ = env.step(action)
    batch = {k: torch.as_tensor(np.stack([o[k] for o in obs_l])) for k in obs_l[0]}
    return batch, np.stack(masks), torch.as_tensor(actions)


def test_masked_passes_score_only_the_layer_slots_the_masks_allow(env: PlanBuilderEnv,
                                                                  model: MaskablePPO) -> None:
    """PPO's passes skip the layer-count logits that every mask of the batch forbids; the
    masked distribution, values and log-probabilities are those of the full network."""
    from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy

    from hetpar.agents.policy import layer_slots_allowed

    policy = model.policy
    batch, masks, actions = _episode_batch(env, model, 4)
    layout = policy.features_extractor.layout
    slots = layer_slots_allowed(masks, layout)
    assert 0 < slots < layout.max_layers  # the test exercises the cut
    assert layer_slots_allowed(masks[:1], layout) == 0  # the memory phase has none
    with torch.no_grad():
        values, log_prob, entropy = policy.evaluate_actions(batch, actions, masks)
        # sb3-contrib's own pass, through the extractor's full output.
        want = MaskableActorCriticPolicy.evaluate_actions(policy, batch, actions, masks)
        for got, ref in zip((values, log_prob, entropy), want):
            assert torch.allclose(got, ref, atol=1e-6)
        torch.manual_seed(0)
        sampled, v, lp = policy(batch, action_masks=masks)
        torch.manual_seed(0)
        ref = MaskableActorCriticPolicy.forward(policy, batch, action_masks=masks)
        assert torch.equal(sampled, ref[0])
        assert torch.allclose(v, ref[1], atol=1e-6) and torch.allclose(lp, ref[2], atol=1e-6)
        assert masks[np.arange(len(masks)), sampled.numpy()].all()
        # Without masks every slot is scored, as before.
        full = policy.features_extractor(batch)
        cut = policy.features_extractor(batch, layer_slots=slots)
        start = layout.start("layers")
        assert torch.equal(full[:, :start + slots], cut[:, :start + slots])
        assert torch.all(cut[:, start + slots:start + layout.max_layers] == 0)


def test_attention_edge_messages_equal_the_per_pair_formula(env: PlanBuilderEnv,
                                                            model: MaskablePPO) -> None:
    """The edge message, applied after the attention-weighted sum of the edge
    embeddings, equals sum_j a_ij edge_msg(e_ij) computed pair by pair."""
    from hetpar.agents import policy as policy_module

    ex = model.policy.features_extractor
    batch, _, _ = _episode_batch(env, model, 2)
    block = ex.blocks[0]
    n = int(batch["host_mask"].sum(1).max())
    real = batch["host_mask"][:, :n] > 0.5
    with torch.no_grad():
        # Weights scaled up so that every term matters.
        for p in block.parameters():
            p.mul_(3.0)
        try:
            h = torch.randn(real.shape[0], n, ex.blocks[0].heads * ex.blocks[0].dk)
            edges = ex.edge(batch["pairs"][:, :n, :n])
            got = block(h, edges, real)

            class PerPair(policy_module._AttentionBlock):
                def forward(self, h, edges, key_mask):  # noqa: ANN001, ANN202
                    b, n, d = h.shape
                    q, k, v = self.qkv(self.norm1(h)).view(b, n, 3, self.heads,
                                                           self.dk).unbind(2)
                    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
                    scores = q @ k.transpose(-1, -2) / self.dk ** 0.5
                    scores = scores + self.edge_bias(edges).permute(0, 3, 1, 2)
                    scores = scores.masked_fill(~key_mask[:, None, None, :], -1e9)
                    attn = torch.softmax(scores, dim=-1)
                    msg = (attn @ v).transpose(1, 2).reshape(b, n, d)
                    msg = msg + torch.einsum("bij,bijd->bid", attn.mean(1),
                                             self.edge_msg(edges))
                    h = h + self.out(msg)
                    h = h + self.ffn(self.norm2(h))
                    return h * key_mask[..., None].to(h.dtype)

            ref = PerPair(block.heads * block.dk, block.heads, edges.shape[-1])
            ref.load_state_dict(block.state_dict())
            want = ref(h, edges, real)
        finally:
            for p in block.parameters():
                p.div_(3.0)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_packed_host_rows_are_the_dense_network(env: PlanBuilderEnv, model: MaskablePPO,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-host layers run on the real hosts' rows only, the pair layers on the pairs of
    two real hosts: the outputs and gradients are those of the dense pass over every padded
    row and pair (float64, so that the comparison is not float32's rounding of gradients
    that sum to zero)."""
    import copy

    ex = copy.deepcopy(model.policy.features_extractor).double()
    batch, masks, _ = _episode_batch(env, model, 4)
    batch = {k: v.double() for k, v in batch.items()}
    assert (batch["host_mask"].sum(1) < batch["host_mask"].shape[1]).any()  # padding exists
    # Every third row as if its cluster had one host less (the tiny suite's clusters are
    # all of one size): rows of one batch padded to different sizes, as train-mixed's are.
    real = batch["host_mask"] > 0.5
    last = real.sum(1) - 1
    for row in range(0, len(last), 3):
        if last[row] > 0:
            j = int(last[row])
            batch["host_mask"][row, j] = 0.0
            batch["hosts"][row, j] = 0.0
            batch["pairs"][row, j, :] = 0.0
            batch["pairs"][row, :, j] = 0.0
    real = batch["host_mask"] > 0.5
    n = int(real.any(0).nonzero().max()) + 1
    assert (real[:, :n].sum(1) < n).any() and real[:, :n].all(1).any()
    # Packing below the size where it pays off, so that this small batch is packed.
    monkeypatch.setattr("hetpar.agents.policy._PACK_MIN_ROWS", 0)
    outs, grads = [], []
    for pack in (False, True):
        ex.pack_rows = pack
        ex.zero_grad()
        out = ex(batch)
        (out * torch.linspace(-1, 1, out.shape[1], dtype=out.dtype)).pow(2).sum().backward()
        outs.append(out.detach())
        grads.append({n: p.grad.clone() for n, p in ex.named_parameters()})
    assert torch.allclose(outs[0], outs[1], atol=1e-10)
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-8), name


def test_softmax_by_hand_is_torchs() -> None:
    from hetpar.agents.policy import _Softmax

    x = torch.randn(5, 4, 7, 7, dtype=torch.float64, requires_grad=True)
    x.data[0, 0, 0, 3:] = -1e9  # masked keys
    assert torch.allclose(_Softmax.apply(x), torch.softmax(x, -1))
    assert torch.autograd.gradcheck(_Softmax.apply, (x,))


def test_update_arithmetic_is_sb3_contribs_distribution(env: PlanBuilderEnv,
                                                        model: MaskablePPO) -> None:
    """The anchored update's log-probabilities and entropies, computed without building
    distribution objects, are those of sb3-contrib's masked distribution."""
    from hetpar.agents.anchored import _masked_parts

    policy = model.policy
    batch, masks, actions = _episode_batch(env, model, 4)
    with torch.no_grad():
        log_probs, log_prob, entropy, values = _masked_parts(policy, batch, masks, actions)
        want_v, want_lp, want_ent = policy.evaluate_actions(batch, actions, masks)
    assert torch.allclose(log_prob, want_lp, atol=1e-6)
    assert torch.allclose(entropy, want_ent, atol=1e-6)
    assert torch.allclose(values, want_v, atol=1e-6)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(len(actions)), atol=1e-5)
