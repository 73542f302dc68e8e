"""Saving and loading trained planning policies (``MaskablePPO`` zip files plus metadata).

A policy file is the zip that stable-baselines3 writes, with one extra member,
``hetpar_meta.json``, holding what is needed to use the policy safely later:

* ``format_version``: version of this file format (``FORMAT_VERSION``);
* ``hetpar_version``: the hetpar version that trained it;
* ``max_hosts``: the host count of the observation (clusters may have fewer hosts);
* ``env_kwargs``: the ``PlanBuilderEnv`` keyword arguments (``objective``, ``bandwidth``,
  ``samples``, ``max_layers``, ``max_micro``, ``max_tp``) a compatible env needs;
* ``observation_signature``: feature names and shapes of the observation and the sizes of
  the action layout (``observation_signature()``), compared at load time so a policy
  trained against another observation format fails with a clear message, not garbage;
* ``training``: the resolved training configuration (free-form).

Typical use::

    bundle = load_policy("runs/default/final_policy.zip")   # or load_policy(None)
    check_compatible(bundle, instance.num_hosts, source="my_cluster.yaml")
    env = bundle.make_env(instance_source)
    obs, _ = env.reset(options={"instance": instance})
    action = bundle.act(obs, env.action_masks())
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetpar.errors import ConfigError
from hetpar.problem import POLICY_SAMPLES

__all__ = ["FORMAT_VERSION", "META_MEMBER", "ENV_KWARGS", "PolicyBundle", "save_policy",
           "load_policy", "check_compatible", "default_policy_path", "observation_signature",
           "BUNDLED_POLICIES", "bundled_policy_path", "policy_path",
           "read_meta"]

FORMAT_VERSION = 1
META_MEMBER = "hetpar_meta.json"
# PlanBuilderEnv keyword arguments a policy depends on (besides max_hosts).
ENV_KWARGS = ("objective", "bandwidth", "samples", "max_layers", "max_micro", "max_tp")
_ENV_DEFAULTS: dict[str, Any] = {"objective": "mean", "bandwidth": "sampled",
                                 "samples": POLICY_SAMPLES,
                                 "max_layers": 128, "max_micro": 16, "max_tp": 16}


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


@dataclass(frozen=True)
class PolicyBundle:
    """A loaded policy: the ``MaskablePPO`` model (on CPU), its metadata and its file."""

    model: Any  # sb3_contrib.MaskablePPO
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


def save_policy(model: Any, path: str | Path, meta: Mapping[str, Any]) -> Path:
    """Save ``model`` (a ``MaskablePPO``) to ``path`` (``.zip`` added if missing) with
    ``meta``; ``format_version``, ``hetpar_version`` and ``observation_signature`` are
    filled in when ``meta`` lacks them. Returns the written path."""
    path = Path(path)
    if path.suffix != ".zip":
        path = path.with_name(path.name + ".zip")
    meta = dict(meta)
    if "max_hosts" not in meta:
        raise ValueError("meta must include max_hosts")
    env_kwargs = dict(_ENV_DEFAULTS)
    env_kwargs.update({k: v for k, v in dict(meta.get("env_kwargs", {})).items()
                       if k in ENV_KWARGS})
    meta["env_kwargs"] = env_kwargs
    meta.setdefault("format_version", FORMAT_VERSION)
    meta.setdefault("hetpar_version", _hetpar_version())
    meta.setdefault("observation_signature", observation_signature(
        meta["max_hosts"], env_kwargs["max_micro"], env_kwargs["max_tp"],
        env_kwargs["max_layers"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.zip")
    model.save(tmp)
    with zipfile.ZipFile(tmp, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(META_MEMBER, json.dumps(meta, indent=1, sort_keys=True, default=str))
    tmp.replace(path)
    return path


def read_meta(path: str | Path) -> dict[str, Any]:
    """The metadata of a policy file, without loading the network (checks the file)."""
    src = str(path)
    p = Path(path)
    if not p.exists():
        raise ConfigError(src, "", "policy file not found")
    if not p.is_file():
        raise ConfigError(src, "", "not a policy file (it is a directory)")
    try:
        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
            if META_MEMBER not in names:
                raise ConfigError(src, "", f"not a hetpar policy file (no {META_MEMBER} in the "
                                           "zip; was it saved with hetpar's save_policy?)")
            meta = json.loads(zf.read(META_MEMBER).decode("utf-8"))
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ConfigError(src, "", f"corrupt or not a policy file ({_one_line(exc)})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(src, META_MEMBER, f"corrupt metadata ({_one_line(exc)})") from None
    if not isinstance(meta, dict) or "max_hosts" not in meta:
        raise ConfigError(src, META_MEMBER, "corrupt metadata (no max_hosts)")
    return meta


def _check_meta(src: str, meta: dict[str, Any]) -> None:
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ConfigError(src, "format_version",
                          f"policy file format {version!r}, this hetpar "
                          f"({_hetpar_version()}) reads format {FORMAT_VERSION}; retrain it "
                          "with 'hetpar train'")
    kw = dict(_ENV_DEFAULTS)
    kw.update(meta.get("env_kwargs") or {})
    try:
        want = observation_signature(int(meta["max_hosts"]), kw["max_micro"], kw["max_tp"],
                                     kw["max_layers"])
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


def load_policy(path: str | Path | None = None) -> PolicyBundle:
    """Load a policy saved by ``save_policy`` on the CPU; ``None`` loads the shipped one,
    and a bundled policy's name (``shipped``, ``clone``) that one (``policy_path``).

    Raises ``ConfigError`` (one line naming the file and the problem) for a missing or
    corrupt file, a zip that is not a hetpar policy, or a format / observation-signature
    mismatch with this hetpar version."""
    p = policy_path(path)
    src = str(p)
    if (path is None or path in BUNDLED_POLICIES) and not p.exists():
        raise ConfigError(src, "", "the bundled policy is not installed (train it with "
                                   "'hetpar train --config clone', then '--config default')")
    meta = read_meta(p)
    _check_meta(src, meta)
    try:
        import hetpar.agents.policy  # noqa: F401  (the pickled policy class lives there)
        from sb3_contrib import MaskablePPO
    except ImportError as exc:
        raise ConfigError(src, "", f"loading a policy needs the 'rl' extra "
                                   f"(pip install 'hetpar[rl]'): {_one_line(exc)}") from None
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
    return PolicyBundle(model=model, meta=meta, path=p)


def check_compatible(bundle: PolicyBundle, max_hosts_needed: int, *, source: str = "",
                     model_layers: int | None = None) -> None:
    """Raise ``ConfigError`` when a cluster (``source``, e.g. its file) has more hosts than
    the policy's ``max_hosts``, or a model more layers than its ``max_layers``."""
    where = f" ({source})" if source else ""
    if int(max_hosts_needed) > bundle.max_hosts:
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
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."
