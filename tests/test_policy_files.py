"""Policy files are data: format 2 (JSON + safetensors) round trip, crafted payloads never
run, format 1 (stable-baselines3 pickles) only with ``trust_pickle``, resumable state."""

from __future__ import annotations

import base64
import json
import pathlib
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")

from sb3_contrib import MaskablePPO  # noqa: E402

from hetpar.agents.io import (FORMAT_VERSION, META_MEMBER, OPTIMIZER_MEMBER,  # noqa: E402
                              WEIGHTS_MEMBER, load_policy, read_meta,
                              restore_training_state, save_policy)
from hetpar.agents.policy import HostAttentionPolicy  # noqa: E402
from hetpar.cli.main import main  # noqa: E402
from hetpar.envs.env import PlanBuilderEnv  # noqa: E402
from hetpar.errors import ConfigError  # noqa: E402

SMALL = {"dim": 16, "heads": 2, "rounds": 1, "edge_dim": 8, "value_dim": 16}
META = {"max_hosts": 6, "env_kwargs": {"bandwidth": "robust", "samples": 4}}


class _Payload:
    """Unpickling this creates ``marker``: the proof that a loader ran a file's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = Path(marker)

    def __reduce__(self):  # noqa: ANN204
        return (pathlib.Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def env() -> PlanBuilderEnv:
    return PlanBuilderEnv("tiny", max_hosts=6, instances=8, samples=4)


@pytest.fixture(scope="module")
def model(env: PlanBuilderEnv) -> MaskablePPO:
    m = MaskablePPO(HostAttentionPolicy, env, policy_kwargs=SMALL, n_steps=64, batch_size=32,
                    n_epochs=1, seed=0, device="cpu")
    m.learn(64)  # the optimizer has moments to save
    return m


@pytest.fixture(scope="module")
def saved(model: MaskablePPO, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_policy(model, tmp_path_factory.mktemp("pol") / "p.zip", META)


def _legacy(model: MaskablePPO, path: Path) -> Path:
    """A format-1 file as earlier hetpar wrote it: SB3's zip plus the metadata member."""
    model.save(path)
    meta = json.loads(zipfile.ZipFile(_fresh_v2(model, path.with_suffix(".v2.zip")))
                      .read(META_MEMBER))
    meta["format_version"] = 1
    meta.pop("network")
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(META_MEMBER, json.dumps(meta))
    return path


def _fresh_v2(model: MaskablePPO, path: Path) -> Path:
    return save_policy(model, path, META)


def _poisoned(src: Path, dst: Path, marker: Path) -> Path:
    """``src`` with a payload in every member stable-baselines3 unpickles: each
    serialized object of ``data`` (policy_class, spaces, rollout_buffer_class, ...) and
    the ``.pth`` files."""
    payload = pickle.dumps(_Payload(marker))
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "data":
                doc = json.loads(data)
                for value in doc.values():
                    if isinstance(value, dict) and ":serialized:" in value:
                        value[":serialized:"] = base64.b64encode(payload).decode()
                data = json.dumps(doc).encode()
            elif item.filename.endswith(".pth"):
                data = payload
            zout.writestr(item, data)
    return dst


def test_round_trip_holds_no_pickle(model: MaskablePPO, saved: Path, env: PlanBuilderEnv,
                                    ) -> None:
    with zipfile.ZipFile(saved) as zf:
        names = set(zf.namelist())
    assert names == {META_MEMBER, WEIGHTS_MEMBER, OPTIMIZER_MEMBER, "optimizer.json"}
    meta = read_meta(saved)
    assert meta["format_version"] == FORMAT_VERSION == 2
    assert meta["network"] == {"class": "HostAttentionPolicy",
                               "kwargs": {**SMALL, "max_micro": 16, "max_tp_log2": 4}}
    assert meta["timesteps"] == model.num_timesteps == 64
    bundle = load_policy(saved)
    ours, theirs = bundle.model.policy.state_dict(), model.policy.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    obs, _ = env.reset(seed=3, options={"instance": 3})
    mask = np.array(env.action_masks())
    assert bundle.act(obs, mask) == int(model.predict(obs, action_masks=mask,
                                                      deterministic=True)[0])
    assert bundle.model.num_timesteps == 64


def test_no_temporary_file_survives_a_failed_write(model: MaskablePPO, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import hetpar.agents.io as io

    def cut(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(io.os, "fsync", cut)
    with pytest.raises(KeyboardInterrupt):
        save_policy(model, tmp_path / "p.zip", META)
    assert list(tmp_path.iterdir()) == []


def test_payload_in_a_legacy_file_never_runs(model: MaskablePPO, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "payload-ran"
    bad = _poisoned(_legacy(model, tmp_path / "old.zip"), tmp_path / "bad.zip", marker)
    with pytest.raises(ConfigError, match="stable-baselines3 pickle.*--trust-pickle") as err:
        load_policy(bad)
    assert "\n" not in str(err.value) and str(bad) in str(err.value)
    assert main(["plan", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--policy",
                 str(bad), "--no-improve"]) == 2
    assert "--trust-pickle" in capsys.readouterr().err
    assert main(["policy", "show", str(bad)]) == 0
    assert main(["policy", "convert", str(bad), str(tmp_path / "new.zip")]) == 2
    with pytest.raises(ConfigError):
        restore_training_state(model, bad)
    assert not marker.exists()
    # The opt-in is real: the same file, trusted, runs its payload (so the test above can fail).
    with pytest.raises(ConfigError):
        load_policy(bad, trust_pickle=True, warn=lambda _: None)
    assert marker.exists()


def test_payload_members_in_a_format_2_file_are_never_read(model: MaskablePPO, saved: Path,
                                                           tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    payload = pickle.dumps(_Payload(marker))
    extra = tmp_path / "extra.zip"
    with zipfile.ZipFile(saved) as zin, zipfile.ZipFile(extra, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item, zin.read(item.filename))
        for name in ("data", "policy.pth", "policy.optimizer.pth", "pytorch_variables.pth"):
            zout.writestr(name, payload)
    bundle = load_policy(extra)
    assert bundle.model.num_timesteps == 64
    fresh = MaskablePPO(HostAttentionPolicy, PlanBuilderEnv("tiny", max_hosts=6, instances=8),
                        policy_kwargs=SMALL, n_steps=64, device="cpu")
    restore_training_state(fresh, extra)
    # A pickle where the tensors should be is corrupt data, not code.
    swapped = tmp_path / "swapped.zip"
    _replace_member(saved, swapped, WEIGHTS_MEMBER, payload)
    with pytest.raises(ConfigError, match="policy.safetensors: corrupt tensors"):
        load_policy(swapped)
    assert not marker.exists()


def _replace_member(src: Path, dst: Path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item, data if item.filename == name else zin.read(item.filename))


def _with_meta(src: Path, dst: Path, change) -> Path:  # noqa: ANN001
    meta = read_meta(src)
    change(meta)
    _replace_member(src, dst, META_MEMBER, json.dumps(meta).encode())
    return dst


def test_metadata_names_no_code(saved: Path, tmp_path: Path) -> None:
    for change, match in (
            (lambda m: m["network"].update({"class": "os.system"}), "not a policy class"),
            (lambda m: m["network"]["kwargs"].update({"dim": 10**9}), "network.kwargs"),
            (lambda m: m["network"]["kwargs"].update({"activation": "x"}), "unknown key"),
            (lambda m: m["network"].update({"kwargs": {**SMALL, "dim": 32}}), "is \\(")):
        path = _with_meta(saved, tmp_path / "m.zip", change)
        with pytest.raises(ConfigError, match=match) as err:
            load_policy(path)
        assert "\n" not in str(err.value)


def test_damaged_tensors_are_one_line(saved: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(saved) as zf:
        weights = zf.read(WEIGHTS_MEMBER)
    for data in (weights[:100], b"\xff" * 64, weights[:8] + b"{" * 200):
        bad = tmp_path / "bad.zip"
        _replace_member(saved, bad, WEIGHTS_MEMBER, data)
        with pytest.raises(ConfigError, match="policy.safetensors") as err:
            load_policy(bad)
        assert "\n" not in str(err.value)


def test_legacy_file_loads_when_trusted_and_converts(model: MaskablePPO, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    old = _legacy(model, tmp_path / "old.zip")
    said: list[str] = []
    bundle = load_policy(old, trust_pickle=True, warn=said.append)
    assert len(said) == 1 and "can run code" in said[0]
    new = tmp_path / "new.zip"
    assert main(["policy", "convert", str(old), str(new), "--trust-pickle"]) == 0
    assert main(["policy", "convert", str(old), str(new), "--trust-pickle"]) == 2  # exists
    assert "exists" in capsys.readouterr().err
    converted = load_policy(new)
    assert converted.meta["converted_from_format"] == 1
    a, b = bundle.model.policy.state_dict(), converted.model.policy.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The optimizer and the timestep count come along: training continues from it.
    fresh = MaskablePPO(HostAttentionPolicy, PlanBuilderEnv("tiny", max_hosts=6, instances=8),
                        policy_kwargs=SMALL, n_steps=64, device="cpu")
    restore_training_state(fresh, new)
    assert fresh.num_timesteps == 64


def test_restore_training_state(model: MaskablePPO, saved: Path, tmp_path: Path) -> None:
    fresh = MaskablePPO(HostAttentionPolicy, PlanBuilderEnv("tiny", max_hosts=6, instances=8),
                        policy_kwargs=SMALL, n_steps=64, device="cpu", seed=5)
    restore_training_state(fresh, saved)
    assert fresh.num_timesteps == model.num_timesteps
    assert fresh._n_updates == model._n_updates
    ours, theirs = fresh.policy.state_dict(), model.policy.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    a, b = fresh.policy.optimizer.state_dict(), model.policy.optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for idx, entry in b["state"].items():
        for name, value in entry.items():
            assert torch.equal(a["state"][idx][name], value)
    # No optimizer state, or another network: refused, and the model is left as it was.
    before = {k: v.clone() for k, v in fresh.policy.state_dict().items()}
    no_opt = tmp_path / "no_opt.zip"
    save_policy(model, no_opt, META, optimizer=False)
    with pytest.raises(ConfigError, match="no optimizer state"):
        restore_training_state(fresh, no_opt)
    other = MaskablePPO(HostAttentionPolicy, PlanBuilderEnv("tiny", max_hosts=6, instances=8),
                        policy_kwargs={**SMALL, "dim": 32}, n_steps=64, device="cpu")
    with pytest.raises(ConfigError, match="not the config's"):
        restore_training_state(other, saved)
    truncated = tmp_path / "trunc.zip"
    truncated.write_bytes(saved.read_bytes()[:-2000])
    with pytest.raises(ConfigError):
        restore_training_state(fresh, truncated)
    after = fresh.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_zip_bomb_member_is_refused(saved: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import hetpar.agents.io as io

    monkeypatch.setattr(io, "MAX_MEMBER_BYTES", 1000)
    with pytest.raises(ConfigError, match="refusing to inflate"):
        load_policy(saved)


def test_bundled_policies_are_format_2() -> None:
    from hetpar.agents.io import BUNDLED_POLICIES, bundled_policy_path

    for name in BUNDLED_POLICIES:
        path = bundled_policy_path(name)
        if path.is_file():
            with zipfile.ZipFile(path) as zf:
                assert not any(n.endswith((".pth", ".pkl")) or n == "data"
                               for n in zf.namelist())
            assert read_meta(path)["format_version"] == 2
