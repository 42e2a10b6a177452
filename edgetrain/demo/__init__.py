"""`edgetrain demo`: the embedded base model and a new user's digits -> the personalization story on screen (base
accuracy, head-only and full fine-tuning side by side, accuracy after, export checked by onnxruntime), a table, a
JSON summary and, with matplotlib, a training-curve plot. Build side: needs onnx; onnxruntime for the check.
`--model lstm` (or gru) tells the same story with a sequence model that reads each digit row by row.
`--quantized` tells it with the LeNet quantized to int8 by onnxruntime's static quantizer (needs onnxruntime): float
and int8 personalized side by side, exported int8 and float, every model file measured by onnxruntime.
`--model keyboard` tells it with a next-word language model (data/keyboard/, tools/build_keyboard.py) and a new
user's sentences: LoRA, head-only and full fine-tuning, the adapters exported for onnxruntime's multi-LoRA serving.

A module a demo: `digits` (LeNet, LSTM, GRU), `quantized` (int8), `keyboard`; `common` holds what they share. The
names below are imported on first use (PEP 562), so that running one demo loads neither of the others' modules.
"""

from importlib import import_module

# name -> the module that defines it (imported on first access)
_LAZY = {
    **dict.fromkeys(
        [
            "BASE_DIGITS",
            "BASE_MODEL",
            "BATCH",
            "MODELS",
            "NEW_USER",
            "USER_STYLE",
            "VARIANTS",
            "BaseModel",
            "DemoResult",
            "VariantResult",
            "run_demo",
        ],
        "edgetrain.demo.digits",
    ),
    **dict.fromkeys(
        [
            "CALIBRATION_BATCH",
            "QUANTIZATION",
            "ModelRow",
            "QuantizedDemoResult",
            "quantize_model",
            "run_quantized_command",
            "run_quantized_demo",
        ],
        "edgetrain.demo.quantized",
    ),
    **dict.fromkeys(
        [
            "EVAL_BATCH",
            "KEYBOARD",
            "KEYBOARD_BATCH",
            "KEYBOARD_EPOCHS",
            "KEYBOARD_MODEL",
            "KEYBOARD_VARIANTS",
            "LORA",
            "RSS_STEPS",
            "SPECIALS",
            "KeyboardDemoResult",
            "KeyboardVariant",
            "LMFigures",
            "lm_figures",
            "run_keyboard_command",
            "run_keyboard_demo",
        ],
        "edgetrain.demo.keyboard",
    ),
    "DATA": "edgetrain.demo.common",
    "_blas_threads": "edgetrain.demo.common",  # tests/cli/test_demo_sequence.py restores the BLAS threads with it
}

__all__ = sorted(name for name in _LAZY if not name.startswith("_"))


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
    value = getattr(import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
