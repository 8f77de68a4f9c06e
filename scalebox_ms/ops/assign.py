"""Write Parameter values so that already-compiled graphs see them.

MindSpore 2.10 (CPU, measured): once a ``@ms.jit`` graph has run, ``Parameter.set_data`` and
``Parameter.assign_value`` change only the host copy; the compiled graphs keep reading the old device memory
(a graph computing ``x @ w.T`` returns the old result after ``w.set_data(zeros)``). An ``ops.assign`` inside a
compiled graph writes the memory every graph shares, so restoring or loading state goes through this Cell.
"""
import mindspore as ms
from mindspore import nn, ops


class AssignParameters(nn.Cell):
    """``AssignParameters(params).write(values)`` assigns ``values[i]`` to ``params[i]`` in one compiled call.

    ``write`` passes the values as ``ms.mutable``: a plain tuple of Tensors is treated as a compile-time
    constant by ``@ms.jit`` and would recompile (~0.3 s) on every call with new values.
    """

    def __init__(self, params):
        super().__init__(auto_prefix=False)
        self.params = ms.ParameterTuple(list(params))

    def write(self, values):
        return self(ms.mutable(tuple(values)))

    @ms.jit
    def construct(self, values):
        for param, value in zip(self.params, values):
            ops.assign(param, value)
        return values[0]
