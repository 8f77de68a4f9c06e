"""Trainers: the policy-scheduling layer."""
from .ppo import Callback, PPOTrainer, schedule_value
from ..config import PPOConfig

__all__ = ["Callback", "PPOConfig", "PPOTrainer", "schedule_value"]
