"""int8 variants: dynamic (weight-only-static, activation-dynamic) quantisation of the projections.

Only MatMul/Gemm nodes whose second operand is a constant weight are quantised: the weights become
int8 per output channel, activations are quantised per call to uint8 (u8·s8, the VNNI/AMX fast path
in ONNX Runtime's CPU provider). Everything else (convolutions, LayerNorm/RMSNorm, softmax, the
attention score MatMuls between two activations, the residual stream) stays fp32, and graph I/O
stays fp32 like every variant (docs/model-format.md).
"""

from __future__ import annotations

from pathlib import Path

# Stages that get an int8 variant. hift_decode is mostly convolutions (left fp32 by design), so
# quantising its few MatMuls gains nothing; flow_front is tiny.
INT8_STAGES = ("llm", "dit")


def quantize_int8(src: Path, dst: Path) -> None:
    """Write `dst`, the int8 dynamic-quantised copy of the fp32 graph `src`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        model_input=str(src),
        model_output=str(dst),
        op_types_to_quantize=["MatMul", "Gemm"],
        per_channel=True,
        reduce_range=False,
        weight_type=QuantType.QInt8,
        extra_options={"MatMulConstBOnly": True},
    )
