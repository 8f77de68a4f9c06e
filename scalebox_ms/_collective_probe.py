"""Run by msrun for ``python -m scalebox_ms.doctor --workers N``:
``python -m scalebox_ms._collective_probe CPU|GPU|Ascend``.

msrun runs this command line as its scheduler too, which only joins the cluster. Each rank binds the backend (on
GPU/Ascend the device of its local rank, as ``train --workers`` does), joins the job with the backend's collective
library (:func:`~scalebox_ms.parallel.context.init_distributed`: mccl on CPU, nccl on GPU, hccl on Ascend), all-gathers
and all-reduces a small vector made from its rank, compares both with what they must be, and prints one JSON line
``{"rank", "world_size", "backend", "ok", "seconds"}`` into its msrun log.
"""
import json
import sys
import time

import numpy as np


def main(target: str) -> None:
    from scalebox_ms.parallel.context import init_distributed, is_msrun_scheduler, local_rank, serve_as_scheduler

    if is_msrun_scheduler():
        serve_as_scheduler()
        return
    import mindspore as ms

    ms.set_context(device_target=target)
    if target != "CPU":
        ms.set_context(device_id=local_rank())
    t0 = time.perf_counter()
    dist = init_distributed(target)
    ranks = np.arange(dist.world_size, dtype=np.float32)
    expected = np.stack([ranks, 10.0 * ranks + 1.0], axis=1)  # (world_size, 2): row r is rank r's vector
    gathered = dist.all_gather(expected[dist.rank])
    summed = dist.all_reduce_sum(expected[dist.rank])
    ok = np.array_equal(gathered, expected) and np.array_equal(summed, expected.sum(axis=0))
    print(json.dumps({"rank": dist.rank, "world_size": dist.world_size, "backend": dist.backend, "ok": bool(ok),
                      "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
