"""Stated upper limits on every input: the one place where hetpar says how big is too big.

Every command either finishes within a predictable time for its input or refuses it up
front with one line naming the file (or flag), the field and the problem. The limits
below are what "up front" means: each is far above any real use, and far below what
would make a command hang, exhaust memory or overflow floating point. Readers
(``hetpar.configio``), loaders and the command line import them from here; change them
here and nowhere else.
"""

from __future__ import annotations

__all__ = [
    "MAX_FILE_BYTES", "MAX_TRACE_BYTES", "MAX_DEPTH", "MAX_NODES", "MAX_ALIASES", "MAX_INT",
    "MAX_NUMBER", "MIN_POSITIVE", "MAX_HOSTS", "MAX_GPUS_PER_HOST",
    "MAX_SAMPLES", "MAX_STATE_VALUES", "MAX_GLOBAL_BATCH", "MAX_SEED", "MAX_TIME_LIMIT_S", "MAX_BRUTE_SPACE",
    "MAX_TRACE_ROWS", "MAX_TIMELINE_STEPS", "MAX_MARKOV_RATE", "MAX_MARKOV_EVENTS", "MAX_ITERATIONS",
    "MAX_INSTANCES", "MAX_BUDGET", "MAX_WORKERS", "MAX_LAYERS", "MAX_MODEL_DIM",
    "MAX_SEQ_LEN", "MAX_VOCAB", "MAX_STEPS", "MAX_BEAM", "GPU_RANGES",
    "MAX_TRAIN_ENVS", "MAX_POLICY_HOSTS", "MAX_ROLLOUT_BYTES", "MAX_TIMESTEPS", "MAX_EPOCHS",
    "MAX_BATCH", "MAX_TRAIN_INSTANCES", "MAX_NETWORK_DIM", "MAX_HEADS", "MAX_ROUNDS",
    "MAX_THREADS",
]

# ---- documents (YAML / JSON) -------------------------------------------------------------

#: Bytes of one configuration, plan, suite or instance file. The largest bundled file is
#: under 50 kB; a saved instance file of thousands of instances stays under a few MB. A
#: pure-Python YAML parse runs at a few MB/s, so this bounds a parse to seconds.
MAX_FILE_BYTES = 32 * 2**20

#: Bytes of one bandwidth trace (CSV). A day sampled every second on 20 links is ~4 MB.
MAX_TRACE_BYTES = 64 * 2**20

#: Nesting depth of a document (mappings and lists inside each other). Every hetpar format
#: is at most about 8 levels deep; deep nesting only exhausts the parser's stack.
MAX_DEPTH = 64

#: Values in a document *after* expanding YAML aliases (each alias counted as a copy of
#: what it names). Bounds "billion laughs" documents, whose few aliases expand to 10**9
#: values that any later walk over the data would visit.
MAX_NODES = 2_000_000

#: YAML aliases (``*name``) in one document. Real configs use a handful.
MAX_ALIASES = 10_000

#: Magnitude of any integer in a document or a flag: int64. Larger integers cannot index
#: an array and overflow when converted to a float; 5,000-digit integers also take
#: quadratic time to parse. Counts have much tighter limits below.
MAX_INT = 2**63 - 1

#: Magnitude of any number read from a document (in its field's unit: seconds, Gb/s,
#: GiB, ...). No hetpar quantity comes near it, and products of two such numbers stay
#: far from float overflow (1e308), so no estimate becomes inf or NaN.
MAX_NUMBER = 1e12

#: Smallest value a field that must be positive accepts. Values such as 1e-308 are
#: "positive" but their reciprocals overflow to inf (and inf - inf is NaN).
MIN_POSITIVE = 1e-9

# ---- clusters and models -----------------------------------------------------------------

#: Hosts of one cluster (all host groups together) or of one suite instance, checked by
#: ``hetpar.cluster.topology.parse_cluster`` before any host group is expanded (a load is
#: linear in hosts, 0.3 s at 20,000, and an estimate 7 s there); a host group of 2**63
#: hosts would never finish.
MAX_HOSTS = 20_000

#: GPUs of one host (one scale-up domain). The largest NVLink domains hold 72-576 GPUs.
MAX_GPUS_PER_HOST = 1024

#: Transformer layers, hidden size / heads / FFN width, sequence length, vocabulary.
#: Llama 3 405B has 126 layers, hidden 16384, FFN 53248, vocabulary 128256.
MAX_LAYERS = 4096
MAX_MODEL_DIM = 1_048_576
MAX_SEQ_LEN = 16_777_216
MAX_VOCAB = 16_777_216

#: Global batch in sequences. Frontier models train at a few thousand to tens of
#: thousands of sequences; the plan space enumerates the batch's divisors.
MAX_GLOBAL_BATCH = 1_048_576

#: Plausible datasheet figures of one GPU type: (low, high) per catalog field, in the
#: field's unit. A figure outside is almost surely given in another unit (TFLOP/s given
#: in FLOP/s, HBM in TB/s, memory in bytes) and would give iteration times that are off
#: by orders of magnitude without a word; the catalog loader refuses it, naming the file
#: and field. The ranges span every GPU made for training, from a 2016 P100 to well past
#: today's largest (B200: 2,250 dense fp16 TFLOP/s, 180 GB, 8 TB/s), and down to the CPU
#: a `hetpar profile --device cpu` entry describes (a 2-core VM: 0.05-0.2 TFLOP/s, 5-20
#: GB/s), still 10^10 from a figure given in FLOP/s or B/s.
GPU_RANGES: dict[str, tuple[float, float, str]] = {
    "peak_tflops": (0.01, 50_000.0, "dense TFLOP/s (not FLOP/s)"),
    "memory_gib": (1.0, 16_384.0, "GiB (not bytes or MiB)"),
    "hbm_GBps": (1.0, 200_000.0, "GB/s (not TB/s)"),
    "scaleup.GBps": (1.0, 100_000.0, "GB/s per direction"),
    "pcie_GBps": (1.0, 10_000.0, "GB/s per direction"),
}

# ---- scoring, search and flags -----------------------------------------------------------

#: Bandwidth states a plan is scored over (``--samples``). The cost model holds a
#: (samples x links) array per plan; the default is 32 and 1,000 already resolves a p99.
MAX_SAMPLES = 100_000

#: Bandwidth states times links: the (samples x links) arrays a cost model holds, 160 MB
#: each at this size; a 20,000-host cluster scores at most 500 states.
MAX_STATE_VALUES = 20_000_000

#: Seeds (``--seed``, ``--seeds``, ``seed:`` fields): what ``numpy.random.default_rng``
#: takes, non-negative; 2**63 - 1 keeps it an int64.
MAX_SEED = 2**63 - 1

#: ``--time-limit`` and every time-limit field, in seconds: finite and positive; a week.
MAX_TIME_LIMIT_S = 7 * 86400.0

#: Plans ``solve --method brute`` may enumerate (its space size, counted up front, which
#: takes under a second at this size). Brute force scores about 10,000 plans a second on
#: one core: under half a minute at most. Larger spaces are the exact search's.
MAX_BRUTE_SPACE = 250_000

#: Plans the random baseline may score (``--budget``), and scored completions of a
#: local search (``--improve``).
MAX_BUDGET = 100_000_000

#: Worker processes of a search (``--workers``).
MAX_WORKERS = 1024

#: Search steps (``--refine-steps``).
MAX_STEPS = 10_000_000

#: Beam width of the policy's search (``--beam``): each step keeps this many rollouts.
MAX_BEAM = 256

# ---- dynamics ------------------------------------------------------------------------------

#: Rows of one bandwidth trace.
MAX_TRACE_ROWS = 1_000_000

#: Steps of a scenario's timeline (``horizon_s / step_s``): every link process draws one
#: value per step.
MAX_TIMELINE_STEPS = 1_000_000

#: Rate of a Markov bandwidth state change, per second. A chain is followed event by
#: event, so rate x horizon events are drawn: 1,000 changes a second over a day is 10**8.
MAX_MARKOV_RATE = 1_000.0

#: Expected state changes of one Markov bandwidth path over a scenario's horizon (the
#: largest total rate out of a state times ``horizon_s``): each is drawn in turn.
MAX_MARKOV_EVENTS = 2_000_000

#: Training iterations of a re-planning run (``--iterations``, ``iterations:``).
MAX_ITERATIONS = 10**12

#: Suite instances one command may generate, show or evaluate (``--n``): generating one
#: takes about 2 ms, so ``suite show --n`` ends within about 20 s.
MAX_INSTANCES = 10_000

# ---- training (configs/train/*.yaml, 'hetpar train') -----------------------------------------

#: Environment processes of one run (``n_envs``, ``--n-envs``): each is a process.
MAX_TRAIN_ENVS = 256

#: Hosts a policy plans for (``env.max_hosts``): the observation holds a max_hosts^2
#: bandwidth tensor per step.
MAX_POLICY_HOSTS = 4096

#: Bytes of one PPO rollout buffer: n_steps x n_envs transitions, each an observation
#: and an action mask (float32). Beyond this a run fails at its first update.
MAX_ROLLOUT_BYTES = 16 * 2**30

#: PPO timesteps of one run (``total_timesteps``, ``--timesteps``).
MAX_TIMESTEPS = 10**12

#: Passes over the data (``ppo.n_epochs``, ``imitation.epochs``), minibatch sizes and
#: instance pools of one run.
MAX_EPOCHS = 100_000
MAX_BATCH = 10_000_000
MAX_TRAIN_INSTANCES = 1_000_000

#: Widths of the policy network (``policy_kwargs``): dim, edge_dim, value_dim; heads and
#: message-passing rounds.
MAX_NETWORK_DIM = 8192
MAX_HEADS = 256
MAX_ROUNDS = 64

#: Torch threads (``torch_threads``, ``update_threads``).
MAX_THREADS = 1024
