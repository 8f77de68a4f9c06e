"""Data-parallel training on MindSpore's own launcher (``msrun``) and collectives (HCCL / NCCL / MCCL).

* :mod:`.context` -- detect an msrun rank, initialise the collective backend for the device, host-side
  collectives (all-gather) for statistics that must agree on every rank, and timing of the update's collectives.
* :mod:`.launcher` -- ``python -m scalebox_ms.train --workers N`` starts ``msrun`` on 127.0.0.1 with a free port
  and its logs in ``<run_dir>/msrun/``, and turns a dead worker, or a job whose ranks stopped ending iterations
  (``parallel.hang_timeout``), into a one-line error naming the ranks.

The gradient all-reduce itself lives in the compiled update step
(:class:`scalebox_ms.trainers.ppo_update.PPOUpdateStep` with ``world_size > 1``).
"""
from .context import DistContext, backend_for_device, current, in_msrun, init_distributed

__all__ = ["DistContext", "backend_for_device", "current", "in_msrun", "init_distributed"]
