"""int8 variants: dynamic (weight-only-static, activation-dynamic) quantisation of the projections.

Only MatMul/Gemm nodes whose second operand is a constant weight are quantised: the weights become
int8 per output channel, activations are quantised per call to uint8 (u8·s8, the VNNI/AMX fast path
in ONNX Runtime's CPU provider). Weights use the 7-bit range (`reduce_range`): on a CPU without VNNI
(AVX2, e.g. AMD Zen 1-3) ONNX Runtime multiplies u8·s8 with VPMADDUBSW, whose int16 pair sums
saturate for full-range weights (255·127·2 > 32767; measured on the tiny model: 27 % mean error for
the LLM logits instead of 2 %); with |w| <= 64 no sum saturates, so every x86-64 CPU computes the
same exact integer sums. Everything else (convolutions, LayerNorm/RMSNorm, softmax, the
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
        reduce_range=True,  # 7-bit weights: no VPMADDUBSW saturation on AVX2 CPUs without VNNI
        weight_type=QuantType.QInt8,
        extra_options={"MatMulConstBOnly": True},
    )
