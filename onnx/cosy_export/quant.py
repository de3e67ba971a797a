"""int8 variants: dynamic (weight-only-static, activation-dynamic) quantisation of the projections.

Only MatMul/Gemm nodes whose second operand is a constant weight are quantised: the weights become
int8 per output channel, activations are quantised per call to uint8 (u8·s8, the VNNI/AMX fast path
in ONNX Runtime's CPU provider) with **one scale per row** (per frame of the DiT, per token of the
LLM), symmetric around the fixed zero point 128. ONNX Runtime's own dynamic quantisation
(`DynamicQuantizeLinear`) takes one scale for the whole tensor, so a frame's result would depend on
every other frame of the call: the DiT would lose its block-causal prefix invariance (a streaming
chunk, or the prompt-prefix cache, would change the prompt's frames) and a batched LLM row would
depend on the other rows. Per row, each row is quantised from itself alone, so int8 keeps both
properties exactly (the integer sums are exact; docs/model-format.md "int8"). Weights use the 7-bit range (`reduce_range`): on a CPU without VNNI
(AVX2, e.g. AMD Zen 1-3) ONNX Runtime multiplies u8·s8 with VPMADDUBSW, whose int16 pair sums
saturate for full-range weights (255·127·2 > 32767; measured on the tiny model: 27 % mean error for
the LLM logits instead of 2 %); with |w| <= 64 no sum saturates, so every x86-64 CPU computes the
same exact integer sums. Everything else (convolutions, LayerNorm/RMSNorm, softmax, the
attention score MatMuls between two activations, the residual stream) stays fp32, and graph I/O
stays fp32 like every variant (docs/model-format.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
    per_row_activations(dst)


# The fixed activation zero point: q = round(x / s) + 128 with s = max|row| / 127, so q is in 1..255.
ROW_ZERO_POINT = 128


def per_row_activations(path: Path) -> int:
    """Rewrite every `DynamicQuantizeLinear` of the graph at `path` into per-row symmetric uint8
    quantisation (see the module text). The quantised rows and the zero point keep their names, so
    the `MatMulInteger` after it is unchanged; the row scale `[..., rows, 1]` is applied after each
    of its `MatMulInteger → Cast → Mul(x_scale · w_scale)` chains, and the tensor scale becomes 1.
    (Feeding the row scale into `Mul(x_scale, w_scale)` instead gives wrong results: ONNX Runtime
    fuses that chain into `MatMulIntegerToFloat`, whose A scale is per tensor or per column of A,
    not per row: 6 % mean error on the tiny DiT instead of 2.6 %.) Returns the nodes rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def only(name: str, op: str) -> onnx.NodeProto:
        found = [n for n in consumers.get(name, []) if n.op_type == op]
        if len(found) != 1:
            raise ValueError(f"int8 per-row rewrite: {name} feeds {len(found)} {op} nodes, expected 1 "
                             "(ONNX Runtime's quantize_dynamic output changed?)")
        return found[0]

    consts = [
        numpy_helper.from_array(np.array(127.0, np.float32), "row_q_127"),
        numpy_helper.from_array(np.array(ROW_ZERO_POINT, np.uint8), "row_q_zero_point"),
        numpy_helper.from_array(np.array([-1], np.int64), "row_q_flat"),
        # rows of zeros: a tiny scale, not 0 (x / 0); their q is 128 = 0 either way
        numpy_helper.from_array(np.array(1e-30, np.float32), "row_q_floor"),
    ]
    nodes = []
    # Mul node (by identity) -> the row scale its output is multiplied by.
    rescale: dict[int, str] = {}
    rewritten = 0
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            continue
        q = node.output[0]
        row_scale = f"{node.name or q}/row/scale"
        for matmul in consumers.get(q, []):
            if matmul.op_type != "MatMulInteger":
                raise ValueError(f"int8 per-row rewrite: {q} feeds a {matmul.op_type}, expected MatMulInteger")
            cast = only(matmul.output[0], "Cast")
            rescale[id(only(cast.output[0], "Mul"))] = row_scale
    for node in graph.node:
        if id(node) in rescale:
            out = node.output[0]
            node.output[0] = f"{out}/per_tensor"
            nodes += [node, helper.make_node("Mul", [node.output[0], rescale[id(node)]], [out])]
            continue
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        rewritten += 1
        x, (q, scale, zero) = node.input[0], node.output
        p = f"{node.name or q}/row"
        if opset >= 18:
            axes = numpy_helper.from_array(np.array([-1], np.int64), f"{p}/axes")
            graph.initializer.append(axes)
            reduce = helper.make_node("ReduceMax", [f"{p}/abs", axes.name], [f"{p}/absmax"], keepdims=1)
        else:
            reduce = helper.make_node("ReduceMax", [f"{p}/abs"], [f"{p}/absmax"], axes=[-1], keepdims=1)
        # Three passes over the activations (Abs, ReduceMax, QuantizeLinear): QuantizeLinear does the
        # divide, round, saturate and cast in one kernel, per row once the rows are flattened to
        # [rows, width] with one scale per row (per-axis, axis 0).
        nodes += [
            helper.make_node("Abs", [x], [f"{p}/abs"]),
            reduce,
            helper.make_node("Max", [f"{p}/absmax", "row_q_floor"], [f"{p}/range"]),
            helper.make_node("Div", [f"{p}/range", "row_q_127"], [f"{p}/scale"]),
            helper.make_node("Reshape", [f"{p}/scale", "row_q_flat"], [f"{p}/scale_flat"]),
            helper.make_node("Shape", [x], [f"{p}/shape"]),
            helper.make_node("Shape", [x], [f"{p}/width"], start=-1),
            helper.make_node("Concat", ["row_q_flat", f"{p}/width"], [f"{p}/rows_shape"], axis=0),
            helper.make_node("Reshape", [x, f"{p}/rows_shape"], [f"{p}/rows"]),
            helper.make_node("Shape", [f"{p}/scale_flat"], [f"{p}/n_rows"]),
            helper.make_node("Expand", ["row_q_zero_point", f"{p}/n_rows"], [f"{p}/zero_points"]),
            helper.make_node("QuantizeLinear", [f"{p}/rows", f"{p}/scale_flat", f"{p}/zero_points"], [f"{p}/q_rows"],
                             axis=0),
            helper.make_node("Reshape", [f"{p}/q_rows", f"{p}/shape"], [q]),
            # The tensor scale the MatMulInteger chain multiplies by is 1, computed at run time: ONNX
            # Runtime fuses the chain into MatMulIntegerToFloat only when `Mul(x_scale, w_scale)`
            # is in the graph, and a constant 1 would be folded away (unfused: ~25 % slower DiT).
            helper.make_node("ReduceMax", [f"{p}/scale_flat"], [f"{p}/largest"], keepdims=0),
            helper.make_node("Div", [f"{p}/largest", f"{p}/largest"], [scale]),
            helper.make_node("Identity", ["row_q_zero_point"], [zero]),
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    if rewritten:
        graph.initializer.extend(consts)
    onnx.save(model, str(path))
    return rewritten
