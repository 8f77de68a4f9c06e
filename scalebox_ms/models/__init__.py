"""Policy and value networks (``nn.Cell``) and their compiled entry points."""
from .actor_critic import ActorCritic, ActStep, DeterministicStep, SpaceSpec, ValueStep, build_model

__all__ = ["ActorCritic", "ActStep", "DeterministicStep", "SpaceSpec", "ValueStep", "build_model"]
