"""scalebox_ms: MindSpore-native reinforcement learning (PPO, DQN, SAC and TD3 compiled into MindSpore graphs)."""
__version__ = "0.2.0"

from .config import Config, load_config  # noqa: E402  (no MindSpore import)
from .errors import CheckpointError, ConfigError, ScaleboxError  # noqa: E402
# (stdlib only: call route_sigint_around_mindspore before numpy/MindSpore start threads)
from .cli_common import import_mindspore, route_sigint_around_mindspore  # noqa: E402


def __getattr__(name):  # lazy: importing scalebox_ms must not pay MindSpore's ~3 s import
    if name == "Sandbox":
        from .sandbox import Sandbox

        return Sandbox
    if name in ("PPOTrainer", "DQNTrainer", "SACTrainer", "TD3Trainer", "Callback", "make_trainer", "load_trainer"):
        from . import trainers

        return getattr(trainers, name)
    raise AttributeError(f"module 'scalebox_ms' has no attribute {name!r}")


__all__ = ["Config", "load_config", "CheckpointError", "ConfigError", "ScaleboxError", "Sandbox", "PPOTrainer",
           "DQNTrainer", "SACTrainer", "TD3Trainer", "make_trainer", "load_trainer", "Callback",
           "import_mindspore", "route_sigint_around_mindspore", "__version__"]
