"""INT8 post-training quantization (see :mod:`scalebox_ms.quant.ptq`)."""
from .ptq import DynamicQuantizer, QuantDense, QuantizedPolicy, collect_calibration_data, quantize_weight_per_channel

__all__ = ["DynamicQuantizer", "QuantDense", "QuantizedPolicy", "collect_calibration_data",
           "quantize_weight_per_channel"]
