"""cosy_export: CosyVoice3 checkpoint folder -> ONNX graphs + manifest for the cosy runtime.

Also holds our own PyTorch modules for the model (never the official code) and an eager
reference pipeline used for parity tests and speed comparisons.
"""

__version__ = "0.1.0"
