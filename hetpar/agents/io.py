"""Saving and loading trained planning policies: weights and metadata, never code.

A policy file (format 2) is a zip with three kinds of member, none of which runs code
when read:

* ``hetpar_meta.json``: what is needed to rebuild and use the policy:

  * ``format_version``: this file format (``FORMAT_VERSION``);
  * ``hetpar_version``: the hetpar version that trained it;
  * ``max_hosts``: the host count of the observation (clusters may have fewer hosts);
  * ``env_kwargs``: the ``PlanBuilderEnv`` keyword arguments (``objective``,
    ``bandwidth``, ``samples``, ``max_layers``, ``max_micro``, ``max_tp``) a compatible
    env needs;
  * ``observation_signature``: feature names and shapes of the observation and the sizes
    of the action layout (``observation_signature()``), compared at load time so a policy
    trained against another observation format fails with a clear message;
  * ``network``: the policy class (one of ``POLICY_CLASSES``, a name looked up in hetpar,
    not an import path) and its constructor's integer arguments;
  * ``timesteps``, ``n_updates``, ``training`` (the resolved training configuration) and
    free-form run information;
* ``policy.safetensors``: the network's tensors (``safetensors``: a JSON header and raw
  little-endian arrays, so reading it cannot execute anything);
* ``optimizer.safetensors`` and ``optimizer.json`` (checkpoints ``hetpar train --resume``
  continues from): Adam's moment tensors, and its step counts and hyper-parameters.

Format 1 was stable-baselines3's own zip, whose members (``data``'s serialized classes and
spaces, the ``.pth`` files) are pickles: loading one can run any code its author put there.
``load_policy`` refuses such a file unless the caller trusts it (``trust_pickle=True``,
``--trust-pickle`` on the command line), and then says so on stderr;
``convert_legacy_policy`` (``hetpar policy convert``) rewrites one as format 2 once.

Typical use::

    bundle = load_policy("runs/default/final_policy.zip")   # or load_policy(None)
    check_compatible(bundle, instance.num_hosts, source="my_cluster.yaml")
    env = bundle.make_env(instance_source)
    obs, _ = env.reset(options={"instance": instance})
    action = bundle.act(obs, env.action_masks())
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetpar.errors import ConfigError
from hetpar.problem import POLICY_SAMPLES

__all__ = ["FORMAT_VERSION", "LEGACY_FORMAT", "META_MEMBER", "WEIGHTS_MEMBER",
           "OPTIMIZER_MEMBER", "OPTIMIZER_META_MEMBER", "ENV_KWARGS", "POLICY_CLASSES",
           "PolicyBundle", "LoadedPolicy", "save_policy", "load_policy",
           "restore_training_state", "convert_legacy_policy", "check_compatible",
           "default_policy_path", "observation_signature", "BUNDLED_POLICIES",
           "bundled_policy_path", "policy_path", "read_meta"]

FORMAT_VERSION = 2
# stable-baselines3's zip (pickled members); read only with trust_pickle.
LEGACY_FORMAT = 1
META_MEMBER = "hetpar_meta.json"
WEIGHTS_MEMBER = "policy.safetensors"
OPTIMIZER_MEMBER = "optimizer.safetensors"
OPTIMIZER_META_MEMBER = "optimizer.json"
# The network classes a file may name, by name: a file chooses among these, it never
# names code to import.
POLICY_CLASSES = ("HostAttentionPolicy",)
# Far above any real policy (the shipped one is 2 MB): a zip bomb or a huge member is
# refused before it is inflated.
MAX_MEMBER_BYTES = 512 * 2**20
MAX_META_BYTES = 16 * 2**20
# PlanBuilderEnv keyword arguments a policy depends on (besides max_hosts).
ENV_KWARGS = ("objective", "bandwidth", "samples", "max_layers", "max_micro", "max_tp")
_ENV_DEFAULTS: dict[str, Any] = {"objective": "mean", "bandwidth": "sampled",
                                 "samples": POLICY_SAMPLES,
                                 "max_layers": 128, "max_micro": 16, "max_tp": 16}
_NETWORK_KWARGS = ("dim", "heads", "rounds", "edge_dim", "value_dim", "max_micro",
                   "max_tp_log2")


# Policies inside the package, by the name configs and ``--policy`` may give them:
# ``shipped`` (PPO, ``configs/train/default.yaml``) and ``clone`` (the behaviour clone of
# exact plans that PPO started from, ``configs/train/clone.yaml``).
BUNDLED_POLICIES = {"shipped": "default_policy.zip", "clone": "clone_policy.zip"}


def default_policy_path() -> Path:
    """The policy shipped inside the package (trained by ``configs/train/default.yaml``)."""
    return bundled_policy_path("shipped")


def bundled_policy_path(name: str) -> Path:
    """The file of a bundled policy (``BUNDLED_POLICIES``)."""
    return Path(__file__).resolve().parent / "data" / BUNDLED_POLICIES[name]


def policy_path(name_or_path: str | Path | None) -> Path:
    """A policy file: None or ``shipped`` is the shipped one, ``clone`` the bundled clone,
    anything else a path (``./clone`` for a file of that name)."""
    if name_or_path is None:
        return default_policy_path()
    if isinstance(name_or_path, str) and name_or_path in BUNDLED_POLICIES:
        return bundled_policy_path(name_or_path)
    return Path(name_or_path)


def observation_signature(max_hosts: int, max_micro: int = 16, max_tp: int = 16,
                          max_layers: int = 128) -> dict[str, Any]:
    """Feature names, observation shapes and action-layout sizes of this hetpar version."""
    from hetpar.envs.actions import KINDS, ActionLayout
    from hetpar.envs.types import GLOBAL_FEATURES, HOST_FEATURES, PAIR_FEATURES

    layout = ActionLayout(int(max_hosts), int(max_micro), int(max_tp).bit_length() - 1,
                          int(max_layers))
    return {
        "host_features": list(HOST_FEATURES),
        "pair_features": list(PAIR_FEATURES),
        "global_features": list(GLOBAL_FEATURES),
        "shapes": {"hosts": [int(max_hosts), len(HOST_FEATURES)],
                   "host_mask": [int(max_hosts)],
                   "pairs": [int(max_hosts), int(max_hosts), len(PAIR_FEATURES)],
                   "globals": [len(GLOBAL_FEATURES)]},
        "action_kinds": list(KINDS),
        "action_sizes": list(layout.sizes),
    }


def _hetpar_version() -> str:
    from hetpar import __version__

    return __version__


class LoadedPolicy:
    """A policy network read from a file, with the part of ``MaskablePPO``'s interface
    planners use: ``policy``, the spaces, ``predict`` and ``num_timesteps``."""

    def __init__(self, policy: Any, num_timesteps: int = 0) -> None:
        self.policy = policy
        self.num_timesteps = int(num_timesteps)

    @property
    def observation_space(self) -> Any:
        return self.policy.observation_space

    @property
    def action_space(self) -> Any:
        return self.policy.action_space

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = False, action_masks: np.ndarray | None = None,
                ) -> tuple[np.ndarray, Any]:
        return self.policy.predict(observation, state, episode_start, deterministic,  # type: ignore[no-any-return]
                                   action_masks=action_masks)


@dataclass(frozen=True)
class PolicyBundle:
    """A loaded policy: the network (``LoadedPolicy``, on CPU), its metadata and its file."""

    model: Any  # LoadedPolicy, or a MaskablePPO where training hands one over
    meta: dict[str, Any]
    path: Path

    @property
    def max_hosts(self) -> int:
        return int(self.meta["max_hosts"])

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a ``PlanBuilderEnv`` this policy can act in."""
        kw = dict(_ENV_DEFAULTS)
        kw.update({k: v for k, v in self.meta.get("env_kwargs", {}).items() if k in ENV_KWARGS})
        kw["max_hosts"] = self.max_hosts
        return kw

    def make_env(self, suite: Any, **overrides: Any) -> Any:
        """A ``PlanBuilderEnv`` over ``suite`` (a suite name, ``Suite`` or source) whose
        observation and action spaces match the policy; ``overrides`` replace env kwargs
        (for example ``objective`` or ``bandwidth``; never ``max_hosts``)."""
        from hetpar.envs.env import PlanBuilderEnv

        kw = self.env_kwargs
        if "max_hosts" in overrides and int(overrides["max_hosts"]) != self.max_hosts:
            raise ConfigError(str(self.path), "max_hosts",
                              f"the policy was trained for max_hosts={self.max_hosts}, "
                              f"an env with {overrides['max_hosts']} cannot be used")
        kw.update(overrides)
        return PlanBuilderEnv(suite, **kw)

    def act(self, obs: Mapping[str, np.ndarray], mask: np.ndarray,
            deterministic: bool = True) -> int:
        """One action of the policy for one (unbatched) observation and its action mask."""
        action, _ = self.model.predict(dict(obs), action_masks=np.array(mask, dtype=bool),
                                       deterministic=deterministic)
        return int(np.asarray(action).reshape(-1)[0])


# ---- writing ------------------------------------------------------------------------------

def save_policy(model: Any, path: str | Path, meta: Mapping[str, Any], *,
                optimizer: bool = True) -> Path:
    """Save ``model`` (a ``MaskablePPO`` or ``LoadedPolicy`` whose policy is one of
    ``POLICY_CLASSES``) to ``path`` (``.zip`` added if missing) with ``meta``, as format
    ``FORMAT_VERSION``; ``hetpar_version`` and ``observation_signature`` are filled in
    when ``meta`` lacks them. ``optimizer``: also the optimizer's state, so that training
    can continue from the file. The file appears whole or not at all (written beside it,
    then renamed; the partial file is removed if anything, Ctrl-C included, stops the
    write). Returns the written path."""
    path = Path(path)
    if path.suffix != ".zip":
        path = path.with_name(path.name + ".zip")
    meta = dict(meta)
    if "max_hosts" not in meta:
        raise ValueError("meta must include max_hosts")
    policy = model.policy
    arch = getattr(policy, "_arch", None)
    if type(policy).__name__ not in POLICY_CLASSES or not isinstance(arch, dict):
        raise ValueError(f"cannot save a {type(policy).__name__}; policy files hold one of "
                         f"{', '.join(POLICY_CLASSES)}")
    env_kwargs = dict(_ENV_DEFAULTS)
    env_kwargs.update({k: v for k, v in dict(meta.get("env_kwargs", {})).items()
                       if k in ENV_KWARGS})
    meta["env_kwargs"] = env_kwargs
    meta["format_version"] = FORMAT_VERSION
    meta.setdefault("hetpar_version", _hetpar_version())
    meta.setdefault("observation_signature", observation_signature(
        meta["max_hosts"], env_kwargs["max_micro"], env_kwargs["max_tp"],
        env_kwargs["max_layers"]))
    meta["network"] = {"class": type(policy).__name__,
                       "kwargs": {k: int(v) for k, v in arch.items()}}
    meta.setdefault("timesteps", int(getattr(model, "num_timesteps", 0)))
    meta.setdefault("n_updates", int(getattr(model, "_n_updates", 0)))
    members = {META_MEMBER: json.dumps(meta, indent=1, sort_keys=True, default=str).encode(),
               WEIGHTS_MEMBER: _tensor_bytes(_unique_tensors(policy.state_dict()))}
    opt = getattr(policy, "optimizer", None)
    if optimizer and opt is not None:
        tensors, rest = _split_optimizer_state(opt.state_dict())
        members[OPTIMIZER_MEMBER] = _tensor_bytes(tensors)
        members[OPTIMIZER_META_MEMBER] = json.dumps(rest, indent=1, sort_keys=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for name, data in members.items():
                    zf.writestr(name, data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _unique_tensors(state: Mapping[str, Any]) -> dict[str, Any]:
    """One name per tensor storage (SB3's policy holds its shared features extractor under
    three names; safetensors stores each array once)."""
    seen: set[tuple[int, int]] = set()
    out: dict[str, Any] = {}
    for name in sorted(state):
        t = state[name]
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().cpu().contiguous()
    return out


def _tensor_bytes(tensors: Mapping[str, Any]) -> bytes:
    from safetensors.torch import save

    return save(dict(tensors))


def _split_optimizer_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Adam's ``state_dict`` as tensors (``state.<param>.<name>``) and JSON (the rest)."""
    import torch

    tensors: dict[str, Any] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, entry in state["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{int(idx)}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(int(idx)), {})[name] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
              for g in state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


# ---- reading ------------------------------------------------------------------------------

def _read_member(zf: zipfile.ZipFile, src: str, name: str, limit: int) -> bytes:
    try:
        info = zf.getinfo(name)
    except KeyError:
        raise ConfigError(src, name, "missing from the policy file") from None
    if info.file_size > limit:
        raise ConfigError(src, name, f"{info.file_size} bytes, more than a policy file holds "
                                     f"({limit}); refusing to inflate it")
    try:
        data = zf.read(name)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, ValueError,
            NotImplementedError) as exc:
        raise ConfigError(src, name, f"corrupt member ({_one_line(exc)})") from None
    if len(data) > limit:
        raise ConfigError(src, name, "larger than its zip entry says; corrupt policy file")
    return data


def _open_zip(path: Path, src: str) -> zipfile.ZipFile:
    if not path.exists():
        raise ConfigError(src, "", "policy file not found")
    if not path.is_file():
        raise ConfigError(src, "", "not a policy file (it is a directory)")
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise ConfigError(src, "", f"corrupt or not a policy file ({_one_line(exc)})") from None


def read_meta(path: str | Path) -> dict[str, Any]:
    """The metadata of a policy file, without loading the network (checks the file)."""
    src = str(path)
    try:
        with _open_zip(Path(path), src) as zf:
            if META_MEMBER not in set(zf.namelist()):
                raise ConfigError(src, "", f"not a hetpar policy file (no {META_MEMBER} in the "
                                           "zip; was it saved with hetpar's save_policy?)")
            meta = json.loads(_read_member(zf, src, META_MEMBER, MAX_META_BYTES).decode("utf-8"),
                              parse_constant=_no_constant)
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError) as exc:
        raise ConfigError(src, "", f"corrupt or not a policy file ({_one_line(exc)})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise ConfigError(src, META_MEMBER, f"corrupt metadata ({_one_line(exc)})") from None
    if not isinstance(meta, dict) or "max_hosts" not in meta:
        raise ConfigError(src, META_MEMBER, "corrupt metadata (no max_hosts)")
    for key in ("env_kwargs", "network", "eval", "observation_signature", "imitation"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise ConfigError(src, f"{META_MEMBER}: {key}",
                              f"corrupt metadata (expected a mapping, got {_short(meta[key])})")
    return meta


def _no_constant(name: str) -> Any:  # noqa: ANN401
    raise ValueError(f"{name} is not a number JSON allows")


def _check_meta(src: str, meta: dict[str, Any]) -> None:
    kw = dict(_ENV_DEFAULTS)
    env_kwargs = meta.get("env_kwargs") or {}
    if not isinstance(env_kwargs, dict):
        raise ConfigError(src, "env_kwargs", "corrupt metadata (not a mapping)")
    kw.update(env_kwargs)
    try:
        max_hosts = _small_int(meta["max_hosts"], 1, 4096)
        want = observation_signature(max_hosts, _small_int(kw["max_micro"], 1, 1024),
                                     _small_int(kw["max_tp"], 1, 1024),
                                     _small_int(kw["max_layers"], 1, 100_000))
    except (TypeError, ValueError) as exc:
        raise ConfigError(src, META_MEMBER, f"corrupt metadata ({_one_line(exc)})") from None
    have = meta.get("observation_signature")
    if not isinstance(have, dict):
        raise ConfigError(src, "observation_signature", "missing from the policy metadata")
    for key in want:
        if have.get(key) != want[key]:
            raise ConfigError(
                src, f"observation_signature.{key}",
                f"observation format mismatch: the policy (hetpar "
                f"{meta.get('hetpar_version', '?')}) has {_short(have.get(key))}, this hetpar "
                f"({_hetpar_version()}) has {_short(want[key])}; retrain it with 'hetpar train'")


def _small_int(value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"expected an integer in [{low}, {high}], got {_short(value)}")
    return value


def _legacy_refusal(src: str) -> ConfigError:
    return ConfigError(
        src, "format_version",
        "a stable-baselines3 pickle (policy format 1): loading it can run any code its "
        "author put in it; if you trust where it came from, pass --trust-pickle, or convert "
        "it once with 'hetpar policy convert FILE NEW.zip --trust-pickle'")


def load_policy(path: str | Path | None = None, *, trust_pickle: bool = False,
                warn: Callable[[str], None] | None = None) -> PolicyBundle:
    """Load a policy file on the CPU; ``None`` loads the shipped one, and a bundled
    policy's name (``shipped``, ``clone``) that one (``policy_path``).

    Only JSON and safetensors members are read, so a file cannot run code here. A format-1
    file (stable-baselines3's pickled zip, written by hetpar before format 2) is refused
    unless ``trust_pickle``; then it is unpickled after a warning through ``warn``
    (default: one line on stderr).

    Raises ``ConfigError`` (one line naming the file and the problem) for a missing or
    corrupt file, a zip that is not a hetpar policy, or a format / observation-signature
    mismatch with this hetpar version."""
    p = policy_path(path)
    src = str(p)
    if (path is None or path in BUNDLED_POLICIES) and not p.exists():
        raise ConfigError(src, "", "the bundled policy is not installed (train it with "
                                   "'hetpar train --config clone', then '--config default')")
    meta = read_meta(p)
    version = meta.get("format_version")
    if version == LEGACY_FORMAT:
        if not trust_pickle:
            raise _legacy_refusal(src)
        (warn or _stderr)(f"hetpar: warning: {src}: unpickling a policy file of format 1 "
                          "(--trust-pickle); it can run code. 'hetpar policy convert' "
                          "writes it as format 2, which cannot")
        _check_meta(src, meta)
        return _load_legacy(p, src, meta)
    if version != FORMAT_VERSION:
        raise ConfigError(src, "format_version",
                          f"policy file format {_short(version)}, this hetpar "
                          f"({_hetpar_version()}) reads format {FORMAT_VERSION}; retrain it "
                          "with 'hetpar train'")
    _check_meta(src, meta)
    policy = _build_policy(src, meta)
    with _open_zip(p, src) as zf:
        tensors = _read_tensors(zf, src, WEIGHTS_MEMBER)
    _load_weights(policy, tensors, src)
    policy.set_training_mode(False)
    return PolicyBundle(model=LoadedPolicy(policy, _timesteps(meta)), meta=meta, path=p)


def _timesteps(meta: Mapping[str, Any]) -> int:
    value = meta.get("timesteps", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


def _rl_imports(src: str) -> None:
    try:
        import safetensors  # noqa: F401
        import sb3_contrib  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise ConfigError(src, "", f"loading a policy needs the 'rl' extra "
                                   f"(pip install 'hetpar[rl]'): {_one_line(exc)}") from None


def _build_policy(src: str, meta: Mapping[str, Any]) -> Any:
    """A fresh network of the class and size ``meta['network']`` names, on the spaces of
    ``meta``'s env (weights still random)."""
    _rl_imports(src)
    from gymnasium import spaces

    from hetpar.agents.policy import HostAttentionPolicy
    from hetpar.envs.observation import observation_space

    net = meta.get("network")
    if not isinstance(net, dict) or not isinstance(net.get("kwargs"), dict):
        raise ConfigError(src, "network", "missing from the policy metadata")
    if net.get("class") not in POLICY_CLASSES:
        raise ConfigError(src, "network.class",
                          f"{_short(net.get('class'))} is not a policy class of hetpar "
                          f"({', '.join(POLICY_CLASSES)})")
    kwargs = net["kwargs"]
    unknown = sorted(set(kwargs) - set(_NETWORK_KWARGS))
    if unknown:
        raise ConfigError(src, "network.kwargs", f"unknown key {unknown[0]!r}")
    try:
        arch = {k: _small_int(v, 0, 4096) for k, v in kwargs.items()}
    except ValueError as exc:
        raise ConfigError(src, "network.kwargs", _one_line(exc)) from None
    n_actions = sum(meta["observation_signature"]["action_sizes"])
    try:
        return HostAttentionPolicy(observation_space(int(meta["max_hosts"])),
                                   spaces.Discrete(n_actions), _zero_lr, **arch)
    except (ValueError, RuntimeError, AssertionError, ZeroDivisionError) as exc:
        raise ConfigError(src, "network.kwargs", f"cannot build the network "
                                                 f"({_one_line(exc)})") from None


def _zero_lr(_progress: float) -> float:
    return 0.0


def _read_tensors(zf: zipfile.ZipFile, src: str, member: str) -> dict[str, Any]:
    from safetensors.torch import load

    try:
        data = _read_member(zf, src, member, MAX_MEMBER_BYTES)
        return dict(load(data))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' errors on damaged bytes vary
        raise ConfigError(src, member, f"corrupt tensors ({_one_line(exc)})") from None


def _load_weights(policy: Any, tensors: Mapping[str, Any], src: str) -> None:
    """Copy ``tensors`` into ``policy``: every parameter given once (names sharing one
    storage count as one), no name it lacks, each of its shape and dtype."""
    expected = policy.state_dict()
    groups: dict[tuple[int, int], list[str]] = {}
    for name, t in expected.items():
        groups.setdefault((t.untyped_storage().data_ptr(), t.storage_offset()), []).append(name)
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise ConfigError(src, WEIGHTS_MEMBER, f"tensor {unknown[0]!r} is not in the "
                                               f"{type(policy).__name__} network")
    full: dict[str, Any] = {}
    for names in groups.values():
        given = [n for n in names if n in tensors]
        if not given:
            raise ConfigError(src, WEIGHTS_MEMBER, f"no tensor {sorted(names)[0]!r}")
        t = tensors[given[0]]
        want = expected[names[0]]
        if tuple(t.shape) != tuple(want.shape) or t.dtype != want.dtype:
            raise ConfigError(src, WEIGHTS_MEMBER,
                              f"tensor {given[0]!r} is {tuple(t.shape)} {t.dtype}, the "
                              f"network's is {tuple(want.shape)} {want.dtype}")
        for n in names:
            full[n] = t
    policy.load_state_dict(full, strict=True)


def restore_training_state(model: Any, path: str | Path) -> dict[str, Any]:
    """Continue training from a checkpoint: copy its weights, optimizer state and
    timestep count into ``model`` (a ``MaskablePPO`` built from the run's config).
    Everything is read and checked before anything in ``model`` changes. Returns the
    file's metadata; ``ConfigError`` for a damaged file, a format-1 file or a network
    that is not the config's."""
    import torch

    p = Path(path)
    src = str(p)
    meta = read_meta(p)
    if meta.get("format_version") == LEGACY_FORMAT:
        raise _legacy_refusal(src)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ConfigError(src, "format_version", f"policy file format "
                                                 f"{_short(meta.get('format_version'))}")
    _check_meta(src, meta)
    with _open_zip(p, src) as zf:
        tensors = _read_tensors(zf, src, WEIGHTS_MEMBER)
        if OPTIMIZER_MEMBER not in set(zf.namelist()):
            raise ConfigError(src, OPTIMIZER_MEMBER, "missing: the file holds no optimizer "
                                                     "state to continue training from")
        opt_tensors = _read_tensors(zf, src, OPTIMIZER_MEMBER)
        try:
            rest = json.loads(_read_member(zf, src, OPTIMIZER_META_MEMBER, MAX_META_BYTES))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
            raise ConfigError(src, OPTIMIZER_META_MEMBER,
                              f"corrupt ({_one_line(exc)})") from None
    policy = model.policy
    # Checked on a network of the file's own, so that a bad file leaves the model as it was.
    staging = _build_policy(src, meta)
    if staging._arch != getattr(policy, "_arch", None):
        raise ConfigError(src, "network.kwargs",
                          f"the checkpoint's network {meta['network']['kwargs']} is not the "
                          f"config's {getattr(policy, '_arch', type(policy).__name__)}")
    _load_weights(staging, tensors, src)
    try:
        staging.optimizer.load_state_dict(_join_optimizer_state(opt_tensors, rest))
    except (KeyError, ValueError, TypeError, RuntimeError, AttributeError) as exc:
        raise ConfigError(src, OPTIMIZER_MEMBER, f"does not fit the network's optimizer "
                                                 f"({_one_line(exc)})") from None
    with torch.no_grad():
        policy.load_state_dict(staging.state_dict())
    policy.optimizer.load_state_dict(staging.optimizer.state_dict())
    model.num_timesteps = _timesteps(meta)
    n_updates = meta.get("n_updates", 0)
    model._n_updates = n_updates if isinstance(n_updates, int) and n_updates >= 0 else 0
    return meta


def _join_optimizer_state(tensors: Mapping[str, Any], rest: Any) -> dict[str, Any]:
    if not isinstance(rest, dict) or not isinstance(rest.get("param_groups"), list):
        raise ValueError("no param_groups")
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    for idx, values in dict(rest.get("scalars") or {}).items():
        state.setdefault(int(idx), {}).update(values)
    groups = []
    for g in rest["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def _load_legacy(p: Path, src: str, meta: dict[str, Any]) -> PolicyBundle:
    """Unpickle a format-1 file (only with trust_pickle): stable-baselines3's loader."""
    _rl_imports(src)
    import hetpar.agents.policy  # noqa: F401  (the pickled policy class lives there)
    from sb3_contrib import MaskablePPO

    custom = {"learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0}
    try:
        model = MaskablePPO.load(p, device="cpu", custom_objects=custom)
    except Exception as exc:  # noqa: BLE001 - anything inside a damaged zip
        raise ConfigError(src, "", f"corrupt policy file ({type(exc).__name__}: "
                                   f"{_one_line(exc)})") from None
    shapes = meta["observation_signature"]["shapes"]
    space = getattr(model, "observation_space", None)
    try:
        got = {k: list(space[k].shape) for k in shapes}  # type: ignore[index]
    except Exception:  # noqa: BLE001
        got = None
    if got != shapes:
        raise ConfigError(src, "observation_space",
                          f"the network's observation space {got} does not match its "
                          f"metadata {shapes}")
    n_actions = sum(meta["observation_signature"]["action_sizes"])
    if int(getattr(model.action_space, "n", -1)) != n_actions:
        raise ConfigError(src, "action_space",
                          f"the network has {getattr(model.action_space, 'n', '?')} actions, "
                          f"its metadata {n_actions}")
    meta = {**meta, "n_updates": int(getattr(model, "_n_updates", 0))}
    return PolicyBundle(model=model, meta=meta, path=p)


def convert_legacy_policy(src: str | Path, dst: str | Path, *, optimizer: bool = True,
                          warn: Callable[[str], None] | None = None) -> Path:
    """Rewrite a format-1 policy file (unpickled: the caller trusts it) as format 2,
    keeping its metadata, weights, timestep count and (``optimizer``) optimizer state."""
    bundle = load_policy(src, trust_pickle=True, warn=warn or (lambda _: None))
    meta = {k: v for k, v in bundle.meta.items()
            if k not in ("format_version", "observation_signature", "network")}
    meta["timesteps"] = int(getattr(bundle.model, "num_timesteps", _timesteps(bundle.meta)))
    meta["converted_from_format"] = LEGACY_FORMAT
    return save_policy(bundle.model, dst, meta, optimizer=optimizer)


def check_compatible(bundle: PolicyBundle, max_hosts_needed: int | None, *, source: str = "",
                     model_layers: int | None = None) -> None:
    """Raise ``ConfigError`` when a cluster (``source``, e.g. its file) has more hosts than
    the policy's ``max_hosts`` (None: not asked; the planning methods take a larger
    cluster as replica slices), or a model more layers than its ``max_layers``."""
    where = f" ({source})" if source else ""
    if max_hosts_needed is not None and int(max_hosts_needed) > bundle.max_hosts:
        raise ConfigError(str(bundle.path), "max_hosts",
                          f"the cluster{where} has {max_hosts_needed} hosts, the policy was "
                          f"trained for at most max_hosts={bundle.max_hosts}; use a policy "
                          "trained with a larger max_hosts")
    max_layers = int(bundle.env_kwargs["max_layers"])
    if model_layers is not None and int(model_layers) > max_layers:
        raise ConfigError(str(bundle.path), "max_layers",
                          f"the model{where} has {model_layers} layers, the policy handles "
                          f"at most max_layers={max_layers}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 120 else text[:117] + "..."
