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
        params = list(params)
        if not params:
            raise ValueError("AssignParameters: no Parameters to write")
        self.params = ms.ParameterTuple(params)

    def write(self, values):
        values = tuple(values)
        if len(values) != len(self.params):  # (zip wrote the first ones and left the rest as they were)
            raise ValueError(f"AssignParameters.write: {len(values)} values for {len(self.params)} Parameters")
        return self(ms.mutable(values))

    @ms.jit
    def construct(self, values):
        for param, value in zip(self.params, values):
            ops.assign(param, value)
        return values[0]
