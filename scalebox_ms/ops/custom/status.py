"""The C++ kernels' return codes (``status.h``) as :class:`~scalebox_ms.errors.CustomOpError` messages.

A kernel that returns a code other than 0 makes MindSpore raise ``RuntimeError("Return value from CPU AOT
kernel(<lib>.so)'s function(<Symbol>) is <N>. Any return value not equal to 0 ...")``. :func:`kernel_error`
parses that text and returns ``CustomOpError("custom op '<kernel>': <what went wrong> (kernel return code N)")``;
:data:`MESSAGES` is the one table of what each code means (``status.h`` lists the same codes; a test compares
them). ``PPOUpdateKernel`` and ``FusedActorKernel`` raise these errors from their calls; a graph that contains a
kernel (e.g. ``ActStep(kernel='custom')``) can translate with :func:`custom_op_errors`.
"""
from __future__ import annotations

import contextlib
import re

from ...errors import CustomOpError

#: return code -> what went wrong (status.h's enum Status; 0 is success)
MESSAGES = {
    1: "too few inputs for the kernel",
    2: "the policy and value MLPs need 1 to 16 layers each",
    3: "the number of inputs does not match the MLPs' layer counts",
    4: "an input has the wrong dtype (float32; int32 for indices, discrete actions, meta and global_step)",
    5: "an input has the wrong shape (features or observations, actions or noise, indices, log_std or its Adam "
       "moments, a per-call scalar, hyper, the step counters, or the output)",
    6: "a layer's weight or bias shape (or its Adam moments') does not match the MLP's layer sizes",
    7: "the policy head is not action_dim wide or the value head not 1 wide",
    8: "a minibatch index is outside the rollout",
    9: "a discrete action is outside the action space",
    10: "out of memory",
    11: "a C++ exception inside the kernel",
    12: "oneDNN (the library inside MindSpore's CPU wheel) refused the convolution",
    13: "meta is not an int32 vector of the MLPs' length, or names an activation other than tanh or relu",
}
#: the codes whose call wrote nothing (checked before any write); other failures may have left a partial update
NOTHING_WRITTEN = frozenset(range(1, 10)) | {13}
#: exported symbol -> kernel name (both entry points of ppo_update.cc and of offpolicy_optim.cc; patches.cc's)
SYMBOLS = {"FusedActorMLP": "fused_actor_mlp", "PPOUpdate": "ppo_update", "PPOUpdateEpochs": "ppo_update",
           "GuardedAdam": "offpolicy_optim", "PolyakUpdate": "offpolicy_optim", "ImagePatches": "image_patches",
           "OneDNNConvForward": "onednn_conv", "OneDNNConvForwardNoInputGrad": "onednn_conv",
           "OneDNNConvBackwardData": "onednn_conv",
           "OneDNNConvBackwardWeights": "onednn_conv"}

_RETURN_VALUE = re.compile(r"AOT kernel\((?P<lib>[^)]*)\)'s function\((?P<symbol>\w+)\) is (?P<code>-?\d+)")


def parse(exc: BaseException):
    """(symbol, code) of a kernel's non-zero return in MindSpore's RuntimeError text, or None."""
    match = _RETURN_VALUE.search(str(exc))
    return (match["symbol"], int(match["code"])) if match else None


def kernel_error(exc: BaseException, detail=None):
    """The :class:`CustomOpError` for MindSpore's RuntimeError about a scalebox_ms kernel's return code, or None if
    ``exc`` is not one. ``detail(code)`` may return a more specific message (e.g. naming the bad index)."""
    parsed = parse(exc)
    if parsed is None or parsed[0] not in SYMBOLS:
        return None
    symbol, code = parsed
    what = None
    if detail is not None:
        try:
            what = detail(code)
        except Exception:  # noqa: BLE001 (a failing detail must not hide the kernel's error)
            what = None
    what = what or MESSAGES.get(code, "unknown error")
    return CustomOpError(f"custom op {SYMBOLS[symbol]!r}: {what} (kernel return code {code})")


def _sync():
    """Wait for the kernels MindSpore has queued (``ms.runtime.synchronize`` is for Ascend/GPU only; on CPU the
    PyNative executor's ``sync`` is what ``mindspore.train.Model`` itself calls after each step)."""
    try:
        from mindspore.graph.api import _pynative_executor
    except ImportError:  # a MindSpore without it: host-blocking runs (the Sandbox's default) make calls synchronous
        return
    _pynative_executor.sync()


@contextlib.contextmanager
def custom_op_errors(detail=None):
    """Re-raise MindSpore's RuntimeError about a kernel's return code as the CustomOpError of :func:`kernel_error`;
    other exceptions pass unchanged. The block's work is synchronized before it ends: without
    ``MS_DEV_HOST_BLOCKING_RUN=1`` (which :mod:`scalebox_ms.sandbox` sets on import) MindSpore runs kernels
    asynchronously and would raise the error later, at whichever call first reads the result."""
    try:
        yield
        _sync()
    except RuntimeError as exc:
        err = kernel_error(exc, detail)
        if err is None:
            raise
        raise err from None
